"""Python functions the executor inlines, and bound methods of values it models itself."""
import functools
import types

from kiln.exc import Unsupported
from kiln.graph import stand_in
from kiln.guards.builder import is_guardable_constant
from kiln.guards.source import AttrSource
from kiln.variables.base import ValueVariable, VariableTracker, constant_args
from kiln.variables.constant import ConstantVariable
from kiln.variables import torch_function
from kiln.variables.marked_calls import call_marked


class UserFunctionVariable(VariableTracker):
    """A Python function: calling it inlines its bytecode into the current graph."""

    def __init__(self, fn: types.FunctionType, source=None):
        super().__init__(source)
        self.fn = fn

    def python_type(self):
        return types.FunctionType

    def as_python_constant(self):
        return self.fn

    def identity(self, tx):
        return self.fn

    def call_function(self, tx, args, kwargs):
        marked = call_marked(tx, self.fn, args, kwargs)
        if marked is not None:
            return marked
        return tx.inline_call(self.fn, args, kwargs, fn_source=self.source)

    def var_getattr(self, tx, name):
        if name == "__class__":  # a function's class cannot be reassigned
            return tx.wrap(type(self.fn), None)
        try:
            value = getattr(self.fn, name)
        except AttributeError:
            raise Unsupported(f"AttributeError: function {self.fn.__qualname__} has no "
                              f"attribute {name!r}") from None
        if self.source is not None:
            # Functions' attributes are writable (__name__, __defaults__, __wrapped__, the
            # program's own): each one read is guarded where it was read from.
            return tx.wrap(value, AttrSource(self.source, name))
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__code__"):
            return ConstantVariable(value)
        raise Unsupported(f"attribute {name!r} of function {self.fn.__qualname__} (no source "
                          "to guard it)")

    def __repr__(self):
        return f"UserFunctionVariable({self.fn.__qualname__})"


class UserMethodVariable(VariableTracker):
    """`obj.method` for a Python-level method: inlined with `obj` as self."""

    def __init__(self, fn: types.FunctionType, obj: VariableTracker, source=None):
        super().__init__(source)
        self.fn = fn
        self.obj = obj

    def python_type(self):
        return types.MethodType

    def call_function(self, tx, args, kwargs):
        marked = call_marked(tx, self.fn, [self.obj, *args], kwargs)
        if marked is not None:
            return marked
        if torch_function.is_default_torch_function(self.fn):  # super().__torch_function__
            return torch_function.default_torch_function(tx, [self.obj, *args], kwargs)
        return tx.inline_call(self.fn, [self.obj, *args], kwargs, fn_source=None)

    def as_python_constant(self):
        return types.MethodType(self.fn, self.obj.as_python_constant())

    def reconstruct(self, codegen) -> str:
        return f"{codegen.constant(self.fn)}.__get__({codegen(self.obj)})"

    def __repr__(self):
        return f"UserMethodVariable({self.fn.__qualname__})"


class NestedFunctionVariable(VariableTracker):
    """A function made by MAKE_FUNCTION inside the frame (lambdas, 3.11 comprehensions)."""

    fresh_object = True  # made in the frame: the tracker is its identity

    def __init__(self, code, qualname, defaults, kwdefaults, closure, f_globals,
                 annotations=None):
        super().__init__(None)
        self.code = code
        self.qualname = qualname
        self.defaults = defaults  # TupleVariable or None
        self.kwdefaults = kwdefaults  # ConstDictVariable or None
        self.closure = closure  # list of CellVariable, or None
        self.f_globals = f_globals
        self.annotations = annotations  # what MAKE_FUNCTION was given, or None
        # Names the frame assigned (torch.nn.modules.utils' `parse.__name__ = name`).
        self.names = {"__name__": code.co_name, "__qualname__": qualname}

    def python_type(self):
        return types.FunctionType

    def call_function(self, tx, args, kwargs):
        return tx.inline_nested(self, args, kwargs)

    def var_getattr(self, tx, name):
        if name in self.names:
            return ConstantVariable(self.names[name])
        if name == "__code__":
            return ConstantVariable(self.code)
        if name == "__module__":
            return ConstantVariable(self.f_globals.get("__name__"))
        if name == "__defaults__":
            return self.defaults if self.defaults is not None else ConstantVariable(None)
        raise Unsupported(f"attribute {name!r} of {self.qualname}")

    def store_attr(self, tx, name, value):
        if name not in ("__name__", "__qualname__", "__doc__") or not value.is_python_constant():
            raise Unsupported(f"assignment to {self.qualname}.{name}")
        self.names[name] = value.as_python_constant()

    def reconstruct(self, codegen) -> str:
        """The function the frame made, made again after the graph (one object however often
        it is reached): its code, globals, defaults and annotations, over the cells
        codegen.cell gives, with the names the frame gave it."""

        def build():
            cells = "None"
            if self.closure:
                cells = "(" + "".join(codegen.cell(c) + ", " for c in self.closure) + ")"
            defaults = codegen(self.defaults) if self.defaults is not None else "None"
            kwdefaults = codegen(self.kwdefaults) if self.kwdefaults is not None else "None"
            annotations = codegen(self.annotations) if self.annotations is not None else "None"
            return (f"{codegen.constant(make_function)}({codegen.constant(self.code)}, "
                    f"{codegen.constant(self.f_globals)}, {defaults}, {kwdefaults}, {cells}, "
                    f"{annotations}, {codegen.constant(self.names)})")

        return codegen.temp(self, build)


