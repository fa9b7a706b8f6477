"""Layout choice for the "kiln" backend's ATen graphs: convolutions run channels-last.

oneDNN convolves NHWC activations without the per-call reorders that NCHW needs; cuDNN's
tensor-core convolutions (TF32, bfloat16, float16) are NHWC kernels, which an NCHW call reaches
through transposes of its input, weight and result. Every op
between two convolutions (batch norm, ReLU, residual adds, pooling) keeps the channels-last
layout of its input, so one conversion at the first convolution carries through the network.
The pass works on the traced ATen graph because the strides of every later value must be known
again afterwards: it inserts the conversions and traces the graph once more, so the IR's
metadata is what the ops really produce. Outputs keep the layout eager PyTorch gives them.
"""
from typing import List, Optional, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten

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


def _to_channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last)


def _to_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous()


def _groups(conv: torch.fx.Node) -> int:
    return conv.args[8] if len(conv.args) > 8 else conv.kwargs.get("groups", 1)


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


def channels_last(aten_gm: torch.fx.GraphModule,
                  example_inputs: Sequence) -> Optional[torch.fx.GraphModule]:
    """`aten_gm` retraced with its 2-D convolutions' activations (and the weights
    _weight_channels_last names) channels-last, or
    None when that does not apply (too few convolutions, on CUDA a graph whose work is mostly
    grouped convolutions, an output whose eager layout it could not restore)."""
    convs = [n for n in aten_gm.graph.nodes if _wants_channels_last(n)]
    if len(convs) < MIN_CONVOLUTIONS:
        return None
    if convs[0].args[0].meta["val"].device.type == "cuda" and \
            _grouped_share(convs) > MAX_GROUPED_SHARE:
        return None
    graph = torch.fx.Graph()
    env = {}
    conv_set = set(convs)
    for node in aten_gm.graph.nodes:
        if node.op == "output":
            outs: List = []
            leaves, spec = torch.utils._pytree.tree_flatten(node.args[0])
            for out in leaves:
                val = out.meta.get("val") if isinstance(out, torch.fx.Node) else None
                if not isinstance(val, torch.Tensor):
                    return None
                if not val.is_contiguous():
                    # Only a contiguous eager layout is restored by a plain copy.
                    if _depends_on(out, conv_set):
                        return None
                    outs.append(env[out])
                else:
                    outs.append(graph.call_function(_to_contiguous, (env[out],)))
            graph.output(torch.utils._pytree.tree_unflatten(outs, spec))
            continue
        if node in conv_set:
            x = graph.call_function(_to_channels_last, (env[node.args[0]],))
            w = env[node.args[1]]
            if _weight_channels_last(node):
                w = graph.call_function(_to_channels_last, (w,))
            rest = _map(tuple(node.args[2:]), env)
            env[node] = graph.call_function(node.target, (x, w) + rest, _map(dict(node.kwargs), env))
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    rewritten = torch.fx.GraphModule(aten_gm, graph)
    with torch.no_grad():
        retraced = make_fx(rewritten, tracing_mode="fake",
                           _allow_non_fake_inputs=True)(*example_inputs)
    retraced.graph.eliminate_dead_code()
    retraced.recompile()
    return retraced


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
