"""What of a code object's layout both the capture and the resume functions read: its exception
table (CPython's Objects/exception_handling_notes.txt), and whether a graph break can resume
inside it."""
import types
from typing import List, Tuple


def _read_varint(data: bytes, i: int) -> Tuple[int, int]:
    b = data[i]
    value = b & 63
    i += 1
    while b & 64:
        b = data[i]
        value = (value << 6) | (b & 63)
        i += 1
    return value, i


def parse_exception_table(table: bytes) -> List[Tuple[int, int, int, int]]:
    """Entries (start, end, target, depth_lasti) in code units, end exclusive."""
    entries = []
    i = 0
    while i < len(table):
        start, i = _read_varint(table, i)
        length, i = _read_varint(table, i)
        target, i = _read_varint(table, i)
        dl, i = _read_varint(table, i)
        entries.append((start, start + length, target, dl))
    return entries


def offset_in_exception_table(code: types.CodeType, offset: int) -> bool:
    """True when the instruction at byte `offset` is covered by a try/with handler."""
    unit = offset // 2
    return any(start <= unit < end
               for start, end, _, _ in parse_exception_table(code.co_exceptiontable))


def can_split(code: types.CodeType) -> bool:
    """Whether a graph break can resume inside `code`: resume functions reuse its bytecode with
    every local and cell variable as a parameter in its own slot (free variables after them,
    from the frame's own cells), which generators and coroutines do not allow."""
    return not (code.co_flags & (
        0x20 | 0x80 | 0x100 | 0x200))  # generator, coroutine, iterable coroutine, async gen
