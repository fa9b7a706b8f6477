"""Layout choice for the "kiln" backend's ATen graphs: convolutions run channels-last.

oneDNN convolves NHWC activations without the per-call reorders that NCHW needs; cuDNN's
tensor-core convolutions (TF32, bfloat16, float16) are NHWC kernels, which an NCHW call reaches
through transposes of its input, weight and result. Every op
between two convolutions (batch norm, ReLU, residual adds, pooling) keeps the channels-last
layout of its input, so one conversion at the first convolution carries through the network.
The pass works on the traced ATen graph: it inserts the conversions and runs every later op again
on fake tensors (not a second trace: the graph is already ATen ops), so the IR's metadata is
what the ops really produce in the new layout. Outputs keep the layout eager PyTorch gives
them.
"""
import contextlib
import logging
from typing import List, Optional

import torch
from torch._guards import detect_fake_mode
from torch.fx._lazy_graph_module import _make_graph_module

from kiln.graph.aten_nodes import meta_values

aten = torch.ops.aten
log = logging.getLogger("kiln")

# Fewer convolutions than this: the conversions cost more than the faster convolutions save
# (a ViT's single patch embedding).
MIN_CONVOLUTIONS = 2


# On CUDA: the largest share of the convolutions' multiply-adds that grouped convolutions with
# more than one input channel per group (ResNeXt's) may have for the graph to go channels-last.
# cuDNN's NHWC kernels for those can be several times slower than its NCHW ones, while dense and
# depthwise (one input channel per group) convolutions gain.
MAX_GROUPED_SHARE = 0.25


def _macs(conv: torch.fx.Node) -> int:
    """Multiply-adds of a 2-D convolution: one per output element per weight element of its
    group."""
    w, y = conv.args[1].meta["val"], conv.meta["val"]
    return y.numel() * w.shape[1] * w.shape[2] * w.shape[3]


def _grouped_share(convs) -> float:
    """The share of `convs`' multiply-adds in grouped convolutions with more than one input
    channel per group."""
    total = sum(_macs(c) for c in convs)
    grouped = sum(_macs(c) for c in convs
                  if _groups(c) > 1 and c.args[1].meta["val"].shape[1] > 1)
    return grouped / total if total else 0.0


def _groups(conv: torch.fx.Node) -> int:
    return conv.args[8] if len(conv.args) > 8 else conv.kwargs.get("groups", 1)


# On the CPU: the largest share, in elements, of the convolutions' results that the graph's
# outputs computed from them may hold for the graph to go channels-last. Each such output is
# copied back to eager's layout; a training graph's forward returns nearly every activation for
# its backward (resnet18's step spent a tenth of its time in those copies, and oneDNN's NHWC
# convolutions were no faster there), an inference graph one result.
MAX_RESTORED_SHARE_CPU = 0.5

# The dtypes each device's convolutions run channels-last in.
_DTYPES = {"cpu": (torch.float32, torch.bfloat16),
           "cuda": (torch.float32, torch.bfloat16, torch.float16)}


def _wants_channels_last(node: torch.fx.Node) -> bool:
    if node.target is not aten.convolution.default:
        return False
    x, w = node.args[0].meta.get("val"), node.args[1].meta.get("val")
    transposed = node.args[6] if len(node.args) > 6 else node.kwargs.get("transposed", False)
    return (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == 4
            and w.device == x.device and x.dtype in _DTYPES.get(x.device.type, ())
            and not transposed)


def _weight_channels_last(conv: torch.fx.Node) -> bool:
    """Whether `conv`'s weight is converted too. On CUDA always: ATen's cuDNN call otherwise
    copies an NCHW weight to NHWC on every call, and the conversion of a parameter is a bound
    value that the plan's prologue makes once. On the CPU only for grouped (depthwise)
    convolutions, which are much slower with an NCHW weight beside NHWC activations; oneDNN
    packs dense ones from either layout in the prologue."""
    return conv.args[0].meta["val"].device.type == "cuda" or _groups(conv) > 1


