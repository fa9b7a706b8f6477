"""Python modules, user-defined classes and their instances, and super()."""
import collections
import inspect
import types
import weakref

import torch

from kiln.exc import Unsupported
from kiln.guards.builder import is_guardable_constant
from kiln.guards.source import (AttrSource, DictItemSource, InstanceAttrSource,
                                InstanceDictSource, ItemSource, TypeSource, WeakRefCallSource)
from kiln.variables import typing_values
from kiln.variables.autograd_function import (AutogradFunctionApplyVariable,
                                              AutogradFunctionInstanceVariable,
                                              has_functions_apply)
from kiln.variables.base import BoundContainerMethod, VariableTracker
from kiln.variables.class_attr import (class_attr, class_source, is_data_descriptor,
                                       object_setattr, plain_getattr)
from kiln.variables.constant import ConstantVariable
from kiln.variables.containers import ConstDictVariable, ListVariable, NamedTupleVariable
from kiln.variables.exceptions import ExceptionVariable, traced_exception
from kiln.variables.fresh_object import ObjectSetattrVariable, can_construct, construct
from kiln.variables.functions import UserFunctionVariable, UserMethodVariable
from kiln.variables.model_output import ModelOutputVariable, is_model_output_class
from kiln.variables.nn_module import construct_module
from kiln.variables.side_effects import mutations_of


_ABSENT = object()


def _is_plain_namedtuple(cls) -> bool:
    """A class collections.namedtuple made, not one that overrides what it wrote."""
    if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
        return False
    new = cls.__dict__.get("__new__")
    new = getattr(new, "__func__", None)  # a staticmethod over the generated function
    return (cls.__bases__ == (tuple,) and isinstance(new, types.FunctionType) and
            new.__module__ == f"namedtuple_{cls.__name__}")


class PythonModuleVariable(VariableTracker):
    """An imported module (math, a user's helpers). Every attribute read is guarded like a global
    of the frame."""

    def __init__(self, module: types.ModuleType, source=None):
        super().__init__(source)
        self.module = module

    def python_type(self):
        return types.ModuleType

    def as_python_constant(self):
        return self.module

    def identity(self, tx):
        return self.module

    def var_getattr(self, tx, name):
        try:
            value = getattr(self.module, name)
        except AttributeError:
            raise Unsupported(f"module {self.module.__name__} has no attribute {name!r}") from None
        source = AttrSource(self.source, name) if self.source is not None else None
        # A module's globals are as mutable as the frame's own (`config.SCALE = 3`, a function
        # swapped for another): each one read is guarded.
        return tx.wrap(value, source)


