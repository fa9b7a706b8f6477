"""What of a code object's layout both the capture and the resume functions read: its exception
table (CPython's Objects/exception_handling_notes.txt, read by client/bytecode as the executor
reads it), and whether a graph break can resume inside it."""
import types
from typing import List, Tuple

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
