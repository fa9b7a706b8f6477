"""kiln.export: the whole function as one GraphModule plus its guards, or an error."""
from typing import List, NamedTuple

import torch

from kiln import eval_frame
from kiln.exc import Unsupported


class ExportResult(NamedTuple):
    graph_module: torch.fx.GraphModule
    guards: List[str]


class _Capture:
    def __init__(self):
        self.graphs = []
        self.infos = []

    def backend(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def entry(self, info):
        self.infos.append(info)

    def eager(self, code, error):
        pass


def export(fn, *args, **kwargs) -> ExportResult:
    """Captures `fn(*args, **kwargs)` (a function or nn.Module) as a single graph. Raises
    kiln.exc.Unsupported, naming the user's source line, at the first graph break. The graph
    takes the tensors the function reads, in placeholder order, and returns its tensor
    results."""
    capture = _Capture()
    callback = eval_frame.FrameCallback(capture.backend, fullgraph=True, observer=capture)
    result = eval_frame._wrap(fn, callback)(*args, **kwargs)
    if len(capture.graphs) != 1:
        raise Unsupported(f"export needs exactly one graph, capture made {len(capture.graphs)}"
                          " (a function with no tensor operations has none)")
    gm = capture.graphs[0]
    if isinstance(result, torch.Tensor):
        # A function returning one tensor exports as a graph returning that tensor.
        out = next(n for n in gm.graph.nodes if n.op == "output")
        if isinstance(out.args[0], (tuple, list)) and len(out.args[0]) == 1:
            out.args = (out.args[0][0],)
            gm.recompile()
    return ExportResult(gm, list(capture.infos[-1].guards))
