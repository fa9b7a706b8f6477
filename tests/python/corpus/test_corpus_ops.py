"""Straight-line functional model code: activations, norms, losses, attention pieces, factory
functions, dtype promotion and reductions, each one graph."""
import math

import pytest
import torch
import torch.nn.functional as F

from .harness import Corpus, t

corpus = Corpus()


@corpus((4, 8), frames=1)
def gelu_tanh_approximation(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))


@corpus((3, 5), frames=1)
def stable_softmax_by_hand(x):
    z = x - x.max(dim=-1, keepdim=True)[0]
    e = z.exp()
    return e / e.sum(-1, keepdim=True)


@corpus((3, 6), frames=1)
def layer_norm_by_hand(x):
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    return (x - mu) / torch.sqrt(var + 1e-5)


@corpus((4, 5), lambda: torch.randint(0, 5, (4,)), frames=1)
def cross_entropy_with_label_smoothing(logits, target):
    return F.cross_entropy(logits, target, label_smoothing=0.1)


@corpus((4, 3), (4, 3), frames=1)
def mse_and_l1_losses(a, b):
    return F.mse_loss(a, b) + F.l1_loss(a, b, reduction="sum")


@corpus((2, 4, 8), (2, 4, 8), (2, 4, 8), frames=1)
def scaled_dot_product_attention_call(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@corpus((2, 6, 8), frames=1)
def rotary_embedding(x):
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    pos = torch.arange(x.shape[1]).float()
    freqs = torch.outer(pos, inv)
    cos, sin = freqs.cos(), freqs.sin()
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


@corpus((4, 6), (4, 6), frames=1)
def cosine_similarity_and_normalize(a, b):
    return F.cosine_similarity(a, b, dim=-1), F.normalize(a, dim=-1)


@corpus((3, 7), frames=1)
def logsumexp_and_log_softmax(x):
    return torch.logsumexp(x, dim=-1), F.log_softmax(x, dim=-1)


@corpus(lambda: torch.randint(0, 4, (5,)), frames=1)
def one_hot_to_float(labels):
    return F.one_hot(labels, num_classes=4).float() * 0.9 + 0.025


@corpus((6,), frames=1)
def cumsum_cumprod_diff(x):
    return x.cumsum(0), x.cumprod(0), torch.diff(x)


@corpus((3, 6), frames=1)
def topk_values_and_indices(x):
    top = x.topk(2, dim=-1)
    return top.values * 2, top.indices


@corpus((3, 6), frames=1)
def topk_unpacked_as_tuple(x):
    vals, idx = torch.topk(x, 2, dim=-1)
    return vals * 2, idx


@corpus((3, 6), frames=1)
def max_dim_values(x):
    return x.max(dim=-1).values - x.min(dim=-1).values


@corpus((5,), (5,), frames=1)
def where_and_clamp(x, y):
    return torch.where(x > y, x, y).clamp(-0.5, 0.5)


@corpus((4,), (4,), frames=1)
def lerp_and_addcmul(a, b):
    return torch.lerp(a, b, 0.3) + torch.addcmul(a, a, b, value=0.5)


@corpus((2, 3, 4), (2, 4, 5), frames=1)
def einsum_and_bmm_agree(a, b):
    return torch.einsum("bij,bjk->bik", a, b) - torch.bmm(a, b)


@corpus((4, 5), frames=1)
def dropout_in_eval_mode_is_identity(x):
    return F.dropout(x, p=0.5, training=False) * 2


@corpus((1, 2, 6, 6), (3, 2, 3, 3), frames=1)
def conv2d_and_pooling_functional(x, w):
    y = F.conv2d(x, w, padding=1)
    return F.avg_pool2d(y, 2), F.max_pool2d(y, 3, stride=3)


@corpus(lambda: torch.randint(0, 10, (4,)), (4,), frames=1)
def int_float_type_promotion(i, f):
    return i + f, i * 2, i // 3, i / 4, (i > 3).sum()


@corpus((3, 4), frames=1)
def factory_functions_following_input(x):
    z = torch.zeros_like(x)
    o = torch.ones(x.shape, dtype=x.dtype)
    f = torch.full((3, 4), 2.5)
    r = torch.arange(x.shape[1], dtype=x.dtype)
    return x + z + o * f + r + torch.linspace(0, 1, 4)


@corpus((3, 4), frames=1)
def dtype_conversions(x):
    return x.double().sum(), x.to(torch.float16).float(), x.int(), x.bool().any()


@corpus((2, 3, 4), frames=1)
def reductions_over_several_dims(x):
    return x.sum((0, 2)), x.amax(dim=(1, 2)), x.std(1), x.prod(-1), x.norm(dim=0)


@corpus((4, 4), frames=1)
def sort_and_argsort(x):
    vals, idx = x.sort(dim=1, descending=True)
    return vals, idx, x.argsort(dim=0)


@corpus((2, 3), (2, 3), frames=1)
def comparison_and_logical_ops(a, b):
    m = (a > 0) & (b < 0) | ~(a == b)
    return m, torch.logical_xor(a > 0, b > 0), m.float().mean()


@corpus((4, 4), frames=1)
def matrix_ops(x):
    s = x @ x.T + torch.eye(4) * 4
    return torch.linalg.cholesky(s), torch.trace(s), torch.det(s)


@corpus((2, 3, 4), frames=1)
def cat_stack_and_broadcast(x):
    y = torch.cat([x, x * 2], dim=-1)
    z = torch.stack([x, x], dim=0)
    return y.sum(-1, keepdim=True) + z.mean(0)


@corpus((3, 4), frames=1)
def python_scalar_ops_on_tensor(x):
    return 1 - x, 2 / (x.abs() + 1), x ** 2, -x, x % 1.5, 3 * x // 1


@corpus((5, 5), frames=1)
def tril_masked_mean(x):
    mask = torch.tril(torch.ones_like(x))
    return (x * mask).sum() / mask.sum()


@corpus((4, 3), frames=1)
def binary_cross_entropy_with_logits(x):
    target = (x > 0).float()
    return F.binary_cross_entropy_with_logits(x, target, pos_weight=torch.full((3,), 2.0))


@corpus((2, 8), frames=1)
def glu_and_softplus(x):
    return F.glu(x, dim=-1), F.softplus(x, beta=2.0)


@corpus((3, 4), frames=1)
def new_tensor_methods(x):
    return x.new_zeros(2), x.new_full((2, 2), 3.0), x.new_empty(0).numel()


@corpus((3,), frames=1)
def constant_tensors_built_inside(x):
    return x + torch.tensor([1, 2, 3]) + x.new_tensor([1.0, 2.0, 3.0]) * torch.as_tensor([2.0])


@corpus(lambda: torch.randint(0, 9, (4,)), frames=1)
def integer_division_modes(x):
    return x / 2, x // 2, torch.div(x, 2, rounding_mode="floor"), x % 3


@corpus((4,), frames=1)
def inf_and_nan_handling(x):
    return torch.nan_to_num(x / 0.0, posinf=1.0, neginf=-1.0), x.clamp(max=float("inf"))


@corpus((3,), frames=1)
def python_int_semantics_negative_mod_and_round(x):
    return x * (-7 % 3) + (-7 // 2) + round(2.5) + round(3.5)


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
