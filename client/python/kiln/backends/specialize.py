"""Graphs with symbolic sizes for compilers that take static ones: the graph is compiled for each
concrete signature of its inputs (every tensor's dtype, sizes, strides, storage offset and
device; every number's value) the first time a call has it, and a specialisation runs only for
calls with exactly its signature, so that its static kernels never see other sizes.

A specialisation is the graph with every number it computes from sizes (x.size(0), s0 * 2, an
AOT graph's SymInt inputs) replaced by its value for that signature: found by running the graph
once on static fake tensors of the call's inputs. The most recently used
kiln.config.specializations_per_graph specialisations are kept.

A signature is compiled on its kiln.config.specialize_after-th call (8 by default): until then
the graph runs as it is (PyTorch's kernels, on any sizes), or compiled whole for every size
when the backend can (the kiln backend: one kilnd artifact whose plan reads its sizes from each
call's inputs). A decoder's growing cache or a
server's random shapes bring a new signature on almost every call, and compiling each one the
first time it is seen would cost far more than it saves; the shapes a program comes back to
are compiled; none is while the graph compiled whole replays a CUDA graph per shape (its
launches were its cost: a signature's compile would gain nothing). With
kiln.config.specialize_in_background (the default) that compile runs on
kiln's background worker (kiln.background), for tensors like the call's but not its own (no
compile reads or writes a caller's data), and calls keep running the graph as it is until it is
ready: no call waits for it. kiln.wait_for_compiles() waits for those under way.
"""
import collections
import logging
import threading
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from kiln import config
from kiln.backends.stable_regions import SizeHistory, stable_regions
from kiln.graph.size_floors import SizeFloors

log = logging.getLogger("kiln")

# Compiles a graph with static sizes for tensor inputs like these: (graph, tensors) -> callable
# taking the tensors (unboxed).
StaticCompiler = Callable[[torch.fx.GraphModule, list], Callable]

_NUMBERS = (bool, int, float)

# A stable region's signature involves only sizes that stayed over many calls: it is compiled
# on its second call, not after config.specialize_after.
REGION_SPECIALIZE_AFTER = 2


def per_signature(gm: torch.fx.GraphModule, example_inputs: list, compile_static,
                  compile_whole: Optional[Callable] = None) -> Callable:
    """A backend's compile of `gm` (symbolic sizes) for a backend that takes static sizes only:
    `compile_static(graph, tensors)` per signature; `compile_whole(graph, example_inputs)`, when
    the backend has one, compiles the graph once for every size, which runs the calls no
    signature's compile serves. Unboxed: called with the graph's inputs."""
    fn = PerSignature(gm, compile_static)
    if compile_whole is not None:
        fn.compile_whole(compile_whole, example_inputs)
    return fn


