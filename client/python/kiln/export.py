"""kiln.export: the whole function as one GraphModule plus its guards, or an error."""
from typing import List, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

from kiln import eval_frame
from kiln.exc import Unsupported


class ExportResult(NamedTuple):
    graph_module: torch.fx.GraphModule
    guards: List[str]


class _Capture:
    def __init__(self):
        self.graphs = []
        self.infos = []
        self.outputs = None  # what the graph returned in the call that captured it
        self.inputs = None  # and what it was given

    def backend(self, gm, example_inputs):
        self.graphs.append(gm)

        def run(*args):
            self.inputs = args
            self.outputs = gm.forward(*args)
            return self.outputs

        return run

    def entry(self, info):
        self.infos.append(info)

    def eager(self, code, error):
        pass


_CONSTANT_LEAVES = (type(None), bool, int, float, str)


def export(fn, *args, aten_graph: bool = False, decomposition_table=None,
           tracing_mode: str = "real", **kwargs) -> ExportResult:
    """Captures `fn(*args, **kwargs)` (a function or nn.Module) as a single graph. Raises
    kiln.exc.Unsupported, naming the user's source line, at the first graph break. The graph
    takes the tensors the function reads, in placeholder order, and returns what the function
    returns: the same structure (tuples, lists, dicts, named tuples, model outputs), the same
    tensors where one is returned twice, and the same constants.

    aten_graph=True: the graph's nodes are ATen ops (torch.ops.aten.*), traced from the captured
    graph on fake tensors, with `decomposition_table` ({op: function}) applied. tracing_mode
    "real" and "fake" give the same graph (shapes are static); "symbolic" is refused."""
    if decomposition_table is not None and not aten_graph:
        raise ValueError("kiln.export: decomposition_table applies to an ATen graph only "
                         "(aten_graph=True)")
    if tracing_mode not in ("real", "fake"):
        raise ValueError(f"kiln.export: tracing_mode {tracing_mode!r}: kiln exports static "
                         "shapes ('real' or 'fake')")
    capture = _Capture()
    callback = eval_frame.FrameCallback(capture.backend, fullgraph=True, observer=capture)
    result = eval_frame._wrap(fn, callback)(*args, **kwargs)
    if len(capture.graphs) != 1:
        raise Unsupported(f"export needs exactly one graph, capture made {len(capture.graphs)}"
                          " (a function with no tensor operations has none)")
    stores = capture.infos[-1].extra.get("replayed_stores")
    if stores:
        raise Unsupported(f"export: the function assigns {', '.join(stores)}, which a graph "
                          "cannot do")
    gm = capture.graphs[0]
    if aten_graph:
        gm = _aten_graph(gm, capture.inputs, decomposition_table)
    _return_as_the_function_does(gm, result, capture.outputs)
    return ExportResult(gm, list(capture.infos[-1].guards))


def _aten_graph(gm: torch.fx.GraphModule, inputs, decomposition_table) -> torch.fx.GraphModule:
    """`gm` as a graph of ATen ops, traced on fake copies of `inputs` (the call the capture ran:
    nothing runs twice on the user's tensors); its outputs are `gm`'s, in order."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(gm, decomposition_table=decomposition_table or {}, tracing_mode="fake",
                   _allow_non_fake_inputs=True)(*inputs)


def _return_as_the_function_does(gm: torch.fx.GraphModule, result, graph_outputs):
    """Rewrites `gm` to return `result`'s structure: each tensor in it is the graph output the
    function returned it from, each other leaf a constant of the graph."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    nodes = list(output.args[0])
    leaves, out_spec = pytree.tree_flatten(result)
    values = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            i = next((i for i, t in enumerate(graph_outputs or ()) if t is leaf), None)
            if i is None:
                raise Unsupported("export: the function returns a tensor its graph does not "
                                  "compute")
            values.append(nodes[i])
        elif type(leaf) in _CONSTANT_LEAVES:
            values.append(leaf)
        else:
            raise Unsupported(f"export: the function returns a {type(leaf).__name__}, which "
                              "an exported graph cannot return as a constant")
    output.args = (tuple(values),)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    gm.graph._codegen = _PyTreeCodeGen(_PyTreeInfo(names, pytree.tree_flatten(names)[1],
                                                   out_spec))
    gm.recompile()
