"""kiln.explain: what capture made of a function — graphs, graph breaks and why, ops, guards."""
from dataclasses import dataclass, field
from typing import List

import torch

from kiln import eval_frame


@dataclass
class BreakReason:
    reason: str
    where: str  # the user's file, line and instruction

    def __str__(self):
        return f"{self.reason}\n{self.where}"


@dataclass
class ExplainOutput:
    graphs: List[torch.fx.GraphModule] = field(default_factory=list)
    graph_count: int = 0
    graph_break_count: int = 0
    break_reasons: List[BreakReason] = field(default_factory=list)
    op_count: int = 0
    ops_per_graph: List[List[str]] = field(default_factory=list)
    out_guards: List[str] = field(default_factory=list)
    compile_seconds: float = 0.0

    def __iter__(self):
        """The tuple TorchDynamo's explain returned: explanation, out_guards, graphs,
        ops_per_graph, break_reasons, explanation_verbose."""
        summary = (f"kiln produced {self.graph_count} graphs with {self.graph_break_count} "
                   f"graph breaks and {self.op_count} ops")
        return iter((summary, self.out_guards, self.graphs, self.ops_per_graph,
                     self.break_reasons, str(self)))

    def __str__(self):
        lines = [f"Graph Count: {self.graph_count}",
                 f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}",
                 "Break Reasons:"]
        for i, br in enumerate(self.break_reasons, 1):
            lines.append(f"  Break Reason {i}:")
            lines.append(f"    Reason: {br.reason}")
            lines.extend("    " + l for l in br.where.splitlines())
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph, 1):
            lines.append(f"  Ops {i}:")
            lines.extend(f"    {op}" for op in ops)
        lines.append("Out Guards:")
        lines.extend(f"  - {g}" for g in self.out_guards)
        lines.append(f"Compile Time: {self.compile_seconds:.4f} s")
        return "\n".join(lines)


class _Recorder:
    def __init__(self):
        self.out = ExplainOutput()

    def backend(self, gm, example_inputs):
        self.out.graphs.append(gm)
        from kiln.graph.output_graph import call_nodes

        ops = [_op_name(n) for n in call_nodes(gm.graph)]
        self.out.ops_per_graph.append(ops)
        self.out.op_count += len(ops)
        return gm.forward

    def entry(self, info):
        self.out.out_guards.extend(info.guards)
        self.out.compile_seconds += info.capture_seconds + info.backend_seconds
        if info.break_reason is not None:
            self.out.break_reasons.append(BreakReason(info.break_reason, info.break_where))

    def eager(self, code, error):
        where = getattr(error, "source_line", "") or (
            f'  File "{code.co_filename}", line {code.co_firstlineno}, in {code.co_name}')
        self.out.break_reasons.append(BreakReason(
            f"frame ran eagerly: {getattr(error, 'reason', error)}", where))


def _op_name(node) -> str:
    target = node.target
    if isinstance(target, str):
        return f"Tensor.{target}" if node.op == "call_method" else target
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", repr(target))
    return f"{module}.{name}" if module else name


def explain(fn, *args, **kwargs):
    """kiln.explain(fn)(*args) or kiln.explain(fn, *args): runs fn once under a recording
    backend (after kiln.reset()) and reports the graphs, breaks, ops and guards."""

    def run(*a, **k):
        eval_frame.reset()
        recorder = _Recorder()
        callback = eval_frame.FrameCallback(recorder.backend, fullgraph=False, observer=recorder)
        eval_frame._wrap(fn, callback)(*a, **k)
        out = recorder.out
        out.graph_count = len(out.graphs)
        out.graph_break_count = len(out.break_reasons)
        return out

    if args or kwargs:
        return run(*args, **kwargs)
    return run
