"""Helpers for tests of code that uses kiln: a backend that counts what it is given."""
import torch


class CompileCounter:
    """A backend recording how many graphs it compiled and how many ops they had."""

    def __init__(self):
        self.frame_count = 0
        self.op_count = 0
        self.graphs = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes
                             if n.op in ("call_function", "call_method", "call_module"))
        self.graphs.append(gm)
        return gm.forward

    def clear(self):
        self.frame_count = 0
        self.op_count = 0
        self.graphs = []
