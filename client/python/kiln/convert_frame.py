"""From a frame the hook could not answer to a cache entry: capture, call the backend, write
the transformed code, build the guard tree. Also decides which frames kiln never looks at."""
import dis
import io
import itertools
import logging
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from kiln import _C, config
from kiln.capture.graph_break import GraphBreak
from kiln.exc import BackendCompilerFailed, Unsupported
from kiln.graph.output_graph import OutputGraph, realized
from kiln.transform.codegen import ConstTable, Reconstructor, transformed_code
from kiln.transform.resume import make_resume_code
from kiln.variables.base import NullVariable
from kiln.variables.side_effects import finish as finish_attribute_stores
from kiln.variables.side_effects import mutations_of

log = logging.getLogger("kiln")

_compile_ids = itertools.count()
_resume_ids = itertools.count(1)


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


# -- capture -----------------------------------------------------------------------------------

def convert_frame(func, code, slots, backend, backend_name: str, fullgraph: bool = False):
    """Captures the frame of `func` about to run with argument `slots`. Returns the hook's
    (guard_manager, transformed_code, info). Raises Unsupported (a frame kiln cannot capture
    even in part, or any break with fullgraph) or BackendCompilerFailed."""
    t0 = time.perf_counter()
    output = OutputGraph()
    tx = _C.Translator.root(func, code, slots, output, may_break=not fullgraph)
    graph_break = None
    grad_enabled = torch.is_grad_enabled()
    try:
        result = tx.run()
    except GraphBreak as gb:
        graph_break = gb
        graph_ckpt, mutations_ckpt = gb.checkpoint.graph
        output.restore(graph_ckpt)
        mutations_of(output).restore(mutations_ckpt)
    finally:
        torch._C._set_grad_enabled(grad_enabled)  # `with no_grad()` in the trace switched it
    output.guards.add(None, "GLOBAL_STATE")
    output.guard_distinct_inputs()
    finish_attribute_stores(output)  # held attribute assignments: dropped if net unchanged

    consts = ConstTable()
    op_count = output.count_calls()
    rebuild = Reconstructor(consts, use_graph=op_count > 0)
    if graph_break is None:
        body = [f"return {rebuild(result)}"]
        resumes = []
    else:
        body, resumes = _break_body(func, code, graph_break, rebuild, consts)
    body = rebuild.prelude + body
    compile_id = next(_compile_ids)
    name = f"__compiled_fn_{compile_id}"
    gm = None
    compiled = None
    call_expr = ""
    t1 = time.perf_counter()
    if op_count > 0:
        gm = output.make_graph_module(rebuild.outputs.nodes, name)
        example_inputs = [inp.example for inp in output.inputs]
        try:
            compiled = backend(gm, example_inputs)
        except Exception as e:
            raise BackendCompilerFailed(backend_name, e) from e
        compiled = realized(compiled, gm)
        if not callable(compiled):
            raise BackendCompilerFailed(backend_name, TypeError(
                f"backend returned {type(compiled).__name__}, not a callable"))
        region = _C.FrameRegion(compiled, None)  # what the graph runs is never captured
        args = ", ".join(inp.source.expr(consts) for inp in output.inputs)
        call_expr = f"{consts.ref(region)}({args})"
    t2 = time.perf_counter()
    new_code, src = transformed_code(code, len(slots), call_expr, body, consts)
    guards = output.guards.describe()
    manager = output.guards.build(guards, code=code)
    info = EntryInfo(compile_id=compile_id, name=name, graph_module=gm, compiled_fn=compiled,
                     guards=guards, original_code=code,
                     transformed_code=new_code, transformed_source=src, op_count=op_count,
                     capture_seconds=t1 - t0, backend_seconds=t2 - t1)
    if graph_break is not None:
        info.break_reason = graph_break.reason
        info.break_where = graph_break.where
        info.resume_codes = resumes
    _print_debug(info)
    return manager, new_code, info


def _break_body(func, code, gb, rebuild, consts):
    """Statements that finish the frame after its graph: run the breaking instruction in
    Python, then return what a resume function computes from there."""
    inst = gb.inst
    ckpt = gb.checkpoint
    stack = list(ckpt.stack)
    varnames = code.co_varnames
    unbound = [n for n in varnames if n not in ckpt.locals]
    local_exprs = [rebuild(ckpt.locals[n]) if n in ckpt.locals else "None" for n in varnames]
    next_offset = inst.next_offset
    body = []
    resumes = []

    def resume_call(target_offset, stack_vts):
        """A call of a new resume function; `stack_vts` holds trackers, or expressions (str)."""
        is_null = [isinstance(v, NullVariable) for v in stack_vts]
        n = next(_resume_ids)
        rname = f"__resume_at_{target_offset}_{n}"
        rcode = make_resume_code(code, target_offset, is_null, unbound, rname)
        fn = types.FunctionType(rcode, func.__globals__, rname)
        resumes.append(rcode)
        args = local_exprs + [v if isinstance(v, str) else rebuild(v)
                              for v in stack_vts if not isinstance(v, NullVariable)]
        return f"{consts.ref(fn)}({', '.join(args)})"

    if inst.opname == "CALL":
        argc = inst.arg
        kw_names = ckpt.kw_names or ()
        args = stack[len(stack) - argc:]
        fn = stack[len(stack) - argc - 1]
        below = stack[len(stack) - argc - 2]
        rest = stack[:len(stack) - argc - 2]
        if not isinstance(below, NullVariable):  # [callable, self, args...]
            args = [fn, *args]
            fn = below
        npos = len(args) - len(kw_names)
        parts = [rebuild(a) for a in args[:npos]]
        parts += [f"{k}={rebuild(v)}" for k, v in zip(kw_names, args[npos:])]
        body.append(f"__kiln_r = {rebuild(fn)}({', '.join(parts)})")
        body.append(f"return {resume_call(next_offset, rest + ['__kiln_r'])}")
    elif inst.opname == "CALL_FUNCTION_EX":
        kwargs_vt = stack[-1] if inst.arg & 1 else None
        rest = stack[:-1] if kwargs_vt is not None else stack
        args_vt, fn, below, rest = rest[-1], rest[-2], rest[-3], rest[:-3]
        call = f"{rebuild(fn)}(*{rebuild(args_vt)}"
        if kwargs_vt is not None:
            call += f", **{rebuild(kwargs_vt)}"
        if not isinstance(below, NullVariable):
            raise Unsupported("CALL_FUNCTION_EX without NULL")
        body.append(f"__kiln_r = {call})")
        body.append(f"return {resume_call(next_offset, rest + ['__kiln_r'])}")
    elif inst.opname.startswith("POP_JUMP"):
        cond = stack[-1]
        rest = stack[:-1]
        jump_if_true = "IF_TRUE" in inst.opname
        taken = resume_call(inst.argval, rest)
        fallthrough = resume_call(next_offset, rest)
        body.append(f"if {rebuild(cond)}:")
        body.append(f"    return {taken if jump_if_true else fallthrough}")
        body.append(f"return {fallthrough if jump_if_true else taken}")
    else:
        raise Unsupported(f"no graph break at {inst.opname}")
    return body, resumes


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
