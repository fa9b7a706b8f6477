"""0-dim CPU tensors among the inputs of a graph on a GPU.

Eager CUDA ops take a 0-dim CPU tensor as a number: transformers' static cache keeps its length
as `torch.tensor(0)` on the CPU until its first update moves it to the cache's device, so a
prefill's graph reads one beside tensors on the GPU. A graph of one device is what kilnd
compiles; such a graph is compiled with that input as a 0-dim tensor on the graph's device,
copied there at each call, where that changes nothing the program sees: no op of the graph writes
into a CPU tensor, and no output of the graph is one. Otherwise the graph runs as it is.
"""
import operator
from typing import Callable, List, Optional, Tuple

import torch


class CpuScalars:
    """The positions of a graph's 0-dim CPU inputs, copied to `device` at each call."""

    def __init__(self, positions: List[int], device: torch.device):
        self.positions, self.device = positions, device

    def tensors(self, args) -> list:
        """The compiled graph's inputs for the program graph's `args`."""
        out = list(args)
        for i in self.positions:
            out[i] = args[i].to(self.device)  # a copy: the program's tensor is never written
        return out

    def adapt(self, plan: Callable) -> Callable:
        """The program's graph over `plan`, the compiled graph that takes them on the device."""

        def call(*args):
            return plan(*self.tensors(args))

        call.plan = plan
        call.cpu_scalars = self
        return call


def _is_cpu_scalar(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0


def _example(node):
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


# Writes that name no trailing underscore: Python's augmented assignments and item stores.
_IN_PLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv,
                       operator.ifloordiv, operator.imod, operator.ipow, operator.iand,
                       operator.ior, operator.ixor, operator.ilshift, operator.irshift,
                       operator.imatmul, operator.setitem, operator.delitem}
_IN_PLACE_DUNDERS = {f"__{op.__name__}__" for op in _IN_PLACE_OPERATORS}


def _writes(node: torch.fx.Node) -> bool:
    """Whether `node` writes into its first argument (or its out= tensor)."""
    target = node.target
    if node.op == "call_method":
        name = target
    else:
        schema = getattr(target, "_schema", None)  # an ATen overload: its schema says
        if schema is not None:
            return schema.is_mutable
        if target in _IN_PLACE_OPERATORS:
            return True
        name = getattr(target, "__name__", "")
    if not isinstance(name, str):
        return False
    return name in _IN_PLACE_DUNDERS or (name.endswith("_") and not name.endswith("__"))


def _writes_a_cpu_tensor(node: torch.fx.Node) -> bool:
    first = _example(node.args[0]) if node.args else None
    if _writes(node) and isinstance(first, torch.Tensor) and first.device.type == "cpu":
        return True
    out = _example(node.kwargs.get("out"))
    return isinstance(out, torch.Tensor) and out.device.type == "cpu"


def on_device(gm: torch.fx.GraphModule, example_inputs: list, params: list
              ) -> Tuple[torch.fx.GraphModule, list, Optional[CpuScalars]]:
    """(`gm`, `example_inputs`, None) unless the graph's other tensors are on one GPU and some
    inputs are 0-dim CPU tensors that it may take on that GPU (see the module docstring); then
    the graph with those inputs' examples (and its placeholders' fakes) on the GPU, the
    examples, and the CpuScalars that copies each call's."""
    positions = [i for i, t in enumerate(example_inputs) if _is_cpu_scalar(t)]
    if not positions or \
            sum(n.op == "placeholder" for n in gm.graph.nodes) != len(example_inputs):
        return gm, example_inputs, None
    devices = {t.device for t in [*params, *example_inputs]
               if isinstance(t, torch.Tensor) and not _is_cpu_scalar(t)}
    if len(devices) != 1:
        return gm, example_inputs, None
    device = devices.pop()
    if device.type != "cuda":
        return gm, example_inputs, None
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    outputs = []
    torch.fx.node.map_arg(output.args, outputs.append)
    if any(isinstance(_example(n), torch.Tensor) and _example(n).device.type == "cpu"
           for n in outputs):
        return gm, example_inputs, None
    if any(n.op in ("call_function", "call_method") and _writes_a_cpu_tensor(n)
           for n in gm.graph.nodes):
        return gm, example_inputs, None
    graph = torch.fx.Graph()  # a copy: the program's graph keeps its fakes on the CPU
    graph.output(graph.graph_copy(gm.graph, {}))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    examples = list(example_inputs)
    for i in positions:
        t = examples[i]
        fake_mode = getattr(t, "fake_mode", None)
        if fake_mode is not None:
            with fake_mode:
                moved = torch.empty((), dtype=t.dtype, device=device)
        else:
            moved = t.to(device)
        examples[i] = moved
        if "example_value" in placeholders[i].meta:
            placeholders[i].meta["example_value"] = moved
    return torch.fx.GraphModule(gm, graph), examples, CpuScalars(positions, device)
