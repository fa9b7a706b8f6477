"""Instances of user classes that the frame itself creates (`DynamicCache(config=...)`, a
dataclass): __init__ is inlined on a tracker that holds the instance's attributes, and the
transformed code builds the real object from them after the graph.

An object made in the frame is invisible to the rest of the program until the frame hands it
out, so its attribute stores need no replay in order: the final attributes are the object's
state, written once (object.__new__(cls), then its __dict__) by the Reconstructor. Only classes
whose instances are plain Python objects are modelled (object's __new__ and __getattribute__,
an instance __dict__, no slots, no metaclass but ABCMeta); constructing anything else stays
Unsupported.
"""
import abc
import collections.abc
import inspect
import types

import torch

from kiln.exc import Unsupported
from kiln.guards.source import AttrSource
from kiln.variables.base import VariableTracker
from kiln.variables.class_attr import class_attr
from kiln.variables.constant import ConstantVariable
from kiln.variables.containers import new_serial, note_mutation

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement
_MISSING = object()


def can_construct(cls) -> bool:
    """Whether `cls(...)` makes a plain object this tracker models."""
    if not isinstance(cls, type) or type(cls) not in (type, abc.ABCMeta):
        return False
    if issubclass(cls, (torch.nn.Module, torch.Tensor, BaseException)):
        return False
    if cls.__new__ is not object.__new__ or getattr(cls, "__abstractmethods__", None):
        return False
    for klass in cls.__mro__[:-1]:
        if not klass.__flags__ & _HEAPTYPE or klass.__dict__.get("__slots__", ()) != ():
            return False
    if inspect.getattr_static(cls, "__getattribute__") is not object.__getattribute__:
        return False
    init = inspect.getattr_static(cls, "__init__")
    setattr_fn = inspect.getattr_static(cls, "__setattr__")
    return ((init is object.__init__ or isinstance(init, types.FunctionType))
            and (setattr_fn is object.__setattr__ or isinstance(setattr_fn, types.FunctionType)))


def construct(tx, cls, cls_source, args, kwargs):
    """`cls(*args, **kwargs)`: a fresh tracker, then cls.__init__ inlined on it."""
    obj = FreshObjectVariable(cls, cls_source)
    init = inspect.getattr_static(cls, "__init__")
    if init is object.__init__:
        if args or kwargs:
            raise Unsupported(f"{cls.__qualname__}() takes no arguments")
        return obj
    result = tx.inline_call(init, [obj, *args], kwargs)
    if not (isinstance(result, ConstantVariable) and result.value is None):
        raise Unsupported(f"{cls.__qualname__}.__init__ returned a value")
    return obj


