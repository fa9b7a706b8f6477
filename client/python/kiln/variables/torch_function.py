"""Tensor subclasses with __torch_function__ (torch.overrides): the graph holds plain tensors,
and each op a subclass tensor takes part in goes through the subclass's __torch_function__ as
eager's does, the override's Python inlined, torch.Tensor's own modelled: the op recorded with
subclass dispatch off, its tensor results made instances of the class.

Modelled where eager dispatches and the function it hands the override is known: a torch
function that is a builtin (torch.sigmoid, F.linear) or a Tensor method of C (x.sigmoid()), and
a Python torch function's own has_torch_function/handle_torch_function (F.relu); other Python
torch functions (F.sigmoid) are inlined, reaching those. Any other op of a subclass tensor
(operators, indexing, a property read through a Python override) is refused by the graph
(OutputGraph.call), so that no op skips the override."""
import inspect
import types

import torch

from kiln.exc import Unsupported
from kiln.variables.base import ValueVariable, VariableTracker
from kiln.variables.constant import ConstantVariable
from kiln.graph.meta_rules import class_overrides_torch_function as overrides_torch_function
from kiln.variables.containers import BaseListVariable, ConstDictVariable, TupleVariable

_DEFAULT = inspect.getattr_static(torch.Tensor, "__torch_function__").__func__
_DEFAULT_SIGNATURE = inspect.signature(_DEFAULT)
_TENSOR_DISPATCH = inspect.getattr_static(torch.Tensor, "__torch_dispatch__")
# What a subclass may define besides __torch_function__: nothing an op or attribute reads.
_INERT_NAMES = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                "__annotations__", "__firstlineno__", "__static_attributes__",
                "__torch_function__", "__parameters__", "__orig_bases__"}


def check_modelled(cls) -> None:
    """Raises Unsupported unless instances of the Tensor subclass `cls` can be traced: its
    __torch_function__ torch.Tensor's or a classmethod over a Python function, no
    __torch_dispatch__ of its own, no method, property or operator of its own (kiln's tensor
    tracker would answer those as torch.Tensor does)."""
    if type(cls) is not type(torch.Tensor):
        raise Unsupported(f"tensor subclass {cls.__qualname__} with a metaclass of its own")
    if inspect.getattr_static(cls, "__torch_dispatch__") is not _TENSOR_DISPATCH:
        raise Unsupported(f"tensor subclass {cls.__qualname__} with __torch_dispatch__")
    tf = inspect.getattr_static(cls, "__torch_function__")
    if tf is not torch._C._disabled_torch_function_impl and not (
            isinstance(tf, classmethod) and isinstance(tf.__func__, types.FunctionType)):
        raise Unsupported(f"tensor subclass {cls.__qualname__}: __torch_function__ is not a "
                          "classmethod")
    for klass in cls.__mro__[:cls.__mro__.index(torch.Tensor)]:
        own = set(vars(klass)) - _INERT_NAMES
        if own:
            raise Unsupported(f"tensor subclass {cls.__qualname__} defines "
                              f"{', '.join(sorted(own))}")


def overloaded(args) -> list:
    """The trackers among `args` (and in lists and tuples among them) whose class overrides
    __torch_function__, one per class, subclasses before their bases: the order torch calls
    the overrides in (torch.overrides._get_overloaded_args)."""
    found = []
    for arg in _flat(args):
        cls = arg.python_type() if arg.overrides_torch_function() else None
        if cls is None or any(f.python_type() is cls for f in found):
            continue
        index = next((i for i, f in enumerate(found) if issubclass(cls, f.python_type())),
                     len(found))
        found.insert(index, arg)
    return found


def _flat(args):
    for arg in args:
        if isinstance(arg, BaseListVariable):
            yield from arg.items
        else:
            yield arg


def dispatch(tx, func_vt, relevant, args, kwargs, from_python: bool):
    """`func(*args, **kwargs)` where `relevant` hold a tracker of a class overriding
    __torch_function__: each override in torch's order until one returns other than
    NotImplemented. `from_python`: dispatched by torch.overrides.handle_torch_function (the
    override gets a kwargs dict), else by torch's C code (kwargs None when there are none)."""
    found = overloaded(relevant)
    types_vt = TupleVariable([tx.wrap(f.python_type(), None, guard=False) for f in found])
    args_vt = TupleVariable(list(args))
    kwargs_vt = ConstDictVariable(dict(kwargs)) if kwargs or from_python else \
        ConstantVariable(None)
    for arg, cls_vt in zip(found, types_vt.items):
        cls = arg.python_type()
        fn = inspect.getattr_static(cls, "__torch_function__").__func__
        if fn is _DEFAULT:
            result = default_torch_function(tx, [cls_vt, func_vt, types_vt, args_vt,
                                                 kwargs_vt], {})
        else:
            result = tx.inline_call(fn, [cls_vt, func_vt, types_vt, args_vt, kwargs_vt], {})
        if not (result.is_python_constant() and result.as_python_constant() is NotImplemented):
            return result
    raise Unsupported(f"every __torch_function__ returned NotImplemented for "
                      f"{getattr(func_vt.as_python_constant(), '__name__', func_vt)}")


