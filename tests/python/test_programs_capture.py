"""Small whole programs (functions and nn.Modules with parameters) captured by kiln: results
equal eager on random inputs, with the expected number of graphs and ops, recompiles included."""
import copy
import enum
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.testing import CompileCounter


def check(program, make_args, *, calls=2, frames=1, ops=None, min_ops=1, **compile_kwargs):
    """Runs `program` eagerly and compiled on `calls` fresh argument sets of the same shapes;
    asserts equal results, `frames` graphs and, when given, `ops` ops in all. An nn.Module is
    compared with a deep copy of itself, so in-place updates of its state are compared too."""
    eager_program = copy.deepcopy(program) if isinstance(program, nn.Module) else program
    inputs = [make_args() for _ in range(calls)]
    expected = [eager_program(*clone_tree(args)) for args in inputs]

    kiln.reset()
    cnt = CompileCounter()
    opt = kiln.compile(program, backend=cnt, **compile_kwargs)
    for args, want in zip(inputs, expected):
        torch.testing.assert_close(opt(*args), want)
    if isinstance(program, nn.Module):
        torch.testing.assert_close(program.state_dict(), eager_program.state_dict())
    assert cnt.frame_count == frames
    if ops is not None:
        assert cnt.op_count == ops
    assert cnt.op_count >= min_ops
    return cnt, opt


def clone_tree(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(clone_tree(v) for v in value)
    if isinstance(value, dict):
        return {k: clone_tree(v) for k, v in value.items()}
    return value


def randn(*shape):
    return lambda: (torch.randn(*shape),)


# ---------------------------------------------------------------------------------------------
# Modules with parameters.


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_mlp_module_one_graph_three_ops():
    check(MLP(), randn(5, 8), ops=3)


class ConvBNReLU(nn.Module):
    def __init__(self, cin=3, cout=6):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _with_bn_stats(mod):
    for m in mod.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.5, 0.5)
    return mod


def test_conv_bn_relu_block_in_eval_mode():
    check(_with_bn_stats(ConvBNReLU()).eval(), randn(2, 3, 8, 8), ops=3)


def test_conv_bn_relu_block_in_train_mode_updates_running_stats_like_eager():
    # check() compares the module's state_dict (running_mean/var, num_batches_tracked) with an
    # eager copy after the same two calls.
    check(ConvBNReLU().train(), randn(4, 3, 6, 6), min_ops=3)


class ResidualBlock(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


def test_residual_block_in_eval_mode():
    check(_with_bn_stats(ResidualBlock()).eval(), randn(2, 4, 7, 7), ops=7)


class Attention(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v


def test_single_head_attention_softmax_qk_v():
    check(Attention(), randn(2, 5, 16), min_ops=7)


class MultiHeadAttention(nn.Module):
    def __init__(self, d=16, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.out(y)


def test_multi_head_causal_attention_with_views_and_mask():
    check(MultiHeadAttention(), randn(2, 6, 16), min_ops=10)


class LayerNormMLP(nn.Module):
    def __init__(self, d=12):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.ln(x))))


def test_prenorm_layer_norm_mlp_with_residual():
    check(LayerNormMLP(), randn(3, 4, 12), ops=5)


class EmbeddingClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        return self.head(self.emb(tokens).mean(dim=1))


def test_embedding_mean_linear_on_token_ids():
    check(EmbeddingClassifier(), lambda: (torch.randint(0, 20, (4, 7)),), ops=3)


class PositionalEncoder(nn.Module):
    def __init__(self, vocab=30, d=8, max_len=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.register_buffer("pos", torch.randn(max_len, d))
        self.norm = nn.LayerNorm(d)

    def forward(self, tokens):
        t = tokens.shape[1]
        return self.norm(self.tok(tokens) + self.pos[:t])


def test_embedding_plus_positional_buffer_and_layer_norm():
    check(PositionalEncoder(), lambda: (torch.randint(0, 30, (2, 9)),), min_ops=4)


def test_sequential_module_is_inlined_into_one_graph():
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 10), nn.Sigmoid(),
                          nn.Linear(10, 2))
    check(model, randn(3, 6), ops=5)


class ModuleListNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(4)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x)) + i
        return x


def test_module_list_iterated_with_enumerate_unrolls():
    check(ModuleListNet(), randn(3, 6), ops=12)


class ModuleDictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.branches = nn.ModuleDict({"a": nn.Linear(5, 3), "b": nn.Linear(5, 3),
                                       "c": nn.Linear(5, 3)})

    def forward(self, x):
        outs = {}
        for name, branch in self.branches.items():
            outs[name] = branch(x)
        return outs["a"] * outs["b"] - outs["c"]


def test_module_dict_items_iterated_in_forward():
    check(ModuleDictNet(), randn(4, 5), ops=5)


class HelperMethodNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.scale = 0.5

    def _project(self, x, shift=1.0):
        return self.proj(x) * self.scale + shift

    def forward(self, x):
        return self._project(x) + self._project(x.flip(0), shift=-1.0)


def test_module_calling_helper_method_with_attribute_constant():
    check(HelperMethodNet(), randn(4, 6), min_ops=7)


class ScaledLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = 3.0
        self.use_bias_shift = True

    def forward(self, x):
        y = self.lin(x) * self.scale
        if self.use_bias_shift:
            y = y + 1
        return y


def test_module_attribute_constant_change_recompiles():
    model = ScaledLinear()
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(2, 4)
    torch.testing.assert_close(opt(x), model(x))
    torch.testing.assert_close(opt(x), model(x))
    assert cnt.frame_count == 1
    model.scale = -2.0
    torch.testing.assert_close(opt(x), model.lin(x) * -2.0 + 1)
    assert cnt.frame_count == 2
    model.use_bias_shift = False
    torch.testing.assert_close(opt(x), model.lin(x) * -2.0)
    assert cnt.frame_count == 3


class ParamNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 3))
        self.bias = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return torch.tanh(x @ self.weight + self.bias)


def test_module_using_raw_parameters_directly():
    check(ParamNet(), randn(4, 5), ops=3)


def test_parameter_update_in_place_is_seen_without_recompiling():
    model = ParamNet()
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(4, 5)
    torch.testing.assert_close(opt(x), model(x))
    with torch.no_grad():
        model.weight.mul_(2.0)
        model.bias.add_(1.0)
    torch.testing.assert_close(opt(x), torch.tanh(x @ model.weight + model.bias))
    assert cnt.frame_count == 1


class LayoutParams(nn.Module):
    """Parameters and buffers of several layouts; forward branches on their metadata."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 2, 2).to(memory_format=torch.channels_last))
        self.register_buffer("scale", torch.randn(3, 4).t())  # non-contiguous, no view base
        self.register_buffer("steps", torch.arange(4, dtype=torch.int64))
        self.frozen = nn.Parameter(torch.randn(4), requires_grad=False)

    def forward(self, x):
        y = F.conv2d(x, self.w)
        if self.w.is_contiguous(memory_format=torch.channels_last):
            y = y * 2
        if self.scale.stride() == (1, 4):
            y = y + self.scale.sum()
        if not self.frozen.requires_grad:
            y = y - self.frozen.view(1, 4, 1, 1)
        return y * self.steps.to(y.dtype).view(1, 4, 1, 1)


def test_parameter_and_buffer_metadata_in_the_graph_matches_the_tensors():
    model = LayoutParams()
    cnt, _ = check(model, randn(2, 3, 5, 5), ops=None)
    gm = cnt.graphs[0]
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert len(attrs) == 4
    for node in attrs:
        real = getattr(gm, node.target)
        fake = node.meta["example_value"]
        assert isinstance(fake, torch._subclasses.fake_tensor.FakeTensor)
        assert (fake.shape, fake.stride(), fake.dtype, fake.device, fake.requires_grad) == (
            real.shape, real.stride(), real.dtype, real.device, real.requires_grad)
    # The branches on metadata were taken as eager takes them: both scale and frozen are used.
    assert cnt.op_count >= 8


class TupleAttr(nn.Module):
    """A user module with a tuple attribute the forward reads (as timm's patch sizes)."""

    def __init__(self):
        super().__init__()
        self.scales = (2.0, 3)

    def forward(self, x):
        return x * self.scales[0] + self.scales[1]


def test_tuple_attribute_of_a_user_module_is_guarded_item_by_item():
    model = TupleAttr()
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(4)
    torch.testing.assert_close(opt(x), x * 2.0 + 3)
    opt(x)
    assert cnt.frame_count == 1
    model.scales = (5.0, 3)
    torch.testing.assert_close(opt(x), x * 5.0 + 3)
    model.scales = (5.0, 3, 1)
    torch.testing.assert_close(opt(x), x * 5.0 + 3)
    assert cnt.frame_count == 3


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 2 * 2, 10)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = self.drop(torch.flatten(x, 1))
        return F.log_softmax(self.fc(x), dim=1)


