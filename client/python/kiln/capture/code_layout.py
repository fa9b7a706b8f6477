"""What of a code object's layout both the capture and the resume functions read: its exception
table (CPython's Objects/exception_handling_notes.txt, read by client/bytecode as the executor
reads it), whether a graph break can resume inside it, and which of its locals are live where
it resumes."""
import dis
import types
import weakref
from typing import FrozenSet, List, Tuple

from kiln import _C


def parse_exception_table(table: bytes) -> List[Tuple[int, int, int, int]]:
    """Entries (start, end, target, depth_lasti) in code units, end exclusive."""
    return [tuple(entry) for entry in _C.exception_table(table)]


def can_split(code: types.CodeType) -> bool:
    """Whether a graph break can resume inside `code`: resume functions reuse its bytecode with
    every local and cell variable as a parameter in its own slot (free variables after them,
    from the frame's own cells), which generators and coroutines do not allow."""
    return not (code.co_flags & (
        0x20 | 0x80 | 0x100 | 0x200))  # generator, coroutine, iterable coroutine, async gen


# Instructions after which control never reaches the next one.
_NO_FALLTHROUGH = {"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
                   "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP"}
# Names whose call can read every local of the frame.
_READS_FRAME = {"locals", "vars", "eval", "exec", "dir", "_getframe", "currentframe"}
_live: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def live_locals(code: types.CodeType, offset: int) -> FrozenSet[str]:
    """The fast locals of `code` that may be read at byte `offset` before they are written
    (a resume function there needs no other: a dead one passed as unbound reads the same, and
    guards nothing). Cell variables are not fast locals and are left out; code that can read
    its frame's locals wholesale (locals(), eval, sys._getframe) has every local live, and
    code that calls super() its first argument. Any read
    of a slot counts, DELETE_FAST too (deleting an unbound local raises), and a handler's live
    locals are live across the whole range it covers."""
    per_code = _live.get(code)
    if per_code is None:
        per_code = _live[code] = _liveness(code)
    live = per_code.get(offset, frozenset(code.co_varnames))
    if "super" in code.co_names and code.co_argcount:
        # super() with no arguments reads the frame's first argument itself.
        live |= {code.co_varnames[0]}
    return live


_BACKWARD_JUMPS = {"JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE"}


def inside_loop(code: types.CodeType, offset: int) -> bool:
    """Whether byte `offset` of `code` is inside a loop: a backward jump after it goes back to
    it or before it (a for or while loop's body, or its header)."""
    return any(ins.opname in _BACKWARD_JUMPS and ins.offset > offset and ins.argval <= offset
               for ins in dis.get_instructions(code))


def _liveness(code: types.CodeType) -> dict:
    if _READS_FRAME & set(code.co_names):
        return {}
    insts = list(dis.get_instructions(code))
    index = {ins.offset: i for i, ins in enumerate(insts)}
    handlers = [(start * 2, end * 2, target * 2)
                for start, end, target, _ in parse_exception_table(code.co_exceptiontable)]
    succ, uses, defs = [], [], []
    for i, ins in enumerate(insts):
        nexts = []
        if ins.opname not in _NO_FALLTHROUGH and i + 1 < len(insts):
            nexts.append(i + 1)
        if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
            nexts.append(index[ins.argval])
        raising = [index[t] for s, e, t in handlers if s <= ins.offset < e]
        succ.append((nexts, raising))
        use = d = frozenset()
        if ins.opcode in dis.haslocal:
            if ins.opname == "STORE_FAST":
                d = frozenset((ins.argval,))
            else:  # LOAD_FAST and kin, DELETE_FAST, 3.13's pairs: a read
                names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
                use = frozenset(names)
        uses.append(use)
        defs.append(d)
    live_in = [frozenset()] * len(insts)
    changed = True
    while changed:
        changed = False
        for i in range(len(insts) - 1, -1, -1):
            nexts, raising = succ[i]
            out = frozenset().union(*(live_in[j] for j in nexts))
            new = uses[i] | (out - defs[i]) | frozenset().union(*(live_in[j] for j in raising))
            if new != live_in[i]:
                live_in[i] = new
                changed = True
    return {ins.offset: live_in[i] for i, ins in enumerate(insts)}
