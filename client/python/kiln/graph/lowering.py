"""Lowering for the "kiln" backend: a captured FX graph -> an ATen-level graph (make_fx with
functionalization and decompositions; input updates as returned values, kiln.graph.input_updates)
-> the kiln.v1 graph IR the daemon compiles (kiln.graph.ir).

The captured graph's parameters and buffers (get_attr nodes) become leading IR inputs, so the
IR, and with it the cache key, never holds weights: the runtime binds them at load time.
"""
import functools
import hashlib
import inspect
import operator
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch._decomp import get_decompositions
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.graph import input_updates
# The IR half of the lowering; its public names are also this module's.
from kiln.graph.ir import (LoweringError, _bound_arguments, _contiguous,  # noqa: F401
                           _layer_norm_stats_dtype, device_from_pb, dtype_from_pb, dtype_to_pb,
                           memory_format_from_pb, meta_to_pb, op_name, to_ir)

aten = torch.ops.aten

# Composite ops rewritten into pointwise ATen ops the compiler fuses, and library ops it keeps.
_DECOMPOSED = [
    aten.native_batch_norm,
    # What batch_norm dispatches to on CUDA (and ROCm) devices: native_batch_norm again.
    aten.cudnn_batch_norm, aten.miopen_batch_norm,
    aten.gelu, aten.native_layer_norm,
    # dropout as native_dropout, which stays: the plan calls it, drawing from the generator as
    # eager's does (torch's decomposition of native_dropout draws with rand_like instead).
    aten.addmm, aten.linear, aten.t, aten.dropout, aten.leaky_relu,
    aten.elu, aten.mish, aten.softplus, aten.clamp_min, aten.clamp_max, aten.rsub, aten.addcmul,
    aten.addcdiv, aten.lerp, aten.masked_fill, aten.unbind, aten.split,
    aten._softmax, aten._log_softmax, aten._safe_softmax,
    # The backward graphs of torch.compile's training graphs (AOT autograd's split).
    aten.gelu_backward, aten.threshold_backward, aten.tanh_backward, aten.sigmoid_backward,
    aten.silu_backward, aten.hardtanh_backward, aten.leaky_relu_backward,
    aten._softmax_backward_data, aten._log_softmax_backward_data,
    aten.native_layer_norm_backward, aten.native_batch_norm_backward,
]


# Changes whenever the same captured graph would lower to a different IR (a new pass, a new
# decomposition): it is part of the structure key, so warm indexes never map to stale IR.
LOWERING_VERSION = b"kiln-lowering-22"


@dataclass
class LoweredGraph:
    graph: "object"                 # kiln.v1.Graph
    params: List[torch.Tensor]      # tensors bound to the first len(params) IR inputs
    num_user_inputs: int
    aten_graph: torch.fx.GraphModule
    # Symbols the lowering took as 2 or more where the capture admitted 1 (symbol -> 2): the
    # plan is for calls where they are (kiln.graph.size_floors).
    size_floors: dict = field(default_factory=dict)


