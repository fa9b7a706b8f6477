"""Shortcuts for the metadata of common ops, instead of running them on fakes (the slowest part
of capture): ops whose result looks exactly like their input (pointwise ops on same-shaped
inputs, batch norm in inference, dropout off) get a new fake with the input's metadata (or the
input's own fake, for the ops that return their input: in-place ops, `contiguous()` of a
contiguous tensor, `float()` of a float32 one); a 2-d convolution's result is built from its
output size and the memory format ATen's convolution would choose (asked of ATen itself, as the
fake convolution does).

A rule applies only when the answer is certain: for the first kind, every tensor argument has
the same metadata, the first is dense and non-overlapping (so the result's strides equal its
strides), dtypes are floating (Python scalars cannot promote them), and no argument requires
grad (a result that does is no leaf and has a grad_fn, which only running the op gives); for the
convolution, plain arguments of the usual types and nothing needing grad. Anything else returns
None and runs on fakes.
"""
import inspect
import operator
from typing import Optional

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

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
    if first.dtype not in _FLOATING or not _dense(first) or first.requires_grad:
        return None
    if kind == "call_method":
        if target not in _METHODS or kwargs:
            return None
        if target == "float" and first.dtype != torch.float32:
            return None
        if target == "contiguous" and not first.is_contiguous():
            return None  # a channels-last tensor's contiguous() is a new row-major one
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


# What returns its first argument itself: in-place ops, and no-op conversions.
_RETURNS_INPUT_METHODS = {"relu_", "sigmoid_", "tanh_", "add_", "mul_", "sub_", "div_",
                          "contiguous", "float"}
_RETURNS_INPUT = {torch.relu_, torch.nn.functional.relu_, operator.iadd, operator.isub,
                  operator.imul, operator.itruediv}


def shortcut(fake_mode, kind: str, target, args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """The fake value of `target(*args, **kwargs)` when a rule above knows it, else None."""
    result = same_as_input(kind, target, args, kwargs)
    if result is not None:
        returns_input = (target in _RETURNS_INPUT_METHODS if kind == "call_method"
                         else target in _RETURNS_INPUT)
        return result if returns_input else _fake_like(fake_mode, result)
    if kind == "call_function" and target is torch.conv2d:
        return conv2d_result(fake_mode, args, kwargs)
    return None


def _fake_like(fake_mode, t: FakeTensor) -> FakeTensor:
    """A new fake tensor (its own object and storage) with `t`'s metadata; no grad."""
    return fake_empty(fake_mode, t.shape, t.stride(), t.dtype, t.fake_device)


def fake_empty(fake_mode, shape, stride, dtype, device) -> FakeTensor:
    """A new fake tensor of `fake_mode` with this metadata, made from a meta tensor directly (no
    fake op dispatch, about a millisecond each). Called with no fake mode active."""
    meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    return FakeTensor(fake_mode, meta, device)


def class_overrides_torch_function(cls) -> bool:
    """Whether ops on instances of `cls` (a Tensor class) dispatch to its __torch_function__,
    as torch's check_has_torch_function decides."""
    if cls in (torch.Tensor, torch.nn.Parameter) or not (
            isinstance(cls, type) and issubclass(cls, torch.Tensor)):
        return False
    return inspect.getattr_static(cls, "__torch_function__", None) is not \
        torch._C._disabled_torch_function_impl


def plain_tensor(t: torch.Tensor) -> bool:
    """A dense tensor of its own storage, of no subclass: its metadata says all about it."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
            and t._base is None and t.storage_offset() == 0 and not t.is_quantized
            and not t.is_nested and t.device.type in ("cpu", "cuda", "meta"))


def fake_of(fake_mode, t: torch.Tensor, device: torch.device) -> FakeTensor:
    """The fake of a plain tensor `t` (plain_tensor) on `device`: its metadata and requires_grad."""
    f = fake_empty(fake_mode, t.shape, t.stride(), t.dtype, device)
    if t.requires_grad:
        f.requires_grad_(True)
    return f


def _pair(v) -> Optional[tuple]:
    if type(v) is int:
        return (v, v)
    if type(v) in (tuple, list) and len(v) == 2 and all(type(i) is int for i in v):
        return tuple(v)
    if type(v) in (tuple, list) and len(v) == 1 and type(v[0]) is int:
        return (v[0], v[0])
    return None


def conv2d_result(fake_mode, args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """torch.conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) on a
    batched 4-d floating input, integer padding, nothing requiring grad: its fake result."""
    if kwargs or not 2 <= len(args) <= 7:
        return None
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    stride = _pair(args[3] if len(args) > 3 else 1)
    padding = _pair(args[4] if len(args) > 4 else 0)
    dilation = _pair(args[5] if len(args) > 5 else 1)
    groups = args[6] if len(args) > 6 else 1
    if not (isinstance(x, FakeTensor) and isinstance(w, FakeTensor)) or None in (
            stride, padding, dilation) or type(groups) is not int or groups < 1:
        return None
    if (x.dim() != 4 or w.dim() != 4 or x.dtype != w.dtype or x.dtype not in _FLOATING
            or x.fake_device != w.fake_device or x.layout != torch.strided
            or w.layout != torch.strided):
        return None
    if bias is not None and not (isinstance(bias, FakeTensor) and bias.dim() == 1
                                 and bias.dtype == x.dtype and bias.shape[0] == w.shape[0]
                                 and bias.fake_device == x.fake_device):
        return None
    if any(t is not None and t.requires_grad for t in (x, w, bias)) and torch.is_grad_enabled():
        return None
    n, c, h, wd = x.shape
    out_c = w.shape[0]
    if c != w.shape[1] * groups or out_c % groups or min(stride) < 1 or min(dilation) < 1 \
            or min(padding) < 0:
        return None
    size = [n, out_c]
    for extent, k, s, p, d in zip((h, wd), w.shape[2:], stride, padding, dilation):
        out = (extent + 2 * p - d * (k - 1) - 1) // s + 1
        if out <= 0:
            return None
        size.append(out)
    if 0 in size:
        return None
    select = dict(stride=list(stride), padding=list(padding), dilation=list(dilation),
                  transposed=False, output_padding=[0, 0], groups=groups, bias=bias)
    if bias is None:
        select["bias_sizes"] = None
    try:
        with fake_mode:  # the fakes report their fake device to ATen's choice
            backend = torch._C._select_conv_backend(x, w, **select)
            memory_format = torch._C._conv_determine_backend_memory_format(x, w, backend)
    except (TypeError, RuntimeError, AttributeError):  # another torch's signature: run on fakes
        return None
    meta = torch.empty(size, dtype=x.dtype, device="meta", memory_format=memory_format)
    return FakeTensor(fake_mode, meta, x.fake_device)
