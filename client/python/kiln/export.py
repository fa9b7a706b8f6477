"""kiln.export: the whole function as one GraphModule plus its guards, or an error."""
import inspect
from typing import List, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch.fx.graph import CodeGen, _PyTreeCodeGen, _PyTreeInfo

from kiln import eval_frame
from kiln.exc import ExportOptionError, Unsupported
from kiln.graph import output_graph


class ExportResult(NamedTuple):
    graph_module: torch.fx.GraphModule
    guards: List[str]


class _GraphScalar:
    """Stands, in the one run of an exported frame, for a number its graph returns
    (Tensor.item() under config.capture_scalar_outputs), so that the function's result shows
    which of its numbers the graph computed: by value or identity one cannot tell a computed
    0 or True from a constant one. The transformed code only places graph outputs into the
    result (it computes nothing on them)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


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
            if self.infos and self.infos[-1].extra.get("replayed_stores"):
                return self.outputs  # export refuses it; what it assigns is the graph's own
            return tuple(o if isinstance(o, torch.Tensor) else _GraphScalar(i)
                         for i, o in enumerate(self.outputs))

        return run

    def entry(self, info):
        self.infos.append(info)

    def eager(self, code, error):
        pass


_CONSTANT_LEAVES = (type(None), bool, int, float, str)


def export(fn, *args, aten_graph: bool = False, decomposition_table=None,
           tracing_mode: str = "real", **kwargs) -> ExportResult:
    """Captures `fn(*args, **kwargs)` (a function or nn.Module) as a single graph. Raises
    kiln.exc.Unsupported, naming the user's source line, at the first graph break.

    The graph takes the function's inputs flattened as torch.utils._pytree flattens
    `(args, kwargs)`, every leaf in order, those it does not read and those that are no
    tensors included (as TorchDynamo's export and torch.export do): call it as
    `gm(*pytree.tree_flatten((args, kwargs))[0])`, `gm(*args)` where the arguments are tensors
    and numbers. What the capture specialised on (a number, a tensor's shape) is baked in, and
    the guards say what that was. A tensor the function reads from elsewhere (a global, an
    attribute of an object) is held by the module, as its parameters are. `gm._in_spec` is
    the structure of `(args, kwargs)`, `gm._out_spec` that of the result: the graph returns
    what the function returns, the same structure (tuples, lists, dicts, named tuples, model
    outputs), the same tensors where one is returned twice, an input returned as the input,
    and the same constants.

    aten_graph=True: the graph's nodes are ATen ops (torch.ops.aten.*), traced from the captured
    graph on fake tensors, with `decomposition_table` ({op: function}) applied. tracing_mode
    "real" and "fake" give the same graph (shapes are static); "symbolic" is refused
    (kiln.exc.ExportOptionError, a ValueError). Each node keeps the stack_trace the capture
    gave it (the executor's location where it recorded the node), an ATen node that of the node
    it came from."""
    if decomposition_table is not None and not aten_graph:
        raise ExportOptionError("kiln.export: decomposition_table applies to an ATen graph "
                                "only (aten_graph=True)")
    if tracing_mode not in ("real", "fake"):
        raise ExportOptionError(f"kiln.export: tracing_mode {tracing_mode!r}: kiln exports "
                                "static shapes ('real' or 'fake')")
    capture = _Capture()
    callback = eval_frame.FrameCallback(capture.backend, fullgraph=True, observer=capture)
    with output_graph.recording_locations():
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
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    placeholders = _take_flat_inputs(gm, capture.inputs, leaves, _input_names(fn, args, kwargs))
    _return_as_the_function_does(gm, result, capture.outputs, list(zip(placeholders, leaves)),
                                 in_spec)
    return ExportResult(gm, list(capture.infos[-1].guards))


def _aten_graph(gm: torch.fx.GraphModule, inputs, decomposition_table) -> torch.fx.GraphModule:
    """`gm` as a graph of ATen ops, traced on fake copies of `inputs` (the call the capture ran:
    nothing runs twice on the user's tensors); its outputs are `gm`'s, in order. `gm` runs node
    by node, so that each ATen node keeps the stack_trace of the node it came from."""
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    def run(*args):
        with fx_traceback.preserve_node_meta():
            return torch.fx.Interpreter(gm).run(*args)

    return make_fx(run, decomposition_table=decomposition_table or {}, tracing_mode="fake",
                   _allow_non_fake_inputs=True)(*inputs)


def _input_names(fn, args, kwargs) -> List[str]:
    """A name for each leaf of `(args, kwargs)`: its parameter's (`x`, or `x_0`, `x_1`, ... for
    the leaves of one argument), `argN` where the signature does not say."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        params = [p.name for p in inspect.signature(target).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # a builtin, a callable without a signature
        params = []
    named = [(params[i] if i < len(params) else f"arg{i}", a) for i, a in enumerate(args)]
    names = []
    for base, value in [*named, *kwargs.items()]:
        n = len(pytree.tree_leaves(value))
        names += [base] if n == 1 else [f"{base}_{i}" for i in range(n)]
    return names


def _take_flat_inputs(gm: torch.fx.GraphModule, graph_inputs, leaves, names) -> list:
    """Rewrites `gm`, whose placeholders took `graph_inputs` (the tensors the capture read, in
    order), to take `leaves` instead: one placeholder per leaf. A placeholder whose tensor is a
    leaf becomes that leaf's (the first one, where the function was given one tensor twice); a
    tensor that is none (a global, an object's attribute) becomes an attribute of `gm`.
    Returns the new placeholders."""
    graph = gm.graph
    old = [n for n in graph.nodes if n.op == "placeholder"]
    if len(old) != len(graph_inputs or ()):
        raise Unsupported(f"export: the graph takes {len(old)} inputs but was called with "
                          f"{len(graph_inputs or ())}")
    with graph.inserting_before(next(iter(graph.nodes), None)):
        new = [graph.placeholder(name) for name in names]
    for node, value in zip(old, graph_inputs):
        j = next((j for j, leaf in enumerate(leaves) if leaf is value), None)
        if j is not None:
            replacement = new[j]
        else:
            target = _free_attr_name(gm, node.name)
            if isinstance(value, torch.nn.Parameter):
                gm.register_parameter(target, value)
            else:
                gm.register_buffer(target, value)
            with graph.inserting_before(node):
                replacement = graph.get_attr(target)
        replacement.meta.update(node.meta)
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
    return new


def _free_attr_name(gm: torch.nn.Module, base: str) -> str:
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name


def _return_as_the_function_does(gm: torch.fx.GraphModule, result, graph_outputs, inputs,
                                 in_spec):
    """Rewrites `gm` to return `result`'s structure: each tensor in it the graph output the
    function returned it from, or the input (placeholder, leaf) or held tensor it is; each other
    number the graph computed (a _GraphScalar) its graph output, each other leaf a constant of
    the graph."""
    graph = gm.graph
    output = next(n for n in graph.nodes if n.op == "output")
    nodes = list(output.args[0])
    # The tensors the graph took, by identity: placeholders first, then those it now holds.
    taken = list(inputs)
    taken += [(n, getattr(gm, n.target)) for n in graph.nodes if n.op == "get_attr"]
    leaves, out_spec = pytree.tree_flatten(result)
    values = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            node = next((nodes[i] for i, t in enumerate(graph_outputs or ()) if t is leaf), None)
            if node is None:
                node = next((n for n, t in taken if t is leaf), None)
            if node is None:
                raise Unsupported("export: the function returns a tensor its graph does not "
                                  "compute")
            values.append(node)
        elif isinstance(leaf, _GraphScalar):
            values.append(nodes[leaf.index])
        elif type(leaf) in _CONSTANT_LEAVES:
            values.append(leaf)
        else:
            raise Unsupported(f"export: the function returns a {type(leaf).__name__}, which "
                              "an exported graph cannot return as a constant")
    output.args = (tuple(values),)
    graph._codegen = _FlatInputsCodeGen(_PyTreeInfo([p.name for p, _ in inputs], in_spec,
                                                    out_spec))
    # Its code now, lazy module or not: gm._in_spec and gm._out_spec are set when it is written.
    gm.recompile()
    if hasattr(gm, "real_recompile"):
        gm.real_recompile()


class _FlatInputsCodeGen(_PyTreeCodeGen):
    """The code of an exported graph: `forward` takes the flattened inputs as they are (its
    pytree info's in_spec says how they nest) and returns the function's structure."""

    def gen_fn_def(self, free_vars, maybe_return_annotation, **kwargs):
        return CodeGen.gen_fn_def(self, free_vars, maybe_return_annotation, **kwargs)
