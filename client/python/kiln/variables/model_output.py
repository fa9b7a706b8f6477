"""Instances of transformers' ModelOutput (an OrderedDict subclass that is also a dataclass)
built inside the frame, modelled by ModelOutput's own semantics rather than by inlining its
__post_init__/__setattr__ machinery.

The model is only used for classes that add nothing to that machinery: every class between the
output class and ModelOutput must be a dataclass whose only methods are the ones @dataclass
writes. Anything else (a subclass overriding __getitem__, say) is Unsupported.

A ModelOutput holds two views that usually agree: dict items (the non-None fields, in the order
they were set) and instance attributes (every field, None included).
"""
import dataclasses
import sys
import types
from collections import OrderedDict
from typing import Dict, List

from kiln.exc import Unsupported
from kiln.variables.base import BoundContainerMethod, VariableTracker
from kiln.variables.class_attr import class_attr
from kiln.variables.constant import ConstantVariable
from kiln.variables.containers import (BaseListVariable, ListVariable, TupleVariable, new_serial,
                                       note_mutation)
from kiln.variables.tensor import TensorVariable

# What @dataclass (with its default options) writes into a class's namespace.
_DATACLASS_WRITTEN = {"__init__", "__repr__", "__eq__", "__hash__", "__match_args__",
                      "__dataclass_fields__", "__dataclass_params__", "__doc__", "__module__",
                      "__qualname__", "__annotations__", "__dict__", "__weakref__",
                      "__orig_bases__", "__parameters__", "__slotnames__"}
# ModelOutput's methods that this tracker models; a subclass must not override any of them.
_MODELLED = {"__post_init__", "__setattr__", "__setitem__", "__getitem__", "__delitem__",
             "to_tuple", "setdefault", "pop", "update", "__init__", "__reduce__",
             "__init_subclass__", "__contains__", "get", "_replace_old_cache_name"}
# Everything ModelOutput itself may define (across the transformers versions modelled): the
# modelled methods, the properties that read a renamed field (read by inlining them), and what
# a class statement writes. A ModelOutput with anything else is not modelled: its instances
# might behave otherwise.
_BASE_KNOWN = _MODELLED | {"past_key_values", "cache_params", "__module__", "__qualname__",
                           "__doc__", "__dict__", "__weakref__", "__orig_bases__",
                           "__parameters__", "__annotations__", "__slotnames__",
                           "__firstlineno__", "__static_attributes__"}
# Metaclass attributes that change nothing of how instances are made and read: a __setattr__
# runs only when the class itself is assigned to (transformers' wraps the dataclass __init__ as
# @dataclass writes it).
_META_KNOWN = {"__module__", "__qualname__", "__doc__", "__setattr__", "__firstlineno__",
               "__static_attributes__"}


def _model_output_base():
    generic = sys.modules.get("transformers.utils.generic")
    return getattr(generic, "ModelOutput", None) if generic is not None else None


def is_model_output_class(cls) -> bool:
    base = _model_output_base()
    if base is None or not isinstance(cls, type) or not issubclass(cls, base) or cls is base:
        return False
    meta = type(base)
    if type(cls) is not meta or base.__mro__[1:] != (OrderedDict, dict, object):
        return False
    if meta is not type and (meta.__mro__[1:] != (type, object)
                             or not set(meta.__dict__) <= _META_KNOWN):
        return False
    if not set(base.__dict__) <= _BASE_KNOWN:
        return False
    mro = cls.__mro__
    for klass in mro[:mro.index(base)]:
        if "__dataclass_fields__" not in klass.__dict__:
            return False
        extra = set(klass.__dict__) - _DATACLASS_WRITTEN - set(klass.__dataclass_fields__)
        if any(not _overridable(k, klass.__dict__[k]) for k in extra):
            return False
    init = cls.__dict__.get("__init__")
    return _is_generated_init(init) or _kwargs_renamer(init, meta) is not None


def _overridable(name: str, value) -> bool:
    """Whether a subclass may define `name` and still be modelled: a plain function read as a
    method of the instance (inlined, over this tracker), to_tuple included (CLIPOutput's
    flattens its nested outputs); not a dunder, not one of the dict's methods (`**output` and
    the modelled ones call those), nor another modelled method."""
    if name.startswith("__"):
        return not callable(value) and not isinstance(value, (property, classmethod,
                                                              staticmethod))
    if name == "to_tuple":
        return isinstance(value, types.FunctionType)
    return (not hasattr(OrderedDict, name) and name not in _MODELLED
            and (isinstance(value, types.FunctionType) or not callable(value)))


def _subclass_defines(cls, name: str) -> bool:
    """Whether a class between `cls` and ModelOutput defines `name` (_overridable's)."""
    base = _model_output_base()
    mro = cls.__mro__
    return any(name in klass.__dict__ and name not in _DATACLASS_WRITTEN
               for klass in mro[:mro.index(base)])


def _is_generated_init(init) -> bool:
    # The __init__ @dataclass writes is compiled from generated source.
    return getattr(getattr(init, "__code__", None), "co_filename", None) == "<string>"


