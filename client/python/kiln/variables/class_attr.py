"""What an attribute lookup finds on a class (functions to bind, properties to inline,
class-level data to guard), and stores below a class's own __setattr__: shared by the trackers
of instances from outside the frame (objects), made in the frame (fresh_object, model_output)
and of modules (nn_module)."""
import collections
import enum
import inspect
import types

from kiln.exc import Unsupported
from kiln.guards.builder import is_guardable_constant
from kiln.guards.source import AttrSource, ObjectSource
from kiln.variables.base import BoundContainerMethod
from kiln.variables.constant import ConstantVariable
from kiln.variables.functions import UserFunctionVariable, UserMethodVariable
from kiln.variables.side_effects import mutations_of


# dict methods that only read it, and whose result is the same for a subclass (copy is not:
# OrderedDict's makes an instance of the subclass).
_DICT_READS = {"keys", "values", "items", "get", "__contains__", "__getitem__"}


def class_attr(tx, cls, name, self_vt, source=None, source_is_plain=False, cls_source=None):
    """Looks `name` up on the class (no instance dict), binding functions to `self_vt`.
    `source` reads the same attribute through the object the lookup started from: plain
    data found on the class (a dict, a list) is guarded through it, where that read is a plain
    lookup (`source_is_plain`, or the class's instances have no getattr of their own).
    `cls_source`, when given, reads the class itself: the function, property or descriptor found
    is guarded through it (`K.method = other` after compiling must recompile)."""
    try:
        static = inspect.getattr_static(cls, name)
    except AttributeError:
        raise Unsupported(f"{cls.__name__} has no attribute {name!r}") from None
    if cls_source is not None:
        guard_class_member(tx, cls_source, name, static)
    if isinstance(static, staticmethod):
        return UserFunctionVariable(static.__func__)
    if isinstance(static, classmethod):
        return UserMethodVariable(static.__func__, tx.wrap(cls, cls_source, guard=False))
    if isinstance(static, types.FunctionType):
        if self_vt is None:
            return UserFunctionVariable(static)
        return UserMethodVariable(static, self_vt)
    if isinstance(static, property) and static.fget is not None and self_vt is not None:
        return tx.inline_call(static.fget, [self_vt], {}, fn_source=None)
    if isinstance(static, enum.Enum):
        if source is not None:
            tx.output.guards.add(source, "ID_MATCH", static)
        return ConstantVariable(static)
    if is_guardable_constant(static) or (isinstance(static, tuple) and all(
            is_guardable_constant(v) for v in static)):
        if source is not None:
            # `K.s = 4.0` after compiling must recompile.
            tx.output.guards.add(source, "CONSTANT_MATCH", static)
        return ConstantVariable(static)
    if isinstance(static, frozenset) and all(is_guardable_constant(v) for v in static):
        if source is not None:  # immutable: its identity says all
            tx.output.guards.add(source, "ID_MATCH", static)
        return ConstantVariable(static)
    if source is not None and not hasattr(type(static), "__get__") and (
            source_is_plain or plain_getattr(cls)):
        # Class-level data is as mutable as any other object: guarded like one.
        return tx.wrap(static, source)
    if isinstance(static, type):
        return tx.wrap(static, None)
    if isinstance(static, types.MethodDescriptorType) and static.__name__ in _DICT_READS and \
            getattr(static, "__objclass__", None) in (dict, collections.OrderedDict) and \
            hasattr(self_vt, "dict_view"):
        # dict's own reading methods on a dict subclass from outside (a ModelOutput's
        # .items()): over the dict's items, read and guarded as a dict's are.
        return BoundContainerMethod(self_vt.dict_view(tx), static.__name__)
    if (isinstance(static, types.MemberDescriptorType) and self_vt is not None
            and self_vt.source is not None and hasattr(self_vt, "value") and plain_getattr(cls)):
        # A __slots__ attribute of an object from outside (dataclasses' Field.name): read and
        # guarded through the instance, as any attribute of it.
        try:
            value = static.__get__(self_vt.value, cls)
        except AttributeError:
            raise Unsupported(f"AttributeError: {cls.__name__}.{name} is not set") from None
        return tx.wrap(value, AttrSource(self_vt.source, name))
    raise Unsupported(f"attribute {cls.__name__}.{name} of kind {type(static).__name__}")


def guard_class_member(tx, cls_source, name, static):
    """Guards that `cls.name` (read through `cls_source`, a source of the class) is still the
    function, property or method descriptor `static` found there: what getattr on the class
    gives back is the function for a function or staticmethod, the property itself, and a bound
    method whose __func__ is the function for a classmethod."""
    member = AttrSource(cls_source, name)
    if isinstance(static, staticmethod):
        tx.output.guards.add(member, "ID_MATCH", static.__func__)
    elif isinstance(static, classmethod):
        tx.output.guards.add(AttrSource(member, "__func__"), "ID_MATCH", static.__func__)
    elif isinstance(static, (types.FunctionType, property)):
        tx.output.guards.add(member, "ID_MATCH", static)


def class_source(cls):
    """A source for a class the capture found through an object whose type is pinned (a
    TYPE_MATCH or ID_MATCH on it): the class itself, read by identity. One per class, so that
    many instances share its guards."""
    return ObjectSource(cls, f"<class {cls.__module__}.{cls.__qualname__}>")


def plain_getattr(cls) -> bool:
    """Whether getattr on instances of `cls` is the default lookup (so a guard's getattr sees
    what the lookup here saw)."""
    return (inspect.getattr_static(cls, "__getattribute__") is object.__getattribute__
            and inspect.getattr_static(cls, "__getattr__", None) is None)


def is_data_descriptor(cls, name) -> bool:
    attr = inspect.getattr_static(cls, name, None)
    return attr is not None and hasattr(type(attr), "__set__")


def object_setattr(tx, obj, name, value, setter=object.__setattr__):
    """object.__setattr__(obj, name, value) for an object from outside the frame: a store into
    its __dict__, held pending until the trace ends and replayed through `setter` (what the
    program called: object.__setattr__, or setattr for an assignment to an object whose class
    has object's __setattr__)."""
    cls = obj.python_type()
    if is_data_descriptor(cls, name) or not hasattr(obj.value, "__dict__"):
        raise Unsupported(f"assignment to {cls.__qualname__}.{name} through a descriptor")
    mutations_of(tx.output).store(obj.value, obj.source, name, value, setter)
