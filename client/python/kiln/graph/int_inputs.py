"""Numbers a graph with symbolic sizes takes, for the kiln.v1 IR, whose graphs take tensors only
and read every size symbol from an input's dimension.

A capture may take an int that changes between calls as a symbol of its own (a static cache's
`max_cache_len`, which sizes the cache it allocates on its first call). Such an input is passed
to the compiled graph as a carrier: an empty tensor of sizes (n, 0), whose first dimension is
the number and whose storage is nothing; the graph reads the number as that size. Each call
makes (or reuses) the carrier of its number.

A number whose guards admit 0 is compiled for 1 and more (its range narrowed to start at 1, so
that a tensor it sizes, whose strides are Max(1, n), is carried as n): a call with 0 runs the
graph as it is.
"""
import functools
from typing import Callable, Dict, List, Optional, Tuple

import torch

from kiln.graph.symbolic_ir import NotSymbolic, ShapeEnvUnchanged, _finite, is_symbolic
from kiln.graph.symbolic_shapes import at_least


class IntInputs:
    """The positions of a graph's int inputs passed as carriers, on `device`, the least number
    the compiled graph takes at each, and the graph as it is (`fallback`) for smaller ones; None
    where the entry's guards admit no smaller one (a stored capture's record adds that
    guard: kiln.stored_capture)."""

    def __init__(self, positions: List[int], least: List[int], device: torch.device,
                 fallback: Callable):
        self.positions, self.least = positions, least
        self.fallback = fallback
        # Kept for the numbers seen last (a server's handful of cache lengths); safe to call
        # from several threads.
        self.carrier = functools.lru_cache(maxsize=64)(
            lambda n: torch.empty((n, 0), device=device))

    def tensors(self, args) -> list:
        """The compiled graph's inputs for the program graph's `args`."""
        out = list(args)
        for i in self.positions:
            out[i] = self.carrier(int(args[i]))
        return out

    def adapt(self, plan: Callable) -> Callable:
        """The program's graph over `plan`, the compiled graph that takes carriers."""
        # Checked at each call only where a smaller number can reach it.
        pairs = list(zip(self.positions, self.least)) if self.fallback is not None else []

        def call(*args):
            for i, least in pairs:
                if args[i] < least:
                    return self.fallback(*args)
            return plan(*self.tensors(args))

        call.plan = plan
        call.int_inputs = self
        return call


def as_carriers(gm: torch.fx.GraphModule, example_inputs: list
                ) -> Tuple[torch.fx.GraphModule, list, Optional[IntInputs]]:
    """(`gm`, `example_inputs`, None) when every input is a tensor; else a copy of `gm` in which
    each int input whose value is a symbol of the capture's is a carrier (its uses read the
    carrier's first size; its fake is the carrier's, made over the same symbol), the example
    inputs with those fakes in the ints' places, and the IntInputs that makes each call's
    carriers. Raises NotSymbolic for another kind of input (a float, a static number), or a
    number the guards admit negative (no size could carry it)."""
    values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if all(isinstance(v, torch.Tensor) for v in values):
        return gm, example_inputs, None
    fakes = [v for v in values if isinstance(v, torch.Tensor)]
    if not fakes:
        raise NotSymbolic("the graph takes no tensor")
    mode, device = fakes[0].fake_mode, fakes[0].device
    graph = torch.fx.Graph()
    copies: Dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    examples = list(example_inputs)
    positions, least = [], []
    for i, (node, value) in enumerate(zip(placeholders, values)):
        if isinstance(value, torch.Tensor):
            continue
        if isinstance(value, bool) or not is_symbolic(value):
            raise NotSymbolic(f"a graph input of type {type(value).__name__}")
        env = value.node.shape_env
        vr = env.var_to_range.get(value.node.expr)
        lower = _finite(vr.lower) if vr is not None else None
        if lower is None or lower < 0:
            raise NotSymbolic(f"an int input {value.node.expr} that its guards admit negative")
        if lower == 0:
            # Calls with 0 run the graph as it is (IntInputs.adapt): the lowering may take the
            # number as 1 or more, as the capture takes a tensor's symbolic size.
            at_least(env, value, 1)
        least.append(max(lower, 1))
        with ShapeEnvUnchanged(env), mode:
            carrier = torch.empty((value, 0), device=device)
        node.meta["example_value"] = examples[i] = carrier
        with graph.inserting_after(node):
            size = graph.call_function(torch.ops.aten.sym_size.int, (node, 0))
        size.meta["example_value"] = value
        node.replace_all_uses_with(size, delete_user_cb=lambda user: user is not size)
        positions.append(i)
    return (torch.fx.GraphModule(gm, graph), examples,
            IntInputs(positions, least, device, gm.forward))
