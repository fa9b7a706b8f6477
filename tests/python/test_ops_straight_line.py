"""Straight-line frames of one torch function, Tensor method or Python operator each: the
compiled result equals eager on fresh random inputs, in one graph that is reused."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.testing import CompileCounter


def randn(*shape):
    return lambda: torch.randn(*shape)


def positive(*shape):
    return lambda: torch.rand(*shape) + 0.1


def ints(high, *shape):
    return lambda: torch.randint(0, high, shape)


def bools(*shape):
    return lambda: torch.rand(*shape) > 0.5


def tensors(*makers):
    """Input factory: one fresh tensor per maker, the arguments of the frame under test."""
    return lambda: tuple(m() for m in makers)


X = tensors(randn(4, 5))
XY = tensors(randn(4, 5), randn(4, 5))
POS = tensors(positive(4, 5))
X_POS = tensors(randn(4, 5), positive(4, 5))
IMG = tensors(randn(2, 3, 8, 8))

CASES = [
    # Unary math, as torch functions and as Tensor methods.
    ("torch.sin", lambda x: torch.sin(x), X),
    ("torch.cos", lambda x: torch.cos(x), X),
    ("torch.tan", lambda x: torch.tan(x), X),
    ("torch.exp", lambda x: torch.exp(x), X),
    ("Tensor.expm1", lambda x: x.expm1(), X),
    ("torch.log", lambda x: torch.log(x), POS),
    ("Tensor.log1p", lambda x: x.log1p(), POS),
    ("torch.log2", lambda x: torch.log2(x), POS),
    ("torch.tanh", lambda x: torch.tanh(x), X),
    ("torch.sigmoid", lambda x: torch.sigmoid(x), X),
    ("torch.relu", lambda x: torch.relu(x), X),
    ("torch.abs", lambda x: torch.abs(x), X),
    ("torch.neg", lambda x: torch.neg(x), X),
    ("torch.sqrt", lambda x: torch.sqrt(x), POS),
    ("torch.rsqrt", lambda x: torch.rsqrt(x), POS),
    ("torch.floor", lambda x: torch.floor(x * 3), X),
    ("Tensor.ceil", lambda x: (x * 3).ceil(), X),
    ("torch.round", lambda x: torch.round(x * 3), X),
    ("torch.trunc", lambda x: torch.trunc(x * 3), X),
    ("torch.erf", lambda x: torch.erf(x), X),
    ("Tensor.reciprocal", lambda x: x.reciprocal(), POS),
    ("torch.sign", lambda x: torch.sign(x), X),
    ("torch.clamp", lambda x: torch.clamp(x, min=-0.5, max=0.5), X),
    ("Tensor.square", lambda x: x.square(), X),
    ("torch.atan", lambda x: torch.atan(x), X),
    # Binary and ternary.
    ("torch.add_alpha", lambda x, y: torch.add(x, y, alpha=2), XY),
    ("torch.sub", lambda x, y: torch.sub(x, y), XY),
    ("torch.mul", lambda x, y: torch.mul(x, y), XY),
    ("torch.div", lambda x, y: torch.div(x, y), X_POS),
    ("torch.pow", lambda x, y: torch.pow(y, x), X_POS),
    ("torch.maximum", lambda x, y: torch.maximum(x, y), XY),
    ("torch.minimum", lambda x, y: torch.minimum(x, y), XY),
    ("torch.atan2", lambda x, y: torch.atan2(x, y), XY),
    ("torch.remainder", lambda x, y: torch.remainder(x, y), X_POS),
    ("torch.fmod", lambda x, y: torch.fmod(x, y), X_POS),
    ("torch.where", lambda x, y: torch.where(x > 0, x, y), XY),
    ("torch.lerp", lambda x, y: torch.lerp(x, y, 0.3), XY),
    ("torch.matmul", lambda a, b: torch.matmul(a, b), tensors(randn(2, 4, 5), randn(5, 3))),
    ("torch.mm", lambda a, b: torch.mm(a, b), tensors(randn(4, 5), randn(5, 3))),
    ("torch.bmm", lambda a, b: torch.bmm(a, b), tensors(randn(2, 4, 5), randn(2, 5, 3))),
    ("torch.addmm", lambda c, a, b: torch.addmm(c, a, b),
     tensors(randn(3), randn(4, 5), randn(5, 3))),
    ("torch.outer", lambda a, b: torch.outer(a, b), tensors(randn(4), randn(5))),
    ("torch.einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b),
     tensors(randn(2, 4, 5), randn(2, 5, 3))),
    # Reductions and normalizations.
    ("torch.sum", lambda x: torch.sum(x, dim=1), X),
    ("Tensor.sum", lambda x: x.sum(), X),
    ("torch.mean", lambda x: torch.mean(x, dim=0, keepdim=True), X),
    ("torch.amax", lambda x: torch.amax(x, dim=1), X),
    ("torch.amin", lambda x: torch.amin(x, dim=-1), X),
    ("torch.prod", lambda x: torch.prod(x, dim=1), X),
    ("torch.std", lambda x: torch.std(x, dim=1), X),
    ("Tensor.var", lambda x: x.var(dim=0), X),
    ("torch.norm", lambda x: torch.norm(x, dim=1), X),
    ("torch.logsumexp", lambda x: torch.logsumexp(x, dim=1), X),
    ("torch.softmax", lambda x: torch.softmax(x, dim=-1), X),
    ("F.log_softmax", lambda x: F.log_softmax(x, dim=1), X),
    ("torch.cumsum", lambda x: torch.cumsum(x, dim=1), X),
    ("torch.argmax", lambda x: torch.argmax(x, dim=1), X),
    ("Tensor.argmin", lambda x: x.argmin(dim=0), X),
    ("torch.max_dim", lambda x: tuple(torch.max(x, dim=1)), X),
    ("torch.topk", lambda x: tuple(torch.topk(x, 2, dim=1)), X),
    ("torch.sort", lambda x: tuple(torch.sort(x, dim=1)), X),
    ("Tensor.all", lambda b: b.all(dim=1), tensors(bools(4, 5))),
    ("torch.any", lambda b: torch.any(b, dim=0), tensors(bools(4, 5))),
    # Shapes and layout.
    ("Tensor.view", lambda x: x.view(5, 4), X),
    ("torch.reshape", lambda x: torch.reshape(x, (2, -1)), X),
    ("Tensor.permute", lambda x: x.permute(2, 0, 1), tensors(randn(2, 3, 4))),
    ("torch.transpose", lambda x: torch.transpose(x, 0, 1), X),
    ("torch.flatten", lambda x: torch.flatten(x, 1), tensors(randn(2, 3, 4))),
    ("Tensor.unsqueeze", lambda x: x.unsqueeze(1), X),
    ("torch.squeeze", lambda x: torch.squeeze(x, 1), tensors(randn(4, 1, 5))),
    ("torch.cat", lambda x, y: torch.cat([x, y], dim=1), XY),
    ("torch.stack", lambda x, y: torch.stack((x, y), dim=0), XY),
    ("torch.chunk", lambda x: torch.chunk(x, 2, dim=0), X),
    ("Tensor.split", lambda x: x.split([2, 3], dim=1), X),
    ("Tensor.expand", lambda x: x.expand(3, 4, 5), tensors(randn(1, 4, 5))),
    ("Tensor.repeat", lambda x: x.repeat(2, 3), X),
    ("torch.narrow", lambda x: torch.narrow(x, 1, 1, 3), X),
    ("Tensor.t", lambda x: x.t(), X),
    ("Tensor.contiguous", lambda x: x.t().contiguous(), X),
    ("torch.clone", lambda x: torch.clone(x), X),
    ("torch.flip", lambda x: torch.flip(x, dims=[0]), X),
    ("torch.roll", lambda x: torch.roll(x, 2, dims=1), X),
    ("torch.tril", lambda x: torch.tril(x), X),
    ("torch.gather", lambda x, i: torch.gather(x, 1, i), tensors(randn(4, 5), ints(5, 4, 3))),
    ("torch.index_select", lambda x, i: torch.index_select(x, 0, i),
     tensors(randn(4, 5), ints(4, 6))),
    ("Tensor.masked_fill", lambda x: x.masked_fill(x < 0, 0.0), X),
    ("torch.zeros_like", lambda x: torch.zeros_like(x) + x, X),
    ("Tensor.new_ones", lambda x: x.new_ones(3, 2) * x[0, 0], X),
    ("torch.arange", lambda x: x * torch.arange(5), X),
    ("Tensor.to_dtype", lambda x: (x * 4).to(torch.int64), X),
    ("Tensor.float", lambda i: i.float() / 3, tensors(ints(10, 4, 5))),
    ("Tensor.size", lambda x: x.reshape(x.size(0) * x.size(1)), X),
    ("Tensor.shape", lambda x: x.view(x.shape[0], 1, -1) * x.shape[-1], X),
    # torch.nn.functional.
    ("F.linear", lambda x, w, b: F.linear(x, w, b), tensors(randn(4, 5), randn(3, 5), randn(3))),
    ("F.conv2d", lambda x, w, b: F.conv2d(x, w, b, padding=1),
     tensors(randn(2, 3, 8, 8), randn(4, 3, 3, 3), randn(4))),
    ("F.max_pool2d", lambda x: F.max_pool2d(x, 2), IMG),
    ("F.avg_pool2d", lambda x: F.avg_pool2d(x, kernel_size=3, stride=2, padding=1), IMG),
    ("F.adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (1, 1)), IMG),
    ("F.layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b, eps=1e-5),
     tensors(randn(4, 5), randn(5), randn(5))),
    ("F.group_norm", lambda x: F.group_norm(x, 1), IMG),
    ("F.gelu", lambda x: F.gelu(x), X),
    ("F.silu", lambda x: F.silu(x), X),
    ("F.leaky_relu", lambda x: F.leaky_relu(x, 0.1), X),
    ("F.elu", lambda x: F.elu(x), X),
    ("F.softplus", lambda x: F.softplus(x), X),
    ("F.hardtanh", lambda x: F.hardtanh(x, -0.5, 0.5), X),
    ("F.dropout_eval", lambda x: F.dropout(x, p=0.5, training=False), X),
    ("F.batch_norm", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
     tensors(randn(2, 3, 8, 8), randn(3), positive(3), randn(3), randn(3))),
    ("F.embedding", lambda i, w: F.embedding(i, w), tensors(ints(10, 2, 7), randn(10, 4))),
    ("F.pad", lambda x: F.pad(x, (1, 2, 0, 1)), X),
    ("F.interpolate", lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), IMG),
    ("F.interpolate_bilinear",
     lambda x: F.interpolate(x, size=(5, 5), mode="bilinear", align_corners=False), IMG),
    ("F.normalize", lambda x: F.normalize(x, dim=1), X),
    ("F.cross_entropy", lambda x, t: F.cross_entropy(x, t), tensors(randn(4, 5), ints(5, 4))),
    ("F.mse_loss", lambda x, y: F.mse_loss(x, y), XY),
    ("F.one_hot", lambda i: F.one_hot(i, 6), tensors(ints(6, 7))),
    ("F.cosine_similarity", lambda x, y: F.cosine_similarity(x, y, dim=1), XY),
    # Python operators on tensors.
    ("op.add", lambda x, y: x + y, XY),
    ("op.radd_scalar", lambda x: 2.5 + x, X),
    ("op.sub", lambda x, y: x - y, XY),
    ("op.mul", lambda x, y: x * y, XY),
    ("op.truediv", lambda x, y: x / y, X_POS),
    ("op.rtruediv_scalar", lambda y: 1.0 / y, POS),
    ("op.floordiv", lambda x, y: x // y, X_POS),
    ("op.mod", lambda x, y: x % y, X_POS),
    ("op.pow", lambda x: x ** 2, X),
    ("op.rpow_scalar", lambda x: 2 ** x, X),
    ("op.matmul", lambda a, b: a @ b, tensors(randn(4, 5), randn(5, 3))),
    ("op.neg", lambda x: -x, X),
    ("op.pos_abs", lambda x: abs(+x), X),
    ("op.lt", lambda x, y: x < y, XY),
    ("op.le", lambda x, y: x <= y, XY),
    ("op.gt_scalar", lambda x: x > 0.1, X),
    ("op.ge", lambda x, y: x >= y, XY),
    ("op.eq", lambda a, b: a == b, tensors(ints(3, 4, 5), ints(3, 4, 5))),
    ("op.ne", lambda a, b: a != b, tensors(ints(3, 4, 5), ints(3, 4, 5))),
    ("op.and", lambda a, b: a & b, tensors(bools(4, 5), bools(4, 5))),
    ("op.or", lambda a, b: a | b, tensors(bools(4, 5), bools(4, 5))),
    ("op.xor", lambda a, b: a ^ b, tensors(bools(4, 5), bools(4, 5))),
    ("op.invert", lambda a: ~a, tensors(bools(4, 5))),
    # Indexing and slicing.
    ("index.int", lambda x: x[0], X),
    ("index.negative_int", lambda x: x[-1, 2], X),
    ("index.slice", lambda x: x[:, 1:3], X),
    ("index.ellipsis_none", lambda x: x[..., None], X),
    ("index.step", lambda x: x[::2], X),
    ("index.tensor", lambda x, i: x[i], tensors(randn(4, 5), ints(4, 3))),
    ("index.tensor_pair", lambda x, i, j: x[i, j],
     tensors(randn(4, 5), ints(4, 3), ints(5, 3))),
    ("index.mixed", lambda x: x[1:, None, ::2], X),
    # More torch functions, methods and attributes.
    ("Tensor.T", lambda x: x.T, X),
    ("Tensor.mT", lambda x: x.mT, tensors(randn(2, 3, 4))),
    ("torch.triu", lambda x: torch.triu(x, diagonal=1), X),
    ("torch.diagonal", lambda x: torch.diagonal(x, offset=1), X),
    ("torch.cumprod", lambda x: torch.cumprod(x, dim=0), X),
    ("Tensor.detach", lambda x: x.detach() * 2, X),
    ("torch.nan_to_num", lambda x: torch.nan_to_num(torch.log(x), neginf=-7.0), X),
    ("torch.logical_and", lambda a, b: torch.logical_and(a, b), tensors(bools(4, 5), bools(4, 5))),
    ("torch.std_mean", lambda x: tuple(torch.std_mean(x, dim=1)), X),
    ("torch.unbind", lambda x: torch.unbind(x, dim=1), X),
    ("torch.addcmul", lambda x, y: torch.addcmul(x, x, y, value=0.5), XY),
    ("torch.baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5),
     tensors(randn(2, 4, 3), randn(2, 4, 5), randn(2, 5, 3))),
    ("torch.tensordot", lambda a, b: torch.tensordot(a, b, dims=([1], [0])),
     tensors(randn(4, 5), randn(5, 3))),
    ("torch.movedim", lambda x: torch.movedim(x, 0, -1), tensors(randn(2, 3, 4))),
    ("Tensor.unflatten", lambda x: x.unflatten(1, (1, 5)), X),
    ("Tensor.view_as", lambda x, y: x.t().reshape(-1).view_as(y), XY),
    ("Tensor.expand_as", lambda b, x: b.expand_as(x) + x, tensors(randn(1, 5), randn(4, 5))),
    ("torch.broadcast_to", lambda b: torch.broadcast_to(b, (3, 4, 5)), tensors(randn(4, 1))),
    ("torch.full", lambda x: torch.full((4, 5), 1.5) * x, X),
    ("torch.eye", lambda x: torch.eye(4) @ x, X),
    ("torch.linspace", lambda x: x + torch.linspace(0, 1, 5), X),
    ("torch.zeros_dtype", lambda i: torch.zeros(4, 5, dtype=torch.int64) + i,
     tensors(ints(9, 4, 5))),
    ("Tensor.type_as", lambda i, x: i.type_as(x) * x, tensors(ints(9, 4, 5), randn(4, 5))),
    ("Tensor.to_bfloat16", lambda x: (x.to(torch.bfloat16) * 2).float(), X),
    ("op.int_floordiv", lambda i: i // 3 + i % 3, tensors(ints(50, 4, 5))),
    ("op.float64", lambda x: x.double() ** 0.5, POS),
    ("F.softmax_dtype", lambda x: F.softmax(x, dim=0, dtype=torch.float64), X),
    ("F.glu", lambda x: F.glu(x, dim=0), X),
    ("F.hardswish", lambda x: F.hardswish(x), X),
    ("F.pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), tensors(randn(1, 8, 3, 3))),
    ("F.unfold", lambda x: F.unfold(x, kernel_size=3), IMG),
    ("F.conv1d", lambda x, w: F.conv1d(x, w, stride=2), tensors(randn(2, 3, 9), randn(4, 3, 3))),
    ("F.conv_transpose2d", lambda x, w: F.conv_transpose2d(x, w, stride=2),
     tensors(randn(1, 3, 4, 4), randn(3, 2, 3, 3))),
    ("F.instance_norm", lambda x: F.instance_norm(x), IMG),
    ("F.scaled_dot_product_attention",
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     tensors(randn(2, 2, 5, 4), randn(2, 2, 5, 4), randn(2, 2, 5, 4))),
    ("F.binary_cross_entropy_with_logits",
     lambda x, t: F.binary_cross_entropy_with_logits(x, t), tensors(randn(4, 5), positive(4, 5))),
    ("F.nll_loss", lambda x, t: F.nll_loss(F.log_softmax(x, 1), t, reduction="sum"),
     tensors(randn(4, 5), ints(5, 4))),
    ("F.smooth_l1_loss", lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), XY),
    ("F.kl_div", lambda x, y: F.kl_div(F.log_softmax(x, 1), F.softmax(y, 1),
                                       reduction="batchmean"), XY),
]


def _clone_args(args):
    return tuple(a.clone() for a in args)


@pytest.mark.parametrize("fn,make_args", [pytest.param(fn, make, id=name)
                                          for name, fn, make in CASES])
def test_single_op_frame_matches_eager_in_one_reused_graph(fn, make_args):
    torch.manual_seed(1234)
    inputs = [make_args(), make_args()]
    expected = [fn(*_clone_args(args)) for args in inputs]

    kiln.reset()
    cnt = CompileCounter()
    opt = kiln.compile(fn, backend=cnt)
    for args, want in zip(inputs, expected):
        got = opt(*args)
        torch.testing.assert_close(got, want, equal_nan=True)
    assert cnt.frame_count == 1
    assert cnt.op_count >= 1
    assert kiln.debug.cache_entries(opt)[0].hits == 2


def test_the_table_covers_at_least_sixty_distinct_ops():
    names = [name for name, _, _ in CASES]
    assert len(set(names)) == len(names)
    assert len(names) >= 60
