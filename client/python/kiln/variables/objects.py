"""Python modules, user-defined classes and their instances, and super()."""
import inspect
import types

from kiln.exc import Unsupported
from kiln.guards.builder import is_guardable_constant
from kiln.guards.source import AttrSource, InstanceAttrSource
from kiln.variables.base import VariableTracker
from kiln.variables.constant import ConstantVariable
from kiln.variables.functions import UserFunctionVariable, UserMethodVariable


class PythonModuleVariable(VariableTracker):
    """An imported module (math, a user's helpers). Its attributes are taken as fixed once the
    module itself is guarded, as Python programs rarely rebind a module's functions."""

    def __init__(self, module: types.ModuleType, source=None):
        super().__init__(source)
        self.module = module

    def python_type(self):
        return types.ModuleType

    def as_python_constant(self):
        return self.module

    def var_getattr(self, tx, name):
        from kiln.variables.builder import wrap

        try:
            value = getattr(self.module, name)
        except AttributeError:
            raise Unsupported(f"module {self.module.__name__} has no attribute {name!r}") from None
        source = AttrSource(self.source, name) if self.source is not None else None
        return wrap(tx, value, source, guard=False)


def _class_attr(tx, cls, name, self_vt):
    """Looks `name` up on the class (no instance dict), binding functions to `self_vt`."""
    from kiln.variables.builder import wrap

    try:
        static = inspect.getattr_static(cls, name)
    except AttributeError:
        raise Unsupported(f"{cls.__name__} has no attribute {name!r}") from None
    if isinstance(static, staticmethod):
        return UserFunctionVariable(static.__func__)
    if isinstance(static, classmethod):
        return UserMethodVariable(static.__func__, UserDefinedClassVariable(cls))
    if isinstance(static, types.FunctionType):
        if self_vt is None:
            return UserFunctionVariable(static)
        return UserMethodVariable(static, self_vt)
    if isinstance(static, property) and static.fget is not None and self_vt is not None:
        return tx.inline_call(static.fget, [self_vt], {}, fn_source=None)
    if is_guardable_constant(static):
        return ConstantVariable(static)
    if isinstance(static, (tuple, frozenset)) and all(is_guardable_constant(v) for v in static):
        return ConstantVariable(static)
    if isinstance(static, type):
        return wrap(tx, static, None)
    raise Unsupported(f"attribute {cls.__name__}.{name} of kind {type(static).__name__}")


class UserDefinedClassVariable(VariableTracker):
    def __init__(self, cls: type, source=None):
        super().__init__(source)
        self.cls = cls

    def python_type(self):
        return type(self.cls)

    def as_python_constant(self):
        return self.cls

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.cls, name))
        return _class_attr(tx, self.cls, name, None)

    def call_function(self, tx, args, kwargs):
        raise Unsupported(f"constructing {self.cls.__qualname__} inside a compiled frame")

    def __repr__(self):
        return f"UserDefinedClassVariable({self.cls.__qualname__})"


class UserDefinedObjectVariable(VariableTracker):
    """An instance of a user class: reads from its __dict__ are guarded values; methods and
    properties are inlined."""

    def __init__(self, value, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def var_getattr(self, tx, name):
        from kiln.variables.builder import wrap

        d = getattr(self.value, "__dict__", None)
        if d is not None and name in d and not _is_data_descriptor(type(self.value), name):
            source = InstanceAttrSource(self.source, name) if self.source is not None else None
            return wrap(tx, d[name], source)
        return _class_attr(tx, type(self.value), name, self)

    def call_function(self, tx, args, kwargs):
        call = inspect.getattr_static(type(self.value), "__call__", None)
        if isinstance(call, types.FunctionType):
            return tx.inline_call(call, [self, *args], kwargs, fn_source=None)
        raise Unsupported(f"call of a {type(self.value).__qualname__} object")

    def __repr__(self):
        return f"UserDefinedObjectVariable({type(self.value).__qualname__})"


def _is_data_descriptor(cls, name) -> bool:
    attr = inspect.getattr_static(cls, name, None)
    return attr is not None and hasattr(type(attr), "__set__")


class SuperVariable(VariableTracker):
    """super() inside a method: attribute lookups start after `cls` in type(self)'s MRO."""

    def __init__(self, cls: type, obj: VariableTracker):
        super().__init__(None)
        self.cls = cls
        self.obj = obj

    def var_getattr(self, tx, name):
        obj_type = self.obj.python_type()
        mro = obj_type.__mro__
        start = mro.index(self.cls) + 1
        for klass in mro[start:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return UserMethodVariable(attr, self.obj)
                if isinstance(attr, staticmethod):
                    return UserFunctionVariable(attr.__func__)
                if isinstance(attr, property) and attr.fget is not None:
                    return tx.inline_call(attr.fget, [self.obj], {}, fn_source=None)
                if attr is object.__init__ or (isinstance(attr, types.WrapperDescriptorType)):
                    return _NoOpMethod()
                raise Unsupported(f"super().{name} of kind {type(attr).__name__}")
        raise Unsupported(f"super() has no attribute {name!r}")


class _NoOpMethod(VariableTracker):
    def call_function(self, tx, args, kwargs):
        return ConstantVariable(None)