def test_small_cnn_classifier_in_eval_mode():
    check(TinyCNN().eval(), randn(3, 1, 14, 14), min_ops=9)


class LossModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 4))

    def forward(self, x, target):
        logits = self.net(x)
        return F.cross_entropy(logits, target), logits.argmax(dim=1)


def test_model_with_cross_entropy_loss_and_argmax():
    check(LossModel(), lambda: (torch.randn(5, 6), torch.randint(0, 4, (5,))), min_ops=5)


class LSTMCellManual(nn.Module):
    def __init__(self, d=6, h=5):
        super().__init__()
        self.ih = nn.Linear(d, 4 * h)
        self.hh = nn.Linear(h, 4 * h)

    def forward(self, x, state):
        h, c = state
        gates = self.ih(x) + self.hh(h)
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, (h, c)


def test_manual_lstm_cell_with_tuple_state_in_and_out():
    check(LSTMCellManual(),
          lambda: (torch.randn(3, 6), (torch.randn(3, 5), torch.randn(3, 5))), min_ops=10)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(LayerNormMLP(8), LayerNormMLP(8))
        self.head = nn.ModuleList([nn.Linear(8, 2), nn.Linear(2, 2)])

    def forward(self, x):
        x = self.blocks(x)
        for layer in self.head:
            x = layer(x)
        return x


def test_nested_modules_sequential_of_custom_blocks_then_module_list():
    check(Encoder(), randn(2, 3, 8), ops=12)


class TrainEvalBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y - 1


def test_training_flag_switch_recompiles_and_matches_eager_each_mode():
    model = TrainEvalBranch()
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(3, 4)
    model.train()
    torch.testing.assert_close(opt(x), model.lin(x) * 2)
    torch.testing.assert_close(opt(x), model(x))
    assert cnt.frame_count == 1
    model.eval()
    torch.testing.assert_close(opt(x), model.lin(x) - 1)
    torch.testing.assert_close(opt(x), model(x))
    assert cnt.frame_count == 2
    model.train()  # the first entry is still cached
    torch.testing.assert_close(opt(x), model.lin(x) * 2)
    assert cnt.frame_count == 2


def test_dropout_module_train_to_eval_switch_recompiles():
    model = nn.Sequential(nn.Linear(5, 5), nn.Dropout(0.5))
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(64, 5)
    model.train()
    out = opt(x)
    # Training-mode dropout zeroes about half of the outputs and scales the rest by 2.
    lin = model[0](x)
    kept = out != 0
    assert 0.2 < kept.float().mean().item() < 0.8
    torch.testing.assert_close(out[kept], (lin * 2)[kept])
    assert cnt.frame_count == 1
    model.eval()
    torch.testing.assert_close(opt(x), model[0](x))
    assert cnt.frame_count == 2


def test_gradients_through_compiled_module_match_eager():
    model = MLP()
    eager = copy.deepcopy(model)
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(5, 8, requires_grad=True)
    x_eager = x.detach().clone().requires_grad_(True)
    opt(x).pow(2).sum().backward()
    eager(x_eager).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_eager.grad)
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert cnt.frame_count == 1


def test_no_grad_outside_the_compiled_call():
    model = MLP()
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(5, 8)
    with torch.no_grad():
        out = opt(x)
        want = model(x)
    torch.testing.assert_close(out, want)
    assert not out.requires_grad
    assert cnt.frame_count == 1
    # Back in grad mode the result needs grad again, whether or not that recompiles.
    out = opt(x)
    assert out.requires_grad and out.grad_fn is not None
    torch.testing.assert_close(out, model(x))


# ---------------------------------------------------------------------------------------------
# User functions: arguments, closures, inlining, control flow on constants.


def _scale_shift(x, scale=2.0, shift=0.5):
    return x * scale + shift


def test_inlined_user_function_with_default_args():
    def f(x):
        return _scale_shift(x) - _scale_shift(x, 3.0) + _scale_shift(x, shift=-1.0)

    check(f, randn(4, 4), ops=8)