def is_default_torch_function(fn) -> bool:
    return fn is _DEFAULT


def default_torch_function(tx, args, kwargs):
    """torch.Tensor.__torch_function__(cls, func, types, args=(), kwargs=None): `func` run
    with subclass dispatch off, its tensor results made instances of `cls` (torch._tensor's
    _convert) unless `func` is one torch hands back as it is."""
    bound = _DEFAULT_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    a = {k: v if isinstance(v, VariableTracker) else ConstantVariable(v)
         for k, v in bound.arguments.items()}
    cls = a["cls"].as_python_constant()
    types_ = [t.as_python_constant() for t in a["types"].unpack(tx)]
    if not all(issubclass(cls, t) for t in types_):
        return ConstantVariable(NotImplemented)
    func_vt = a["func"]
    call_args = a["args"].unpack(tx)
    call_kwargs = a["kwargs"]
    if isinstance(call_kwargs, ConstDictVariable):
        call_kwargs = dict(call_kwargs.items)
    elif call_kwargs.is_python_constant() and call_kwargs.as_python_constant() is None:
        call_kwargs = {}
    else:
        raise Unsupported(f"torch.Tensor.__torch_function__ with kwargs {call_kwargs}")
    output = tx.output
    was = output.torch_function_enabled
    output.torch_function_enabled = False
    try:
        result = func_vt.call_function(tx, call_args, call_kwargs)
    finally:
        output.torch_function_enabled = was
    if func_vt.as_python_constant() in torch.overrides.get_default_nowrap_functions():
        return result
    return _convert(result, cls)


def _convert(vt, cls):
    """torch._tensor._convert: a tensor not already an instance of `cls` becomes one (a new
    object over the same tensor), inside a tuple or list too."""
    if cls is torch.Tensor:
        return vt
    if vt.contains_tensor() and hasattr(vt, "example"):
        if issubclass(vt.python_type(), cls):
            return vt
        return vt.as_subclass(cls)
    if type(vt) is TupleVariable or (isinstance(vt, BaseListVariable) and
                                     vt.python_type() is list):
        return type(vt)([_convert(v, cls) for v in vt.items])
    return vt


def has_torch_function(tx, fn, args) -> bool:
    """torch.overrides.has_torch_function(iterable) / _unary(x) / _variadic(*xs)."""
    if not tx.output.torch_function_enabled:
        return False
    if fn is torch.overrides.has_torch_function:
        args = args[0].unpack(tx)
    return bool(overloaded(args))


def handle_torch_function(tx, args, kwargs):
    """torch.overrides.handle_torch_function(public_api, relevant_args, *args, **kwargs)."""
    public_api, relevant = args[0], args[1].unpack(tx)
    return dispatch(tx, public_api, relevant, args[2:], kwargs, from_python=True)


class TensorMethodDescriptorVariable(ValueVariable):
    """A method of torch.Tensor written in C, taken from the class (`torch.Tensor.add`, and
    the `func` eager's dispatch hands an override for `x.add(y)`): calling it calls the
    method of its first argument."""

    def call_function(self, tx, args, kwargs):
        if not args:
            raise Unsupported(f"torch.Tensor.{self.value.__name__}() with no tensor")
        return args[0].var_getattr(tx, self.value.__name__).call_function(tx, args[1:], kwargs)

    def reconstruct(self, codegen) -> str:
        return codegen.source(self.source) if self.source is not None else \
            codegen.constant(self.value)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__doc__"):
            return ConstantVariable(getattr(self.value, name))
        raise Unsupported(f"attribute {name!r} of torch.Tensor.{self.value.__name__}")

    def __repr__(self):
        return f"TensorMethodDescriptorVariable({self.value.__name__})"


def is_tensor_method_descriptor(value) -> bool:
    return isinstance(value, types.MethodDescriptorType) and \
        getattr(value, "__objclass__", None) is torch._C.TensorBase and \
        not value.__name__.startswith("__")
