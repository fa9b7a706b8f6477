"""An ATen op's call node as the lowering reads it: its arguments bound to its schema's names, its
arguments' fake values, and the error raised for what the kiln.v1 IR cannot express. Shared by
kiln.graph.ir, kiln.graph.input_updates and kiln.graph.layout, which each other's imports would
otherwise make a cycle."""
import torch


class LoweringError(Exception):
    """The graph uses something the kiln.v1 IR cannot express (the graph then runs eagerly)."""


def _bound_arguments(node: torch.fx.Node) -> dict:
    """Every argument of an ATen op's call node by its schema's names, defaults filled in."""
    return {a.name: (node.args[i] if i < len(node.args) else
                     node.kwargs.get(a.name, a.default_value))
            for i, a in enumerate(node.target._schema.arguments)}


def meta_values(value):
    """An FX argument with its nodes replaced by their values (meta["val"]: fake tensors), for
    running an op on as a trace would."""
    return torch.fx.node.map_aggregate(
        value, lambda v: v.meta["val"] if isinstance(v, torch.fx.Node) else v)