def _sum_all(*tensors):
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return total


def test_star_args_forwarded_to_inlined_function():
    def f(a, b, c):
        parts = (a, b)
        return _sum_all(*parts, c) * len(parts)

    check(f, lambda: (torch.randn(3), torch.randn(3), torch.randn(3)), ops=3)


def test_star_args_in_compiled_function_signature():
    def f(x, *rest):
        out = x
        for r in rest:
            out = out * r
        return out

    check(f, lambda: (torch.randn(4), torch.randn(4), torch.randn(4)), ops=2)


def _apply(x, **options):
    y = x * options.get("scale", 1.0)
    if options.get("relu", False):
        y = torch.relu(y)
    return y + options["bias"]


def test_kwargs_forwarded_to_inlined_function():
    def f(x):
        return _apply(x, bias=1.0, relu=True) + _apply(x, bias=-1.0, scale=2.0)

    check(f, randn(5), ops=6)


def test_kwargs_at_the_compiled_call_site():
    def f(x, y, *, alpha=1.0, **extra):
        return x * alpha + y * extra["beta"]

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    for _ in range(2):
        x, y = torch.randn(3), torch.randn(3)
        torch.testing.assert_close(opt(x, y, alpha=2.0, beta=3.0), f(x, y, alpha=2.0, beta=3.0))
    assert cnt.frame_count == 1 and cnt.op_count == 3


def _kwonly(x, *, power, offset=0.0):
    return x ** power + offset


def test_keyword_only_arguments_of_inlined_function():
    def f(x):
        return _kwonly(x, power=2) + _kwonly(x, power=3, offset=1.0)

    check(f, randn(4, 2), ops=5)


def test_closure_over_constants():
    scale, shift = 3.0, -2

    def f(x):
        return torch.sin(x) * scale + shift

    check(f, randn(6), ops=3)


def test_closure_over_a_tensor():
    bias = torch.randn(6)

    def f(x):
        return torch.relu(x + bias)

    check(f, randn(2, 6), ops=2)


def _make_adder(k):
    def add(x):
        return x + k
    return add


def test_calling_closures_made_outside_the_frame():
    add2, add_t = _make_adder(2.0), _make_adder(torch.ones(3) * 5)

    def f(x):
        return add2(x) * add_t(x)

    check(f, randn(3), ops=3)


def test_nested_function_defined_and_called_inside_the_frame():
    def f(x, y):
        def combine(a, b=y):
            return a * b + 1
        return combine(x) + combine(x, b=2.0)

    check(f, lambda: (torch.randn(4), torch.randn(4)), ops=5)


def _inner(x):
    return torch.cos(x) * 2


def _middle(x):
    return _inner(x) + _inner(-x)


def test_two_levels_of_inlined_helpers():
    def f(x):
        return _middle(x).sum(dim=-1)

    check(f, randn(3, 4), ops=7)


def test_for_loop_over_range_unrolls():
    def f(x):
        acc = torch.zeros_like(x)
        for i in range(4):
            acc = acc + x * i
        return acc

    check(f, randn(5), ops=9)


def test_zip_enumerate_over_constant_lists():
    def f(x):
        out = x
        for i, (a, b) in enumerate(zip([1.0, 2.0, 3.0], (0.5, -0.5, 0.25))):
            out = out * a + b * i
        return out

    check(f, randn(4), ops=6)


def test_if_on_constant_argument_specializes_and_recompiles_on_change():
    def f(x, use_sin):
        if use_sin:
            return torch.sin(x)
        return torch.cos(x)

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = torch.randn(5)
    torch.testing.assert_close(opt(x, True), torch.sin(x))
    x = torch.randn(5)
    torch.testing.assert_close(opt(x, True), torch.sin(x))
    assert cnt.frame_count == 1
    torch.testing.assert_close(opt(x, False), torch.cos(x))
    assert cnt.frame_count == 2


def test_builtins_on_shapes_and_containers():
    def f(x, ys):
        n = len(ys)
        assert isinstance(ys, list)
        scale = max(x.shape[0], 2) - min(x.shape[1], 10) + abs(-3)
        if hasattr(x, "shape") and getattr(x, "ndim") == 2:
            x = x * scale
        return x + torch.stack(ys).sum(0) / n

    check(f, lambda: ([torch.randn(4, 3)] + [[torch.randn(4, 3) for _ in range(3)]]),
          min_ops=4)