def _kwargs_renamer(init, meta):
    """When `init` is the wrapper `meta.__setattr__` puts around a generated __init__ (it
    renames deprecated keyword arguments, then calls the generated one), the function that
    renames them in a kwargs dict; else None."""
    setattr_fn = meta.__dict__.get("__setattr__")
    code = getattr(init, "__code__", None)
    if not isinstance(setattr_fn, types.FunctionType) or code is None or \
            code not in setattr_fn.__code__.co_consts:
        return None  # a plain `type` (transformers before 5.24): no wrapper
    cells = dict(zip(code.co_freevars, init.__closure__ or ()))
    if "init" not in cells or not _is_generated_init(cells["init"].cell_contents):
        return None
    names = [n for n in code.co_names if n.startswith("_rename")]
    renamer = init.__globals__.get(names[0]) if len(names) == 1 else None
    if not isinstance(renamer, types.FunctionType) or renamer.__module__ != meta.__module__:
        return None
    return renamer


def _renamed_kwargs(cls, kwargs: Dict[str, VariableTracker]) -> Dict[str, VariableTracker]:
    """The keyword arguments as the class's __init__ passes them on to the generated one."""
    renamer = _kwargs_renamer(cls.__dict__.get("__init__"), type(cls))
    if renamer is None:
        return kwargs
    names = {k: k for k in kwargs}
    try:
        renamer(names)  # a pure renaming of keys (and a deprecation warning, as eager gives)
    except Exception as e:
        raise Unsupported(f"{cls.__qualname__}(): {type(e).__name__}: {e}") from None
    if not all(isinstance(v, str) and v in kwargs for v in names.values()):
        raise Unsupported(f"{cls.__qualname__}(): keyword arguments renamed unexpectedly")
    return {new: kwargs[old] for new, old in names.items()}


def _key(cls, key):
    """A dict key or attribute name as ModelOutput's methods see it: deprecated field names
    map to their new ones where the class renames them (`_replace_old_cache_name`)."""
    base = _model_output_base()
    rename = base.__dict__.get("_replace_old_cache_name") if base is not None else None
    if rename is None or not isinstance(key, str):
        return key
    new = rename(None, key)
    if not isinstance(new, str):
        raise Unsupported(f"{cls.__qualname__} renamed {key!r} to a {type(new).__name__}")
    return new


