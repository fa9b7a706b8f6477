"""Outputs other than tensors, for the kiln.v1 IR, whose graphs return tensors only.

A capture with symbolic sizes may return a size it computed (the batch size a decoder's cache
stores as an attribute on its first call); an AOT backward graph returns None for gradients no
input needs. Such an output is left out of the compiled graph's; each call puts it back in its
place: a constant as it is, a size read from the call's inputs, where its symbol is exactly one
input dimension.
"""
from typing import Callable, Dict, List, Optional, Tuple

import sympy
import torch

from kiln.graph.symbolic_ir import NotSymbolic


class SizeOutputs:
    """Where each output of the program's graph comes from: ("tensor", i), the compiled graph's
    i-th output; ("size", (argument, dim)), that dimension of that argument of the call;
    ("constant", value)."""

    def __init__(self, outputs: List[Tuple[str, object]]):
        self.outputs = outputs

    def results(self, tensors, args) -> list:
        out = []
        for kind, where in self.outputs:
            if kind == "tensor":
                out.append(tensors[where])
            elif kind == "size":
                arg, dim = where
                out.append(args[arg].shape[dim])
            else:
                out.append(where)
        return out

    def adapt(self, plan: Callable) -> Callable:
        """The program's graph over `plan`, the compiled tensors-only graph."""
        def call(*args):
            return self.results(plan(*args), args)

        call.plan = plan
        call.size_outputs = self
        return call


def tensors_only(gm: torch.fx.GraphModule
                 ) -> Tuple[torch.fx.GraphModule, Optional[SizeOutputs]]:
    """(`gm`, None) when the graph returns tensors only; else a copy of `gm` that returns its
    tensors, and the SizeOutputs that puts the other outputs back. Raises NotSymbolic for a
    value the graph computes that is neither a tensor nor exactly one input dimension's size (an
    expression of sizes, a number it reads)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = output.args[0]
    if not isinstance(results, (tuple, list)) or all(_is_tensor_node(r) for r in results):
        return gm, None
    # Where each symbol is read: the first input dimension whose size is exactly it.
    source: Dict[sympy.Symbol, Tuple[int, int]] = {}
    for i, p in enumerate(placeholders):
        v = _value(p)
        if isinstance(v, torch.Tensor):
            for d, size in enumerate(v.shape):
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    source.setdefault(size.node.expr, (i, d))
    graph = torch.fx.Graph()
    copies: Dict[torch.fx.Node, torch.fx.Node] = {}
    graph.graph_copy(gm.graph, copies)
    kept, outputs = [], []
    for r in results:
        if _is_tensor_node(r):
            outputs.append(("tensor", len(kept)))
            kept.append(copies[r])
            continue
        value = _value(r) if isinstance(r, torch.fx.Node) else r
        if isinstance(value, torch.SymInt) and value.node.expr in source:
            outputs.append(("size", source[value.node.expr]))
        elif not isinstance(r, torch.fx.Node):  # a constant (a backward's None gradient)
            outputs.append(("constant", value))
        else:
            raise NotSymbolic(f"the graph returns {value!r}, which is not a size of an input")
    graph.output(tuple(kept))
    return torch.fx.GraphModule(gm, graph), SizeOutputs(outputs)


def _value(node):
    return node.meta.get("example_value", node.meta.get("val"))


def _is_tensor_node(r) -> bool:
    return isinstance(r, torch.fx.Node) and isinstance(_value(r), torch.Tensor)