class PerSignature:
    """`gm` compiled per signature of its arguments (see the module's docstring)."""

    # Signatures whose calls are counted towards specialize_after, at most.
    _MAX_COUNTED = 4096

    def __init__(self, gm: torch.fx.GraphModule, compile_static: StaticCompiler,
                 specialize_after: Optional[int] = None, regions: bool = True):
        self.gm, self.compile_static = gm, compile_static
        # The call of a signature on which it is compiled (kiln.config.specialize_after when
        # None).
        self.specialize_after = specialize_after
        # Whether the graph may be run in stable regions (a captured graph; not the ATen graphs
        # AOT autograd makes of one, whose forward and backward must stay whole).
        self.regions = regions
        self.compiled: "collections.OrderedDict[Tuple, Callable]" = collections.OrderedDict()
        self.calls: "collections.OrderedDict[Tuple, int]" = collections.OrderedDict()
        self._lock = threading.Lock()  # `compiled` and `calls`, which the worker also changes
        # Calls of signatures not compiled run the graph as it is, or (once the sizes that keep
        # changing are known: kiln.backends.stable_regions) its stable regions compiled.
        self.sizes = SizeHistory()
        self.uncompiled: Optional[Callable] = None
        # The graph compiled once for every size (compile_whole), once it is ready: what calls
        # run instead of the graph as it is, those that `_admits` admits where it is set (a
        # plan whose lowering took a size as 2 or more: kiln.graph.size_floors).
        self.whole: Optional[Callable] = None
        self._admits: Optional[Callable] = None
        self._compiled_whole = None  # what compile_whole returned: when_whole's argument
        self._on_whole: List[Callable] = []  # when_whole's, until it is ready

    def compile_whole(self, compile_whole: Callable, example_inputs: list) -> None:
        """Has `compile_whole(gm, example_inputs)` make self.whole: on kiln's background worker
        with config.specialize_in_background (calls run the graph as it is meanwhile), else
        now. A compile that fails or returns None leaves the graph as it is."""
        def work():
            whole = compile_whole(self.gm, example_inputs)
            if whole is not None:
                floored = isinstance(whole, SizeFloors)
                with self._lock:
                    self.whole = whole.plan if floored else whole
                    self._admits = whole.admits if floored else None
                    self._compiled_whole = whole
                    waiting, self._on_whole = self._on_whole, []
                for fn in waiting:
                    _call_back(fn, whole)
            return whole

        if config.specialize_in_background:
            _in_background(work, (self, "whole"), "whole")
            return
        try:
            work()
        except Exception as e:
            _failed("whole", e)

    def when_whole(self, fn: Callable) -> None:
        """Calls `fn(whole)` once the graph's plan for every size is ready: now when it is, else
        where its compile finishes (kiln's background worker); never when there is none."""
        with self._lock:
            whole = self._compiled_whole
            if whole is None:
                self._on_whole.append(fn)
                return
        _call_back(fn, whole)

    def __call__(self, *args):
        key = signature(args)
        with self._lock:
            fn = self.compiled.get(key) if key is not None else None
            if fn is not None:
                self.compiled.move_to_end(key)
            else:
                count = self._count(key) if key is not None else None
        if fn is not None:
            return fn(*args)
        whole = self._whole_for(args)
        after = self.specialize_after or config.specialize_after
        if whole is not None:
            after = max(after, config.specialize_after_whole)
        if count is not None and count < after:
            return self._uncompiled(count, args, whole)  # not compiled yet
        if whole is not None and (count in (None, after) or
                                  not config.specialize_in_background) \
                and _replays_per_shape(whole):
            # Asked where a compile would start: its launches were the cost, and each shape
            # replays a graph of them now; a signature's own compile would gain nothing for the
            # seconds it takes (holding the interpreter from the calls while it lowers).
            return whole(*args)
        if count is not None and config.specialize_in_background:
            if count == after:  # one compile per signature
                self._specialise_in_background(key, args)
            return self._uncompiled(count, args, whole)  # until the worker has it
        return self._specialise(key, args)(*args)

    def _uncompiled(self, count: int, args: Sequence, whole: Optional[Callable]):
        """A call whose signature has no specialisation: `whole`, the graph compiled for every
        size (_whole_for), where there is one; else the graph as it is (PyTorch's kernels on any
        sizes), or its stable regions once the sizes that keep changing are known."""
        if whole is not None:
            # One plan with kernels over the call's sizes: no region compiles a signature again
            # for sizes that never come back.
            return whole(*args)
        if self.regions and self.uncompiled is None:
            self.sizes.add(args)
            if count == 1 and self.sizes.full() and config.stable_regions:
                changing = self.sizes.changing()
                if changing:
                    self.uncompiled = self._split(changing)
        return (self.uncompiled or self.gm)(*args)

    def _whole_for(self, args: Sequence) -> Optional[Callable]:
        """The plan for every size where it is ready and admits these arguments (a plan whose
        lowering took a size as 2 or more does not admit 1 there: kiln.graph.size_floors)."""
        whole, admits = self.whole, self._admits
        if whole is not None and admits is not None and not admits(args):
            return None
        return whole

    def _split(self, changing) -> Callable:
        """The graph's stable regions (or the graph itself when none is worth compiling)."""
        try:
            regions = stable_regions(self.gm, changing, lambda graph: PerSignature(
                graph, self.compile_static, REGION_SPECIALIZE_AFTER, regions=False))
        except Exception as e:  # a graph the split does not understand runs as it is
            log.debug("kiln: no stable regions: %s: %s", type(e).__name__, e)
            regions = None
        if regions is not None:
            log.debug("kiln: a dynamic graph whose sizes %s keep changing runs in %d regions, "
                      "%d compiled", sorted(changing, key=str), len(regions.regions),
                      sum(r.stable for r in regions.regions))
        return regions or self.gm

    def _specialise_in_background(self, key: Tuple, args: Sequence) -> None:
        # Tensors like the call's (same sizes, strides, device, dtype), none of its data: the
        # call goes on with its own while the worker compiles.
        alike = [_like(a) if isinstance(a, torch.Tensor) else a for a in args]
        # (A failure leaves the signature running the graph as it is.)
        _in_background(lambda: self._specialise(key, alike), (self, key), f"for {key}")

    def _count(self, key: Tuple) -> int:
        n = self.calls.pop(key, 0) + 1
        self.calls[key] = n
        if len(self.calls) > self._MAX_COUNTED:
            self.calls.popitem(last=False)
        return n

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
        tensors_only, rebuild = tensor_outputs(static)
        if tensors_only is None:  # a number that is not a size (a value the graph computes)
            return self.gm
        compiled = self.compile_static(tensors_only, [args[i] for i in tensor_at])
        if len(tensor_at) == len(args) and rebuild is None:
            fn = compiled
        else:
            def fn(*a):
                tensors = [a[i] for i in tensor_at]
                out = compiled(*tensors)
                return out if rebuild is None else rebuild(out, tensors)
        with self._lock:
            while len(self.compiled) >= max(1, config.specializations_per_graph):
                self.compiled.popitem(last=False)
            self.compiled[key] = fn
            self.calls.pop(key, None)
        return fn


