"""From a frame the hook could not answer to a cache entry: capture, call the backend, write
the transformed code, build the guard tree. Also decides which frames kiln never looks at."""
import dis
import io
import itertools
import logging
import os
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from kiln import _C, config
from kiln.capture.symbolic_executor import InstructionTranslator
from kiln.exc import BackendCompilerFailed, Unsupported
from kiln.graph.output_graph import OutputGraph
from kiln.transform.codegen import ConstTable, OutputCollector, reconstruct, transformed_code

log = logging.getLogger("kiln")

_compile_ids = itertools.count()


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
    extra: dict = field(default_factory=dict)


# -- which frames kiln never captures ---------------------------------------------------------

def _dir_of(module_file: str) -> str:
    return os.path.dirname(os.path.abspath(module_file)) + os.sep


_TORCH_DIR = _dir_of(torch.__file__)
_KILN_DIR = _dir_of(__file__)
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                      for k in ("stdlib", "platstdlib")})
_THIRD_PARTY_SKIPPED = ("numpy", "scipy", "_pytest", "pytest", "pluggy", "typing_extensions")
_TORCH_NN_MODULES_DIR = os.path.join(_TORCH_DIR, "nn", "modules") + os.sep


def is_skipped(code) -> bool:
    """True for code kiln leaves to CPython: its own, torch's internals, the standard library."""
    filename = code.co_filename
    if filename.startswith(_KILN_DIR):
        return True
    if filename.startswith(_TORCH_DIR):
        # torch.nn's modules are models too: their forward methods are captured.
        return not (filename.startswith(_TORCH_NN_MODULES_DIR) and code.co_name == "forward")
    if filename.startswith(_STDLIB_DIRS) and "site-packages" not in filename:
        return True
    if filename.startswith("<") and filename.startswith(("<frozen", "<kiln")):
        return True
    for pkg in _THIRD_PARTY_SKIPPED:
        if f"{os.sep}site-packages{os.sep}{pkg}{os.sep}" in filename:
            return True
    return False


# -- capture -----------------------------------------------------------------------------------

def convert_frame(func, code, slots, backend, backend_name: str):
    """Captures the frame of `func` about to run with argument `slots`. Returns the hook's
    (guard_manager, transformed_code, info). Raises Unsupported or BackendCompilerFailed."""
    t0 = time.perf_counter()
    output = OutputGraph()
    output.root_globals = func.__globals__
    tx = InstructionTranslator(func, code, slots, output)
    result = tx.run()
    output.guards.add(None, "GLOBAL_STATE")

    consts = ConstTable()
    outputs = OutputCollector()
    return_expr = reconstruct(result, consts, outputs)
    compile_id = next(_compile_ids)
    name = f"__compiled_fn_{compile_id}"
    gm = None
    compiled = None
    call_expr = ""
    op_count = output.count_calls()
    t1 = time.perf_counter()
    if op_count == 0:
        # Nothing to compile: the return value is rebuilt from the sources of its tensors.
        return_expr = _rebuild_without_graph(result, consts, output)
    else:
        gm = output.make_graph_module(outputs.nodes, name)
        example_inputs = [inp.example for inp in output.inputs]
        try:
            compiled = backend(gm, example_inputs)
        except Exception as e:
            raise BackendCompilerFailed(backend_name, e) from e
        if not callable(compiled):
            raise BackendCompilerFailed(backend_name, TypeError(
                f"backend returned {type(compiled).__name__}, not a callable"))
        region = _C.FrameRegion(compiled, None)  # what the graph runs is never captured
        args = ", ".join(inp.source.expr(consts) for inp in output.inputs)
        call_expr = f"{consts.ref(region)}({args})"
    t2 = time.perf_counter()
    nslots = len(slots)
    new_code, src = transformed_code(code, nslots, call_expr, return_expr, consts)
    manager = output.guards.build()
    info = EntryInfo(compile_id=compile_id, name=name, graph_module=gm, compiled_fn=compiled,
                     guards=output.guards.describe(), original_code=code,
                     transformed_code=new_code, transformed_source=src, op_count=op_count,
                     capture_seconds=t1 - t0, backend_seconds=t2 - t1)
    _print_debug(info)
    return manager, new_code, info


def _rebuild_without_graph(result, consts, output):
    """With no ops recorded, every tensor in the result is a graph input or module attribute:
    reload it from its source rather than running an empty graph."""
    from kiln.variables.tensor import TensorVariable

    class _SourceOutputs:
        def slot(self, tensor):
            raise AssertionError

    def rebuild(vt):
        if isinstance(vt, TensorVariable):
            if vt.source is None:
                raise Unsupported("a returned tensor with no source")
            return vt.source.expr(consts)
        from kiln.variables.containers import BaseListVariable, ListVariable

        if isinstance(vt, BaseListVariable):
            parts = [rebuild(v) for v in vt.items]
            if isinstance(vt, ListVariable):
                return "[" + ", ".join(parts) + "]"
            return "(" + "".join(p + ", " for p in parts) + ")"
        return reconstruct(vt, consts, _SourceOutputs())

    return rebuild(result)


def _print_debug(info: EntryInfo):
    if not (config.logs("graph") or config.logs("bytecode") or config.logs("guards")):
        return
    out = io.StringIO()
    if config.logs("graph"):
        out.write(f"\n{info.name}\n")
        if info.graph_module is not None:
            out.write(format_graph_tabular(info.graph_module.graph) + "\n")
        else:
            out.write("(no ops: nothing to compile)\n")
    if config.logs("bytecode"):
        out.write("\nORIGINAL BYTECODE\n")
        dis.dis(info.original_code, file=out)
        out.write("\nMODIFIED BYTECODE\n")
        dis.dis(info.transformed_code, file=out)
    if config.logs("guards"):
        out.write("\nGUARDS:\n")
        for g in info.guards:
            out.write(f" - {g}\n")
    sys.stderr.write(out.getvalue())


def format_graph_tabular(graph: torch.fx.Graph) -> str:
    """The table print_tabular shows, without its optional dependency."""
    rows = [("opcode", "name", "target", "args", "kwargs")]
    for n in graph.nodes:
        rows.append((n.op, n.name, str(n.target), str(n.args), str(n.kwargs)))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(rows[0], widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for r in rows[1:]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)
