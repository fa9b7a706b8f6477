"""The VariableTracker protocol: every operation the executor (client/capture) and the
transformed code's writer (kiln/transform) may ask of a tracker, each defaulting to
Unsupported, so that a tracker says what it models by overriding and nothing probes for
methods. Modelled on TorchDynamo's variables/base.py."""
import contextlib
from typing import Dict, List, Optional, Tuple

from kiln.exc import Unsupported
from kiln.guards.source import Source
from kiln.variables.side_effects import mutations_of


class VariableTracker:
    """A Python value as the symbolic executor sees it. `source` says where it was read from,
    when it came from outside the frame; guards were installed on that source when it was read.

    `tx` below is the executor of the frame being traced (kiln._C.Translator): trackers reach
    the capture's graph and guards through `tx.output`, make trackers of outside values through
    `tx.wrap`, and inline calls through `tx.inline_call`.
    """

    # An object the frame made: the tracker is its identity (`is` compares trackers).
    fresh_object = False
    # The NULL that PUSH_NULL / LOAD_GLOBAL / LOAD_ATTR put below a callable.
    is_null = False
    # Whether the guards installed when the value was read pin which object it is (ID_MATCH,
    # or a constant's value): `is` between values that are not pinned must be guarded itself.
    identity_pinned = True

    def __init__(self, source: Optional[Source] = None):
        self.source = source

    # -- what the value is ---------------------------------------------------------------------

    def python_type(self):
        raise Unsupported(f"{type(self).__name__} has no known Python type")

    def is_python_constant(self) -> bool:
        try:
            self.as_python_constant()
            return True
        except Unsupported:
            return False

    def as_python_constant(self):
        raise Unsupported(f"{self} is not a Python constant")

    def identity(self, tx):
        """The object `is` compares: the real object where the tracker stands for one, the
        tracker itself for an object the frame made."""
        if self.fresh_object:
            return self
        raise Unsupported(f"identity of {self}")

    def contains_tensor(self) -> bool:
        """Whether the value is, or holds, a tensor of the graph."""
        return False

    def overrides_torch_function(self) -> bool:
        """Whether the value is, or a list or tuple of it holds, a tensor whose class overrides
        __torch_function__ (kiln.variables.torch_function): an op taking it must go through
        the override."""
        return False

    def as_fx_arg(self):
        """The value as an FX node argument (tensors as their nodes)."""
        return self.as_python_constant()

    def as_fake_arg(self):
        """The value as the argument an op runs on at trace time (tensors as fake tensors)."""
        return self.as_python_constant()

    # -- what one can do with it ---------------------------------------------------------------

    def unpack(self, tx) -> List["VariableTracker"]:
        """The items, for iteration and unpacking."""
        raise Unsupported(f"cannot iterate over {self}")

    def truth(self, tx) -> bool:
        """bool(value) at trace time, or Unsupported when it depends on data."""
        return bool(self.as_python_constant())

    def length(self, tx) -> int:
        """len(value)."""
        try:
            return len(self.as_python_constant())
        except TypeError:
            raise Unsupported(f"len() of {self}") from None

    def var_getattr(self, tx, name: str) -> "VariableTracker":
        raise Unsupported(f"attribute {name!r} of {self}")

    def has_attr(self, tx, name: str) -> bool:
        """hasattr(value, name). A value from outside the frame answers from the real object
        and guards the answer on its source (`obj.flag = True` later must recompile)."""
        value = self.identity(tx)
        if self.fresh_object:
            raise Unsupported(f"hasattr on {self}")
        if mutations_of(tx.output).load(value, name) is not None:
            return True  # a store this frame made, pending until the trace ends
        found = hasattr(value, name)
        if self.source is not None:
            tx.output.guards.add(self.source, "HASATTR" if found else "NO_HASATTR", name)
        return found

    def store_attr(self, tx, name: str, value: "VariableTracker") -> None:
        raise Unsupported(f"assignment to attribute {name!r} of {self}")

    def object_setattr(self, tx, name: str, value: "VariableTracker") -> None:
        """object.__setattr__(value, name, new): the store below the class's own __setattr__."""
        raise Unsupported(f"object.__setattr__ on {self}")

    def del_attr(self, tx, name: str) -> None:
        raise Unsupported(f"del of attribute {name!r} of {self}")

    def getitem(self, tx, index: "VariableTracker") -> "VariableTracker":
        raise Unsupported(f"indexing {self}")

    def delitem(self, tx, index: "VariableTracker") -> None:
        """`del value[index]` (DELETE_SUBSCR)."""
        raise Unsupported(f"del of an item of {self}")

    def setitem(self, tx, index: "VariableTracker", value: "VariableTracker") -> None:
        raise Unsupported(f"item assignment on {self}")

    def contains(self, tx, item: "VariableTracker") -> "VariableTracker":
        """`item in value`, as a tracker."""
        raise Unsupported(f"`in` on {self}")

    def call_function(self, tx, args: List["VariableTracker"],
                      kwargs: Dict[str, "VariableTracker"]) -> "VariableTracker":
        raise Unsupported(f"call of {self}")

    def call_method(self, tx, name: str, args: List["VariableTracker"],
                    kwargs: Dict[str, "VariableTracker"]) -> "VariableTracker":
        raise Unsupported(f"{self}.{name}()")

    def owned_by_frame(self) -> None:
        """The value is an argument CPython made for this very call (*args, **kwargs): nothing
        outside the frame can see it, so the frame may mutate it."""

    def enter(self, tx) -> Tuple["VariableTracker", "VariableTracker"]:
        """`with value:` (BEFORE_WITH): enters, and returns (the bound __exit__, what __enter__
        returned); the block's end calls that __exit__ with three Nones. An object whose class
        has Python __enter__ and __exit__ needs no override: the executor inlines them
        (kiln.variables.ctx_manager.enter_context)."""
        raise Unsupported(f"`with` over {self}")

    # -- after the graph -----------------------------------------------------------------------

    def reconstruct(self, codegen) -> str:
        """A Python expression that gives this value in the transformed code, after the graph
        ran (`codegen`: kiln.transform.codegen.Reconstructor). By default the value is read
        again from its source, or is a constant object."""
        if self.source is not None:
            return codegen.source(self.source)
        try:
            return codegen.constant(self.as_python_constant())
        except Unsupported:
            raise Unsupported(f"kiln cannot rebuild {self} after the graph") from None

    def __repr__(self):
        return f"{type(self).__name__}()"


