"""A plan for every size that holds only where some sizes are 2 or more.

A capture admits a batch of 1 (kiln.graph.symbolic_shapes), but the lowering of its graph may
ask whether the batch is 1 where the capture did not: on a GPU, the choice of an attention
kernel does. The lowering then takes the batch as 2 or more (kiln.graph.symbolic_ir's
ShapeEnvUnchanged), and its plan is right only for such calls. SizeFloors is that plan with
where each such size is read from the graph's inputs: calls it does not admit run as the
graph's other calls without a plan do (kiln.backends.specialize), and a stored capture of it
guards the sizes (kiln.stored_capture)."""
from typing import Callable, List, Sequence, Tuple

import torch

from kiln.graph.symbolic_ir import NotSymbolic


class SizeFloors:
    """`plan`, for the calls whose sizes at `floors` ((input position, dimension or None for an
    int input, least)) are at least that: what kiln_backend.compile_symbolic returns for such a
    plan. Not itself called: PerSignature runs `plan` on the calls `admits` admits, with no
    layer between them."""

    def __init__(self, plan: Callable, floors: List[Tuple[int, object, int]]):
        self.plan = plan
        self.floors = floors

    def admits(self, args: Sequence) -> bool:
        for position, dim, least in self.floors:
            value = args[position]
            n = value if dim is None else value.shape[dim]
            if n < least:
                return False
        return True


def floor_positions(example_inputs: Sequence, floors: dict) -> List[Tuple[int, object, int]]:
    """Where each symbol of `floors` (symbol -> least) is an input's size or an int input of the
    graph; raises NotSymbolic where one is neither (no call could be checked)."""
    found = {}
    for i, value in enumerate(example_inputs):
        if isinstance(value, torch.SymInt) and value.node.expr in floors:
            found.setdefault(value.node.expr, (i, None))
        elif isinstance(value, torch.Tensor):
            for d, n in enumerate(value.shape):
                if isinstance(n, torch.SymInt) and n.node.expr in floors:
                    found.setdefault(n.node.expr, (i, d))
    missing = [str(s) for s in floors if s not in found]
    if missing:
        raise NotSymbolic(f"the lowering took {', '.join(missing)} as 2 or more, and no input's "
                          "size is it")
    return [(i, d, int(floors[s])) for s, (i, d) in found.items()]
