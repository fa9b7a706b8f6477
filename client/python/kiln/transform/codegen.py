"""Writes the transformed code object of a captured frame: load the graph inputs from their
sources, call the compiled graph, rebuild the frame's return value from the graph outputs and
constants.

The code object is written as Python source and compiled, then its placeholder constant is
replaced by a tuple of the objects it needs (the compiled callable, non-literal constants), so
nothing is injected into the user's globals.
"""
import itertools
import math
import types
from typing import Dict, List

from kiln import _C
from kiln.exc import Unsupported
from kiln.variables.base import NullVariable, VariableTracker
from kiln.variables.constant import ConstantVariable
from kiln.variables.containers import (BaseListVariable, ConstDictVariable, ListIteratorVariable,
                                       ListVariable, NamedTupleVariable, SetVariable)
from kiln.variables.functions import BoundBuiltinMethod, BoundContainerMethod, UserMethodVariable
from kiln.variables.tensor import TensorMethodVariable, TensorVariable

_CONSTS_PLACEHOLDER = "__kiln_consts__"
_LITERAL_TYPES = (bool, int, str, type(None), bytes)


class ConstTable:
    """Objects the transformed code reads from its constants tuple."""

    def __init__(self):
        self.objects: List[object] = []
        self._index: Dict[int, int] = {}

    def ref(self, obj) -> str:
        i = self._index.get(id(obj))
        if i is None:
            i = len(self.objects)
            self.objects.append(obj)
            self._index[id(obj)] = i
        return f"__kiln_k[{i}]"


class OutputCollector:
    """Assigns graph output slots to the tensors the return value needs."""

    def __init__(self):
        self.nodes: List = []
        self._index: Dict = {}

    def slot(self, tensor: TensorVariable) -> int:
        i = self._index.get(tensor.node)
        if i is None:
            i = len(self.nodes)
            self.nodes.append(tensor.node)
            self._index[tensor.node] = i
        return i


