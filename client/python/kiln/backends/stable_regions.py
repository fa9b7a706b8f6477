"""The stable regions of a graph with symbolic sizes, for a backend that compiles static sizes
(kiln.backends.specialize): when some of the graph's sizes change on almost every call while
others stay (a decoder's cache grows by a token per step while its batch stays; a server's
padded length changes while its hidden width does not), no signature of the whole graph comes
back often enough to be compiled. The nodes whose sizes, and whose inputs' sizes, involve only
the sizes that stay are then cut into regions, each compiled per signature of its own inputs
like any graph with symbolic sizes; the nodes that involve a changing size run between them as
they are (PyTorch's kernels on any sizes), in the graph's order.

Which sizes change is learned from the calls: a graph input's dimension (or an int input) that
took at least CHANGING_VALUES distinct values over the last WINDOW calls. The split is made once,
from the first window full of calls in which no signature came back; it changes nothing a call
computes (the same nodes run in the same order, a region being any graph kiln compiles), only
where each node runs.
"""
import collections
import operator
from typing import Callable, Dict, List, Optional, Sequence, Set

import torch

# Calls looked at, and distinct values of a size over them that make it a changing size.
WINDOW = 16
CHANGING_VALUES = 4
# A region is compiled only when it has at least this many nodes that compute (not views,
# item lookups or sizes): smaller ones run as they are.
MIN_REGION_NODES = 3

_NO_COMPUTE = {operator.getitem, getattr, torch.Tensor.size, torch.Tensor.dim}
_NO_COMPUTE_METHODS = {"size", "dim", "view", "reshape", "unsqueeze", "squeeze", "transpose",
                       "permute", "expand", "contiguous", "__getitem__", "stride", "t"}


class SizeHistory:
    """The sizes of a graph's inputs over its recent calls: which ones keep changing."""

    def __init__(self):
        self.recent = collections.deque(maxlen=WINDOW)

    def add(self, args: Sequence) -> None:
        sizes = []
        for a in args:
            if isinstance(a, torch.Tensor):
                sizes.append(tuple(a.shape))
            elif type(a) is int:
                sizes.append(a)
            else:
                sizes.append(None)
        self.recent.append(tuple(sizes))

    def full(self) -> bool:
        return len(self.recent) == WINDOW

    def changing(self) -> Set[tuple]:
        """(argument index, dim or None for an int) of every size that took CHANGING_VALUES
        distinct values in the window."""
        seen: Dict[tuple, set] = collections.defaultdict(set)
        for call in self.recent:
            for i, s in enumerate(call):
                if isinstance(s, tuple):
                    for d, n in enumerate(s):
                        seen[(i, d)].add(n)
                elif s is not None:
                    seen[(i, None)].add(s)
        return {k for k, values in seen.items() if len(values) >= CHANGING_VALUES}


def _symbols_of(value) -> set:
    """The free symbols of every size, stride and offset of `value` (a fake tensor, a SymInt, or
    a tuple or list of them)."""
    out = set()
    if isinstance(value, torch.Tensor):
        for n in (*value.shape, *value.stride(), value.storage_offset()):
            out |= _symbols_of(n)
    elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        out |= set(value.node.expr.free_symbols)
    elif isinstance(value, (tuple, list)):
        for v in value:
            out |= _symbols_of(v)
    elif isinstance(value, dict):
        for v in value.values():
            out |= _symbols_of(v)
    return out


def _value(node: torch.fx.Node):
    return node.meta.get("example_value", node.meta.get("val"))


