"""Graphs with symbolic sizes for compilers that take static ones: the graph is compiled for each
concrete signature of its inputs (every tensor's dtype, sizes, strides, storage offset and
device; every number's value) the first time a call has it, and a specialisation runs only for
calls with exactly its signature, so that its static kernels never see other sizes.

A specialisation is the graph with every number it computes from sizes (x.size(0), s0 * 2, an
AOT graph's SymInt inputs) replaced by its value for that signature: found by running the graph
once on static fake tensors of the call's inputs. The most recently used
kiln.config.specializations_per_graph specialisations are kept.
"""
import collections
import logging
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from kiln import config

log = logging.getLogger("kiln")

# Compiles a graph with static sizes for tensor inputs like these: (graph, tensors) -> callable
# taking the tensors (unboxed).
StaticCompiler = Callable[[torch.fx.GraphModule, list], Callable]

_NUMBERS = (bool, int, float)


def per_signature(gm: torch.fx.GraphModule, example_inputs: list, compile_static) -> Callable:
    """A backend's compile of `gm` (symbolic sizes) for a backend that takes static sizes only:
    `compile_static(graph, tensors)` per signature. Unboxed: called with the graph's inputs."""
    return PerSignature(gm, compile_static)


class PerSignature:
    """`gm` compiled per signature of its arguments (see the module's docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, compile_static: StaticCompiler):
        self.gm, self.compile_static = gm, compile_static
        self.compiled: "collections.OrderedDict[Tuple, Callable]" = collections.OrderedDict()

    def __call__(self, *args):
        key = signature(args)
        fn = self.compiled.get(key) if key is not None else None
        if fn is None:
            fn = self._specialise(key, args)
        else:
            self.compiled.move_to_end(key)
        return fn(*args)

    def _specialise(self, key: Optional[Tuple], args: Sequence) -> Callable:
        if key is None:
            log.debug("kiln: a dynamic graph called with a %s runs eagerly",
                      ", ".join(sorted({type(a).__name__ for a in args})))
            return self.gm
        log.debug("kiln: specialising a dynamic graph for %s", key)
        tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        try:
            static = specialised_graph(self.gm, args)
        except Exception as e:  # a size no static fake can compute (a value the graph reads)
            log.debug("kiln: a dynamic graph runs eagerly for %s: %s: %s", key,
                      type(e).__name__, e)
            return self.gm
        compiled = self.compile_static(static, [args[i] for i in tensor_at])
        if len(tensor_at) == len(args):
            fn = compiled
        else:
            def fn(*a):
                return compiled(*[a[i] for i in tensor_at])
        while len(self.compiled) >= max(1, config.specializations_per_graph):
            self.compiled.popitem(last=False)
        self.compiled[key] = fn
        return fn


def signature(args: Sequence) -> Optional[Tuple]:
    """What a specialisation is compiled for; None when an argument is neither a tensor nor a
    number."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.dtype, tuple(a.shape), a.stride(), a.storage_offset(), a.device,
                        a.requires_grad))
        elif type(a) in _NUMBERS:
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


def specialised_graph(gm: torch.fx.GraphModule, args: Sequence) -> torch.fx.GraphModule:
    """A copy of `gm` for these arguments: numbers it takes or computes from sizes are
    constants, and its placeholders are its tensor inputs only."""
    values = _static_values(gm, args)
    graph = torch.fx.Graph()
    env = {}
    for node in gm.graph.nodes:
        value = values.get(node, _MISSING)
        if node.op == "placeholder":
            if not isinstance(value, torch.Tensor):
                env[node] = value
                continue
        elif node.op in ("call_function", "call_method") and _is_number(value):
            env[node] = value
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(gm, graph)


_MISSING = object()


def _is_number(value) -> bool:
    if type(value) in _NUMBERS:
        return True
    if type(value) in (tuple, torch.Size):
        return all(type(v) in _NUMBERS for v in value)
    return False


def _static_values(gm: torch.fx.GraphModule, args: Sequence) -> dict:
    """node -> its value when `gm` runs on static fakes of `args` (numbers as themselves)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.graph.output_graph import leave_autocast_blocks

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    interpreter = torch.fx.Interpreter(gm, garbage_collect_values=False)
    grad = torch.is_grad_enabled()
    try:
        with mode:
            interpreter.run(*fakes)
    finally:
        leave_autocast_blocks(gm.graph, interpreter.env)
        torch._C._set_grad_enabled(grad)
    return interpreter.env


def boxed(fn: Callable) -> Callable:
    """`fn` (unboxed) in AOT autograd's boxed convention: called with one list of arguments."""
    def call(args: List):
        return fn(*args)

    call._boxed_call = True
    return call