class Reconstructor:
    """Writes Python expressions that rebuild trackers in the transformed code.

    With `use_graph`, tensors come from the compiled graph's outputs; without (no op was
    recorded), from their sources. A mutable container reached twice (on the stack and in a
    local, say) is built once into a temporary, so the aliasing the program sees is kept."""

    def __init__(self, consts: ConstTable, use_graph: bool = True):
        self.consts = consts
        self.outputs = OutputCollector()
        self.use_graph = use_graph
        self.prelude: List[str] = []
        self._memo: Dict[int, str] = {}

    def __call__(self, vt: VariableTracker) -> str:
        consts = self.consts
        if isinstance(vt, TensorVariable):
            if self.use_graph:
                return f"__kiln_out[{self.outputs.slot(vt)}]"
            if vt.source is None:
                raise Unsupported("a tensor with no source and no graph to compute it")
            return vt.source.expr(consts)
        if isinstance(vt, SetVariable) and vt.source is None:
            return self._temp(vt, f"set({consts.ref(frozenset(vt.value))})")
        if isinstance(vt, (BaseListVariable, ConstDictVariable)) and vt.source is not None:
            # The program's own object: it may be mutated or compared by identity later.
            return vt.source.expr(consts)
        if isinstance(vt, NamedTupleVariable):
            items = "".join(self(v) + ", " for v in vt.items)
            return f"{consts.ref(vt.tuple_type)}._make(({items}))" if vt.is_collections \
                else f"{consts.ref(vt.tuple_type)}(({items}))"
        if isinstance(vt, ConstantVariable):
            v = vt.value
            if type(v) in _LITERAL_TYPES or (type(v) is float and math.isfinite(v)):
                return repr(v)
            return consts.ref(v)
        if isinstance(vt, (ListVariable, ConstDictVariable)):
            return self._temp(vt, None)
        if isinstance(vt, BaseListVariable):
            return self._build(vt)
        if isinstance(vt, ListIteratorVariable):
            # One object however often it is reached (a local and the argument of next(), say):
            # advancing one advances the other.
            if vt.origin is not None:
                return self._temp(vt, f"{consts.ref(iterator_at)}({self(vt.origin)}, {vt.index})")
            items = "".join(self(v) + ", " for v in vt.items[vt.index:])
            return self._temp(vt, f"iter(({items}))")
        if isinstance(vt, TensorMethodVariable):
            return f"{self(vt.tensor)}.{vt.name}"
        if isinstance(vt, (BoundBuiltinMethod, BoundContainerMethod)):
            return f"{self(vt.obj)}.{vt.name}"
        if isinstance(vt, UserMethodVariable):
            return f"{consts.ref(vt.fn)}.__get__({self(vt.obj)})"
        if isinstance(vt, NullVariable):
            raise Unsupported("rebuilding NULL")
        if hasattr(vt, "rebuild_expr"):  # objects that know how to rebuild themselves
            return vt.rebuild_expr(self, self.consts)
        if vt.source is not None:
            return vt.source.expr(consts)
        try:
            return consts.ref(vt.as_python_constant())
        except Unsupported:
            raise Unsupported(f"kiln cannot rebuild {vt} after the graph") from None

    def _temp(self, vt, expr) -> str:
        """A mutable container built once into a temporary, however often it is reached."""
        name = self._memo.get(id(vt))
        if name is None:
            name = f"__kiln_t{len(self._memo)}"
            self._memo[id(vt)] = name
            self.prelude.append(f"{name} = {expr if expr is not None else self._build(vt)}")
        return name

    def fresh_object(self, vt, cls, attrs: Dict[str, VariableTracker]) -> str:
        """An object the frame made, built once: object.__new__(cls) into a temporary first (so
        attributes that lead back to it, or to each other, see the one object), then its
        instance __dict__ in the order the frame wrote it."""
        name = self._memo.get(id(vt))
        if name is None:
            name = f"__kiln_t{len(self._memo)}"
            self._memo[id(vt)] = name
            self.prelude.append(f"{name} = {self.consts.ref(object.__new__)}"
                                f"({self.consts.ref(cls)})")
            values = [f"{k!r}: {self(v)}" for k, v in attrs.items()]
            if values:
                self.prelude.append(f"{name}.__dict__.update({{{', '.join(values)}}})")
        return name

    def _build(self, vt) -> str:
        if isinstance(vt, ConstDictVariable):
            if vt.user_type is not dict:
                raise Unsupported(f"rebuilding a {vt.user_type.__name__}")
            items = [f"{self(ConstantVariable(k))}: {self(v)}" for k, v in vt.items.items()]
            return "{" + ", ".join(items) + "}"
        parts = [self(v) for v in vt.items]
        if isinstance(vt, ListVariable):
            return "[" + ", ".join(parts) + "]"
        return "(" + "".join(p + ", " for p in parts) + ")"


def iterator_at(items: list, index: int):
    """A list iterator over `items` that has yielded its first `index` items."""
    it = iter(items)
    for _ in itertools.islice(it, index):
        pass
    return it


def transformed_code(code: types.CodeType, nslots: int, call_expr: str, body: List[str],
                     consts: ConstTable):
    """The code object the hook runs for `code`: same argument slots (all positional), same
    free variables, body `__kiln_out = <call_expr>` then the statements of `body`. Returns the
    code object and the source it was compiled from (for debug output)."""
    params = list(code.co_varnames[:nslots])
    free = list(code.co_freevars)
    lines = ["def __kiln_outer():"]
    for name in free:
        lines.append(f"    {name} = None")
    lines.append(f"    def __kiln_transformed({', '.join(params)}):")
    if free:
        lines.append(f"        if False: ({', '.join(free)},)")
    lines.append(f"        __kiln_k = {_CONSTS_PLACEHOLDER!r}")
    if call_expr:
        lines.append(f"        __kiln_out = {call_expr}")
    lines.extend("        " + line for line in body)
    lines.append("    return __kiln_transformed")
    src = "\n".join(lines) + "\n"
    module = compile(src, f"<kiln transformed {code.co_qualname}>", "exec")
    outer = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    inner = next(c for c in outer.co_consts if isinstance(c, types.CodeType))
    if inner.co_freevars != code.co_freevars:
        raise Unsupported("free variables of the transformed code do not match the original")
    new_consts = tuple(tuple(consts.objects) if c == _CONSTS_PLACEHOLDER else c
                       for c in inner.co_consts)
    inner = inner.replace(co_consts=new_consts, co_name=code.co_name,
                          co_qualname=code.co_qualname)
    _C.mark_skip(inner)
    return inner, src