class UserDefinedClassVariable(VariableTracker):
    def __init__(self, cls: type, source=None):
        super().__init__(source)
        self.cls = cls

    def python_type(self):
        return type(self.cls)

    def as_python_constant(self):
        return self.cls

    def identity(self, tx):
        return self.cls

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.cls, name))
        if self.cls is object and name == "__setattr__":
            return ObjectSetattrVariable()
        if self.cls is object and name == "__getattribute__":
            return ObjectGetattributeVariable()
        if name == "apply" and has_functions_apply(self.cls):
            return AutogradFunctionApplyVariable(self.cls, self.source)
        if name == "__subclasses__" and type(self.cls) is type and \
                inspect.getattr_static(self.cls, name) is _TYPE_SUBCLASSES:
            return SubclassesMethodVariable(self)
        source = AttrSource(self.source, name) if self.source is not None else None
        if type(self.cls) is not type:
            source = None  # a metaclass may intercept getattr
        cls_source = self.source if source is not None else None
        return class_attr(tx, self.cls, name, None, source, cls_source=cls_source)

    def call_function(self, tx, args, kwargs):
        if issubclass(self.cls, torch.autograd.Function) and not args and not kwargs and \
                inspect.getattr_static(self.cls, "__init__") is \
                inspect.getattr_static(torch.autograd.Function, "__init__"):
            # The old spelling CustomFunc().apply(x): an instance only to reach apply (its
            # __init__ only issues a DeprecationWarning, which Python hides by default).
            return AutogradFunctionInstanceVariable(self.cls, self.source)
        if _is_plain_namedtuple(self.cls):
            # The generated __new__ binds the fields (defaults applied) into a tuple of them.
            try:
                bound = inspect.signature(self.cls).bind(*args, **kwargs)
            except TypeError as e:
                raise Unsupported(f"{self.cls.__qualname__}(): {e}") from None
            bound.apply_defaults()
            items = [v if isinstance(v, VariableTracker) else tx.wrap(v, None)
                     for v in bound.arguments.values()]
            return NamedTupleVariable(items, self.cls)
        if self.cls is collections.OrderedDict:
            from kiln.variables.builtins import construct_dict

            return construct_dict(tx, self.cls, args, kwargs)
        if self.cls is collections.defaultdict:
            from kiln.variables.builtins import construct_dict

            factory = args[0] if args else ConstantVariable(None)
            if factory.is_python_constant() and not (
                    factory.as_python_constant() is None or
                    callable(factory.as_python_constant())):
                raise Unsupported("a defaultdict whose default_factory is not callable")
            made = construct_dict(tx, self.cls, args[1:], kwargs)
            made.default_factory = factory
            return made
        if is_model_output_class(self.cls):
            return ModelOutputVariable.construct(tx, self.cls, args, kwargs)
        if issubclass(self.cls, torch.nn.Module):
            return construct_module(tx, self.cls, args, kwargs)
        if issubclass(self.cls, BaseException) and not kwargs:
            return ExceptionVariable.make(self.cls, args)
        if can_construct(self.cls):
            return construct(tx, self.cls, self.source, args, kwargs)
        raise Unsupported(f"constructing {self.cls.__qualname__} inside a compiled frame")

    def __repr__(self):
        return f"UserDefinedClassVariable({self.cls.__qualname__})"


_TYPE_SUBCLASSES = type.__dict__["__subclasses__"]


