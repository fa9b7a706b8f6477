"""Real models through the "kiln" backend (kilnd's CPU compiler and the C++ runtime), in small
configurations with random weights: every graph is compiled (no eager fallback), the fused
kernels cover what the models emit, and results match eager."""
import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


def compile_and_compare(model, *inputs, rtol=1e-4, atol=1e-4):
    model = model.eval()
    with torch.no_grad():
        expected = model(*inputs)
        out = kiln.compile(model, backend="kiln", fullgraph=True)(*inputs)
    arts = kiln.debug.artifacts()
    assert len(arts) == 1, "the graph ran eagerly instead of through kilnd"
    expected = expected.last_hidden_state if hasattr(expected, "last_hidden_state") else expected
    out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)
    return arts[0]


def library_ops(art):
    return [s.library.op for s in art.body.plan.steps if s.WhichOneof("kind") == "library"]


def test_resnet_block_model_runs_channels_last_and_matches_eager():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10)
    art = compile_and_compare(model, torch.randn(2, 3, 64, 64), rtol=1e-3, atol=1e-3)
    # Batch norm + ReLU (+ residual add) run in generated kernels, not in ATen.
    assert "aten::native_batch_norm" not in library_ops(art)
    assert "aten::relu" not in library_ops(art)


def test_mobilenet_v3_small_matches_eager():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.mobilenet_v3_small(num_classes=10)
    compile_and_compare(model, torch.randn(2, 3, 64, 64), rtol=1e-3, atol=1e-3)


def test_small_vit_fuses_layer_norms_and_matches_eager():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                 num_heads=2, hidden_dim=64, mlp_dim=128,
                                                 num_classes=10)
    art = compile_and_compare(model, torch.randn(2, 3, 32, 32))
    assert not [op for op in library_ops(art) if "layer_norm" in op or "var_mean" in op]


class _SelfAttention(torch.nn.Module):
    def __init__(self, need_weights=False):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(64, 4, batch_first=True)
        self.need_weights = need_weights

    def forward(self, x):
        out, weights = self.attention(x, x, x, need_weights=self.need_weights)
        return out + weights.sum() if self.need_weights else out


def test_multi_head_self_attention_fast_path_runs_as_linears_and_sdpa():
    art = compile_and_compare(_SelfAttention(), torch.randn(2, 10, 64))
    ops = library_ops(art)
    assert "aten::_native_multi_head_attention" not in ops
    assert any("scaled_dot_product" in op for op in ops)
    projections = [op for op in ops if op in ("mkldnn::_linear_pointwise", "aten::addmm")]
    assert len(projections) == 2, ops


class _CrossAttention(torch.nn.Module):
    """The fused op with three distinct tensors (as autocast hands it: q, k and v each cast)."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, q, kv):
        a = self.attention
        return torch._native_multi_head_attention(
            q, kv, kv * 2, a.embed_dim, a.num_heads, a.in_proj_weight, a.in_proj_bias,
            a.out_proj.weight, a.out_proj.bias, need_weights=False)[0]


def test_multi_head_attention_fast_path_on_distinct_q_k_v_runs_as_linears_and_sdpa():
    art = compile_and_compare(_CrossAttention(), torch.randn(2, 10, 64), torch.randn(2, 10, 64))
    ops = library_ops(art)
    assert "aten::_native_multi_head_attention" not in ops
    assert any("scaled_dot_product" in op for op in ops)


def test_multi_head_attention_returning_its_weights_stays_the_fused_op():
    art = compile_and_compare(_SelfAttention(need_weights=True), torch.randn(2, 10, 64))
    assert "aten::_native_multi_head_attention" in library_ops(art)


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "deit_small_patch16_224"])
def test_timm_vits_compile_whole_and_match_eager(name):
    timm = pytest.importorskip("timm")
    model = timm.create_model(name, pretrained=False, img_size=64, num_classes=10)
    art = compile_and_compare(model, torch.randn(2, 3, 64, 64), rtol=1e-3, atol=1e-3)
    assert any("scaled_dot_product" in op for op in library_ops(art))


def test_unbind_and_squeeze_lower_to_ir_views():
    class Heads(torch.nn.Module):
        def forward(self, qkv):
            q, k, v = qkv.unbind(0)
            return (q * k).squeeze() + v.squeeze(1).sum(-1, keepdim=True)

    compile_and_compare(Heads(), torch.randn(3, 4, 1, 8))


def test_small_bert_fuses_layer_norms_and_matches_eager():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=500,
                                     attn_implementation="sdpa")
    art = compile_and_compare(transformers.BertModel(config), torch.randint(0, 500, (2, 16)))
    assert not [op for op in library_ops(art) if "layer_norm" in op or "var_mean" in op]


def test_small_gpt2_matches_eager():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500,
                                     use_cache=False, attn_implementation="sdpa")
    art = compile_and_compare(transformers.GPT2Model(config), torch.randint(0, 500, (2, 16)))
    assert not [op for op in library_ops(art) if "layer_norm" in op or "var_mean" in op]


def test_the_default_backend_is_kiln():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = model.eval()(x)
        out = kiln.compile(model)(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert len(kiln.debug.artifacts()) == 1