class ValueVariable(VariableTracker):
    """A tracker that stands for one known Python object (a constant, a torch function)."""

    def __init__(self, value, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        return self.value

    def identity(self, tx):
        return self.value


class LazyLocal(VariableTracker):
    """An argument of the root frame not read yet: the executor wraps it (and so guards it)
    when the trace first reads it (Translator::Local). One the trace never reads is only handed
    on, to a resume function or the frame's cells: read again from the frame's local, unguarded,
    as the graph does not depend on it (a tensor passed through a break recompiles nothing)."""

    def __init__(self, value, source, owned: bool):
        super().__init__(source)
        self.value = value
        self.owned = owned  # made by CPython for this call (*args, **kwargs)

    def __repr__(self):
        return f"LazyLocal({self.source.name})"


class NullVariable(VariableTracker):
    """The NULL that PUSH_NULL / LOAD_GLOBAL / LOAD_ATTR put below a callable."""

    is_null = True

    def reconstruct(self, codegen) -> str:
        raise Unsupported("rebuilding NULL")

    def __repr__(self):
        return "NULL"


_walking = set()  # ids of the containers whose items a walk below is inside


@contextlib.contextmanager
def walking(container: VariableTracker):
    """Marks a walk into `container`'s items: a container met again inside its own items (a
    list that contains itself) is Unsupported rather than an endless recursion."""
    key = id(container)
    if key in _walking:
        raise Unsupported(f"a {type(container).__name__} that contains itself")
    _walking.add(key)
    try:
        yield
    finally:
        _walking.discard(key)


def walked(container: VariableTracker) -> bool:
    """Whether a walk into `container`'s items is already under way (it contains itself)."""
    return id(container) in _walking


def to_fx_arg(value):
    """A tracker (or nested structure of them) as an FX node argument."""
    return value.as_fx_arg() if isinstance(value, VariableTracker) else value


def to_fake_arg(value):
    """A tracker (or nested structure of them) as the fake value an op runs on."""
    return value.as_fake_arg() if isinstance(value, VariableTracker) else value


def constant_args(args, kwargs):
    """(args, kwargs) as Python values if every one is a constant, else None."""
    try:
        return ([a.as_python_constant() for a in args],
                {k: v.as_python_constant() for k, v in kwargs.items()})
    except Unsupported:
        return None


def any_tensor(values) -> bool:
    return any(v.contains_tensor() for v in values)


class BoundContainerMethod(VariableTracker):
    """A method of a list/tuple/dict tracker, modelled by the tracker's call_method."""

    def __init__(self, obj: VariableTracker, name: str):
        super().__init__(None)
        self.obj = obj
        self.name = name

    def call_function(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def reconstruct(self, codegen) -> str:
        return f"{codegen(self.obj)}.{self.name}"


def same_object(tx, a, b) -> bool:
    """`a is b`, guarded: where neither value's own guards pin which object it is (an instance
    of a user class, a tensor argument), the answer holds only while the objects are the same,
    or distinct, again."""
    ia, ib = a.identity(tx), b.identity(tx)
    same = ia is ib

    def unpinned(vt):
        return vt.source is not None and not vt.identity_pinned

    def made_here(vt):  # its identity is a tracker: no object outside the frame is it
        return isinstance(vt.identity(tx), VariableTracker)

    guards = tx.output.guards
    if not (unpinned(a) or unpinned(b)) or (made_here(a) or made_here(b)):
        return same
    if a.source is not None and b.source is not None:
        if a.source != b.source:
            guards.add(b.source, "ALIAS", a.source) if same else \
                guards.add(None, "DISTINCT", (a.source, b.source))
        return same
    # One of them comes from outside with no guard on which object it is; the other is a fixed
    # object (a global read without a source, a constant).
    x, fixed = (a, ib) if unpinned(a) else (b, ia)
    if same:
        guards.add(x.source, "ID_MATCH", fixed)
    elif type(fixed) is x.python_type():
        raise Unsupported(f"`is` of {x.source.name} and a fixed object of its type")
    return same
