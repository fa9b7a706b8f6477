"""Inspecting what kiln compiled: cache entries with their guards and code objects."""
from dataclasses import dataclass
from typing import Any, List

from kiln import _C


@dataclass
class CacheEntry:
    guards: List[str]
    guard_manager: Any
    code: Any  # the transformed code object
    info: Any  # kiln.convert_frame.EntryInfo
    hits: int

    def check(self, *args) -> bool:
        """Would these arguments reuse this entry? (The slow path of the same C++ check.)"""
        return self.guard_manager.check(tuple(args), self.info.extra.get("func"))


def innermost_fn(fn):
    """The user's function behind kiln wrappers, modules and bound methods."""
    import torch

    from kiln.eval_frame import OptimizedModule

    seen = set()
    while id(fn) not in seen:
        seen.add(id(fn))
        if isinstance(fn, OptimizedModule):
            fn = fn._orig_mod
        elif isinstance(fn, _C.FrameRegion):
            fn = fn.fn
        elif isinstance(fn, torch.nn.Module):
            fn = type(fn).forward
        elif hasattr(fn, "__func__"):
            fn = fn.__func__
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
    return fn


def cache_entries(fn) -> List[CacheEntry]:
    """The compiled entries of `fn` (a function, a kiln-compiled callable or module)."""
    code = fn if hasattr(fn, "co_code") else innermost_fn(fn).__code__
    return [CacheEntry(guards=list(mgr.describe()), guard_manager=mgr, code=new_code, info=info,
                       hits=hits)
            for mgr, new_code, info, hits in _C.cache_entries(code)]