def test_shape_arithmetic_reshape_and_scaling():
    def f(x):
        b = x.size(0)
        d = x.shape[-1]
        y = x.view(b, -1) / d ** 0.5
        return y.reshape(b, x.dim(), -1) * x.numel()

    check(f, randn(2, 3, 4), ops=4)


def test_dict_of_tensors_as_argument():
    def f(batch):
        return batch["x"] * batch["w"] + batch["b"]

    check(f, lambda: ({"x": torch.randn(4, 3), "w": torch.randn(3), "b": torch.randn(3)},),
          ops=2)


def test_list_of_tensors_as_argument():
    def f(xs):
        return torch.stack([t.sin() for t in xs]).sum(0)

    check(f, lambda: ([torch.randn(5) for _ in range(3)],), ops=5)


def test_tuple_unpacking_and_swaps():
    def f(a, b):
        a, b = b, a + b
        (c, d), e = (a * 2, b), a - b
        return c + d * e

    check(f, lambda: (torch.randn(4), torch.randn(4)), ops=5)


def test_comparison_chains_and_boolean_ops_on_constants():
    def f(x, n):
        if 0 < n <= 3 and not n == 2 or n is None:
            return x + n
        return x - n

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x, 3), x + 3)
    torch.testing.assert_close(opt(x, 2), x - 2)
    assert cnt.frame_count == 2


# ---------------------------------------------------------------------------------------------
# Return values and mutation.


def test_tuple_return():
    def f(x):
        return x.sin(), x.cos()

    check(f, randn(3, 3), ops=2)


def test_list_return():
    def f(x, y):
        return [x + y, x * y, x - y]

    check(f, lambda: (torch.randn(4), torch.randn(4)), ops=3)


def test_dict_return():
    def f(x):
        return {"max": x.amax(dim=0), "min": x.amin(dim=0), "nested": {"sum": x.sum()}}

    check(f, randn(4, 3), ops=3)


def test_returning_constants_and_none_with_tensors():
    def f(x):
        return x * 2, None, 3, "tag", (1.5, None), x.shape

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    for _ in range(2):
        x = torch.randn(2, 5)
        out = opt(x)
        torch.testing.assert_close(out[0], x * 2)
        assert out[1:] == (None, 3, "tag", (1.5, None), torch.Size([2, 5]))
    assert cnt.frame_count == 1 and cnt.op_count == 1


def test_returning_an_input_unchanged_and_a_computed_tensor():
    def f(x, y):
        return x, y + 1

    cnt, opt = check(f, lambda: (torch.randn(3), torch.randn(3)), ops=1)
    x = torch.randn(3)
    assert opt(x, torch.randn(3))[0] is x


def test_in_place_op_on_input_is_visible_after_return():
    def f(x, y):
        x.add_(1)
        y.mul_(x)
        return x.sum() + y.sum()

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    for _ in range(2):
        x, y = torch.randn(4), torch.randn(4)
        xe, ye = x.clone(), y.clone()
        want = f(xe, ye)
        got = opt(x, y)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x, xe)
        torch.testing.assert_close(y, ye)
    assert cnt.frame_count == 1


def test_in_place_methods_on_intermediate_tensors():
    def f(x):
        y = x * 2
        y += 1
        y.clamp_(min=0.5)
        y.mul_(x)
        return y

    check(f, randn(5, 2), ops=4)


def test_setitem_on_intermediate_tensor_is_part_of_the_result():
    def f(x):
        y = x * 2
        y[0] = -1.0
        y[:, 1] = x[:, 0]
        return y + 1

    check(f, randn(5, 2), min_ops=3)


def test_setitem_on_input_is_visible_after_return():
    def f(x, v):
        x[1:3] = v
        return x.sum(dim=0)

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    for _ in range(2):
        x, v = torch.randn(4, 3), torch.randn(3)
        xe = x.clone()
        want = f(xe, v)
        torch.testing.assert_close(opt(x, v), want)
        torch.testing.assert_close(x, xe)
    assert cnt.frame_count == 1


# ---------------------------------------------------------------------------------------------
# Guards and recompiles.


