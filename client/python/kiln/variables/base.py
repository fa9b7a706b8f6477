"""The VariableTracker base class and the conversions every tracker shares."""
import contextlib
from typing import Dict, List, Optional

from kiln.exc import Unsupported
from kiln.guards.source import Source


class VariableTracker:
    """A Python value as the symbolic executor sees it. `source` says where it was read from,
    when it came from outside the frame; guards were installed on that source when it was read.
    """

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

    def unpack(self, tx) -> List["VariableTracker"]:
        """The items, for iteration and unpacking."""
        raise Unsupported(f"cannot iterate over {self}")

    def truth(self, tx) -> bool:
        """bool(value) at trace time, or Unsupported when it depends on data."""
        return bool(self.as_python_constant())

    # -- what one can do with it ---------------------------------------------------------------

    def var_getattr(self, tx, name: str) -> "VariableTracker":
        raise Unsupported(f"attribute {name!r} of {self}")

    def call_function(self, tx, args: List["VariableTracker"],
                      kwargs: Dict[str, "VariableTracker"]) -> "VariableTracker":
        raise Unsupported(f"call of {self}")

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


class NullVariable(VariableTracker):
    """The NULL that PUSH_NULL / LOAD_GLOBAL / LOAD_ATTR put below a callable."""

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


def _unwrap(value, tensor_leaf):
    """A tracker (or nested structure of them) as plain Python, tensors via `tensor_leaf`."""
    from kiln.variables.containers import BaseListVariable, ConstDictVariable, SliceVariable
    from kiln.variables.tensor import TensorVariable

    if isinstance(value, TensorVariable):
        return tensor_leaf(value)
    if isinstance(value, BaseListVariable):
        with walking(value):
            items = [_unwrap(v, tensor_leaf) for v in value.items]
        return items if value.python_type() is list else tuple(items)
    if isinstance(value, SliceVariable):
        return slice(*(_unwrap(v, tensor_leaf) for v in value.parts))
    if isinstance(value, ConstDictVariable):
        with walking(value):
            return {k: _unwrap(v, tensor_leaf) for k, v in value.items.items()}
    if isinstance(value, VariableTracker):
        return value.as_python_constant()
    return value


def to_fx_arg(value):
    """A tracker (or nested structure of them) as an FX node argument."""
    return _unwrap(value, lambda t: t.node)


def to_fake_arg(value):
    """A tracker (or nested structure of them) as the fake value an op runs on."""
    return _unwrap(value, lambda t: t.example)


def constant_args(args, kwargs):
    """(args, kwargs) as Python values if every one is a constant, else None."""
    try:
        return ([a.as_python_constant() for a in args],
                {k: v.as_python_constant() for k, v in kwargs.items()})
    except Unsupported:
        return None


def any_tensor(values) -> bool:
    from kiln.variables.containers import BaseListVariable, ConstDictVariable
    from kiln.variables.tensor import TensorVariable

    for v in values:
        if isinstance(v, TensorVariable):
            return True
        if isinstance(v, (BaseListVariable, ConstDictVariable)) and id(v) not in _walking:
            with walking(v):
                items = v.items.values() if isinstance(v, ConstDictVariable) else v.items
                if any_tensor(items):
                    return True
    return False