def channels_last(aten_gm: torch.fx.GraphModule) -> Optional[torch.fx.GraphModule]:
    """`aten_gm` with its 2-D convolutions' activations (and the weights _weight_channels_last
    names) converted to channels-last, every later value's metadata recomputed, or None when
    that does not apply (too few convolutions, on CUDA a graph whose work is mostly grouped
    convolutions, an output whose eager layout it could not restore, an op that refuses the new
    layout)."""
    convs = [n for n in aten_gm.graph.nodes if _wants_channels_last(n)]
    if len(convs) < MIN_CONVOLUTIONS:
        return None
    if convs[0].args[0].meta["val"].device.type == "cuda" and \
            _grouped_share(convs) > MAX_GROUPED_SHARE:
        return None
    graph = torch.fx.Graph()
    env = {}
    conv_set = set(convs)
    vals = [n.meta.get("val") for n in aten_gm.graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode(vals) or contextlib.nullcontext()
    try:
        with torch.no_grad(), fake_mode:
            for node in aten_gm.graph.nodes:
                if node.op == "output":
                    outs, restored = _outputs(graph, node, env, conv_set)
                    if outs is None or _restores_too_much(restored, convs):
                        return None
                    graph.output(outs)
                elif node in conv_set:
                    x = _converted(graph, env[node.args[0]], torch.channels_last)
                    w = env[node.args[1]]
                    if _weight_channels_last(node):
                        w = _converted(graph, w, torch.channels_last)
                    rest = _map(tuple(node.args[2:]), env)
                    env[node] = _computed(graph, node, (x, w) + rest, _map(dict(node.kwargs), env))
                elif node.op == "call_function":
                    env[node] = _computed(graph, node, _map(node.args, env),
                                          _map(dict(node.kwargs), env))
                else:
                    env[node] = graph.node_copy(node, lambda n: env[n])
    except Exception as e:  # an op (a view) that refuses the new layout: the graph keeps eager's
        log.debug("kiln: convolutions stay in eager's layout (%s: %s)", type(e).__name__, e)
        return None
    return _make_graph_module(aten_gm, graph)


def _restores_too_much(restored: int, convs) -> bool:
    """Whether, on the CPU, the copies that give the outputs back eager's layout (`restored`
    elements) hold more than MAX_RESTORED_SHARE_CPU of the convolutions' results."""
    if convs[0].args[0].meta["val"].device.type != "cpu":
        return False
    return restored > MAX_RESTORED_SHARE_CPU * sum(c.meta["val"].numel() for c in convs)


def _computed(graph: torch.fx.Graph, node: torch.fx.Node, args, kwargs) -> torch.fx.Node:
    """`node` copied into `graph` over new arguments, its value computed again from theirs: the
    op run on fake tensors, as a trace would, without tracing the graph again."""
    copy = graph.call_function(node.target, args, kwargs)
    copy.meta = {k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")}
    copy.meta["val"] = node.target(*meta_values(args), **meta_values(kwargs))
    return copy


def _converted(graph: torch.fx.Graph, x: torch.fx.Node, fmt) -> torch.fx.Node:
    """`x` in memory format `fmt`: x itself where it already is (as Tensor.contiguous returns
    it), else a copy (aten.clone, as that call traces)."""
    val = x.meta["val"]
    if val.is_contiguous(memory_format=fmt):
        return x
    copy = graph.call_function(aten.clone.default, (x,), {"memory_format": fmt})
    copy.meta["val"] = val.clone(memory_format=fmt)
    return copy


def _outputs(graph: torch.fx.Graph, node: torch.fx.Node, env, conv_set):
    """(The graph's outputs in the layouts eager gives them, the elements copied to give them
    those), or (None, 0) where the eager layout of one that a convolution computes cannot be
    restored by a plain copy."""
    leaves, spec = torch.utils._pytree.tree_flatten(node.args[0])
    outs: List = []
    restored = 0
    for out in leaves:
        val = out.meta.get("val") if isinstance(out, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            return None, 0
        if not val.is_contiguous():
            # Only a contiguous eager layout is restored by a plain copy.
            if _depends_on(out, conv_set):
                return None, 0
            outs.append(env[out])
        else:
            converted = _converted(graph, env[out], torch.contiguous_format)
            if converted is not env[out]:
                restored += val.numel()
            outs.append(converted)
    return torch.utils._pytree.tree_unflatten(outs, spec), restored


def _map(value, env):
    return torch.fx.node.map_arg(value, lambda n: env[n])


def _depends_on(out: torch.fx.Node, nodes) -> bool:
    """Whether `out` is computed from any of `nodes`."""
    seen, stack = set(), [out]
    while stack:
        n = stack.pop()
        if n in nodes:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return False