def test_dtype_and_shape_changes_recompile_same_inputs_do_not():
    def f(x):
        return torch.sigmoid(x) * 2

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    for x in (torch.randn(3, 4), torch.randn(3, 4)):
        torch.testing.assert_close(opt(x), f(x))
    assert cnt.frame_count == 1
    x64 = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(opt(x64), f(x64))
    assert opt(x64).dtype == torch.float64
    assert cnt.frame_count == 2
    x5 = torch.randn(5, 4)
    torch.testing.assert_close(opt(x5), f(x5))
    assert cnt.frame_count == 3
    for x in (torch.randn(3, 4), torch.randn(3, 4, dtype=torch.float64), torch.randn(5, 4)):
        torch.testing.assert_close(opt(x), f(x))
    assert cnt.frame_count == 3


def test_requires_grad_change_recompiles():
    def f(x):
        return x.exp()

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x), x.exp())
    xg = torch.randn(3, requires_grad=True)
    out = opt(xg)
    assert out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(xg.grad, xg.detach().exp())
    assert cnt.frame_count == 2


GLOBAL_WEIGHT = torch.randn(4, 4)
GLOBAL_SCALE = 2.0


def _read_globals(x):
    return (x @ GLOBAL_WEIGHT) * GLOBAL_SCALE


def test_global_tensor_read_by_function():
    check(_read_globals, randn(3, 4), ops=2)


def test_rebinding_a_global_constant_recompiles():
    global GLOBAL_SCALE
    cnt = CompileCounter()
    opt = kiln.compile(_read_globals, backend=cnt)
    x = torch.randn(3, 4)
    saved = GLOBAL_SCALE
    try:
        torch.testing.assert_close(opt(x), (x @ GLOBAL_WEIGHT) * 2.0)
        GLOBAL_SCALE = -5.0
        torch.testing.assert_close(opt(x), (x @ GLOBAL_WEIGHT) * -5.0)
        assert cnt.frame_count == 2
    finally:
        GLOBAL_SCALE = saved


def _activation(x):
    return torch.relu(x)


def _uses_global_function(x):
    return _activation(x) + 1


def test_rebinding_a_global_function_recompiles():
    global _activation
    cnt = CompileCounter()
    opt = kiln.compile(_uses_global_function, backend=cnt)
    x = torch.randn(6)
    saved = _activation
    try:
        torch.testing.assert_close(opt(x), torch.relu(x) + 1)
        torch.testing.assert_close(opt(x), torch.relu(x) + 1)
        assert cnt.frame_count == 1
        _activation = torch.tanh
        torch.testing.assert_close(opt(x), torch.tanh(x) + 1)
        assert cnt.frame_count == 2

        def _square(t):
            return t * t
        _activation = _square
        torch.testing.assert_close(opt(x), x * x + 1)
        assert cnt.frame_count == 3
    finally:
        _activation = saved


def test_cache_size_limit_caps_graphs_and_results_stay_right():
    def f(x):
        return torch.cos(x) + x.shape[0]

    saved = kiln.config.cache_size_limit
    try:
        kiln.config.cache_size_limit = 2
        cnt = CompileCounter()
        opt = kiln.compile(f, backend=cnt)
        for n in (2, 3, 4, 5, 2, 5):
            x = torch.randn(n)
            torch.testing.assert_close(opt(x), f(x))
        assert cnt.frame_count == 2
        assert len(kiln.debug.cache_entries(opt)) == 2
    finally:
        kiln.config.cache_size_limit = saved


def test_two_compiled_functions_sharing_a_callee_have_their_own_graphs():
    def f(x):
        return _middle(x)

    def g(x):
        return _middle(x) * 3

    cnt = CompileCounter()
    of, og = kiln.compile(f, backend=cnt), kiln.compile(g, backend=cnt)
    x = torch.randn(4)
    torch.testing.assert_close(of(x), f(x))
    torch.testing.assert_close(og(x), g(x))
    torch.testing.assert_close(of(x), f(x))
    assert cnt.frame_count == 2 and cnt.op_count == 6 + 7


# ---------------------------------------------------------------------------------------------
# Frames that cannot be captured.


def _prints(x):
    y = torch.sin(x)
    print("kiln-test: inside _prints")
    return y * 2


