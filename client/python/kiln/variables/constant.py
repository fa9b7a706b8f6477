"""Python constants: numbers, strings, None, dtypes, devices, torch.Size and tuples of them; and
the methods of constants, run at trace time."""
import operator

import torch

from kiln.exc import Unsupported
from kiln.graph.symbolic_shapes import SYM_PYTHON_TYPE, SYM_TYPES
from kiln.variables.base import ValueVariable, VariableTracker, constant_args


def specialised(value):
    """`value` with each symbolic number (kiln.variables.sym_node) replaced by the value it has
    now, guarded (the ShapeEnv records that the graph holds only for it): for values that must
    be Python constants. Tuples, lists and torch.Size are walked."""
    t = type(value)
    if t in SYM_TYPES:
        return SYM_PYTHON_TYPE[t](value)
    if t is torch.Size or t is tuple or t is list:
        if any(type(v) in SYM_TYPES for v in value):
            return t(specialised(v) for v in value)
    return value


class ConstantVariable(ValueVariable):
    """A Python constant: a number, string, None, dtype, device, torch.Size, tuple of them."""

    def __init__(self, value, source=None):
        t = type(value)
        if t in SYM_TYPES or t is torch.Size:
            # A symbolic size that reached a constant: its value, guarded.
            value = specialised(value)
        super().__init__(value, source)

    def unpack(self, tx):
        try:
            return [ConstantVariable(v) for v in self.value]
        except TypeError:
            raise Unsupported(f"cannot iterate over {type(self.value).__name__}") from None

    def var_getattr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raise Unsupported(f"{type(self.value).__name__} has no attribute {name!r}") from e
        if callable(attr):
            return BoundBuiltinMethod(self, name)
        return ConstantVariable(attr)

    def has_attr(self, tx, name):
        return hasattr(self.value, name)  # the value is guarded as a whole

    def getitem(self, tx, index):
        try:
            return ConstantVariable(self.value[index.as_python_constant()])
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(f"indexing {type(self.value).__name__}: {e}") from None

    def contains(self, tx, item):
        try:
            return ConstantVariable(item.as_python_constant() in self.value)
        except TypeError as e:
            raise Unsupported(f"`in` on a {type(self.value).__name__}: {e}") from None

    def __repr__(self):
        return f"ConstantVariable({self.value!r})"


class BoundBuiltinMethod(VariableTracker):
    """A method of a constant (str.format, tuple.index, ...), run at trace time."""

    def __init__(self, obj: VariableTracker, name: str):
        super().__init__(None)
        self.obj = obj
        self.name = name

    def call_function(self, tx, args, kwargs):
        const = constant_args(args, kwargs)
        if const is None:
            raise Unsupported(f"{type(self.obj.as_python_constant()).__name__}.{self.name} "
                              "with non-constant arguments")
        value = getattr(self.obj.as_python_constant(), self.name)(*const[0], **const[1])
        return ConstantVariable(value)

    def reconstruct(self, codegen) -> str:
        return f"{codegen(self.obj)}.{self.name}"


# Functions that are safe to run at trace time on constant arguments.
PURE_OPERATORS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.neg, operator.pos, operator.not_, operator.invert,
    operator.and_, operator.or_, operator.xor, operator.lshift, operator.rshift,
    operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge,
    operator.is_, operator.is_not, operator.contains, operator.getitem, operator.matmul,
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
    operator.irshift, operator.truth, operator.abs, operator.index,
}