class SubclassesMethodVariable(VariableTracker):
    """`cls.__subclasses__` where the lookup finds type's own. Its list is the subclasses alive
    when it is called, which no guard can check: the transformed code calls it (after the
    graph, or at a graph break) and the trace only hands the list on."""

    def __init__(self, cls_vt: UserDefinedClassVariable):
        super().__init__(None)
        self.cls_vt = cls_vt

    def call_function(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported("__subclasses__() takes no arguments")
        return SubclassListVariable(self.cls_vt)

    def reconstruct(self, codegen) -> str:
        return f"{codegen(self.cls_vt)}.__subclasses__"

    def __repr__(self):
        return f"SubclassesMethodVariable({self.cls_vt.cls.__qualname__})"


class SubclassListVariable(VariableTracker):
    """The new list `cls.__subclasses__()` returns, made by the transformed code: the trace
    knows only that it is a list of its own, not what is in it."""

    fresh_object = True

    def __init__(self, cls_vt: UserDefinedClassVariable):
        super().__init__(None)
        self.cls_vt = cls_vt

    def python_type(self):
        return list

    def reconstruct(self, codegen) -> str:
        return codegen.temp(self, lambda: f"{codegen(self.cls_vt)}.__subclasses__()")

    def __repr__(self):
        return f"SubclassListVariable({self.cls_vt.cls.__qualname__})"


class UserDefinedObjectVariable(VariableTracker):
    """An instance of a user class: reads from its __dict__ are guarded values; methods and
    properties are inlined."""

    identity_pinned = False  # TYPE_MATCH pins its class, not which object it is

    def __init__(self, value, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        if self.source is None and typing_values.is_typing_value(self.value):
            # Made at capture (List[Variable] in an annotation): immutable, and what the
            # program's own subscript gives (typing caches it), so a constant of the transformed
            # code too. One read from a source is read again from there.
            return self.value
        return super().as_python_constant()

    def identity(self, tx):
        return self.value

    def var_getattr(self, tx, name):
        if name == "__class__":
            # type(value) is pinned by the TYPE_MATCH guard installed when it was read.
            return tx.wrap(type(self.value), None)
        getattribute = inspect.getattr_static(type(self.value), "__getattribute__")
        if isinstance(getattribute, types.FunctionType):
            # A Python __getattribute__ (transformers' configs map attribute names): inlined;
            # its super().__getattribute__ ends in generic_getattr.
            return tx.inline_call(getattribute, [self, ConstantVariable(name)], {})
        fallback = self._dunder("__getattr__")
        if fallback is not None and self._missing(tx, name):
            # What the generic lookup does not find goes to the class's __getattr__.
            return tx.inline_call(fallback, [self, ConstantVariable(name)], {})
        if fallback is None and plain_getattr(type(self.value)) and self._missing(tx, name):
            # Absent from the instance and the class, so guarded: the generic lookup raises.
            raise traced_exception(AttributeError, f"{type(self.value).__name__!r} object has "
                                                   f"no attribute {name!r}")
        return self.generic_getattr(tx, name)

    def _missing(self, tx, name) -> bool:
        """Whether the generic lookup finds nothing for `name` (no pending store, nothing in the
        instance dict, nothing on the class), guarded so."""
        if self.source is None or mutations_of(tx.output).load(self.value, name) is not None:
            return False
        cls = type(self.value)
        try:
            d = object.__getattribute__(self.value, "__dict__")
        except AttributeError:
            d = None
        if (d is not None and name in d) or \
                inspect.getattr_static(cls, name, _ABSENT) is not _ABSENT:
            return False
        if d is not None:
            tx.output.guards.add(InstanceDictSource(self.source), "NO_ITEM", name)
        tx.output.guards.add(class_source(cls), "NO_HASATTR", name)
        return True

    def generic_getattr(self, tx, name):
        """object.__getattribute__(value, name): pending stores, the instance dict, then the
        class."""
        cls = type(self.value)
        if name == "__dict__" and self.source is not None and \
                isinstance(object.__getattribute__(self.value, "__dict__"), dict):
            return InstanceDictVariable(self)
        if not is_data_descriptor(cls, name):
            pending = mutations_of(tx.output).load(self.value, name)
            if pending is not None:
                return pending
        try:
            d = object.__getattribute__(self.value, "__dict__")
        except AttributeError:
            d = None
        if d is not None and name in d and not is_data_descriptor(cls, name):
            source = InstanceAttrSource(self.source, name) if self.source is not None else None
            return tx.wrap(d[name], source)
        if self.source is None:
            return class_attr(tx, cls, name, self, None)
        if d is not None and not is_data_descriptor(cls, name):
            # The instance must not gain an attribute that would shadow the class's.
            tx.output.guards.add(InstanceDictSource(self.source), "NO_ITEM", name)
        # TYPE_MATCH pins type(value): the class is read by identity.
        cls_source = class_source(cls)
        if plain_getattr(cls):
            return class_attr(tx, cls, name, self, AttrSource(self.source, name),
                               cls_source=cls_source)
        # Guards read class-level data through the type: getattr on the instance would run
        # the class's own lookup.
        return class_attr(tx, cls, name, self, AttrSource(TypeSource(self.source), name),
                           source_is_plain=True, cls_source=cls_source)

    def _dunder(self, name):
        """The class's Python implementation of a special method, or None."""
        fn = inspect.getattr_static(type(self.value), name, None)
        return fn if isinstance(fn, types.FunctionType) else None

    def _builtin_container(self, item_access_only: bool = False):
        """The list, tuple or dict the class derives from, where the object is one read from
        outside the frame and the class keeps that container's own item access and length
        (`item_access_only`: a list's or tuple's item access alone; a dict's both)."""
        if self.source is None:
            return None
        for base in (dict, list, tuple):
            names = ("__getitem__",) if item_access_only and base is not dict else (
                "__getitem__", "__len__")
            if isinstance(self.value, base) and all(
                    inspect.getattr_static(type(self.value), n, None) is
                    inspect.getattr_static(base, n) for n in names):
                return base
        return None

    def getitem(self, tx, index):
        if typing_values.is_typing_value(self.value):
            made = typing_values.subscript(tx, self, index)
            if made is not None:
                return made
        fn = self._dunder("__getitem__")
        if fn is not None:
            return tx.inline_call(fn, [self, index], {})
        base = self._builtin_container(item_access_only=True)
        if base is not None and index.is_python_constant():
            # A list or dict subclass whose item access is the container's own (its other
            # methods may be its own: a __len__ or __iter__ that the read does not call): its
            # items read and guarded as a plain list's or dict's are, its length by the
            # container's own count, which the LEN_MATCH guard reads too.
            if base is dict:  # a missing key must not reach a __missing__ (defaultdict's)
                return _dict_read(tx, self, "__getitem__", [index], {})
            key = index.as_python_constant()
            if type(key) is not int:
                raise Unsupported(f"indexing a {type(self.value).__qualname__} with {key!r}")
            try:
                item = base.__getitem__(self.value, key)
            except (KeyError, IndexError):
                raise Unsupported(f"{type(self.value).__qualname__}[{key!r}] raises") from None
            tx.output.guards.add(self.source, "LEN_MATCH", base.__len__(self.value))
            return tx.wrap(item, ItemSource(self.source, key))
        raise Unsupported(f"indexing a {type(self.value).__qualname__}")

    def dict_view(self, tx):
        """The items of a dict subclass from outside the frame, as a read-only dict tracker:
        its keys guarded in its own iteration order, each value read through its item."""
        if self.source is None or not isinstance(self.value, dict) or \
                not all(is_guardable_constant(k) for k in self.value):
            raise Unsupported(f"reading a {type(self.value).__qualname__} as a dict")
        tx.output.guards.add(self.source, "DICT_KEYS", tuple(self.value))
        view = ConstDictVariable({k: tx.wrap(dict.__getitem__(self.value, k),
                                             DictItemSource(self.source, k))
                                  for k in self.value}, dict, source=self.source)
        view.mutable = False
        return view

    def length(self, tx):
        fn = self._dunder("__len__")
        if fn is not None:
            n = tx.inline_call(fn, [self], {})
            if not n.is_python_constant() or type(n.as_python_constant()) is not int:
                raise Unsupported(f"len() of a {type(self.value).__qualname__} that is not a "
                                  "known int")
            return n.as_python_constant()
        if self._builtin_container() is not None:
            tx.output.guards.add(self.source, "LEN_MATCH", len(self.value))
            return len(self.value)
        raise Unsupported(f"len() of a {type(self.value).__qualname__}")

    def truth(self, tx):
        """bool(obj): its class's __bool__, else its length, else True (TYPE_MATCH pins a class
        that has neither)."""
        cls = type(self.value)
        fn = self._dunder("__bool__")
        if fn is not None:
            return tx.inline_call(fn, [self], {}).truth(tx)
        has_bool = inspect.getattr_static(cls, "__bool__", None) is not None
        has_len = inspect.getattr_static(cls, "__len__", None) is not None
        if not has_bool and has_len:
            return self.length(tx) != 0
        if not has_bool and not has_len:
            return True
        raise Unsupported(f"bool() of a {cls.__qualname__}")

    def contains(self, tx, item):
        fn = self._dunder("__contains__")
        if fn is None:
            raise Unsupported(f"`in` on a {type(self.value).__qualname__}")
        result = tx.inline_call(fn, [self, item], {})
        return ConstantVariable(result.truth(tx))

    def store_attr(self, tx, name, value):
        """`self.value.name = value`: a pending store (see side_effects), or the class's own
        Python __setattr__ inlined."""
        cls = type(self.value)
        setattr_fn = inspect.getattr_static(cls, "__setattr__")
        if isinstance(setattr_fn, types.FunctionType):
            tx.inline_call(setattr_fn, [self, ConstantVariable(name), value], {})
            return
        if setattr_fn is not object.__setattr__:
            raise Unsupported(f"assignment to an attribute of a {cls.__qualname__} "
                              f"(its __setattr__ is {setattr_fn!r})")
        object_setattr(tx, self, name, value, setattr)

    def object_setattr(self, tx, name, value):
        """object.__setattr__(value, name, new): a store held pending until the trace ends."""
        object_setattr(tx, self, name, value)

    def call_function(self, tx, args, kwargs):
        call = inspect.getattr_static(type(self.value), "__call__", None)
        if isinstance(call, types.FunctionType):
            return tx.inline_call(call, [self, *args], kwargs, fn_source=None)
        if type(self.value) is weakref.ref and self.source is not None and not (args or kwargs):
            # What it refers to, read and guarded through the reference (None once it died).
            return tx.wrap(self.value(), WeakRefCallSource(self.source))
        raise Unsupported(f"call of a {type(self.value).__qualname__} object")

    def __repr__(self):
        return f"UserDefinedObjectVariable({type(self.value).__qualname__})"


class SuperVariable(VariableTracker):
    """super() inside a method: attribute lookups start after `cls` in type(self)'s MRO."""

    def __init__(self, cls: type, obj: VariableTracker):
        super().__init__(None)
        self.cls = cls
        self.obj = obj

    def var_getattr(self, tx, name):
        # As CPython's super(): the MRO searched is type(obj)'s for an instance, obj's own for a
        # class (super() inside a classmethod), and what is found is bound accordingly.
        of_class = isinstance(self.obj, UserDefinedClassVariable)
        start = self.obj.cls if of_class else self.obj.python_type()
        if not (isinstance(start, type) and issubclass(start, self.cls)):
            raise Unsupported(f"super({self.cls.__qualname__}, ...) of {self.obj}")
        mro = start.__mro__
        for klass in mro[mro.index(self.cls) + 1:]:
            if name not in klass.__dict__:
                continue
            attr = klass.__dict__[name]
            if isinstance(attr, classmethod):
                return UserMethodVariable(attr.__func__, self.obj if of_class
                                          else UserDefinedClassVariable(start))
            if isinstance(attr, staticmethod):
                return UserFunctionVariable(attr.__func__)
            if of_class:
                if isinstance(attr, types.FunctionType):
                    return UserFunctionVariable(attr)
                raise Unsupported(f"super().{name} of kind {type(attr).__name__} on a class")
            if isinstance(attr, types.FunctionType):
                return UserMethodVariable(attr, self.obj)
            if isinstance(attr, property) and attr.fget is not None:
                return tx.inline_call(attr.fget, [self.obj], {}, fn_source=None)
            if attr is object.__init__:
                return _NoOpMethod()
            if attr is object.__getattribute__ and hasattr(self.obj, "generic_getattr"):
                return ObjectGetattributeVariable(self.obj)
            if attr is object.__setattr__:
                    return ObjectSetattrVariable(self.obj)
            if klass in _MODELLED_BASES:
                return BuiltinBaseMethodVariable(klass, name, self.obj)
            raise Unsupported(f"super().{name} of kind {type(attr).__name__}")
        raise Unsupported(f"super() has no attribute {name!r}")


class ObjectGetattributeVariable(VariableTracker):
    """`object.__getattribute__`: unbound (object.__getattribute__(obj, name)) or bound to a
    user object through super() (transformers' configs: super().__getattribute__(key)): the
    generic lookup, below the class's own __getattribute__."""

    def __init__(self, obj=None):
        super().__init__(None)
        self.obj = obj

    def python_type(self):
        return type(object.__getattribute__) if self.obj is None else types.MethodWrapperType

    def call_function(self, tx, args, kwargs):
        args = [self.obj, *args] if self.obj is not None else list(args)
        if kwargs or len(args) != 2:
            raise Unsupported("object.__getattribute__ with other than two arguments")
        obj, name = args
        if not hasattr(obj, "generic_getattr"):
            raise Unsupported(f"object.__getattribute__ of {obj}")
        return obj.generic_getattr(tx, name.as_python_constant())

    def reconstruct(self, codegen) -> str:
        fn = codegen.constant(object.__getattribute__)
        if self.obj is None:
            return fn
        return f"{fn}.__get__({codegen(self.obj)})"  # the method-wrapper super() gives

    def __repr__(self):
        return f"ObjectGetattributeVariable({'bound' if self.obj is not None else 'unbound'})"


class InstanceDictVariable(VariableTracker):
    """`obj.__dict__` of a user object from outside the frame, for reads: a present key is
    guarded as the attribute it holds, an absent one by pinning the dict's key set."""

    def __init__(self, obj: UserDefinedObjectVariable):
        super().__init__(InstanceDictSource(obj.source))
        self.obj = obj

    def python_type(self):
        return dict

    def _dict(self):
        return object.__getattribute__(self.obj.value, "__dict__")

    def _lookup(self, tx, key):
        """The tracker of `key`'s value, or None where it is absent."""
        if not isinstance(key, str):
            raise Unsupported(f"instance __dict__ lookup with a {type(key).__name__} key")
        pending = mutations_of(tx.output).load(self.obj.value, key)
        if pending is not None:
            return pending
        d = self._dict()
        if key in d:
            return tx.wrap(d[key], InstanceAttrSource(self.obj.source, key))
        if not all(isinstance(k, str) for k in d):
            raise Unsupported("an instance __dict__ with non-string keys")
        tx.output.guards.add(self.source, "DICT_KEYS", tuple(d))
        return None

    def var_getattr(self, tx, name):
        if name not in ("get", "__getitem__", "__contains__"):
            raise Unsupported(f"__dict__.{name} of a {self.obj.python_type().__qualname__}")
        return BoundContainerMethod(self, name)

    def call_method(self, tx, name, args, kwargs):
        if kwargs or not args:
            raise Unsupported(f"__dict__.{name} with these arguments")
        found = self._lookup(tx, args[0].as_python_constant())
        if name == "__contains__":
            return ConstantVariable(found is not None)
        if found is not None:
            return found
        if name == "get":
            return args[1] if len(args) > 1 else ConstantVariable(None)
        if type(self._dict()) is not dict:
            raise Unsupported(f"KeyError {args[0].as_python_constant()!r} while tracing")
        raise traced_exception(KeyError, args[0].as_python_constant())  # its key set is guarded

    def getitem(self, tx, index):
        return self.call_method(tx, "__getitem__", [index], {})

    def contains(self, tx, item):
        return self.call_method(tx, "__contains__", [item], {})

    def __repr__(self):
        return f"InstanceDictVariable({self.obj.source.name})"


class EnvironVariable(UserDefinedObjectVariable):
    """os.environ. A lookup of one variable (get, [], in; os.getenv) is guarded on that
    variable alone, its value or its absence in the mapping's storage (os.environ._data): a
    library that reads one flag (transformers reads TRANSFORMERS_SDPA_FORCE_GQA) leaves the
    capture valid, and storable, in a process whose environment differs elsewhere. Anything
    else is inlined from os._Environ's Python, as any object's methods are."""

    _LOOKUPS = ("get", "__getitem__", "__contains__")

    def var_getattr(self, tx, name):
        if name in self._LOOKUPS and self.source is not None:
            return BoundContainerMethod(self, name)
        return super().var_getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name not in self._LOOKUPS or self.source is None:
            return super().call_method(tx, name, args, kwargs)
        if kwargs or not args or len(args) > (2 if name == "get" else 1):
            raise Unsupported(f"os.environ.{name} with these arguments")
        key = args[0].as_python_constant()
        if type(key) is not str:
            raise Unsupported(f"an os.environ lookup with a {type(key).__name__} key")
        environ = self.value
        data = object.__getattribute__(environ, "_data")
        if type(data) is not dict:
            raise Unsupported("an os.environ whose storage is not a dict")
        stored = environ.encodekey(key)
        data_source = AttrSource(self.source, "_data")
        tx.output.guards.add(data_source, "TYPE_MATCH", dict)
        if stored in data:
            raw = data[stored]
            tx.output.guards.add(ItemSource(data_source, stored), "CONSTANT_MATCH", raw)
            if name == "__contains__":
                return ConstantVariable(True)
            return ConstantVariable(environ.decodevalue(raw))
        tx.output.guards.add(data_source, "NO_ITEM", stored)
        if name == "__contains__":
            return ConstantVariable(False)
        if name == "get":
            return args[1] if len(args) > 1 else ConstantVariable(None)
        raise traced_exception(KeyError, key)

    def getitem(self, tx, index):
        if self.source is None:
            return super().getitem(tx, index)
        return self.call_method(tx, "__getitem__", [index], {})

    def contains(self, tx, item):
        if self.source is None:
            return super().contains(tx, item)
        return self.call_method(tx, "__contains__", [item], {})

    def __repr__(self):
        return f"EnvironVariable({self.source.name if self.source is not None else '?'})"


class _NoOpMethod(VariableTracker):
    def call_function(self, tx, args, kwargs):
        return ConstantVariable(None)


class BuiltinBaseMethodVariable(VariableTracker):
    """`base.name` bound to a user object whose class derives from the builtin `base` (a dict
    subclass calling super().get, say). Only reads are modelled: they see the object's storage,
    guarded through the object's source; anything that would mutate it is Unsupported."""

    def __init__(self, base: type, name: str, obj: VariableTracker):
        super().__init__(None)
        self.base = base
        self.name = name
        self.obj = obj

    def call_function(self, tx, args, kwargs):
        if self.base is dict:
            return _dict_read(tx, self.obj, self.name, args, kwargs)
        raise Unsupported(f"{self.base.__name__}.{self.name} on a "
                          f"{self.obj.python_type().__name__}")

    def __repr__(self):
        return f"BuiltinBaseMethodVariable({self.base.__name__}.{self.name})"


_MODELLED_BASES = (dict,)


def _dict_read(tx, obj, name, args, kwargs):
    """A read-only dict method on `obj`, a guarded instance of a dict subclass."""
    value = getattr(obj, "value", None)
    if not isinstance(value, dict) or obj.source is None:
        raise Unsupported(f"dict.{name} on {obj}")
    if kwargs or name not in ("get", "__getitem__", "__contains__", "__len__", "keys"):
        raise Unsupported(f"dict.{name} on a {type(value).__name__}")
    # Guards read items with PyObject_GetItem: it must be dict's own, or the guard would run
    # user code and see something other than what the trace read.
    if type(value).__getitem__ is not dict.__getitem__:
        raise Unsupported(f"{type(value).__name__} overrides __getitem__")
    if name == "__len__":
        tx.output.guards.add(obj.source, "LEN_MATCH", len(value))
        return ConstantVariable(len(value))
    if name == "keys":
        _guard_key_set(tx, obj.source, value)
        return ListVariable([ConstantVariable(k) for k in dict.keys(value)])
    key = args[0].as_python_constant()
    if not is_guardable_constant(key):
        raise Unsupported(f"dict lookup with a {type(key).__name__} key")
    if dict.__contains__(value, key):
        if name == "__contains__":
            # A guard on the item fails when the key is gone.
            tx.output.guards.add(ItemSource(obj.source, key), "TYPE_MATCH",
                                 type(dict.__getitem__(value, key)))
            return ConstantVariable(True)
        return tx.wrap(dict.__getitem__(value, key), ItemSource(obj.source, key))
    # Absent: only provable by pinning the whole key set.
    _guard_key_set(tx, obj.source, value)
    if name == "__contains__":
        return ConstantVariable(False)
    if name == "get":
        return args[1] if len(args) > 1 else ConstantVariable(None)
    if hasattr(type(value), "__missing__"):  # what dict.__getitem__ calls on a subclass
        raise Unsupported(f"KeyError {key!r} while tracing")
    raise traced_exception(KeyError, key)  # its key set is guarded


def _guard_key_set(tx, source, value: dict):
    """Guards that `value`'s keys stay exactly what they are: its length, and each key present
    (a guard on a missing item fails). Keys must be constants."""
    if not all(is_guardable_constant(k) for k in value):
        raise Unsupported("a dict subclass with non-constant keys")
    tx.output.guards.add(source, "LEN_MATCH", len(value))
    for k, v in dict.items(value):
        tx.output.guards.add(ItemSource(source, k), "TYPE_MATCH", type(v))
