"""In-place updates of a graph's inputs, from the functional ATen graph to the kiln.v1 IR.

A program that updates a graph input in place (x.add_(1), x[:, 0] = y, an in-place activation of
a tensor that a graph break made an input, BatchNorm's running statistics in a no_grad graph,
x.unsqueeze_(0)) traces, through functionalize(remove="mutations"), to a functional graph that
ends with a copy_ of each such input's new value into the input, through an as_strided_ of the
input where the program changed its metadata. Those are the only writes a functional graph has,
and the IR has no op that writes: returned_as_outputs turns them into values the graph returns
after its own outputs, with a record of which input each updates (UPDATES in the graph module's
meta), and the IR names them as Graph.input_updates; the plan writes them into the caller's own
tensors after its last step, as the program's in-place ops left them.

The program's results keep eager's aliasing: one that is the updated input itself is the input
(the plan returns the caller's tensor, updated), one that is a view of it is that view of the
input (computed by the plan as a view of the caller's tensor, so it shows the update). A view the
IR cannot rebuild on the input (its input's layout changed too) refuses the graph.

A metadata update of a value the graph computes (ATen's adaptive_avg_pool2d restrides its mean in
place for a channels-last input, below functionalization) is no write at all: functional_restrides
makes it the view op it amounts to.
"""
from dataclasses import dataclass
import contextlib
from typing import Dict, List, Optional, Tuple

import torch
from torch._guards import detect_fake_mode
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.graph.aten_nodes import LoweringError, _bound_arguments, meta_values

aten = torch.ops.aten

# The graph module's meta key: the InputUpdates its last outputs are the values of, in order.
UPDATES = "kiln_input_updates"


@dataclass(frozen=True)
class InputUpdate:
    """One input the graph updates: its position among the placeholders, and its layout afterwards
    (sizes, strides, storage offset) where the program changed it."""
    input: int
    new_layout: Optional[Tuple[Tuple[int, ...], Tuple[int, ...], int]] = None


def returned_as_outputs(gm: torch.fx.GraphModule) -> None:
    """Rewrites `gm`'s trailing copy_ (and as_strided_) nodes into returned values: its outputs
    become (its own outputs..., one value per updated input), gm.meta[UPDATES] the InputUpdates
    in that order. A graph with none is left as it is. Raises LoweringError for a write the IR
    cannot express (into a value that is not a graph input, one input twice, a view of an updated
    input returned where the plan cannot rebuild it). The caller recompiles gm."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    position = {n: i for i, n in enumerate(placeholders)}
    updates: Dict[torch.fx.Node, tuple] = {}  # input -> (value, as_strided_ node or None)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.copy_.default:
            continue
        dst, src = node.args[0], node.args[1]
        restride = None
        if isinstance(dst, torch.fx.Node) and dst.target is aten.as_strided_.default:
            restride, dst = dst, dst.args[0]
        if dst not in position or not isinstance(src, torch.fx.Node) or node.users or \
                (restride is not None and list(restride.users) != [node]):
            raise LoweringError("aten::copy_ writes a value that is not a graph input")
        if _bound_arguments(node)["non_blocking"]:
            raise LoweringError("aten::copy_ into a graph input with non_blocking=True")
        if dst in updates:
            raise LoweringError(f"graph input {position[dst]} is written twice")
        updates[dst] = (src, restride)
        graph.erase_node(node)
        if restride is not None:
            graph.erase_node(restride)
    if not updates:
        return
    output = next(n for n in graph.nodes if n.op == "output")
    outs = list(torch.utils._pytree.tree_leaves(output.args[0]))
    returned_inputs = {value: dst for dst, (value, _) in updates.items()}
    fresh = {value: (dst, restride) for dst, (value, restride) in updates.items()
             if not _same_storage(value, dst)}
    with graph.inserting_before(output):
        # An output that is an update's value is the input the program updated and returned.
        outs = [returned_inputs[o] if o in returned_inputs else _as_eager_returns(graph, o, fresh)
                for o in outs]
    order = list(updates)
    output.args = (tuple(outs) + tuple(updates[dst][0] for dst in order),)
    gm.meta[UPDATES] = [InputUpdate(position[dst], _new_layout(dst, updates[dst][1]))
                        for dst in order]


def _new_layout(dst: torch.fx.Node, restride: Optional[torch.fx.Node]):
    """The layout as_strided_ gives the input (its arguments: the node's value is the input's
    fake tensor, whose metadata the trace may have recorded before or after)."""
    if restride is None:
        return None
    bound = _bound_arguments(restride)
    offset = bound["storage_offset"]
    if offset is None:
        offset = dst.meta["val"].storage_offset()
    return (tuple(int(s) for s in bound["size"]), tuple(int(s) for s in bound["stride"]),
            int(offset))


def _storage(node) -> Optional[StorageWeakRef]:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    return StorageWeakRef(val.untyped_storage())


def _same_storage(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    sa, sb = _storage(a), _storage(b)
    return sa is not None and sa == sb


def _layout(t: torch.Tensor):
    return tuple(t.shape), t.stride(), t.storage_offset()


def _is_view(node: torch.fx.Node) -> bool:
    """A call of an op whose result may share its first argument's memory ("Tensor(a) self")."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    schema = node.target._schema
    info = schema.returns[0].alias_info if len(schema.returns) == 1 else None
    return info is not None and not info.is_write and bool(node.args) and \
        isinstance(node.args[0], torch.fx.Node)