def _self_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                    proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                    mask_type=None):
    """aten._native_multi_head_attention (nn.MultiheadAttention's inference fast path, as in
    torchvision's ViTs) as the ops it computes, for self-attention without mask or weights:
    the two projections become linears that kilnd gives oneDNN with prepacked weights (the
    fused op runs them as unpacked GEMMs), and the attention itself is scaled_dot_product_attention
    (one fused kernel instead of two bmm and a softmax). Anything else stays the fused op."""
    if (mask is not None or need_weights or embed_dim % num_head != 0
            or any(t.dim() != 3 or t.shape[0] != query.shape[0] for t in (query, key, value))
            or key.shape[1] != value.shape[1]):
        return NotImplemented
    batch, tokens, _ = query.shape
    head_dim = embed_dim // num_head
    if query is key and key is value:  # self-attention: one projection for q, k and v
        qkv = torch.nn.functional.linear(query, qkv_weight, qkv_bias)
        heads = qkv.view(batch, tokens, 3, num_head, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = heads.select(0, 0), heads.select(0, 1), heads.select(0, 2)
    else:  # three tensors (autocast casts q, k and v apart): one projection each
        biases = qkv_bias.chunk(3) if qkv_bias is not None else (None, None, None)
        q, k, v = (torch.nn.functional.linear(t, w, b).view(batch, t.shape[1], num_head, head_dim)
                   .transpose(1, 2) for t, w, b in zip((query, key, value),
                                                       qkv_weight.chunk(3), biases))
    # On CUDA as kiln::attention: traced through torch's own, the trace would record the kernel
    # it picks for the tracer's inputs (see _attention_op).
    sdpa = _attention_op() if query.is_cuda else torch.nn.functional.scaled_dot_product_attention
    attention = sdpa(q, k, v)
    out = attention.transpose(1, 2).reshape(batch, tokens, embed_dim)
    # No weights: eager returns None there, the op's fake (which capture saw) an empty tensor.
    return torch.nn.functional.linear(out, proj_weight, proj_bias), query.new_empty((0,))


@functools.lru_cache(maxsize=1)
def _attention_op():
    """kiln::attention, scaled_dot_product_attention's schema as an op of its own, for tracing
    CUDA graphs: torch's scaled_dot_product_attention picks its kernel (flash, memory-efficient,
    cuDNN, math) inside its composite implementation, so a trace would record that choice (an op
    whose results include host integers the IR cannot carry, made for the tracer's fake inputs).
    Traced as this op, it is lowered back to aten::scaled_dot_product_attention, which the plan
    calls, choosing its kernel for the real inputs."""
    lib = torch.library.Library("kiln", "FRAGMENT")
    lib.define("attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
               "float dropout_p=0., bool is_causal=False, *, float? scale=None, "
               "bool enable_gqa=False) -> Tensor")

    def run(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
            enable_gqa=False):
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
            enable_gqa=enable_gqa)

    def fake(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
             enable_gqa=False):
        if query.dim() == 4 and query.is_cuda:
            # The layout of CUDA's fused kernels (flash, memory-efficient; cuDNN's for inputs
            # laid out so): [batch, tokens, heads, dim] in memory, so that merging the heads
            # back is a view. The math kernel's result is contiguous: the plan then copies it
            # into this layout (a library result always has its metadata's layout).
            batch, heads, tokens, _ = query.shape
            return query.new_empty((batch, tokens, heads, value.shape[-1])).transpose(1, 2)
        return query.new_empty((*query.shape[:-1], value.shape[-1]))

    lib.impl("attention", run, "CompositeExplicitAutograd")
    torch.library.register_fake("kiln::attention", fake, lib=lib)
    _attention_op.lib = lib  # the registration lives as long as the library object
    return torch.ops.kiln.attention.default


_SDPA_TARGETS = (torch._C._nn.scaled_dot_product_attention,
                 torch.nn.functional.scaled_dot_product_attention)


