"""Helpers for tests of code that uses kiln: a backend that counts what it is given, and a call
that is always a graph break."""
import torch

from kiln.eval_frame import disable
from kiln.graph.output_graph import call_nodes


class CompileCounter:
    """A backend recording how many graphs it compiled and how many ops they had."""

    def __init__(self):
        self.frame_count = 0
        self.op_count = 0
        self.graphs = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.frame_count += 1
        self.op_count += len(call_nodes(gm.graph))
        self.graphs.append(gm)
        return gm.forward

    def clear(self):
        self.frame_count = 0
        self.op_count = 0
        self.graphs = []


@disable
def unsupported(a, b):
    """Returns `b` through a call kiln never captures: each call of it from a compiled frame is
    a graph break, with `a` and `b` computed before it (torch._dynamo's test helper of that
    name does the same)."""
    return b