def make_function(code, f_globals, defaults, kwdefaults, closure, annotations=None,
                  names=None):
    """What MAKE_FUNCTION makes of these (the transformed code's rebuild of a function the frame
    made); `names`: __name__ and kin as the frame left them."""
    fn = types.FunctionType(code, f_globals, code.co_name, defaults, closure)
    if kwdefaults is not None:
        fn.__kwdefaults__ = kwdefaults
    if annotations is not None:  # MAKE_FUNCTION's flattened (name, value, ...) or a dict
        fn.__annotations__ = annotations if isinstance(annotations, dict) else dict(
            zip(annotations[::2], annotations[1::2]))
    for name, value in (names or {}).items():
        setattr(fn, name, value)
    return fn


class CellVariable(VariableTracker):
    """A reference to a local of an enclosing translator, pushed by LOAD_CLOSURE."""

    def __init__(self, owner_tx, name: str):
        super().__init__(None)
        self.owner_tx = owner_tx
        self.name = name

    def get(self):
        if self.name not in self.owner_tx.symbolic_locals:
            # A free variable of the owner itself (a closure passed on to a nested function).
            return self.owner_tx.load_deref(self.name)
        return self.owner_tx.local(self.name)

    def set(self, value):
        owner = self.owner_tx
        if self.name in owner.symbolic_locals or self.name in owner.code.co_cellvars:
            self.owner_tx.symbolic_locals[self.name] = value
        else:
            self.owner_tx.store_deref(self.name, value)


class OpaqueCallableVariable(ValueVariable):
    """A callable kiln does not model (a C function such as time.perf_counter): loading it is
    fine, calling it is a graph break."""

    def call_function(self, tx, args, kwargs):
        raise Unsupported(f"call of {getattr(self.value, '__qualname__', self.value)}, "
                          "which kiln does not trace")


class FrameRegionVariable(VariableTracker):
    """A callable kiln.compile/kiln.optimize or kiln.disable made (kiln._C.FrameRegion), called
    inside a captured frame: a compiled one is traced into as the function it wraps (the
    outermost compile decides, as under torch.compile), a disabled one is a graph break.
    `obj`: the object a region used as a method is bound to."""

    def __init__(self, region, source=None, obj=None):
        super().__init__(source)
        self.region = region
        self.obj = obj

    def python_type(self):
        return type(self.region)

    def identity(self, tx):
        return self.region

    def call_function(self, tx, args, kwargs):
        target = self.region.fn
        name = getattr(target, "__qualname__", type(target).__qualname__)
        if self.region.callback is None:
            raise Unsupported(f"call of {name}, which kiln.disable() leaves to Python")
        args = [self.obj, *args] if self.obj is not None else list(args)
        # The region's identity is guarded, and with it what it wraps.
        return tx.wrap(target, None).call_function(tx, args, kwargs)

    def reconstruct(self, codegen) -> str:
        if self.obj is not None:
            return f"{codegen.constant(self.region)}.__get__({codegen(self.obj)})"
        return super().reconstruct(codegen)

    def __repr__(self):
        return f"FrameRegionVariable({getattr(self.region.fn, '__qualname__', '?')})"


class PartialVariable(VariableTracker):
    """functools.partial(func, *args, **keywords): read from outside the frame (its func, args
    and keywords each guarded where they were read) or made in it; a call is func's with the
    stored arguments first."""

    def __init__(self, func, args, keywords, source=None):
        super().__init__(source)
        self.func = func  # trackers
        self.args = list(args)
        self.keywords = dict(keywords)
        self.fresh_object = source is None

    def python_type(self):
        return functools.partial

    def identity(self, tx):
        if self.fresh_object:
            return self
        raise Unsupported("identity of a functools.partial from outside the frame")

    def call_function(self, tx, args, kwargs):
        return self.func.call_function(tx, [*self.args, *args], {**self.keywords, **kwargs})

    def var_getattr(self, tx, name):
        if name == "func":
            return self.func
        raise Unsupported(f"attribute {name!r} of a functools.partial")

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        args = "".join(f", {codegen(a)}" for a in self.args)
        kw = "".join(f", {k}={codegen(v)}" for k, v in self.keywords.items())
        return codegen.temp(self, lambda: f"{codegen.constant(functools.partial)}("
                                          f"{codegen(self.func)}{args}{kw})")

    def __repr__(self):
        return f"PartialVariable({self.func})"


class LruCacheVariable(VariableTracker):
    """A functools.lru_cache wrapper (transformers' is_torch_*_available()): called with constant
    arguments it is called at capture, as the program's first call would call it, and what it
    returns, a constant, is the cache's answer from then on; anything else is a graph break
    (its function inlined would run on every call, where the cache runs it once)."""

    def __init__(self, wrapper, source=None):
        super().__init__(source)
        self.wrapper = wrapper

    def python_type(self):
        return type(self.wrapper)

    def identity(self, tx):
        return self.wrapper

    def call_function(self, tx, args, kwargs):
        const = constant_args(args, kwargs)
        name = getattr(self.wrapper, "__qualname__", "an lru_cache function")
        if stand_in.target() is not None:
            # Its answer would be this machine's (transformers' is_torch_cuda_available()).
            raise Unsupported(f"call of {name} (lru_cache) while capturing for "
                              f"{stand_in.target()}")
        if const is None:
            raise Unsupported(f"call of {name} (lru_cache) with values that are not constants")
        try:
            result = self.wrapper(*const[0], **const[1])
        except Exception as e:
            raise Unsupported(f"{name} raised {type(e).__name__} at capture") from None
        if is_guardable_constant(result):
            return ConstantVariable(result)
        raise Unsupported(f"{name} (lru_cache) returned a {type(result).__name__}")

    def __repr__(self):
        return f"LruCacheVariable({getattr(self.wrapper, '__qualname__', '?')})"