def _attention_as_leaf(gm: torch.fx.GraphModule) -> None:
    """Rewrites gm's scaled_dot_product_attention calls to kiln::attention (see _attention_op)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SDPA_TARGETS:
            node.target = _attention_op()
    gm.recompile()


# The kernels scaled_dot_product_attention picks on CUDA, as a trace records them when it reaches
# attention inside a function it enters rather than as a call of the captured graph (under
# autocast, nn.MultiheadAttention calls multi_head_attention_forward, which calls it): the op,
# and where its (query, key, value, mask, dropout, causal) arguments are. Each also returns host
# integers (sequence bounds, random state) that the IR cannot carry.
_FUSED_ATTENTION = {
    aten._scaled_dot_product_cudnn_attention.default: (0, 1, 2, 3, 5, 6),
    aten._scaled_dot_product_efficient_attention.default: (0, 1, 2, 3, 5, 6),
    aten._scaled_dot_product_flash_attention.default: (0, 1, 2, None, 3, 4),
}


def _fused_attention_as_sdpa(gm: torch.fx.GraphModule) -> None:
    """Rewrites the fused attention kernels of an ATen-level CUDA graph whose only result read
    is the attention's output into kiln::attention over the same arguments, which the plan runs
    as aten::scaled_dot_product_attention (it picks its kernel for the real inputs). Exact: the
    arguments are the ones the kernel received, after whatever scaled_dot_product_attention did
    to them first (a boolean mask made additive, a head dim padded, its scale computed before
    padding and passed as `scale`), and each kernel computes that attention. A kernel called
    with dropout, with both a mask and the causal flag (which scaled_dot_product_attention
    refuses), or whose other results are read stays (and the graph then runs eagerly). The
    caller recompiles gm."""
    for node in list(gm.graph.nodes):
        where = _FUSED_ATTENTION.get(node.target) if node.op == "call_function" else None
        if where is None:
            continue
        schema = node.target._schema
        bound = _bound_arguments(node)
        values = [bound[schema.arguments[i].name] if i is not None else None for i in where]
        query, key, value, mask, dropout_p, is_causal = values
        users = list(node.users)
        if dropout_p or (is_causal and mask is not None) or \
                not all(u.target is operator.getitem and u.args[1] == 0 for u in users):
            continue  # (scaled_dot_product_attention takes a mask or is_causal, not both)
        with gm.graph.inserting_before(node):
            attention = gm.graph.call_function(
                _attention_op(), (query, key, value, mask, 0.0, bool(is_causal)),
                {"scale": bound["scale"]})
        attention.meta["val"] = node.meta["val"][0]  # the kernel's output, in its layout
        for user in users:
            user.replace_all_uses_with(attention)
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)


def _dense_attention_masks(gm: torch.fx.GraphModule) -> None:
    """Copies the attention masks of gm's kiln::attention calls whose last dim is not dense
    (stride 1) into contiguous tensors. CUDA's fused attention kernels refuse such a mask (an
    expanded one, as transformers' BERT builds: strides [0, S, 1, 0]) and ATen falls back to its
    math kernel, two matrix products and a softmax in separate passes. The copy holds the same
    values; a mask computed from parameters alone is copied once, by the prologue. The caller
    recompiles gm."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _attention_op():
            continue
        mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
        val = mask.meta.get("val") if isinstance(mask, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() == 0 or val.shape[-1] < 2 or \
                val.stride(-1) == 1:
            continue
        with gm.graph.inserting_before(node):
            dense = gm.graph.call_function(aten.clone.default, (mask,),
                                           {"memory_format": torch.contiguous_format})
        dense.meta["val"] = val.clone(memory_format=torch.contiguous_format)
        if len(node.args) > 3:
            node.args = (*node.args[:3], dense, *node.args[4:])
        else:
            node.kwargs = {**node.kwargs, "attn_mask": dense}


def _addmm_in_its_dtype(torch_addmm):
    """aten.addmm of floating operands as torch decomposes it (alpha * mm, then beta * self
    added to it), traced as those ATen calls directly: torch's decomposition goes through its
    dtype and out= wrappers, a tenth of a transformer's lowering, and computes bfloat16 and
    float16 in float32 (its pointwise opmath rule), which would turn the matrix product of an
    autocast region into a float32 one, slower and not the product eager computes. Where
    _addmm_simple knows the results' metadata, those calls are one traced node,
    kiln::addmm, that to_ir writes as them (_Builder.expand_addmm). Other dtypes take torch's
    decomposition."""

    def addmm(self, mat1, mat2, beta=1, alpha=1):
        if not self.is_floating_point():
            return torch_addmm(self, mat1, mat2, beta=beta, alpha=alpha)
        if _addmm_simple(self, mat1, mat2, beta, alpha):
            return _metadata_ops()["addmm"](self, mat1, mat2, beta=beta, alpha=alpha)
        out = aten.mul.Tensor(aten.mm.default(mat1, mat2), alpha)
        if beta == 0:
            return out
        # mm's result first: the sum takes its (contiguous) layout, as addmm's result has.
        return aten.add.Tensor(out, aten.mul.Tensor(self, beta))

    return addmm


def _layer_norm_as_traced(torch_layer_norm):
    """aten.native_layer_norm as torch's reference decomposes it, traced as the ATen calls it
    ends in (var_mean in the computation dtype, rsqrt of var + eps, the scaled difference, the
    affine weight and bias, the cast back; on the CPU mean and rstd in the input's dtype), without
    the reference's wrappers, checks and dispatch through torch functions: those made a layer norm
    two dozen milliseconds of lowering. What this form does not cover (inputs or parameters that
    are not contiguous, a missing weight or bias, shapes or dtypes that do not match the input's,
    non-float dtypes) takes torch's, with its checks. The calls of a non-empty input are one traced
    node, kiln::layer_norm, that to_ir writes as them (_Builder.expand_layer_norm)."""

    def native_layer_norm(input, normalized_shape, weight, bias, eps):
        shape = tuple(normalized_shape)
        n = len(shape)
        if weight is None or bias is None or n < 1 or input.dim() < n or \
                tuple(input.shape[input.dim() - n:]) != shape or \
                tuple(weight.shape) != shape or tuple(bias.shape) != shape or \
                input.dtype not in (torch.float32, torch.bfloat16, torch.float16) or \
                weight.dtype != input.dtype or bias.dtype != input.dtype or \
                not input.is_contiguous() or not weight.is_contiguous() or \
                not bias.is_contiguous():
            return torch_layer_norm(input, normalized_shape, weight, bias, eps)
        if _layer_norm_simple(input):
            return _metadata_ops()["layer_norm"](input, shape, weight, bias, eps)
        x = input
        if input.dtype != torch.float32:
            x = aten._to_copy.default(input, dtype=torch.float32)
        var, mean = aten.var_mean.correction(x, list(range(input.dim() - n, input.dim())),
                                             correction=0, keepdim=True)
        rstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
        out = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
        out = aten.add.Tensor(aten.mul.Tensor(out, weight), bias)
        if out.dtype != input.dtype:
            out = aten._to_copy.default(out, dtype=input.dtype)
        if input.device.type in ("cpu", "mtia") and input.dtype != torch.float32:
            mean = aten._to_copy.default(mean, dtype=input.dtype)
            rstd = aten._to_copy.default(rstd, dtype=input.dtype)
        return out, mean, rstd

    return native_layer_norm


def _batch_norm_eval(input, weight, bias, running_mean, running_var, momentum, eps):
    """Batch norm with running statistics as one traced node,
    aten._native_batch_norm_legit_no_training (its statistics outputs are empty), whatever op
    the trace met: kilnd decomposes it into the form it folds into a preceding convolution
    (compiler/passes/conv_folding.h, DecomposeBatchNormEval). Tracing torch's decomposition here
    instead made a dozen ops per batch norm, a third of a convolutional network's lowering. Traced
    as kiln::batch_norm_eval where its result's metadata is known without running torch's
    decomposition (see _metadata_ops)."""
    op = aten._native_batch_norm_legit_no_training.default
    if _batch_norm_simple(input, weight, bias, running_mean, running_var):
        op = _metadata_ops()["batch_norm_eval"]
    return op(input, weight, bias, running_mean, running_var, momentum, eps)


def _hardswish(self):
    """hardswish as one traced node (kiln::hardswish, see _metadata_ops) where its result's
    metadata is its input's; else as torch decomposes it."""
    if _dense(self):
        return _metadata_ops()["hardswish"](self)
    from torch._decomp import decompositions

    return decompositions.hardswish(self)


def _dense(t: torch.Tensor) -> bool:
    """A non-empty tensor whose elements fill its memory with no overlap: its empty_like has its
    very sizes and strides (preserve_format's rule)."""
    if t.layout != torch.strided or t.numel() == 0:
        return False
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _batch_norm_simple(input, weight, bias, running_mean, running_var) -> bool:
    """Whether _batch_norm_metadata knows the op's results: a dense input of two or more dims,
    running statistics, and every per-channel tensor one contiguous dim of the input's channels."""
    stats = [t for t in (weight, bias, running_mean, running_var) if t is not None]
    return _dense(input) and input.dim() >= 2 and running_mean is not None and \
        running_var is not None and all(t.dim() == 1 and t.shape[0] == input.shape[1] and
                                        t.is_contiguous() for t in stats)


def _batch_norm_metadata(input, weight, bias, running_mean, running_var):
    """(output, save_mean, save_invstd) of aten._native_batch_norm_legit_no_training, for inputs
    _batch_norm_simple accepts, as empty tensors of the metadata torch's decomposition (which
    fake tensors run for it) gives them: the output like the input; on the CPU empty statistics
    of the input's dtype, elsewhere the running statistics' shape in the input's computation
    dtype."""
    out = _fake_empty(input, input.shape, input.stride(), input.dtype)
    if input.device.type == "cpu":
        return (out, _fake_empty(input, (0,), (1,), input.dtype),
                _fake_empty(input, (0,), (1,), input.dtype))
    dtype = torch._prims_common.get_computation_dtype(input.dtype)
    return (out, _fake_empty(input, running_mean.shape, (1,), dtype),
            _fake_empty(input, running_var.shape, (1,), dtype))


def _fake_empty(like, shape, stride, dtype):
    """A fake tensor of `like`'s fake mode and device with this metadata (meta_rules.fake_empty,
    from inside the fake mode running a fake implementation)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from kiln.graph.meta_rules import fake_empty

    with unset_fake_temporarily():
        return fake_empty(like.fake_mode, shape, stride, dtype, like.fake_device)


def _hardswish_fake(self):
    return _fake_empty(self, self.shape, self.stride(), self.dtype)


def _addmm_simple(self, mat1, mat2, beta, alpha) -> bool:
    """Whether _Builder.expand_addmm knows the metadata of addmm's decomposition (mm, alpha *
    it, beta * self, their sum): matrices and a contiguous bias of one floating dtype and
    device, the bias no larger than the product it is broadcast to, number scalars, beta not 0
    (the decomposition then adds nothing)."""
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (beta, alpha)) \
            or beta == 0:
        return False
    if mat1.dim() != 2 or mat2.dim() != 2 or mat1.shape[1] != mat2.shape[0] or \
            self.dim() not in (1, 2) or not self.is_contiguous() or self.layout != torch.strided:
        return False
    m, n = mat1.shape[0], mat2.shape[1]
    if self.shape[-1] not in (1, n) or (self.dim() == 2 and self.shape[0] not in (1, m)):
        return False
    return (self.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and mat1.dtype == self.dtype and mat2.dtype == self.dtype
            and mat1.device == self.device and mat2.device == self.device)


def _addmm_fake(self, mat1, mat2, *, beta=1, alpha=1):
    if not _addmm_simple(self, mat1, mat2, beta, alpha):
        raise RuntimeError("kiln::addmm: operands outside _addmm_simple")
    shape = (mat1.shape[0], mat2.shape[1])
    return _fake_empty(self, shape, _contiguous(shape), self.dtype)


def _layer_norm_simple(input) -> bool:
    """Whether _Builder.expand_layer_norm knows the metadata of _layer_norm_as_traced's calls
    for `input` (which that function's own checks let through: contiguous, of a float dtype
    its parameters share): a non-empty one."""
    return input.is_contiguous() and input.numel() > 0


def _layer_norm_fake(input, normalized_shape, weight, bias, eps):
    if not _layer_norm_simple(input):
        raise RuntimeError("kiln::layer_norm: an empty or non-contiguous input")
    n = len(normalized_shape)
    stats = (*input.shape[:input.dim() - n], *([1] * n))
    dtype = _layer_norm_stats_dtype(input)
    return (_fake_empty(input, input.shape, _contiguous(input.shape), input.dtype),
            _fake_empty(input, stats, _contiguous(stats), dtype),
            _fake_empty(input, stats, _contiguous(stats), dtype))


@functools.lru_cache(maxsize=1)
def _metadata_ops():
    """aten ops under kiln's names, with aten's schemas and computations, whose fake
    implementations give the results' metadata directly, so that a trace runs no decomposition
    for them on fake tensors. kiln::batch_norm_eval and kiln::hardswish are
    aten._native_batch_norm_legit_no_training and aten.hardswish: fake tensors have no meta
    kernel for either and run torch's decomposition, ~15 ms a call on a new shape (a
    MobileNetV3's 34 batch norms and 19 hardswishes: half its lowering); the IR names aten's
    ops (kiln.graph.ir._AS_ATEN). kiln::layer_norm and kiln::addmm are aten.native_layer_norm and aten.addmm
    where lowering decomposes them (_layer_norm_as_traced, _addmm_in_its_dtype): each is one
    traced node instead of seven and four (a transformer's layer norms and linears: a quarter of
    its lowering), and to_ir writes the very calls their decompositions trace. Either way the
    lowered graph is the same."""
    lib = torch.library.Library("kiln", "FRAGMENT")
    lib.define("batch_norm_eval(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, "
               "Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)")
    lib.define("hardswish(Tensor self) -> Tensor")
    lib.define("layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, "
               "Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)")
    lib.define("addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) "
               "-> Tensor")
    lib.impl("batch_norm_eval", aten._native_batch_norm_legit_no_training.default,
             "CompositeExplicitAutograd")
    lib.impl("hardswish", aten.hardswish.default, "CompositeExplicitAutograd")
    lib.impl("layer_norm", aten.native_layer_norm.default, "CompositeExplicitAutograd")
    lib.impl("addmm", aten.addmm.default, "CompositeExplicitAutograd")

    def batch_norm_fake(input, weight, bias, running_mean, running_var, momentum, eps):
        return _batch_norm_metadata(input, weight, bias, running_mean, running_var)

    # register_fake records where it was called from: inspect.getmodule of this frame, whose
    # first use reads the file of every module in sys.modules unless this file is known (0.16 s
    # of a cold first call in a process that has imported transformers). Named ahead: the module
    # it would find.
    for path in {os.path.normcase(os.path.abspath(__file__)), os.path.realpath(__file__)}:
        inspect.modulesbyfile.setdefault(path, __name__)
    torch.library.register_fake("kiln::batch_norm_eval", batch_norm_fake, lib=lib)
    torch.library.register_fake("kiln::hardswish", _hardswish_fake, lib=lib)
    torch.library.register_fake("kiln::layer_norm", _layer_norm_fake, lib=lib)
    torch.library.register_fake("kiln::addmm", _addmm_fake, lib=lib)
    _metadata_ops.lib = lib  # the registrations live as long as the library object
    return {"batch_norm_eval": torch.ops.kiln.batch_norm_eval.default,
            "hardswish": torch.ops.kiln.hardswish.default,
            "layer_norm": torch.ops.kiln.layer_norm.default,
            "addmm": torch.ops.kiln.addmm.default}


def _batch_norm_forms(table):
    """The batch norm ops a trace meets, in eval form as _batch_norm_eval's one node; in training
    form (batch statistics) through torch's decompositions."""

    def with_running_stats(torch_form, extra_outputs):
        """torch_form in training form; in eval form _batch_norm_eval, then (cudnn's) extra empty
        outputs."""
        def decomposed(input, weight, bias, running_mean, running_var, training, momentum, eps):
            if training or running_mean is None or running_var is None:
                return torch_form(input, weight, bias, running_mean, running_var, training,
                                  momentum, eps)
            out = _batch_norm_eval(input, weight, bias, running_mean, running_var, momentum, eps)
            return (*out, *(input.new_zeros((0,), dtype=d) for d in extra_outputs))
        return decomposed

    table[aten.native_batch_norm.default] = with_running_stats(
        table[aten.native_batch_norm.default], ())
    for op in (aten.cudnn_batch_norm.default, aten.miopen_batch_norm.default):
        if op in table:
            table[op] = with_running_stats(table[op], (torch.uint8,))