class FreshObjectVariable(VariableTracker):
    """An instance of `cls` made in the frame; `attrs` is its instance __dict__, in order."""

    def __init__(self, cls: type, cls_source=None):
        super().__init__(None)
        self.obj_cls = cls
        self.cls_source = cls_source  # where `cls` was read, to guard class-level data
        self.attrs = {}
        self.fresh_object = True  # made in the frame: the tracker is its identity
        self.serial = new_serial()

    def python_type(self):
        return self.obj_cls

    # -- attributes ----------------------------------------------------------------------------

    def var_getattr(self, tx, name):
        cls = self.obj_cls
        if name == "__class__":
            return tx.wrap(cls, None)
        if name == "__dict__":
            raise Unsupported(f"__dict__ of a {cls.__qualname__} made in the frame")
        static = inspect.getattr_static(cls, name, _MISSING)
        if name in self.attrs and not _is_data_descriptor(static):
            return self.attrs[name]
        if static is _MISSING:
            getattr_fn = inspect.getattr_static(cls, "__getattr__", None)
            if isinstance(getattr_fn, types.FunctionType):
                return tx.inline_call(getattr_fn, [self, ConstantVariable(name)], {})
            raise Unsupported(f"AttributeError: {cls.__qualname__} object has no attribute "
                              f"{name!r}")
        # Class-level data is guarded through the class, whose lookup (type's or ABCMeta's)
        # is the plain one.
        source = AttrSource(self.cls_source, name) if self.cls_source is not None else None
        return class_attr(tx, cls, name, self, source, source_is_plain=True,
                           cls_source=self.cls_source)

    def has_attr(self, tx, name) -> bool:
        if name in self.attrs:
            return True
        if inspect.getattr_static(self.obj_cls, "__getattr__", None) is not None:
            raise Unsupported(f"hasattr on a {self.obj_cls.__qualname__} (it has __getattr__)")
        found = hasattr(self.obj_cls, name)
        if self.cls_source is not None:  # the class may gain or lose it between calls
            tx.output.guards.add(self.cls_source, "HASATTR" if found else "NO_HASATTR", name)
        return found

    def store_attr(self, tx, name, value):
        """`obj.name = value`: the class's own Python __setattr__ inlined, a property's setter
        inlined, or a store into the instance dict."""
        setattr_fn = inspect.getattr_static(self.obj_cls, "__setattr__")
        if isinstance(setattr_fn, types.FunctionType):
            tx.inline_call(setattr_fn, [self, ConstantVariable(name), value], {})
            return
        self.object_setattr(tx, name, value)

    def object_setattr(self, tx, name, value):
        """object.__setattr__(obj, name, value)."""
        static = inspect.getattr_static(self.obj_cls, name, None)
        if isinstance(static, property):
            if static.fset is None:
                raise Unsupported(f"AttributeError: property {name!r} of "
                                  f"{self.obj_cls.__qualname__} has no setter")
            tx.inline_call(static.fset, [self, value], {})
            return
        if _is_data_descriptor(static):
            raise Unsupported(f"assignment to {self.obj_cls.__qualname__}.{name} through a "
                              "descriptor")
        note_mutation(self.serial)
        self.attrs[name] = value

    def del_attr(self, tx, name):
        delattr_fn = inspect.getattr_static(self.obj_cls, "__delattr__")
        if delattr_fn is not object.__delattr__ or name not in self.attrs:
            raise Unsupported(f"del of attribute {name!r} of a {self.obj_cls.__qualname__}")
        note_mutation(self.serial)
        del self.attrs[name]

    # -- protocols: the class's Python special methods, inlined --------------------------------

    def _dunder(self, name):
        fn = inspect.getattr_static(self.obj_cls, name, None)
        return fn if isinstance(fn, types.FunctionType) else None

    def _call_dunder(self, tx, name, args, what):
        fn = self._dunder(name)
        if fn is None:
            raise Unsupported(f"{what} a {self.obj_cls.__qualname__}")
        return tx.inline_call(fn, [self, *args], {})

    def call_function(self, tx, args, kwargs):
        fn = self._dunder("__call__")
        if fn is None:
            raise Unsupported(f"call of a {self.obj_cls.__qualname__} object")
        return tx.inline_call(fn, [self, *args], kwargs)

    def getitem(self, tx, index):
        return self._call_dunder(tx, "__getitem__", [index], "indexing")

    def setitem(self, tx, index, value):
        self._call_dunder(tx, "__setitem__", [index, value], "item assignment on")

    def contains(self, tx, item):
        result = self._call_dunder(tx, "__contains__", [item], "`in` on")
        return ConstantVariable(result.truth(tx))

    def length(self, tx) -> int:
        n = self._call_dunder(tx, "__len__", [], "len() of").as_python_constant()
        if not isinstance(n, int):
            raise Unsupported(f"{self.obj_cls.__qualname__}.__len__ returned a "
                              f"{type(n).__name__}")
        return n

    def truth(self, tx) -> bool:
        if self._dunder("__bool__") is not None:
            return self._call_dunder(tx, "__bool__", [], "bool() of").truth(tx)
        if self._dunder("__len__") is not None:
            return self.length(tx) > 0
        if inspect.getattr_static(self.obj_cls, "__bool__", None) is not None or \
                inspect.getattr_static(self.obj_cls, "__len__", None) is not None:
            raise Unsupported(f"bool() of a {self.obj_cls.__qualname__}")
        return True

    def unpack(self, tx):
        fn = self._dunder("__iter__")
        if fn is None:
            raise Unsupported(f"iteration over a {self.obj_cls.__qualname__}")
        if fn is collections.abc.Sequence.__iter__ and self._dunder("__len__") is not None:
            # Sequence's mixin indexes until IndexError; a sequence whose __getitem__ agrees
            # with its __len__ (what the ABC asks of it) yields its first len() items.
            return [self.getitem(tx, ConstantVariable(i)) for i in range(self.length(tx))]
        if fn.__code__.co_flags & inspect.CO_GENERATOR:
            return tx.inline_generator(fn, [self], {})
        return tx.inline_call(fn, [self], {}).unpack(tx)

    # -- after the graph -----------------------------------------------------------------------

    def reconstruct(self, codegen) -> str:
        return codegen.fresh_object(self, self.obj_cls, self.attrs)

    def __repr__(self):
        return f"FreshObjectVariable({self.obj_cls.__qualname__})"


def _is_data_descriptor(static) -> bool:
    return static is not _MISSING and static is not None and hasattr(type(static), "__set__")


class ObjectSetattrVariable(VariableTracker):
    """`object.__setattr__` (frozen dataclasses' __init__, a __setattr__ override calling
    super().__setattr__): a store below the class's __setattr__, into an object made in the
    frame or, held pending like any attribute store, into one from outside it."""

    def __init__(self, obj=None):
        super().__init__(None)
        self.obj = obj  # bound through super(), or None for the unbound function

    def call_function(self, tx, args, kwargs):
        args = [self.obj, *args] if self.obj is not None else list(args)
        if kwargs or len(args) != 3:
            raise Unsupported("object.__setattr__ with other than three arguments")
        obj, name, value = args[0], args[1].as_python_constant(), args[2]
        obj.object_setattr(tx, name, value)
        return ConstantVariable(None)

    def reconstruct(self, codegen) -> str:
        fn = codegen.constant(object.__setattr__)
        if self.obj is None:
            return fn
        return f"{fn}.__get__({codegen(self.obj)})"  # the method-wrapper super() gives

    def __repr__(self):
        return "ObjectSetattrVariable()"
