"""Inspecting what kiln compiled: cache entries with their guards and code objects; artifacts
with the IR after each compiler pass, their plan and their generated C++."""
import zlib
from dataclasses import dataclass
from typing import Any, List, Optional

import torch

from kiln import _C
from kiln.daemon import protocol
from kiln.state import STATE


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
    seen = set()
    while id(fn) not in seen:
        seen.add(id(fn))
        if isinstance(fn, torch.nn.Module) and "_kiln_region" in fn.__dict__:
            fn = fn.__dict__["_kiln_region"].fn  # kiln.eval_frame.OptimizedModule
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


def explain_miss(fn) -> Optional[str]:
    """Why the last call of `fn` (a function, a kiln-compiled callable or module) that found no
    compiled entry did not install a stored capture (kiln.stored_capture): the guard that failed
    on the live frame, or the part of the key (kiln's build, torch's or Python's version, the
    compile setting, the code) that differs from the nearest capture stored for that code.
    None when a stored capture was installed, or none was looked for."""
    code = fn if hasattr(fn, "co_code") else innermost_fn(fn).__code__
    return STATE.capture_misses.get(code)


def artifacts(fn=None) -> list:
    """What the "kiln" backend built (kiln.backends.kiln_backend.CompiledArtifact), oldest
    first: all of this process's, or those `fn`'s cache entries run."""
    built = STATE.artifacts
    if fn is None:
        return list(built)
    mine = {id(e.info.compiled_fn) for e in cache_entries(fn)}
    return [a for a in built if id(a.plan) in mine]


def artifact(fn):
    """The newest artifact `fn` runs (None when its graphs run through another backend)."""
    found = artifacts(fn)
    return found[-1] if found else None


def format_artifact(a) -> str:
    """An artifact's key and where it came from, the IR after each compiler pass, the plan step
    by step and the generated C++."""
    pb = protocol.messages()
    body = a.body
    plan = body.plan
    source = "client index + daemon cache" if a.index_hit else \
        ("daemon cache" if a.cache_hit else f"compiled in {a.compile_seconds:.3f}s")
    lines = [f"artifact {a.key[:16]}… ({source}; {a.client_seconds * 1000:.1f} ms in the "
             f"client); {len(plan.prologue)} prologue + {len(plan.steps)} steps, {len(plan.buffers)} buffers, arena "
             f"{plan.arena_bytes} bytes, binary {len(body.kernel_binary)} bytes "
             f"({pb.artifact.BinaryFormat.Name(body.format)})"]
    lines.extend(_format_passes(body))
    lines.append(f"  plan: inputs {list(plan.inputs)} -> outputs {list(plan.outputs)}")
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


def pass_snapshots(body) -> list:
    """The kiln.v1.PassSnapshot of each compiler pass an ArtifactBody records, in pipeline order
    (empty for an artifact from a compiler that records none)."""
    if not body.pass_snapshots:
        return []
    raw = zlib.decompress(body.pass_snapshots)
    return list(protocol.messages().artifact.PassSnapshots.FromString(raw).passes)


def _format_passes(body) -> List[str]:
    from google.protobuf.message import DecodeError

    try:
        passes = pass_snapshots(body)
    except (zlib.error, DecodeError) as e:  # printing must not fail the program it inspects
        return [f"  (pass snapshots unreadable: {e})"]
    if not passes:
        return ["  (no pass snapshots in this artifact)"]
    lines = []
    for i, snapshot in enumerate(passes):
        if snapshot.unchanged:
            lines.append(f"  after {snapshot.name}: unchanged")
            continue
        g = snapshot.graph
        lines.append(f"  after {snapshot.name}: {len(g.nodes)} nodes")
        # Passes keep the graph's inputs: they are shown once, with the first graph.
        lines.extend("    " + line for line in format_graph(g, inputs=i == 0).splitlines())
    return lines


