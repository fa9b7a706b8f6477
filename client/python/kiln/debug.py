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


def artifacts(fn=None) -> list:
    """What the "kiln" backend built (kiln.backends.kiln_backend.CompiledArtifact), oldest
    first: all of this process's, or those `fn`'s cache entries run."""
    from kiln.backends.kiln_backend import artifacts as built

    if fn is None:
        return list(built)
    mine = {id(e.info.compiled_fn) for e in cache_entries(fn)}
    return [a for a in built if id(a.plan) in mine]


def artifact(fn):
    """The newest artifact `fn` runs (None when its graphs run through another backend)."""
    found = artifacts(fn)
    return found[-1] if found else None


def format_artifact(a) -> str:
    """The plan of an artifact, step by step, with its key, where it came from and the
    generated C++."""
    from kiln.daemon import protocol

    pb = protocol.messages()
    body = a.body
    plan = body.plan
    source = "client index + daemon cache" if a.index_hit else \
        ("daemon cache" if a.cache_hit else f"compiled in {a.compile_seconds:.3f}s")
    lines = [f"artifact {a.key[:16]}… ({source}; {a.client_seconds * 1000:.1f} ms in the "
             f"client); {len(plan.prologue)} prologue + {len(plan.steps)} steps, {len(plan.buffers)} buffers, arena "
             f"{plan.arena_bytes} bytes, binary {len(body.kernel_binary)} bytes "
             f"({pb.artifact.BinaryFormat.Name(body.format)})"]
    lines.append(f"  inputs {list(plan.inputs)} -> outputs {list(plan.outputs)}")
    if plan.prologue:
        lines.append(f"  prologue (bound inputs only; run again when one changes) -> "
                     f"{', '.join(f'%{v}' for v in plan.prologue_outputs)}")
        lines.extend(_format_steps(plan.prologue))
        lines.append("  per call")
    lines.extend(_format_steps(plan.steps))
    if body.kernel_source:
        lines.append("  generated C++:")
        lines.extend("    " + line for line in body.kernel_source.splitlines())
    return "\n".join(lines)


def _format_steps(steps) -> List[str]:
    lines = []
    for i, step in enumerate(steps):
        if step.WhichOneof("kind") == "kernel":
            k = step.kernel
            text = f"kernel  {k.symbol}({', '.join(f'%{v}' for v in k.args)}) " \
                   f"writes {', '.join(f'%{v}' for v in k.writes)}"
        else:
            c = step.library
            text = f"library {c.op} -> {', '.join(f'%{v}' for v in c.outputs)}"
        if step.release:
            text += f"   release {list(step.release)}"
        lines.append(f"  {i:3d} {text}")
    return lines