def test_print_breaks_the_frame_into_two_graphs_and_still_prints(capsys):
    cnt = CompileCounter()
    opt = kiln.compile(_prints, backend=cnt)
    for _ in range(2):
        x = torch.randn(4)
        torch.testing.assert_close(opt(x), torch.sin(x) * 2)
    assert capsys.readouterr().out.count("kiln-test: inside _prints") == 2
    assert (cnt.frame_count, cnt.op_count) == (2, 2)  # sin | print | mul


def _prints_too(x):
    y = torch.cos(x)
    print("kiln-test: inside _prints_too")
    return y - 1


def test_fullgraph_on_frame_with_print_raises_unsupported_naming_file_and_line():
    cnt = CompileCounter()
    opt = kiln.compile(_prints_too, backend=cnt, fullgraph=True)
    with pytest.raises(kiln.exc.Unsupported) as info:
        opt(torch.randn(4))
    print_line = _prints_too.__code__.co_firstlineno + 2
    message = str(info.value)
    assert os.path.basename(__file__) in message
    assert str(print_line) in message
    assert cnt.frame_count == 0


def _prints_three(x):
    print("kiln-test: inside _prints_three")
    return x + 3


def test_reset_forgets_a_frame_that_ran_eagerly_so_fullgraph_raises_afterwards():
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(_prints_three, backend=CompileCounter())(x), x + 3)
    kiln.reset()
    with pytest.raises(kiln.exc.Unsupported):
        kiln.compile(_prints_three, backend=CompileCounter(), fullgraph=True)(x)


def test_data_dependent_branch_gives_three_graphs_over_both_directions():
    def f(x):
        if x.sum() > 0:
            return x + 1
        return x - 1

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    for x in (torch.ones(3), -torch.ones(3), torch.randn(3)):
        torch.testing.assert_close(opt(x), f(x))
    assert cnt.frame_count == 3  # sum > 0 | x + 1, x - 1


def test_item_call_breaks_the_graph_and_specializes_on_the_value():
    def f(x):
        return x * x.max().item()

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    for _ in range(2):
        x = torch.randn(5)
        torch.testing.assert_close(opt(x), f(x))
    # max | .item() in Python | x * <float>: the float is a constant of the resumed graph,
    # so a new value compiles that part again.
    assert cnt.frame_count == 3


