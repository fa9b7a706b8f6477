"""torch's namespace: modules, functions and classes reached through `torch.`/`F.` attributes.

Calls of torch functions become graph nodes; a few answer questions about the trace itself
(is_scripting, is_compiling) and are folded to constants.
"""
import sys
import types

import torch
import torch.fx._symbolic_trace as _fx_trace
import torch.fx.experimental.proxy_tensor  # noqa: F401  (for _is_make_fx_tracing)

from kiln.exc import Unsupported
from kiln.graph import stand_in
from kiln.guards.builder import is_guardable_constant
from kiln.guards.source import AttrSource, ObjectSource
from kiln.variables.base import ValueVariable, constant_args
from kiln.variables.constant import ConstantVariable
from kiln.variables.ctx_manager import CONTEXT_MANAGER_CLASSES, context_manager
from kiln.variables import torch_function
from kiln.variables.marked_calls import call_marked

# Python-level torch functions that are graph ops: called on fake values, never inlined.
_GRAPH_OP_MODULES = ("torch.nn.functional", "torch.functional", "torch", "torch._tensor",
                     "torch.fft", "torch.linalg", "torch.special", "torch._refs")

_FOLDED = {
    fn: value
    for fn, value in (
        (torch.jit.is_scripting, False),
        (torch.jit.is_tracing, False),
        (torch._C._get_tracing_state, None),
        (getattr(torch.compiler, "is_compiling", None), True),
        (getattr(torch.compiler, "is_dynamo_compiling", None), True),
        # Questions about torch-function / dispatch modes: kiln traces plain tensors with no
        # mode active (its own fake mode is an implementation detail the program must not see).
        (torch._C._get_dispatch_mode, None),
        (torch._C._len_torch_dispatch_stack, 0),
        (torch._C._is_torch_function_mode_enabled, False),
        (getattr(torch.fx.experimental.proxy_tensor, "_is_make_fx_tracing", None)
         if hasattr(torch.fx, "experimental") else None, False),
    )
    if fn is not None
}



def _folded_value(fn):
    """(True, value) when a call of `fn` is folded to a constant, else (False, None).

    torch._dynamo.is_compiling is looked up only once the program imported torch._dynamo:
    `torch._dynamo` is a lazy attribute, and touching it imports Dynamo (over a second)."""
    if fn in _FOLDED:
        return True, _FOLDED[fn]
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and fn is getattr(dynamo, "is_compiling", None):
        return True, True
    return False, None


_is_fx_tracing = getattr(_fx_trace, "is_fx_tracing", None)

# Whether arguments take an override of __torch_function__ (kiln.variables.torch_function).
_HAS_TORCH_FUNCTION = {torch.overrides.has_torch_function, torch.overrides.has_torch_function_unary,
                       torch.overrides.has_torch_function_variadic}

# Calls with effects outside the graph (global state, RNG seeding, printing).
_UNSUPPORTED = {torch.manual_seed, torch.set_default_dtype,
                torch.seed, torch.use_deterministic_algorithms, torch.set_printoptions}


def _in_torch(module_name: str) -> bool:
    """torch itself or one of its modules (not torchvision, torchaudio, ...)."""
    return module_name == "torch" or module_name.startswith("torch.")


def is_torch_object(value) -> bool:
    """A module, class or function of torch's own (nn.Module subclasses excepted: user code
    subclasses them)."""
    if isinstance(value, types.ModuleType):
        return _in_torch(value.__name__)
    if isinstance(value, type):
        return _in_torch(value.__module__) and not issubclass(value, torch.nn.Module)
    mod = getattr(value, "__module__", None) or ""
    if isinstance(value, (types.BuiltinFunctionType, torch._ops.OpOverloadPacket,
                          torch._ops.OpOverload)):
        self_obj = getattr(value, "__self__", None)
        return _in_torch(mod) or (
            isinstance(self_obj, types.ModuleType) and _in_torch(self_obj.__name__)) \
            or type(self_obj).__name__ == "_VariableFunctionsClass" \
            or isinstance(value, (torch._ops.OpOverloadPacket, torch._ops.OpOverload))
    if isinstance(value, types.FunctionType):
        return mod.startswith("torch.") or mod == "torch"
    return False


def is_graph_op(fn) -> bool:
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType,
                       torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    if isinstance(fn, types.FunctionType):
        # torch.nn.functional's private Python helpers (_canonical_mask, _none_or_dtype) are
        # not ops: inlined, what they compute (often nothing, for None arguments) is recorded.
        return getattr(fn, "__module__", "") in _GRAPH_OP_MODULES and \
            not fn.__name__.startswith("_")
    return False


def _fx_tracing_tls(fn):
    """The thread-local "an FX trace is under way" flag that `fn` reads: torch's is_fx_tracing
    on a torch that keeps it per thread, or the reader kiln.background installs on one that
    does not; None for anything else."""
    tls = getattr(fn, "_kiln_fx_tracing_tls", None)
    if tls is None and fn is _is_fx_tracing:
        tls = getattr(_fx_trace, "_is_fx_tracing_tls", None)
    return tls


def _fx_tracing(tx, tls):
    """torch.fx's is_fx_tracing(): its thread's flag (set while symbolic_trace runs), read and
    guarded; the warning it logs once (an lru_cache) logged as the program's first call would."""
    holder = ObjectSource(tls, "<torch.fx tracing flag>")
    if hasattr(tls, "flag"):
        value = tls.flag
        tx.output.guards.add(AttrSource(holder, "flag"), "CONSTANT_MATCH", value)
    else:
        value = False
        tx.output.guards.add(holder, "NO_HASATTR", "flag")
    warn = getattr(_fx_trace, "is_fx_tracing_warning", None)
    if callable(warn):
        warn()
    return ConstantVariable(bool(value))


