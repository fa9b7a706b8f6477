"""Resume functions: after a graph break, the rest of a frame runs as a new function,
`__resume_at_<offset>_<n>`, whose code is a short prologue followed by the original bytecode.

The prologue rebuilds the value stack the original had at `offset` (from extra arguments, or
NULL), drops the locals that were unbound there, and jumps into the original body. Every local
of the original is a parameter, in its original slot, so the body's bytecode is reused as it is;
the stack values are parameters after them. The hook then captures the resume function's frame
like any other.

Code with free variables (a closure, a method that calls super()) keeps them: the prologue
copies them from the resume function's closure, which the transformed code makes over the
running frame's own cells (with_cells), and the body's free-variable slots move past the added
parameters. A cell variable (a local a nested function closes over) is a parameter too, made a
cell by the prologue. The exception table and line table of the body are shifted past the
prologue.
"""
import dis
import itertools
import types
import weakref
from typing import NamedTuple, Optional, Sequence, Tuple

from kiln.capture.code_layout import parse_exception_table

_OP = dis.opmap
_NO_LOCATION = 15  # line table entry code: no source position

# Each resume code made -> (a weak reference to the code it continues, the bytes its prologue
# adds before that code's body).
_origins: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# The resume functions alive for each code, by (offset, stack layout, unbound locals, globals):
# a break at the same place with the same layout (every entry of the code breaking there: one
# per instance of a module class, one per set of guards, one per turn of a loop) continues in
# one resume function, whose own entries are then shared as well. Held weakly both ways: the
# entries whose transformed code calls a resume function keep it alive.
_made: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_ids = itertools.count(1)


def _emit(out: bytearray, opname: str, arg: int = 0):
    """Appends one cache-less instruction, with EXTENDED_ARG prefixes for large arguments."""
    op = _OP[opname]
    if arg > 0xFFFFFF:
        raise ValueError(f"argument {arg} too large")
    if arg > 0xFFFF:
        out += bytes((_OP["EXTENDED_ARG"], (arg >> 16) & 0xFF))
    if arg > 0xFF:
        out += bytes((_OP["EXTENDED_ARG"], (arg >> 8) & 0xFF))
    out += bytes((op, arg & 0xFF))


def _write_varint(value: int, first: bool) -> bytes:
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    out = bytearray(c | 64 for c in chunks[:-1])
    out.append(chunks[-1])
    if first:
        out[0] |= 128
    return bytes(out)


def write_exception_table(entries) -> bytes:
    out = bytearray()
    for start, end, target, dl in entries:
        out += _write_varint(start, True)
        out += _write_varint(end - start, False)
        out += _write_varint(target, False)
        out += _write_varint(dl, False)
    return bytes(out)