@functools.lru_cache(maxsize=2)  # one table per device kind
def decompositions(cuda: bool = True):
    """The decomposition table of a graph on CUDA (`cuda`) or on the CPU. On the CPU a batch
    norm's backward over contiguous tensors stays ATen's one fused kernel: decomposed, its
    per-channel sums over N, H and W are library reductions that cost more than that kernel
    (the seed tutorial's step on this CPU: 0.89-0.96x eager decomposed, 0.98-0.99x kept). Over
    other layouts (a BatchNorm1d of a transposed sequence) ATen's kernel lays its gradient out
    unlike its fake, so it is decomposed as on CUDA."""
    table = get_decompositions(_DECOMPOSED)
    if not cuda:
        table[aten.native_batch_norm_backward.default] = _batch_norm_backward_kept_if_contiguous(
            table[aten.native_batch_norm_backward.default])
    table[aten.addmm.default] = _addmm_in_its_dtype(table[aten.addmm.default])
    table[aten.native_layer_norm.default] = _layer_norm_as_traced(
        table[aten.native_layer_norm.default])
    _batch_norm_forms(table)
    table[aten._native_multi_head_attention.default] = _self_attention
    table[aten.hardswish.default] = _hardswish
    # squeeze() as squeeze.dims over its size-1 dims: torch's own decomposition of squeeze
    # (and of unbind, through it) ends in prims.squeeze, which the IR does not have.
    table[aten.squeeze.default] = lambda x: aten.squeeze.dims(
        x, [d for d in range(x.dim()) if x.shape[d] == 1])
    return table