def test_print_in_forward_breaks_and_the_rest_of_forward_is_one_graph(capsys):
    class Printing(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            print("kiln-test: module forward")
            return self.lin(x).relu()

    model = Printing()
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    for _ in range(2):
        x = torch.randn(2, 3)
        torch.testing.assert_close(opt(x), model.lin(x).relu())
    assert capsys.readouterr().out.count("kiln-test: module forward") == 2
    # Nothing before the print; after it, linear and relu in one graph.
    assert cnt.frame_count == 1 and cnt.op_count == 2


# ---------------------------------------------------------------------------------------------
# Entry points and arguments of other kinds.


def test_optimize_decorator_on_a_function():
    cnt = CompileCounter()

    @kiln.optimize(cnt)
    def f(x, y):
        return torch.addmm(y, x, x.t()).relu()

    for _ in range(2):
        x, y = torch.randn(3, 4), torch.randn(3, 3)
        torch.testing.assert_close(f(x, y), torch.addmm(y, x, x.t()).relu())
    assert cnt.frame_count == 1 and cnt.op_count == 3


def test_optimize_context_manager_captures_a_module_call():
    model = LayerNormMLP(6)
    cnt = CompileCounter()
    x = torch.randn(2, 6)
    want = model(x)
    with kiln.optimize(cnt):
        got = model(x)
    torch.testing.assert_close(got, want)
    assert cnt.frame_count >= 1 and cnt.op_count >= 5


def test_compiled_module_forwards_attributes_and_shares_parameters():
    model = MLP()
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    assert opt.fc1 is model.fc1
    assert set(opt._orig_mod.state_dict()) == set(model.state_dict())
    x = torch.randn(2, 8)
    torch.testing.assert_close(opt(x), model(x))
    assert cnt.frame_count == 1


def test_non_contiguous_inputs_match_eager():
    def f(x, y):
        return (x * y).sum(dim=0) + x[0]

    check(f, lambda: (torch.randn(5, 4).t(), torch.randn(4, 5)), ops=4)


def test_contiguous_then_transposed_input_recompiles_and_stays_right():
    def f(x):
        return x.view(-1) * 2 if x.is_contiguous() else x.reshape(-1) * 3

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    a = torch.randn(3, 3)
    torch.testing.assert_close(opt(a), a.view(-1) * 2)
    b = torch.randn(3, 3).t()
    torch.testing.assert_close(opt(b), b.reshape(-1) * 3)
    assert cnt.frame_count == 2


def test_python_float_argument_is_specialized_and_recompiles_on_a_new_value():
    def f(x, alpha):
        return x * alpha + alpha ** 2

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = torch.randn(4)
    torch.testing.assert_close(opt(x, 2.0), x * 2.0 + 4.0)
    torch.testing.assert_close(opt(x, 2.0), x * 2.0 + 4.0)
    assert cnt.frame_count == 1
    torch.testing.assert_close(opt(x, -3.0), x * -3.0 + 9.0)
    assert cnt.frame_count == 2


def test_module_batch_size_change_recompiles_and_old_shape_still_hits():
    model = MLP()
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    for n in (4, 4, 7, 4, 7):
        x = torch.randn(n, 8)
        torch.testing.assert_close(opt(x), model(x))
    assert cnt.frame_count == 2


def test_zero_dim_tensor_and_integer_tensor_inputs():
    def f(scale, idx, table):
        return table[idx] * scale + idx.float().mean()

    check(f, lambda: (torch.randn(()), torch.randint(0, 6, (3,)), torch.randn(6, 2)), ops=5)


def test_float64_module_after_double():
    check(MLP().double(), lambda: (torch.randn(3, 8, dtype=torch.float64),), ops=3)


class _Action(enum.Enum):
    NONE = "none"
    WARN = "warn"


class _Settings:
    mode = _Action.NONE


def test_enum_members_from_arguments_and_class_attributes_are_guarded_by_identity():
    def f(x, a):
        m = _Settings.mode
        return x * 2 if m is _Action.NONE and a is _Action.WARN else x - 1

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(3)
    try:
        torch.testing.assert_close(opt(x, _Action.WARN), x * 2)
        torch.testing.assert_close(opt(x, _Action.NONE), x - 1)  # new member: recompiles
        _Settings.mode = _Action.WARN
        torch.testing.assert_close(opt(x, _Action.WARN), x - 1)  # class attribute changed
    finally:
        _Settings.mode = _Action.NONE
    assert cnt.frame_count == 3


# ---------------------------------------------------------------------------------------------
# Questions about the trace itself fold to constants.


def test_is_compiling_questions_fold_to_true_in_one_graph():
    import torch._dynamo  # the program imported Dynamo: its is_compiling is folded too

    def f(x):
        compiling = torch.compiler.is_compiling() and torch._dynamo.is_compiling()
        if compiling and not torch.jit.is_scripting():
            return x * 2 + 1
        return x - 1

    x = torch.randn(5)
    kiln.reset()
    cnt = CompileCounter()
    out = kiln.compile(f, backend=cnt, fullgraph=True)(x)
    torch.testing.assert_close(out, x * 2 + 1)
    assert (cnt.frame_count, cnt.op_count) == (1, 2)


def test_import_kiln_does_not_import_dynamo():
    import subprocess
    import sys

    code = ("import sys, torch, kiln\n"
            "assert 'torch._dynamo' not in sys.modules, 'kiln imported torch._dynamo'\n"
            "print(kiln.compile(lambda x: x + 1, backend='eager')(torch.ones(2)).tolist())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[2.0, 2.0]"


def test_captures_leave_no_reference_cycles_the_collector_cannot_break():
    # A lambda's cell (LOAD_CLOSURE) refers to the translator whose locals hold the lambda: the
    # executor's translators must show their references to the garbage collector, or every such
    # capture would keep its graph, fakes and example inputs alive.
    import gc

    from kiln.graph.output_graph import OutputGraph

    def program(x):
        y = x + 1
        scale = lambda t: t * y  # noqa: E731
        return scale(x)

    gc.collect()
    before = sum(isinstance(o, OutputGraph) for o in gc.get_objects())
    for _ in range(3):
        kiln.reset()
        x = torch.randn(4)
        torch.testing.assert_close(kiln.compile(program, backend="eager")(x), program(x))
    kiln.reset()
    gc.collect()
    assert sum(isinstance(o, OutputGraph) for o in gc.get_objects()) == before