def _as_eager_returns(graph: torch.fx.Graph, out, fresh: Dict[torch.fx.Node, tuple]):
    """What the program returned in place of `out`, for an `out` that is a view of a freshly
    computed update value (not a view of its input): that view of the input. `out` otherwise
    (a view of an input is a view of the caller's tensor in the plan too)."""
    storage = _storage(out)
    if storage is None or not fresh:
        return out
    value = next((v for v in fresh if _storage(v) == storage), None)
    if value is None:
        return out
    dst, restride = fresh[value]
    chain: List[torch.fx.Node] = []
    node = out
    while node is not value and isinstance(node, torch.fx.Node) and _is_view(node):
        chain.append(node)
        node = node.args[0]
    if node is not value or restride is not None or \
            _layout(value.meta["val"]) != _layout(dst.meta["val"]):
        raise LoweringError(f"the graph returns a view of graph input {dst.name}, which it "
                            "updates in place, that the IR cannot rebuild on the input")
    # The same views of the input: in the plan they are views of the caller's tensor, computed
    # before the update is written into it and showing it after, as eager's views do.
    base = dst
    for view in reversed(chain):
        rebuilt = graph.call_function(view.target, (base, *view.args[1:]), dict(view.kwargs))
        rebuilt.meta["val"] = view.meta["val"]
        base = rebuilt
    return base


def outputs_and_updates(aten_gm: torch.fx.GraphModule, flat_outputs: list):
    """(the graph's own outputs, [(InputUpdate, value node)]) of `flat_outputs`, the leaves of
    aten_gm's output, as returned_as_outputs arranged them."""
    updates = aten_gm.meta.get(UPDATES, ())
    returned = len(flat_outputs) - len(updates)
    return flat_outputs[:returned], list(zip(updates, flat_outputs[returned:]))