def _batch_norm_backward_kept_if_contiguous(decomposition):
    """native_batch_norm_backward's decomposition, which leaves the op to ATen (make_fx keeps an
    op whose decomposition returns NotImplemented) where its gradient and input are
    contiguous."""

    def batch_norm_backward(grad_out, input, *args, **kwargs):
        if grad_out.is_contiguous() and input.is_contiguous():
            return NotImplemented
        return decomposition(grad_out, input, *args, **kwargs)

    return batch_norm_backward


def needs_autograd(gm: torch.fx.GraphModule, example_inputs: Sequence) -> bool:
    """True when the graph would record autograd history: the "kiln" backend takes it through
    AOT autograd (a forward and a backward graph, each compiled as an inference graph)."""
    if not torch.is_grad_enabled() and not any(
            n.op == "call_function" and n.target is torch._C._set_grad_enabled and n.args[0]
            for n in gm.graph.nodes):
        # Called without grad, and nothing in the graph turns it on (torch.enable_grad(),
        # or the end of a `with no_grad()` a resume function starts inside).
        return False
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    tensors += list(attr_tensors(gm).values())
    return any(t.requires_grad for t in tensors)


def attr_tensors(gm: torch.fx.GraphModule) -> Dict[str, torch.Tensor]:
    """The graph module's tensor attributes (parameters, buffers) by get_attr target, in graph
    order: the order lowering makes them leading inputs."""
    out = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(gm)
            if isinstance(value, torch.Tensor):
                out[node.target] = value
    return out