def _computes(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return node.target not in _NO_COMPUTE_METHODS
    if node.op == "call_function":
        return node.target not in _NO_COMPUTE
    return node.op == "call_module"


def _mode_nodes(gm: torch.fx.GraphModule) -> Set[torch.fx.Node]:
    """The nodes of `gm` that run as they are because of the modes the graph sets: every node
    of an autocast block (its enter and exit included), and each grad mode change. A region
    thus never spans a mode change: it runs, and is compiled (at its place in a call, under the
    modes the call has there, which the graph's guards and its own mode changes fix), under
    one grad mode and outside the graph's autocast blocks."""
    nodes, depth = set(), 0
    for n in gm.graph.nodes:
        is_call = n.op == "call_function"
        if is_call and n.target is torch.amp._enter_autocast:
            depth += 1
        if depth or (is_call and n.target is torch._C._set_grad_enabled):
            nodes.add(n)
        if is_call and n.target is torch.amp._exit_autocast:
            depth = max(depth - 1, 0)
    return nodes


class _Region:
    def __init__(self, nodes: List[torch.fx.Node], stable: bool):
        self.nodes, self.stable = nodes, stable  # stable: compiled per signature
        self.inputs: List[torch.fx.Node] = []  # values from outside, in call order
        self.attrs: List[torch.fx.Node] = []   # the parameters and buffers it reads
        self.outputs: List[torch.fx.Node] = []
        self.run: Optional[Callable] = None  # inputs -> outputs: compiled, or the region's graph


class StableRegions:
    """`gm` run region by region: stable regions compiled (`make(graph)` -> a callable taking
    the region's inputs, returning a tuple of its outputs), each other region as a graph of its
    own run as it is (generated Python, as `gm` itself runs)."""

    def __init__(self, gm: torch.fx.GraphModule, regions: List[_Region], make):
        self.regions = regions
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.output = next(n for n in gm.graph.nodes if n.op == "output")
        for r in regions:
            graph = _region_graph(gm, r)
            r.run = make(graph) if r.stable else graph
        # values no region after the i-th reads: dropped after it (as the graph would free them)
        last: Dict[torch.fx.Node, int] = {}
        for i, r in enumerate(regions):
            for n in r.inputs:
                last[n] = i
        self.dead_after: List[List[torch.fx.Node]] = [[] for _ in regions]
        kept = set(self.output.all_input_nodes)
        for n, i in last.items():
            if n not in kept:
                self.dead_after[i].append(n)

    def __call__(self, *args):
        env = dict(zip(self.placeholders, args))
        for r, dead in zip(self.regions, self.dead_after):
            outs = r.run(*[env[n] for n in r.inputs])
            for node, value in zip(r.outputs, outs):
                env[node] = value
            for n in dead:
                del env[n]
        return torch.fx.node.map_arg(self.output.args[0], lambda n: env[n])


def stable_regions(gm: torch.fx.GraphModule, changing: Set[tuple], make) -> Optional[
        StableRegions]:
    """`gm`'s stable regions given the changing sizes of its inputs ((argument, dim) pairs,
    SizeHistory.changing), or None when no region is worth compiling."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    changing_symbols = set()
    for i, dim in changing:
        if i >= len(placeholders):
            continue
        value = _value(placeholders[i])
        if dim is None:
            changing_symbols |= _symbols_of(value)
        elif isinstance(value, torch.Tensor) and dim < value.dim():
            changing_symbols |= _symbols_of(value.shape[dim])
    if not changing_symbols:
        return None

    mode_nodes = _mode_nodes(gm)

    def stable(node: torch.fx.Node) -> bool:
        if node in mode_nodes or _symbols_of(_value(node)) & changing_symbols:
            return False
        return not any(_symbols_of(_value(a)) & changing_symbols for a in node.all_input_nodes
                       if a.op != "get_attr")

    regions: List[_Region] = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        s = stable(node)
        if regions and regions[-1].stable == s:
            regions[-1].nodes.append(node)
        else:
            regions.append(_Region([node], s))
    worth = False
    for r in regions:
        if r.stable and sum(_computes(n) for n in r.nodes) < MIN_REGION_NODES:
            r.stable = False
        worth |= r.stable
    if not worth:
        return None
    _connect(regions, gm)
    return StableRegions(gm, regions, make)


def _connect(regions: List[_Region], gm: torch.fx.GraphModule) -> None:
    """Each region's inputs (values from outside it; the parameters it reads apart) and
    outputs (its values read after it)."""
    region_of = {n: i for i, r in enumerate(regions) for n in r.nodes}
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for i, r in enumerate(regions):
        members = set(r.nodes)
        for n in r.nodes:
            for used in n.all_input_nodes:
                if used in members:
                    continue
                kind = r.attrs if used.op == "get_attr" else r.inputs
                if used not in kind:
                    kind.append(used)
        for n in r.nodes:
            users = [u for u in n.users if u is output or region_of.get(u, -1) != i]
            if users:
                r.outputs.append(n)


def _region_graph(gm: torch.fx.GraphModule, r: _Region) -> torch.fx.GraphModule:
    """A region as a graph of its own: its inputs placeholders (parameters get_attr nodes, as
    in `gm`), its outputs a tuple."""
    graph = torch.fx.Graph()
    env: Dict[torch.fx.Node, torch.fx.Node] = {}
    for n in r.inputs:
        env[n] = p = graph.placeholder(n.name)
        p.meta = dict(n.meta)
    for n in r.attrs:
        env[n] = graph.node_copy(n)
    for n in r.nodes:
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(tuple(env[n] for n in r.outputs))
    return torch.fx.GraphModule(gm, graph)