def functional_restrides(gm: torch.fx.GraphModule) -> None:
    """Rewrites in-place metadata updates (as_strided_, unsqueeze_, transpose_: ATen's
    inplace_view ops) of values the graph computes into their view ops, whose results the later
    readers of the value read. Only the value's own tensor changed (its storage did not), so no
    other value sees it; an update of a graph input is the caller's (returned_as_outputs). The
    value's metadata is computed again, as the op made it: the trace's fake tensor was updated
    in place and shows the new layout. The caller recompiles gm."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or \
                torch.Tag.inplace_view not in node.target.tags:
            continue
        base = node.args[0]
        view = _view_op(node.target)
        if view is None or not isinstance(base, torch.fx.Node) or base.op != "call_function" or \
                not isinstance(base.target, torch._ops.OpOverload) or \
                not isinstance(base.meta.get("val"), torch.Tensor):
            continue
        args, kwargs = meta_values(base.args), meta_values(base.kwargs)
        with detect_fake_mode([base.meta["val"]]) or contextlib.nullcontext():
            base_val = base.target(*args, **kwargs)
        with graph.inserting_after(node):
            replacement = graph.call_function(view, node.args, dict(node.kwargs))
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        for user in list(base.users):
            if user is not node and user is not replacement and order.get(user, -1) > order[node]:
                user.replace_input_with(base, replacement)
        graph.erase_node(node)
        order[replacement] = order[node]
        base.meta["val"] = base_val


def _view_op(inplace: torch._ops.OpOverload) -> Optional[torch._ops.OpOverload]:
    """The view op an in-place metadata update amounts to: its name less the trailing underscore,
    the overload taking the same arguments (transpose_.default is transpose.int)."""
    name = inplace._schema.name.split("::")[-1]
    packet = getattr(aten, name[:-1], None) if name.endswith("_") else None
    if packet is None:
        return None
    wanted = [(a.name, str(a.type)) for a in inplace._schema.arguments]
    for overload in packet.overloads():
        op = getattr(packet, overload)
        returns = op._schema.returns
        # A view of its input (Tensor(a)): resize_as_ and set_ are tagged too, but their
        # functional forms allocate.
        is_view = len(returns) == 1 and returns[0].alias_info is not None and \
            not returns[0].alias_info.is_write
        if is_view and [(a.name, str(a.type)) for a in op._schema.arguments] == wanted:
            return op
    return None



def functional_writes(gm: torch.fx.GraphModule) -> None:
    """For a graph traced without functionalization (lower_symbolic traces eager's ops: torch's
    functionalization reads sizes as ints): each in-place op that writes a graph input itself
    (cumulative_length.add_(n), keys.index_copy_(2, position, k): a decoder's static cache) or
    a value the graph made (a cache's first call: zeros, then index_copy_ into them) becomes
    its functional op; a trailing copy_ writes an input's last value back, as functionalization
    leaves a graph, and returned_as_outputs takes it from there. The trace already points the
    readers after a write at the in-place node (make_fx tracks the tensor's new value there),
    which the functional node replaces.

    A write the rewrite cannot make exact stays an in-place op, which to_ir refuses: one through
    a view (of an input or of a value), into an input sharing memory with another, one whose
    tensor a reader after it reads as it was (directly, or through a view taken before the
    write: in eager that view shows the write), or an op without a functional twin of the same
    arguments. The caller recompiles gm."""
    graph = gm.graph
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    written: Dict[torch.fx.Node, torch.fx.Node] = {}  # rewritten in-place node -> its tensor
    last: Dict[torch.fx.Node, torch.fx.Node] = {}  # written tensor -> its latest value
    for node in nodes:
        functional = _functional_twin(node)
        if functional is None:
            continue
        dst = written.get(node.args[0], node.args[0])
        if not _own_memory(dst, placeholders) or \
                not _writable_in_order(dst, node, placeholders, order, set(written)):
            continue
        with graph.inserting_after(node):
            replacement = graph.call_function(functional, node.args, dict(node.kwargs))
        replacement.meta = dict(node.meta)
        try:
            replacement.meta["val"] = _fresh_value(functional, node.args, node.kwargs)
        except Exception:  # no fake value for it: left to to_ir, which refuses the write
            graph.erase_node(replacement)
            continue
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        order[replacement] = order[node]
        written[replacement] = dst
        last[dst] = replacement
    inputs = [dst for dst in last if dst.op == "placeholder"]
    if not inputs:
        return
    output = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(output):
        for dst in inputs:
            graph.call_function(aten.copy_.default, (dst, last[dst]))


def _own_memory(node: torch.fx.Node, placeholders) -> bool:
    """Whether `node` is a graph input, or a value the graph made in memory of its own (an op's
    result that is no view, in no input's storage)."""
    if node.op == "placeholder":
        return True
    if node.op != "call_function" or _is_view(node):
        return False
    storage = _storage(node)
    return storage is not None and all(_storage(p) != storage for p in placeholders)


def _functional_twin(node: torch.fx.Node):
    """The functional overload of `node`'s in-place op (add_.Tensor -> add.Tensor) when it writes
    only its first argument, returns it, and the twin takes the same arguments; else None."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or \
            not node.args or not isinstance(node.args[0], torch.fx.Node) or \
            torch.Tag.inplace_view in node.target.tags:
        return None
    schema = node.target._schema
    writes = [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments]
    if not writes or not writes[0] or any(writes[1:]) or schema.is_mutable is False or \
            len(schema.returns) != 1 or schema.returns[0].alias_info is None:
        return None
    name = schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(aten, name[:-1], None)
    twin = getattr(packet, node.target._overloadname, None) if packet is not None else None
    if twin is None or [a.name for a in twin._schema.arguments] != \
            [a.name for a in schema.arguments] or \
            any(a.alias_info is not None for a in twin._schema.arguments):
        return None
    return twin


def _writable_in_order(dst: torch.fx.Node, write: torch.fx.Node, placeholders, order,
                       rewritten) -> bool:
    """Whether the write into `dst` (a graph input or a value of its own memory) at `write` can
    become a functional value: no other input shares an input's memory, and nothing read after
    the write reads `dst` as it was (the node itself, or a view of its memory computed before
    the write), other than for its sizes and strides, which a write of its elements leaves as
    they were."""
    storage = _storage(dst)
    if storage is None:
        return False
    if dst.op == "placeholder" and \
            any(p is not dst and _storage(p) == storage for p in placeholders):
        return False
    at = order[write]
    for node, position in order.items():
        if node is write or node in rewritten or position >= at or node.op == "placeholder" \
                and node is not dst:
            continue
        if node is not dst and (not _is_view(node) or _storage(node) != storage):
            continue
        if any(order.get(user, -1) > at for user in node.users
               if user is not write and user.target not in _METADATA_READS):
            return False
    return True


# Ops that read only a tensor's metadata.
_METADATA_READS = (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default,
                   aten.sym_storage_offset.default, aten.dim.default)


def _fresh_value(target, args, kwargs) -> torch.Tensor:
    """The fake tensor `target` makes of the nodes' values: a new tensor, not the input's."""
    values, kw = meta_values(args), meta_values(kwargs)
    with detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)]) or \
            contextlib.nullcontext():
        return target(*values, **kw)