def _with_attrs_as_inputs(gm: torch.fx.GraphModule) -> Tuple[torch.fx.GraphModule, List]:
    """A copy of `gm` whose tensor get_attr nodes are leading placeholders."""
    attrs = attr_tensors(gm)
    graph = torch.fx.Graph()
    env = {}
    order = list(attrs)
    attr_nodes = {name: graph.placeholder(f"param_{i}") for i, name in enumerate(order)}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target in attrs:
            env[node] = attr_nodes[node.target]
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    return torch.fx.GraphModule(gm, graph), [attrs[name] for name in order]


def to_aten(gm: torch.fx.GraphModule, example_inputs: Sequence,
            params: Optional[List[torch.Tensor]] = None,
            eager_ops: bool = False,
            eager_decompositions: Optional[dict] = None
            ) -> Tuple[torch.fx.GraphModule, List[torch.Tensor]]:
    """The ATen-level, functional graph of `gm` over (params..., inputs...). `params`: what
    stands for the graph's tensor attributes, in attr_tensors' order (default: themselves). The
    inputs the program updates in place are written by no node: the graph returns their new
    values after its own outputs (kiln.graph.input_updates). `eager_ops`: the ops as eager
    runs them: not decomposed by kiln's table (only by `eager_decompositions`, when given), and
    not functionalized: an in-place write becomes a functional op (of a graph input: an update
    as above) where input_updates.functional_writes can make it exact; any other stays one,
    which to_ir refuses."""
    flat, attrs = _with_attrs_as_inputs(gm)
    if params is None:
        params = attrs
    elif len(params) != len(attrs):
        raise ValueError(f"{len(params)} tensors for the graph's {len(attrs)} attributes")
    for t in example_inputs:
        if not isinstance(t, torch.Tensor):
            raise LoweringError(f"non-tensor graph input of type {type(t).__name__}")
    cuda = any(t.is_cuda for t in (*params, *example_inputs))
    if cuda:
        _attention_as_leaf(flat)
    # The ATen graph's Python code is written only if something reads or runs it (a debug
    # print): lowering itself reads nodes and their metadata.
    with torch.no_grad(), _use_lazy_graph_module(True):
        traced = make_fx(flat if eager_ops else
                         torch.func.functionalize(flat, remove="mutations"),
                         decomposition_table=(eager_decompositions or {}) if eager_ops
                         else decompositions(cuda),
                         tracing_mode="fake",
                         _allow_non_fake_inputs=True)(*params, *example_inputs)
        if eager_ops:
            input_updates.functional_writes(traced)
        input_updates.returned_as_outputs(traced)
        input_updates.functional_restrides(traced)
        traced.graph.eliminate_dead_code()
        if cuda:
            _fused_attention_as_sdpa(traced)
            _dense_attention_masks(traced)
        traced.recompile()
        from kiln.graph import layout

        relaid = layout.channels_last(traced)
        if relaid is not None and input_updates.UPDATES in traced.meta:
            relaid.meta[input_updates.UPDATES] = traced.meta[input_updates.UPDATES]
    return (relaid if relaid is not None else traced), params


