"""What kiln keeps about one compiled entry of a code object (kiln.debug, explain), however
it was made: captured (kiln.convert_frame) or installed from a stored capture."""
import itertools
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

_compile_ids = itertools.count()


def next_compile_id() -> int:
    return next(_compile_ids)


@dataclass
class EntryInfo:
    """What kiln keeps about one compiled entry, for kiln.debug and explain."""
    compile_id: int
    name: str
    graph_module: Optional[torch.fx.GraphModule]
    compiled_fn: Any
    guards: List[str]
    original_code: Any
    transformed_code: Any
    transformed_source: str
    op_count: int
    capture_seconds: float
    backend_seconds: float
    break_reason: Optional[str] = None  # why the graph ended before the frame did
    break_where: Optional[str] = None
    resume_codes: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