def make_resume_code(code: types.CodeType, target_offset: int, stack_is_null: Sequence[bool],
                     unbound_locals: Sequence[str], name: str) -> types.CodeType:
    """The code of a resume function continuing `code` at byte `target_offset` with a value
    stack whose entries are NULL where `stack_is_null` says so, else the next parameter after
    the locals. Parameters: every local of `code` in order, its other cell variables
    (resume_params), then the non-NULL stack values. A cell variable's parameter becomes a new
    cell holding the value it is passed (an empty one where `unbound_locals` names it): no
    closure made before the break outlives the graph (the capture cannot rebuild one), so no
    one else holds the frame's cells."""
    varnames = resume_params(code)
    nlocals = len(varnames)
    # Named after their slot, so a resume function of a resume function adds new names.
    n_values = sum(not null for null in stack_is_null)
    stack_params = [f"__kiln_stack_{nlocals + i}" for i in range(n_values)]
    prologue = bytearray()
    for cell in code.co_cellvars:
        if cell in unbound_locals:
            _emit(prologue, "DELETE_FAST", varnames.index(cell))
        _emit(prologue, "MAKE_CELL", varnames.index(cell))
    if code.co_freevars:
        _emit(prologue, "COPY_FREE_VARS", len(code.co_freevars))
    _emit(prologue, "RESUME", 0)
    param = nlocals
    for null in stack_is_null:
        if null:
            _emit(prologue, "PUSH_NULL")
        else:
            _emit(prologue, "LOAD_FAST", param)
            param += 1
    for local in unbound_locals:
        if local not in code.co_cellvars:
            _emit(prologue, "DELETE_FAST", varnames.index(local))
    # JUMP_FORWARD counts code units from the instruction after it: the start of the body.
    _emit(prologue, "JUMP_FORWARD", target_offset // 2)
    units = len(prologue) // 2

    linetable = bytearray()
    left = units
    while left > 0:
        n = min(left, 8)
        linetable.append(0x80 | (_NO_LOCATION << 3) | (n - 1))
        left -= n
    linetable += code.co_linetable

    entries = [(s + units, e + units, t + units, dl)
               for s, e, t, dl in parse_exception_table(code.co_exceptiontable)]
    new_varnames = tuple(varnames + stack_params)
    flags = code.co_flags & ~(0x04 | 0x08)  # no *args / **kwargs: every parameter positional
    return code.replace(
        co_code=bytes(prologue) + _deref_slots_moved(code, varnames, n_values),
        co_linetable=bytes(linetable),
        co_exceptiontable=write_exception_table(entries),
        co_varnames=new_varnames,
        co_nlocals=len(new_varnames),
        co_argcount=len(new_varnames),
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_flags=flags,
        co_stacksize=code.co_stacksize + len(stack_is_null) + 1,
        co_name=name,
        co_qualname=name,
    )


def resume_params(code: types.CodeType) -> list:
    """The leading parameters of `code`'s resume functions: every local, then each cell variable
    that is not a local too (a parameter in the slot its cell had: cells follow the locals)."""
    return list(code.co_varnames) + [c for c in code.co_cellvars if c not in code.co_varnames]


def _deref_slots_moved(code: types.CodeType, params: list, by: int) -> bytes:
    """`code`'s bytecode with the slot of every cell and free-variable access (LOAD_DEREF and
    kin: an index into the frame's locals-plus) set to where the resume function keeps that name:
    a cell in its parameter of the same name, a free variable past the `by` parameters added
    after them. An argument that would need an EXTENDED_ARG of its own is refused (ValueError):
    the code keeps its length, so jumps, tables and caches stay where they are."""
    if not (code.co_freevars or code.co_cellvars):
        return code.co_code
    out = bytearray(code.co_code)
    for ins in dis.get_instructions(code):
        if ins.opcode not in dis.hasfree:
            continue
        if ins.argval in code.co_freevars:
            slot = len(params) + by + code.co_freevars.index(ins.argval)
        else:
            slot = params.index(ins.argval)
        if ins.arg > 0xFF or slot > 0xFF:
            raise ValueError(f"cell slot {slot} of {code.co_qualname} needs an EXTENDED_ARG")
        out[ins.offset + 1] = slot
    return bytes(out)


class ResumeRecipe(NamedTuple):
    """What make_resume_code made a resume function from, besides the code it continues: the
    same recipe on the same code gives the same code object (a stored capture names a resume
    function so, and makes it again in another process)."""
    target_offset: int
    stack_is_null: tuple
    unbound_locals: tuple
    name: str


def resume_function(code: types.CodeType, globals_: dict, recipe: ResumeRecipe):
    """The resume function `recipe` describes for `code`, with `globals_`, carrying its recipe
    as __kiln_resume__."""
    rcode = make_resume_code(code, recipe.target_offset, recipe.stack_is_null,
                             recipe.unbound_locals, recipe.name)
    # Code with free variables: empty cells here; each call runs a copy over the frame's own
    # (with_cells).
    closure = tuple(types.CellType() for _ in rcode.co_freevars) or None
    fn = types.FunctionType(rcode, globals_, recipe.name, None, closure)
    fn.__kiln_resume__ = recipe
    _origins[rcode] = (weakref.ref(code), len(rcode.co_code) - len(code.co_code))
    return fn


def shared_resume(code: types.CodeType, globals_: dict, target_offset: int,
                  stack_is_null: tuple, unbound_locals: tuple, name: Optional[str] = None):
    """The resume function of `code` at `target_offset` for this stack layout and these unbound
    locals over `globals_`: the one alive already, or a new one (named `name`, as a stored
    capture's record names it, else __resume_at_<offset>_<n>). Raises ValueError where none
    can be made."""
    made = _made.get(code)
    if made is None:
        made = _made[code] = weakref.WeakValueDictionary()
    key = (target_offset, stack_is_null, unbound_locals, id(globals_))
    fn = made.get(key)
    if fn is not None and (name is None or fn.__name__ == name):
        return fn
    fn = resume_function(code, globals_, ResumeRecipe(
        target_offset, stack_is_null, unbound_locals,
        name or f"__resume_at_{target_offset}_{next(_ids)}"))
    made.setdefault(key, fn)
    return fn


def resume_origin(code: types.CodeType) -> Tuple[types.CodeType, int]:
    """(the code `code` continues, how many bytes later its body starts in `code`): for a
    resume code, the code it was made from (never itself a resume code), else (code, 0). A break
    in a resume function continues in a resume function of that code, at the same place in its
    body: a loop whose every iteration breaks runs the same few resume functions, however many
    times it turns, as TorchDynamo's ContinueExecutionCache does."""
    origin = _origins.get(code)
    if origin is not None:
        continued = origin[0]()
        if continued is not None:
            return continued, origin[1]
    return code, 0


def with_cells(resume, cells_of):
    """`resume` (a resume function of code with free variables) over the cells of the running
    frame: the cells `cells_of` closes over, a function the transformed code makes there over
    the same names (the frame's own cells are not reachable otherwise)."""
    cells = dict(zip(cells_of.__code__.co_freevars, cells_of.__closure__))
    return types.FunctionType(resume.__code__, resume.__globals__, resume.__name__, None,
                              tuple(cells[name] for name in resume.__code__.co_freevars))