def lower(gm: torch.fx.GraphModule, example_inputs: Sequence,
          params: Optional[List[torch.Tensor]] = None) -> LoweredGraph:
    aten_gm, params = to_aten(gm, example_inputs, params)
    graph = to_ir(aten_gm)
    graph.num_bound_inputs = len(params)  # bound once at load (build_plan); see graph.proto
    return LoweredGraph(graph, params, len(example_inputs), aten_gm)


def lower_symbolic(gm: torch.fx.GraphModule, params: List[torch.Tensor]) -> LoweredGraph:
    """The kiln.v1 graph of `gm`, captured with symbolic sizes, for every size in its symbols'
    ranges: traced over its placeholders' fakes (the capture's, whose ShapeEnv holds the
    symbols), each size an expression over the per-call inputs' (kiln.graph.symbolic_ir).
    Raises NotSymbolic for a graph the IR cannot carry exactly, or whose lowering would rely on
    a relation between sizes that the capture did not guard."""
    from kiln.graph.symbolic_ir import NotSymbolic, ShapeEnvUnchanged
    from kiln.graph.symbolic_shapes import symbolic_ops

    fakes = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    env = next((s.node.shape_env for f in fakes if isinstance(f, torch.Tensor)
                for s in f.shape if isinstance(s, torch.SymInt)), None)
    if env is None:
        raise NotSymbolic("no input has a symbolic size")
    # Under the Python dispatcher, as the capture ran them: composite ops (linear) decompose
    # through kernels written for symbolic sizes instead of reading a size as an int. Eager's
    # ops (torch's functionalization reads sizes as ints: a linear over a 3-d input specialises
    # its batch; a graph with an in-place op is refused by to_ir instead), except the layer norm,
    # traced through torch's own decomposition: its row statistics and affine become kilnd's row
    # kernel over the call's rows, with the residual add before it.
    # The parameters as static fakes of the capture's mode (a real tensor it converted itself
    # would get symbols of its own).
    mode = next(f.fake_mode for f in fakes if isinstance(f, torch.Tensor))
    static = [mode.from_tensor(p, static_shapes=True) for p in params]
    # A kernel's choice that asks whether a batch is 1 (SDPA's on a GPU) takes it as 2 and up:
    # the plan is then for such calls only (ShapeEnvUnchanged's floors).
    floors = {}
    with ShapeEnvUnchanged(env, floors), symbolic_ops():
        aten_gm, _ = to_aten(gm, fakes, static, eager_ops=True,
                             eager_decompositions=get_decompositions([aten.native_layer_norm]))
        graph = to_ir(aten_gm, num_bound=len(params))
    graph.num_bound_inputs = len(params)
    return LoweredGraph(graph, params, len(fakes), aten_gm, floors)


