"""torch.autograd.Function subclasses: `Fn.apply(...)` where no input needs a gradient runs the
Function's forward, inlined into the graph with a stand-in for its ctx; where one does, the
call is a graph break (its backward would be lost in the graph)."""
import inspect
import types

import torch

from kiln.exc import Unsupported
from kiln.variables.base import VariableTracker
from kiln.variables.class_attr import guard_class_member
from kiln.variables.constant import ConstantVariable
from kiln.variables.ctx_manager import set_grad_mode
from kiln.variables.tensor import TensorVariable

_BASE_SETUP_CONTEXT = inspect.getattr_static(torch.autograd.Function, "setup_context", None)


def has_functions_apply(cls) -> bool:
    """Whether `cls` is a torch.autograd.Function whose apply is Function's own (modelled by
    AutogradFunctionApplyVariable), not one it overrides."""
    return isinstance(cls, type) and issubclass(cls, torch.autograd.Function) and \
        inspect.getattr_static(cls, "apply") is \
        inspect.getattr_static(torch.autograd.Function, "apply")


def _static_function(cls, name):
    fn = inspect.getattr_static(cls, name, None)
    if isinstance(fn, staticmethod):
        fn = fn.__func__
    return fn if isinstance(fn, types.FunctionType) else None


class AutogradFunctionApplyVariable(VariableTracker):
    """`Fn.apply` of a torch.autograd.Function subclass `cls` (read through `cls_source`)."""

    def __init__(self, cls, cls_source=None):
        super().__init__(None)
        self.cls = cls
        self.cls_source = cls_source

    def call_function(self, tx, args, kwargs):
        cls = self.cls
        forward = _static_function(cls, "forward")
        if forward is None:
            raise Unsupported(f"{cls.__qualname__}.forward is not a Python static method")
        if any(_needs_grad(a) for a in (*args, *kwargs.values())) and torch.is_grad_enabled():
            # Dynamo makes a subgraph of forward and backward for this; kiln leaves the call to
            # Python, where autograd records the Function's own backward.
            raise Unsupported(f"{cls.__qualname__}.apply with inputs that need gradients")
        if self.cls_source is not None:  # `Fn.forward = other` later must recompile
            guard_class_member(tx, self.cls_source, "forward",
                               inspect.getattr_static(cls, "forward"))
            guard_class_member(tx, self.cls_source, "setup_context",
                               inspect.getattr_static(cls, "setup_context"))
        setup = inspect.getattr_static(cls, "setup_context", None)
        if setup is not None and setup is not _BASE_SETUP_CONTEXT:
            # The forward-without-ctx style: setup_context would only fill a ctx no one reads.
            call_args = list(args)
        else:
            # No gradient is recorded: apply() is forward's result, its ctx read by no backward.
            call_args = [FunctionCtxVariable(cls), *args]
        # apply runs forward with grad mode off, as the graph then does: what forward computes
        # from a tensor that needs a gradient (a global weight) does not.
        prior = torch.is_grad_enabled()
        if prior:
            set_grad_mode(tx, False)
        try:
            return tx.inline_call(forward, call_args, kwargs, fn_source=None)
        finally:
            # Also when forward raises: a traced `except` around apply goes on with grad mode on.
            if prior:
                set_grad_mode(tx, True)

    def reconstruct(self, codegen) -> str:
        cls = codegen.source(self.cls_source) if self.cls_source is not None else \
            codegen.constant(self.cls)
        return f"{cls}.apply"

    def __repr__(self):
        return f"AutogradFunctionApplyVariable({self.cls.__qualname__})"


def _needs_grad(vt) -> bool:
    """Whether an argument is a tensor that needs a gradient, or a tuple or list holding one.
    A tensor inside another object is no input of the Function's autograd node: forward, run
    with grad mode off, computes what eager does from it."""
    if isinstance(vt, TensorVariable):
        return bool(getattr(vt.as_fake_arg(), "requires_grad", False))
    if vt.python_type() in (tuple, list):
        return any(_needs_grad(v) for v in vt.unpack(None))
    return False


class FunctionCtxVariable(VariableTracker):
    """The ctx a Function's forward gets when no backward will read it: what forward saves or
    marks on it is dropped, what it stores on it reads back."""

    fresh_object = True

    def __init__(self, cls):
        super().__init__(None)
        self.cls = cls
        self.attrs = {}

    def python_type(self):
        return torch.autograd.function.FunctionCtx

    def store_attr(self, tx, name, value):
        self.attrs[name] = value

    def var_getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name in ("save_for_backward", "save_for_forward", "mark_dirty",
                    "mark_non_differentiable", "set_materialize_grads"):
            if name == "mark_dirty":
                raise Unsupported(f"ctx.mark_dirty in {self.cls.__qualname__}.forward")
            return _CtxNoOp(name)
        if name == "needs_input_grad":
            raise Unsupported("ctx.needs_input_grad read in a forward kiln inlines")
        raise Unsupported(f"ctx.{name} in {self.cls.__qualname__}.forward")

    def __repr__(self):
        return f"FunctionCtxVariable({self.cls.__qualname__})"


class _CtxNoOp(VariableTracker):
    def __init__(self, name):
        super().__init__(None)
        self.name = name

    def call_function(self, tx, args, kwargs):
        return ConstantVariable(None)


class AutogradFunctionInstanceVariable(VariableTracker):
    """`Fn()`, an instance of a torch.autograd.Function subclass made in the frame to call its
    apply (the old spelling): its apply is the class's."""

    fresh_object = True

    def __init__(self, cls, cls_source=None):
        super().__init__(None)
        self.cls = cls
        self.cls_source = cls_source

    def python_type(self):
        return self.cls

    def var_getattr(self, tx, name):
        if name == "apply":
            return AutogradFunctionApplyVariable(self.cls, self.cls_source)
        raise Unsupported(f"attribute {name!r} of a {self.cls.__qualname__} made in the frame")

    def reconstruct(self, codegen) -> str:
        return codegen.temp(self, lambda: f"{codegen.constant(self.cls)}()")
