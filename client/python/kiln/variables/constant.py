"""Python constants: numbers, strings, None, dtypes, devices, torch.Size and tuples of them."""
import operator

from kiln.exc import Unsupported
from kiln.variables.base import ValueVariable


class ConstantVariable(ValueVariable):
    """A Python constant: a number, string, None, dtype, device, torch.Size, tuple of them."""

    def unpack(self, tx):
        try:
            return [ConstantVariable(v) for v in self.value]
        except TypeError:
            raise Unsupported(f"cannot iterate over {type(self.value).__name__}") from None

    def var_getattr(self, tx, name):
        from kiln.variables.functions import BoundBuiltinMethod

        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raise Unsupported(f"{type(self.value).__name__} has no attribute {name!r}") from e
        if callable(attr):
            return BoundBuiltinMethod(self, name)
        return ConstantVariable(attr)

    def __repr__(self):
        return f"ConstantVariable({self.value!r})"


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