def _call_back(fn: Callable, whole: Callable) -> None:
    try:
        fn(whole)
    except Exception as e:  # what waits on the plan (storing it) is never the calls' error
        log.debug("kiln: after a dynamic graph's compile: %s: %s", type(e).__name__, e)


def _replays_per_shape(whole: Callable) -> bool:
    """Whether the plan compiled for every size replays a CUDA graph per shape (its calls'
    launches took the GPU's time: kiln.runtime's CudaGraphShapes gate said so)."""
    plan = whole
    while not hasattr(plan, "cuda_graph_shapes") and hasattr(plan, "plan"):
        plan = plan.plan  # through kiln.graph.size_outputs' and int_inputs' adapters
    stats = getattr(plan, "cuda_graph_shapes", None)
    return isinstance(stats, dict) and stats.get("gate") == "record" and \
        not stats.get("disabled")


def _in_background(work: Callable, key, what: str) -> None:
    """Runs `work()` on kiln's background worker (pending under `key`), a failure logged as a
    dynamic graph's compile `what` ("whole", "for <signature>")."""
    from kiln.background import BACKGROUND

    done = BACKGROUND.submit(work, key)

    def failed(future):
        if future.exception() is not None:
            _failed(what, future.exception())

    done.add_done_callback(failed)


def _failed(what: str, e: BaseException) -> None:
    log.warning("kiln: compiling a dynamic graph %s failed: %s: %s", what, type(e).__name__, e)


def _like(t: torch.Tensor) -> torch.Tensor:
    """A tensor with `t`'s sizes, strides, storage offset, dtype and device, not its data."""
    extent = t.storage_offset() + 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    if t.numel() == 0:
        extent = t.storage_offset()
    with torch.no_grad():
        storage = torch.empty(extent, dtype=t.dtype, device=t.device)
        alike = storage.as_strided(t.shape, t.stride(), t.storage_offset())
    return alike.detach().requires_grad_(t.requires_grad)


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
        env[node] = copy = graph.node_copy(node, lambda n: env[n])
        if "example_value" in node.meta and value is not _MISSING:
            copy.meta["example_value"] = value  # the static fake, not the symbolic one
    # No dead-code elimination: FX takes an in-place method whose result is unused (the
    # cache.index_copy_ of a decoder) for dead code.
    return torch.fx.GraphModule(gm, graph)


def tensor_outputs(gm: torch.fx.GraphModule):
    """(graph, rebuild): `gm` itself and None when it returns tensors only; else a copy of `gm`
    that returns just its tensor outputs, and rebuild(tensors, graph inputs), which puts its
    other outputs (the None gradients of a backward graph, a size an input has) back around
    them (kiln.graph.size_outputs). (None, None) when an output is a value computed by the graph
    that is not a tensor."""
    from kiln.graph.size_outputs import tensors_only
    from kiln.graph.symbolic_ir import NotSymbolic

    output = next(n for n in gm.graph.nodes if n.op == "output")
    if not isinstance(output.args[0], (tuple, list)):
        return None, None
    try:
        graph, sizes = tensors_only(gm)
    except NotSymbolic:
        return None, None
    return graph, (sizes.results if sizes is not None else None)


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
