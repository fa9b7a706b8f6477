"""Shortcuts for the metadata of ops whose result looks exactly like their input (pointwise ops
on same-shaped inputs, batch norm in inference, dropout off): the input's fake value is reused
instead of running the op on fakes, the slowest part of capture.

A rule applies only when the answer is certain: every tensor argument has the same metadata,
the first is dense and non-overlapping (so the result's strides equal its strides), dtypes are
floating (Python scalars cannot promote them), and grad mode cannot change requires_grad.
"""
import operator
from typing import Optional

import torch
import torch.nn.functional as F

_F_UNARY = {F.relu, F.gelu, F.silu, F.hardswish, F.hardsigmoid, F.sigmoid, F.tanh, F.elu,
            F.leaky_relu, F.relu6, F.mish, F.softplus, F.hardtanh}
_TORCH_UNARY = {torch.relu, torch.sigmoid, torch.tanh, torch.exp, torch.neg, torch.abs,
                torch.sin, torch.cos, torch.sqrt, torch.rsqrt, torch.erf, torch.relu_,
                torch.nn.functional.relu_}
_METHODS = {"relu", "sigmoid", "tanh", "exp", "neg", "abs", "sin", "cos", "sqrt", "rsqrt",
            "erf", "relu_", "sigmoid_", "tanh_", "add_", "mul_", "sub_", "div_", "clone",
            "contiguous", "add", "mul", "sub", "div", "float"}
_BINARY = {operator.add, operator.sub, operator.mul, operator.truediv, operator.iadd,
           operator.isub, operator.imul, operator.itruediv, torch.add, torch.sub, torch.mul,
           torch.div}
_UNARY_OPERATORS = {operator.neg, operator.pos}
_FLOATING = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


def _same_meta(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
            and a.stride() == b.stride() and a.requires_grad == b.requires_grad)


def _dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)


def same_as_input(kind: str, target, args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """The fake value of `target(*args, **kwargs)` when it is certainly `args[0]`'s metadata,
    else None (the caller then runs the op on fakes)."""
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    first = args[0]
    if first.dtype not in _FLOATING or not _dense(first):
        return None
    if first.requires_grad and not torch.is_grad_enabled():
        return None
    if kind == "call_method":
        if target not in _METHODS or kwargs:
            return None
        if target == "float" and first.dtype != torch.float32:
            return None
        operands = args[1:]
    elif target in _F_UNARY or target in _TORCH_UNARY or target in _UNARY_OPERATORS:
        if len(args) != 1 or kwargs.get("out") is not None:
            return None
        operands = ()
    elif target in _BINARY:
        if len(args) != 2 or kwargs:
            return None
        operands = args[1:]
    elif target is F.batch_norm:
        training = kwargs.get("training", args[5] if len(args) > 5 else False)
        if training:
            return None
        operands = ()
    elif target is F.dropout:
        training = kwargs.get("training", args[2] if len(args) > 2 else True)
        if training:
            return None
        operands = ()
    else:
        return None
    for other in operands:
        if isinstance(other, torch.Tensor):
            if not _same_meta(first, other):
                return None
        elif type(other) not in (int, float, bool):
            return None
    return first