def structure_key(gm: torch.fx.GraphModule, example_inputs: Sequence,
                  extra: bytes = b"") -> Optional[str]:
    """A digest of everything the lowering depends on, taken before lowering: the lowering's
    own code, torch's version, the global state tracing sees, the captured graph's code, every
    input's and parameter's metadata. Two processes with equal digests lower to the same IR, so
    a warm process may skip the lowering. None when the graph's code does not pin what it
    computes (a call of a user's function or submodule, a constant printed by a name): such a
    graph is always lowered."""
    attrs = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            return None
        if node.op == "call_function" and not _named_by_torch(node.target):
            return None
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(gm)
            if not isinstance(value, torch.Tensor):
                return None
            attrs.append((node.target, value))
        if not all(_printed_exactly(a) for a in node.args) or \
                not all(_printed_exactly(a) for a in node.kwargs.values()):
            return None
    h = hashlib.sha256()
    h.update(_lowering_digest())
    h.update(torch.__version__.encode())
    h.update(_global_state().encode())
    h.update(_graph_text(gm.graph).encode())
    for name, t in sorted(attrs, key=lambda a: a[0]):
        h.update(name.encode())
        h.update(_meta_text(t).encode())
    for t in example_inputs:
        h.update(_meta_text(t).encode() if isinstance(t, torch.Tensor) else repr(t).encode())
    h.update(extra)  # what else the caller's key depends on (the target, the compiler)
    return h.hexdigest()


def _graph_text(graph: torch.fx.Graph) -> str:
    """Every node of `graph` in order: kind, name, the target's qualified name, arguments and
    keywords (checked by structure_key to print exactly; nodes print as their names). What the
    graph's Python code says, without generating that code (35 ms for resnet50)."""
    lines = []
    for n in graph.nodes:
        lines.append(f"{n.op}|{n.name}|{_target_text(n.target)}|{n.args!r}|{n.kwargs!r}")
    return "\n".join(lines)


def _target_text(target) -> str:
    if isinstance(target, str):
        return target
    owner = getattr(target, "__objclass__", None)  # methods of torch._C.TensorBase
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", "?")
    if owner is not None:
        return f"{owner.__module__}.{owner.__qualname__}.{getattr(target, '__name__', '?')}"
    return f"{getattr(target, '__module__', None)}.{qualname}:{type(target).__name__}"


@functools.lru_cache(maxsize=1)
def _lowering_digest() -> bytes:
    """LOWERING_VERSION and the source of this module, the IR's, the input updates' and
    layout's: an edit to the lowering that forgets to bump the version still gets new structure
    keys."""
    from kiln.graph import ir, layout

    h = hashlib.sha256(LOWERING_VERSION)
    for module in (__file__, ir.__file__, input_updates.__file__, layout.__file__):
        try:
            with open(module, "rb") as f:
                h.update(f.read())
        except (OSError, TypeError):
            h.update(b"?")  # no source to read (a frozen install): the version alone
    return h.digest()


def _global_state() -> str:
    """The process state that changes what tracing records."""
    try:
        autocast = [(torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                    for d in ("cpu", "cuda")]
    except (TypeError, AttributeError):  # torch < 2.4
        autocast = [torch.is_autocast_cpu_enabled(), torch.is_autocast_enabled()]
    return f"{torch.is_grad_enabled()}|{torch.is_inference_mode_enabled()}|" \
           f"{torch.get_default_dtype()}|{autocast}"


# Where a call target's qualified name fixes what it computes, for a given torch version.
_NAMED_MODULES = ("torch", "_operator", "operator", "math", "builtins")


def _named_by_torch(target) -> bool:
    owner = getattr(target, "__objclass__", None)  # methods of torch._C.TensorBase
    module = getattr(owner if owner is not None else target, "__module__", None)
    return isinstance(module, str) and module.split(".", 1)[0] in _NAMED_MODULES


_PRINTED = (type(None), bool, int, float, complex, str, torch.dtype, torch.device,
            torch.memory_format, torch.layout, type(Ellipsis), torch.fx.Node)


def _printed_exactly(value) -> bool:
    """Whether graph code shows `value` completely (FX prints other objects by a name)."""
    if isinstance(value, (tuple, list)):
        return all(_printed_exactly(v) for v in value)
    if isinstance(value, slice):
        return all(_printed_exactly(v) for v in (value.start, value.stop, value.step))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _printed_exactly(v) for k, v in value.items())
    return type(value) in _PRINTED


def _meta_text(t: torch.Tensor) -> str:
    return f"{t.dtype}|{tuple(t.shape)}|{t.stride()}|{t.storage_offset()}|{t.device}|" \
           f"{t.requires_grad}|{type(t).__name__};"