class ModelOutputVariable(VariableTracker):
    def __init__(self, cls, items: Dict[str, VariableTracker], attrs: Dict[str, VariableTracker]):
        super().__init__(None)
        self.output_cls = cls
        self.fresh_object = True  # made in the frame: the tracker is its identity
        self.items = items  # the OrderedDict's items, in order
        self.attrs = attrs  # instance __dict__
        self.serial = new_serial()

    @classmethod
    def construct(cls_, tx, cls, args: List[VariableTracker], kwargs: Dict[str, VariableTracker]):
        """`cls(*args, **kwargs)`: the dataclass __init__, then ModelOutput.__post_init__."""
        fields = [f for f in dataclasses.fields(cls) if f.init]
        if len(fields) != len(dataclasses.fields(cls)):
            raise Unsupported(f"{cls.__qualname__} has fields outside __init__")
        if len(args) > len(fields):
            raise Unsupported(f"{cls.__qualname__}() given too many positional arguments")
        kwargs = _renamed_kwargs(cls, kwargs)
        values = {}
        for f, a in zip(fields, args):
            values[f.name] = a
        for k, v in kwargs.items():
            if k in values or k not in {f.name for f in fields}:
                raise Unsupported(f"{cls.__qualname__}() got a bad keyword argument {k!r}")
            values[k] = v
        for f in fields:
            if f.name not in values:
                if f.default is dataclasses.MISSING or f.default is not None:
                    raise Unsupported(f"{cls.__qualname__}.{f.name} has a non-None default")
                values[f.name] = ConstantVariable(None)
        if not fields:
            raise Unsupported(f"{cls.__qualname__} has no fields")
        # __post_init__: with every field but the first None and a first field that is not a
        # tensor, ModelOutput treats the first field as an iterator of (key, value) pairs.
        first = values[fields[0].name]
        others_none = all(_is_none(values[f.name]) for f in fields[1:])
        # A tuple or list of values (DETR's BackboneOutput(feature_maps=(...))) whose first item
        # is not a (str, value) pair is set as the first field, as a tensor is; an empty one
        # leaves the output empty.
        if others_none and not isinstance(first, TensorVariable) and not _is_none(first):
            elements = _sequence_items(first)
            if elements is None or (elements and _is_pair(elements[0])):
                raise Unsupported(f"{cls.__qualname__} built from a non-tensor first field")
            if not elements:
                values[fields[0].name] = ConstantVariable(None)
        items = {f.name: values[f.name] for f in fields if not _is_none(values[f.name])}
        return cls_(cls, items, dict(values))

    def python_type(self):
        return self.output_cls

    def truth(self, tx):
        return len(self.items) > 0

    def unpack(self, tx):
        return [ConstantVariable(k) for k in self.items]

    def length(self, tx):
        return len(self.items)

    def var_getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return tx.wrap(self.output_cls, None)
        if _subclass_defines(self.output_cls, name):
            return class_attr(tx, self.output_cls, name, self)
        if name in ("to_tuple", "keys", "values", "items", "get", "__getitem__",
                    "__setitem__", "__contains__", "__len__"):
            return BoundContainerMethod(self, name)
        if hasattr(OrderedDict, name) and not hasattr(object, name):
            raise Unsupported(f"{self.output_cls.__qualname__}.{name}")
        return class_attr(tx, self.output_cls, name, self)

    def has_attr(self, tx, name) -> bool:
        return name in self.attrs or hasattr(self.output_cls, name)

    def getitem(self, tx, index):
        key = _key(self.output_cls, index.as_python_constant())
        if isinstance(key, str):
            if key not in self.items:
                raise Unsupported(f"KeyError {key!r} while tracing")
            return self.items[key]
        if _subclass_defines(self.output_cls, "to_tuple"):
            # ModelOutput.__getitem__ of an int or slice is self.to_tuple()[key]: the class's own.
            flat = self.var_getattr(tx, "to_tuple").call_function(tx, [], {})
            return flat.getitem(tx, index)
        values = list(self.items.values())
        if isinstance(key, slice):
            return TupleVariable(values[key])
        try:
            return values[key]
        except (IndexError, TypeError) as e:
            raise Unsupported(f"{self.output_cls.__qualname__} index {key!r}: {e}") from None

    def setitem(self, tx, index, value):
        # ModelOutput.__setitem__: the dict item, then the attribute.
        key = _key(self.output_cls, index.as_python_constant())
        note_mutation(self.serial)
        self.items[key] = value
        self.attrs[key] = value

    def store_attr(self, tx, name, value):
        # ModelOutput.__setattr__: a non-None value of a field is also stored as an item.
        name = _key(self.output_cls, name)
        note_mutation(self.serial)
        if name in {f.name for f in dataclasses.fields(self.output_cls)} and not _is_none(value):
            self.items[name] = value
        self.attrs[name] = value

    def contains(self, tx, item):
        return ConstantVariable(_key(self.output_cls, item.as_python_constant()) in self.items)

    def call_method(self, tx, name, args, kwargs):
        if kwargs:
            raise Unsupported(f"{self.output_cls.__qualname__}.{name} with keyword arguments")
        if name == "to_tuple":
            return TupleVariable(list(self.items.values()))
        if name == "keys":
            return ListVariable([ConstantVariable(k) for k in self.items])
        if name == "values":
            return ListVariable(list(self.items.values()))
        if name == "items":
            return ListVariable([TupleVariable([ConstantVariable(k), v])
                                 for k, v in self.items.items()])
        if name == "get":
            key = _key(self.output_cls, args[0].as_python_constant())
            if key in self.items:
                return self.items[key]
            return args[1] if len(args) > 1 else ConstantVariable(None)
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__setitem__":
            self.setitem(tx, args[0], args[1])
            return ConstantVariable(None)
        if name == "__contains__":
            return self.contains(tx, args[0])
        if name == "__len__":
            return ConstantVariable(len(self.items))
        raise Unsupported(f"{self.output_cls.__qualname__}.{name}()")

    def reconstruct(self, codegen) -> str:
        items = "".join(f"({k!r}, {codegen(v)}), " for k, v in self.items.items())
        attrs = "".join(f"({k!r}, {codegen(v)}), " for k, v in self.attrs.items())
        return (f"{codegen.constant(rebuild_model_output)}({codegen.constant(self.output_cls)}, "
                f"({items}), ({attrs}))")

    def __repr__(self):
        return f"ModelOutputVariable({self.output_cls.__qualname__}, {list(self.items)})"


def rebuild_model_output(cls, items, attrs):
    """The object a ModelOutputVariable stands for: its dict items in order, then its instance
    attributes, written below ModelOutput's __setitem__/__setattr__ so that neither view
    disturbs the other."""
    obj = cls.__new__(cls)
    OrderedDict.__init__(obj)
    for k, v in items:
        OrderedDict.__setitem__(obj, k, v)
    for k, v in attrs:
        object.__setattr__(obj, k, v)
    return obj


def _sequence_items(vt):
    """The items of a tuple or list (a tracker's, or a constant's as trackers), else None."""
    if isinstance(vt, BaseListVariable):
        return vt.items
    if vt.is_python_constant() and type(vt.as_python_constant()) in (tuple, list):
        return [ConstantVariable(v) for v in vt.as_python_constant()]
    return None


def _is_pair(vt) -> bool:
    """Whether __post_init__ might read `vt` as a (key, value) pair."""
    items = _sequence_items(vt)
    if items is None:
        return not isinstance(vt, (TensorVariable, ConstantVariable))
    return len(items) == 2 and not (items[0].is_python_constant() and
                                    not isinstance(items[0].as_python_constant(), str))


def _is_none(vt) -> bool:
    return isinstance(vt, ConstantVariable) and vt.value is None
