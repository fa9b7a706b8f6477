"""Sizes that are symbols (kiln.graph.symbolic_shapes): a number the graph computes from its
inputs' sizes (`x.size(0)`, `x.shape[1] * 2`), and the torch.Size of a tensor with symbolic
dimensions.

A symbolic number is a graph node whose fake value is a torch.SymInt (SymFloat, SymBool):
arithmetic on it records nodes, an op taking it as a size records it as an argument, and the
graph holds for every size the SHAPE guard admits. Where Python needs its value (a branch, a
range(), an index into a list) the capture asks the ShapeEnv, which guards what it answered:
a branch on `n > 1` guards that relation, `range(n)` guards n's value (the graph is then
specialised to it).
"""
import operator

import torch

from kiln.graph.symbolic_shapes import SYM_PYTHON_TYPE, SYM_TYPES
from kiln.variables.base import VariableTracker
from kiln.variables.constant import specialised
from kiln.variables.containers import TupleVariable


def is_symbolic(value) -> bool:
    return type(value) in SYM_TYPES


class SymNodeVariable(VariableTracker):
    """A number the graph computes from symbolic sizes: its node and its symbolic value."""

    def __init__(self, node, value):
        super().__init__(None)
        self.node = node
        self.value = value

    def python_type(self):
        return SYM_PYTHON_TYPE[type(self.value)]

    def is_python_constant(self) -> bool:
        # Not a constant unless asked for one: a probe must not specialise the graph.
        return False

    def as_python_constant(self):
        """The value, guarded: the graph is specialised to it."""
        return specialised(self.value)

    def as_fx_arg(self):
        return self.node

    def as_fake_arg(self):
        return self.value

    def truth(self, tx) -> bool:
        return bool(self.value)  # the ShapeEnv guards the relation the branch took

    def reconstruct(self, codegen) -> str:
        if self.source is not None and self.node.op == "placeholder":
            return codegen.source(self.source)  # an int input: the program's own value
        return codegen.tensor(self)  # one of the graph's outputs

    def __repr__(self):
        return f"SymNodeVariable({self.node.name}: {self.value})"


class SizeVariable(TupleVariable):
    """A torch.Size some of whose items are symbolic (SymNodeVariable)."""

    def python_type(self):
        return torch.Size

    def as_python_constant(self):
        return torch.Size(v.as_python_constant() for v in self.items)

    def build(self, codegen) -> str:
        items = "".join(codegen(v) + ", " for v in self.items)
        return f"{codegen.constant(torch.Size)}(({items}))"


# Python operators on numbers that stay symbolic: recorded as nodes on their operands.
SYMBOLIC_OPERATORS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.neg, operator.pos, operator.abs,
    operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod,
}
_IN_PLACE = {operator.iadd: operator.add, operator.isub: operator.sub,
             operator.imul: operator.mul, operator.itruediv: operator.truediv,
             operator.ifloordiv: operator.floordiv, operator.imod: operator.mod}


def symbolic_operator(tx, fn, args):
    """`fn(*args)` for operands among which a symbolic number, none a tensor: a node whose
    value is symbolic (or a constant, where the ShapeEnv knows the answer)."""
    fn = _IN_PLACE.get(fn, fn)  # numbers are immutable: += is +
    return tx.output.call("call_function", fn, tuple(args), {})