def _refuse_machine_question(value, called: bool) -> None:
    """While CPU tensors stand in for a GPU's (kiln.graph.stand_in), torch.cuda's answers are
    this machine's, not the GPU's: a frame that asks is not captured."""
    if stand_in.target() is not None and stand_in.asks_the_machine(value, called):
        raise Unsupported(f"{getattr(value, '__name__', value)!r} asks this machine's CUDA "
                          f"state while capturing for {stand_in.target()}")


class TorchVariable(ValueVariable):
    """A torch module, function or class (torch, torch.nn.functional, torch.add, torch.Size)."""

    def var_getattr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError:
            raise Unsupported(f"{self.value!r} has no attribute {name!r}") from None
        _refuse_machine_question(attr, called=False)
        # torch's namespace is fixed for the life of the process: nothing to guard.
        if is_guardable_constant(attr) or type(attr) is torch.Size:
            return ConstantVariable(attr)
        if isinstance(attr, types.ModuleType) or is_torch_object(attr):
            return TorchVariable(attr)
        return tx.wrap(attr, None, guard=False)

    def call_function(self, tx, args, kwargs):
        fn = self.value
        _refuse_machine_question(fn, called=True)
        folded, value = _folded_value(fn)
        if folded:
            return ConstantVariable(value)
        if fn in _UNSUPPORTED:
            raise Unsupported(f"call of {getattr(fn, '__qualname__', fn)} (changes global state)")
        marked = call_marked(tx, fn, args, kwargs)
        if marked is not None:
            return marked
        if fn in _HAS_TORCH_FUNCTION:
            return ConstantVariable(torch_function.has_torch_function(tx, fn, args))
        if fn is torch.overrides.handle_torch_function:
            return torch_function.handle_torch_function(tx, args, kwargs)
        if is_graph_op(fn) and tx.output.has_subclass_inputs and \
                tx.output.torch_function_enabled and any(
                a.overrides_torch_function() for a in (*args, *kwargs.values())):
            if isinstance(fn, types.FunctionType):
                # Its Python dispatches where eager's does (has_torch_function, or the ops it
                # calls).
                return tx.inline_call(fn, args, kwargs, fn_source=None)
            if fn in torch.overrides.get_ignored_functions():
                raise Unsupported(f"{getattr(fn, '__name__', fn)} of a tensor whose class "
                                  "overrides __torch_function__")
            return torch_function.dispatch(tx, self, [*args, *kwargs.values()], args, kwargs,
                                           from_python=False)
        if fn is torch.is_grad_enabled:
            tx.output.guards.add(None, "GLOBAL_STATE")
            return ConstantVariable(torch.is_grad_enabled())
        if fn is torch.get_default_dtype:
            tx.output.guards.add(None, "GLOBAL_STATE")
            return ConstantVariable(torch.get_default_dtype())
        if fn is torch.is_tensor:
            cls = args[0].python_type()
            return ConstantVariable(isinstance(cls, type) and issubclass(cls, torch.Tensor))
        if fn is torch._shape_as_tensor and len(args) == 1 and not kwargs and \
                hasattr(args[0], "example"):
            # A tensor of the sizes, which are constants under static shapes.
            shape = ConstantVariable(list(args[0].example.shape))
            return tx.output.call("call_function", torch.tensor, (shape,),
                                  {"dtype": ConstantVariable(torch.int64)})
        fx_tls = _fx_tracing_tls(fn)
        if fx_tls is not None and not args and not kwargs:
            return _fx_tracing(tx, fx_tls)
        if getattr(fn, "_kiln_fx_symbolic_tracing", False) and not args and not kwargs:
            return ConstantVariable(False)  # a trace that is not a compile's: never this one
        if fn in CONTEXT_MANAGER_CLASSES:  # no_grad, enable_grad, autocast
            return context_manager(tx, fn, args, kwargs)
        if isinstance(fn, type):
            return self._construct(tx, fn, args, kwargs)
        if is_graph_op(fn):
            # Factory functions (torch.ones, torch.arange) make tensors from constants alone:
            # they are graph nodes too.
            return tx.output.call("call_function", fn, tuple(args), kwargs)
        if isinstance(fn, types.FunctionType):
            return tx.inline_call(fn, args, kwargs, fn_source=None)
        raise Unsupported(f"call of torch object {fn!r}")

    def _construct(self, tx, cls, args, kwargs):
        const = constant_args(args, kwargs)
        if cls in (torch.Size, torch.device, torch.dtype) and const is not None:
            return ConstantVariable(cls(*const[0], **const[1]))
        if cls in (torch.finfo, torch.iinfo) and const is not None:
            # Immutable facts about a dtype (`torch.finfo(x.dtype).min`); with no argument, the
            # default dtype's, which the global-state guard covers.
            if not const[0] and not const[1]:
                tx.output.guards.add(None, "GLOBAL_STATE")
            try:
                return ConstantVariable(cls(*const[0], **const[1]))
            except (TypeError, ValueError) as e:
                raise Unsupported(f"torch.{cls.__name__}() raised {type(e).__name__}") from None
        if cls is torch.Tensor or cls is torch.tensor:
            raise Unsupported("torch.Tensor(...) constructor")
        if issubclass(cls, torch.nn.Module):
            raise Unsupported(f"constructing {cls.__name__} inside a compiled frame")
        raise Unsupported(f"constructing torch class {cls.__qualname__}")

    def __repr__(self):
        return f"TorchVariable({getattr(self.value, '__name__', self.value)!r})"