def format_graph(graph, inputs: bool = True) -> str:
    """A kiln.v1.Graph, one value per line: `%7 = aten::add.Tensor(%3, %5)  f32[8, 64]`, then
    `return %7`. Metadata shows strides and storage offset only where they are not those of a
    contiguous tensor."""
    lines = []
    if inputs:
        for i, v in enumerate(graph.inputs):
            kind = "bound input" if i < graph.num_bound_inputs else "input"
            lines.append(f"%{v.id} = {kind}  {format_meta(v.meta)}")
    for c in graph.constants:
        lines.append(f"%{c.value.id} = constant  {format_meta(c.value.meta)}")
    for n in graph.nodes:
        defined = ", ".join(f"%{v.id}" for v in n.outputs)
        metas = ", ".join(format_meta(v.meta) for v in n.outputs)
        lines.append(f"{defined} = {n.op}({', '.join(_format_arg(a) for a in n.args)})  {metas}")
    lines.append("return " + ", ".join(f"%{v}" for v in graph.outputs))
    return "\n".join(lines)


_DTYPE_NAMES = {"FLOAT32": "f32", "FLOAT64": "f64", "FLOAT16": "f16", "BFLOAT16": "bf16",
                "INT8": "i8", "INT16": "i16", "INT32": "i32", "INT64": "i64", "UINT8": "u8",
                "BOOL": "bool", "COMPLEX64": "c64", "COMPLEX128": "c128"}


def _dtype_name(value: int) -> str:
    name = protocol.messages().graph.DType.Name(value).removeprefix("DTYPE_")
    return _DTYPE_NAMES.get(name, name.lower())


def _device_name(device) -> str:
    cpu = device.kind == protocol.messages().graph.DEVICE_KIND_CPU
    return "cpu" if cpu else f"cuda:{device.index}"


def format_meta(meta) -> str:
    """`f32[2, 4, 8, 8]`, with `stride (256, 1, 32, 4)` and `offset 3` when not contiguous, and
    the device when it is not the CPU."""
    text = f"{_dtype_name(meta.dtype)}[{', '.join(str(s) for s in meta.sizes)}]"
    contiguous, step = [], 1
    for size in reversed(meta.sizes):
        contiguous.insert(0, step)
        step *= size
    # Strides of dims of size 1 do not matter (torch's is_contiguous ignores them too).
    if any(s != c and size != 1 for s, c, size in zip(meta.strides, contiguous, meta.sizes)):
        text += f" stride ({', '.join(str(s) for s in meta.strides)})"
    if meta.storage_offset:
        text += f" offset {meta.storage_offset}"
    if meta.device.kind != protocol.messages().graph.DEVICE_KIND_CPU:
        text += f" {_device_name(meta.device)}"
    return text


def _format_arg(a) -> str:
    pb = protocol.messages().graph
    kind = a.WhichOneof("kind")
    if kind == "value":
        text = f"%{a.value}"
    elif kind == "value_list":
        text = f"[{', '.join(f'%{v}' for v in a.value_list.ids)}]"
    elif kind == "int_list":
        text = f"[{', '.join(str(v) for v in a.int_list.values)}]"
    elif kind == "float_value":
        text = repr(a.float_value)
    elif kind == "dtype_value":
        text = _dtype_name(a.dtype_value)
    elif kind == "none":
        text = "None"
    elif kind == "string_value":
        text = repr(a.string_value)
    elif kind == "device_value":
        text = _device_name(a.device_value)
    elif kind == "memory_format_value":
        text = pb.MemoryFormat.Name(a.memory_format_value).removeprefix("MEMORY_FORMAT_").lower()
    elif kind == "layout_value":
        text = pb.Layout.Name(a.layout_value).removeprefix("LAYOUT_").lower()
    else:
        text = str(getattr(a, kind)) if kind else "?"  # int_value, bool_value
    return f"{a.name}={text}" if a.name else text
