"""Writes the transformed code object of a captured frame: load the graph inputs from their
sources, call the compiled graph, rebuild the frame's return value from the graph outputs and
constants.

The code object is written as Python source and compiled, then its placeholder constant is
replaced by a tuple of the objects it needs (the compiled callable, non-literal constants), so
nothing is injected into the user's globals.
"""
import math
import types
from typing import Callable, Dict, List

from kiln import _C
from kiln.exc import Unsupported
from kiln.guards.source import FrameCellSource

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

    def slot(self, node) -> int:
        i = self._index.get(node)
        if i is None:
            i = len(self.nodes)
            self.nodes.append(node)
            self._index[node] = i
        return i


class Reconstructor:
    """Writes the Python expressions that rebuild values in the transformed code. Calling it on a
    tracker asks the tracker (its `reconstruct(codegen)`), which calls back for its parts:

    - `codegen(vt)`: the expression of a nested tracker;
    - `codegen.constant(value)`: a literal, or a reference into the constants tuple;
    - `codegen.tensor(vt)`: a tensor, from the compiled graph's outputs with `use_graph`, else
      from its source (no op was recorded);
    - `codegen.source(source)`: the value the frame read from `source`; with `snapshot`
      (the transformed code replays attribute stores) read once into a temporary before them,
      so that a store cannot change what a later expression reads there;
    - `codegen.temp(vt, build)`: a mutable object built once into a temporary however often it
      is reached (a list on the stack and in a local), so the aliasing the program sees is kept;
    - `codegen.fresh_object(vt, cls, attrs)`: an object the frame made, from its attributes;
    - `codegen.cell(cell_vt)`: a cell a function the frame made is rebuilt over (see there).

    `root` is the capture's root executor and `at_break` whether the code being written
    continues the frame in a resume function."""

    def __init__(self, consts: ConstTable, use_graph: bool = True, snapshot: bool = False):
        self.consts = consts
        self.outputs = OutputCollector()
        self.use_graph = use_graph
        self.snapshot = snapshot
        self.prelude: List[str] = []
        self._memo: Dict[int, str] = {}
        self._read: Dict[object, str] = {}  # source -> its temporary (snapshot)
        self.root = None
        self.at_break = False
        self._cells: Dict[tuple, str] = {}  # (id(owner executor), name) -> its temporary
        self._cell_values: List[tuple] = []  # (temporary, cell tracker) still to fill

    def __call__(self, vt) -> str:
        return vt.reconstruct(self)

    def constant(self, value) -> str:
        if type(value) in _LITERAL_TYPES or (type(value) is float and math.isfinite(value)):
            return repr(value)
        return self.consts.ref(value)

    def tensor(self, vt) -> str:
        if self.use_graph:
            return f"__kiln_out[{self.outputs.slot(vt.node)}]"
        if vt.source is None:
            raise Unsupported("a tensor with no source and no graph to compute it")
        return self.source(vt.source)

    def source(self, source) -> str:
        if not self.snapshot:
            return source.expr(self.consts)
        name = self._read.get(source)
        if name is None:
            name = self._read[source] = f"__kiln_s{len(self._read)}"
            self.prelude.append(f"{name} = {source.expr(self.consts)}")
        return name

    def cell(self, cell_vt) -> str:
        """The cell a rebuilt function closes over (a CellVariable: `name` of executor `owner`).
        A free variable of the compiled frame is its own cell, reached through a lambda over
        that name (each closure of the code has its own). A cell variable of the frame or of a
        call kiln inlined is a new cell, one per variable however many functions close over
        it, holding the variable's value: the frame is over (no one else holds its cells), or,
        for an inlined call's cells, the call is. At a graph break the frame goes on in a
        resume function with cells of its own, so a function over them cannot be rebuilt."""
        owner, name = cell_vt.owner_tx, cell_vt.name
        if name in owner.code.co_freevars:
            if owner is self.root:
                return self.source(FrameCellSource(name))
            entry = owner.closure_cell(name)
            if isinstance(entry, tuple):
                # A real cell of a function kiln inlined, which its guards pin (ID_MATCH): the
                # same cell on every call the entry serves.
                return self.consts.ref(entry[0])
            if entry is None:
                raise Unsupported(f"rebuilding a function over {name!r}: no cell found")
            return self.cell(entry)  # a cell of the executor that made that function
        if owner is self.root and self.at_break:
            raise Unsupported(f"a function over the frame's cell {name!r} outlives the graph "
                              "break")
        key = (id(owner), name)
        tmp = self._cells.get(key)
        if tmp is None:
            tmp = self._cells[key] = f"__kiln_c{len(self._cells)}"
            self.prelude.append(f"{tmp} = {self.consts.ref(types.CellType)}()")
            self._cell_values.append((tmp, cell_vt))
        return tmp

    def fill_cells(self) -> List[str]:
        """The statements that give each new cell its value: after every temporary is made (a
        function may be the value of its own cell, as a recursive nested function is)."""
        out = []
        while self._cell_values:
            tmp, cell_vt = self._cell_values.pop(0)
            owner, name = cell_vt.owner_tx, cell_vt.name
            if name not in owner.symbolic_locals:
                continue  # unbound: an empty cell, as MAKE_CELL leaves it
            out.append(f"{tmp}.cell_contents = {self(owner.symbolic_locals[name])}")
        return out

    def temp(self, vt, build: Callable[[], str]) -> str:
        """`build()`'s object in a temporary, built once per tracker."""
        name = self._memo.get(id(vt))
        if name is None:
            name = f"__kiln_t{len(self._memo)}"
            self._memo[id(vt)] = name
            self.prelude.append(f"{name} = {build()}")
        return name

    def fresh_object(self, vt, cls, attrs: Dict[str, object]) -> str:
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
    return code_from_source(code, src, consts.objects), src


def code_from_source(code: types.CodeType, src: str, objects: List[object]) -> types.CodeType:
    """The transformed code object for `code` compiled from transformed_code's source `src`,
    reading `objects` as its constants tuple (also how a stored capture is installed)."""
    module = compile(src, f"<kiln transformed {code.co_qualname}>", "exec")
    outer = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    inner = next(c for c in outer.co_consts if isinstance(c, types.CodeType))
    if inner.co_freevars != code.co_freevars:
        raise Unsupported("free variables of the transformed code do not match the original")
    new_consts = tuple(tuple(objects) if c == _CONSTS_PLACEHOLDER else c
                       for c in inner.co_consts)
    inner = inner.replace(co_consts=new_consts, co_name=code.co_name,
                          co_qualname=code.co_qualname)
    _C.mark_skip(inner)
    return inner
