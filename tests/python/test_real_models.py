"""Whole real models captured with fullgraph=True and compared with eager: torchvision CNNs and
a ViT, HuggingFace BERT and GPT-2 built from configs with random weights (no downloads)."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import kiln

torchvision = pytest.importorskip("torchvision")


def _compile_and_compare(model, x):
    model = model.eval()
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        out = compiled(x)
        ref = model(x)
    return out, ref


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v3_small"])
def test_torchvision_cnn_captures_as_one_graph_matching_eager(name):
    model = getattr(torchvision.models, name)(weights=None, num_classes=10)
    out, ref = _compile_and_compare(model, torch.randn(2, 3, 64, 64))
    torch.testing.assert_close(out, ref)


def test_torchvision_vit_captures_as_one_graph_matching_eager():
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                 num_heads=2, hidden_dim=64, mlp_dim=128,
                                                 num_classes=10)
    out, ref = _compile_and_compare(model, torch.randn(2, 3, 32, 32))
    torch.testing.assert_close(out, ref)


def test_torchvision_vit_b_16_captures_as_one_graph_matching_eager():
    model = torchvision.models.vit_b_16(weights=None)
    out, ref = _compile_and_compare(model, torch.randn(1, 3, 224, 224))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


transformers = pytest.importorskip("transformers")

def _bert(config):
    torch.manual_seed(0)
    return transformers.BertModel(config), torch.randint(0, config.vocab_size, (2, 16))


def test_small_bert_returns_a_model_output_matching_eager():
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
                                     intermediate_size=256, vocab_size=1000)
    out, ref = _compile_and_compare(*_bert(config))
    assert type(out) is type(ref) and list(out.keys()) == list(ref.keys())
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output)
    torch.testing.assert_close(out[0], ref[0])


def test_default_bert_matches_eager():
    out, ref = _compile_and_compare(*_bert(transformers.BertConfig()))
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state)


def _gpt2(config, model_class=None):
    torch.manual_seed(0)
    model = (model_class or transformers.GPT2Model)(config).eval()
    return model, torch.randint(0, config.vocab_size, (2, 16))


def _compile_counting(model):
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return kiln.compile(model, backend=counting, fullgraph=True), graphs


def _assert_same_cache(got, want):
    """Two DynamicCaches hold layers of the same types, attributes and key/value tensors."""
    assert type(got) is type(want)
    assert list(vars(got)) == list(vars(want))
    assert len(got.layers) == len(want.layers) > 0
    for g, w in zip(got.layers, want.layers):
        assert type(g) is type(w) and list(vars(g)) == list(vars(w))
        torch.testing.assert_close(g.keys, w.keys)
        torch.testing.assert_close(g.values, w.values)
    assert got.get_seq_length() == want.get_seq_length()


_SMALL_GPT2 = dict(n_layer=2, n_embd=128, n_head=2, vocab_size=1000)


def test_small_gpt2_matches_eager():
    # use_cache=True: forward builds a DynamicCache and its DynamicLayers, fills them through
    # update() and returns the cache; kiln rebuilds it after the graph from the graph outputs.
    model, x = _gpt2(transformers.GPT2Config(**_SMALL_GPT2))
    compiled, graphs = _compile_counting(model)
    with torch.no_grad():
        out = compiled(x)
        ref = model(x)
    assert len(graphs) == 1
    assert kiln.explain(model)(x).graph_break_count == 0
    assert type(out) is type(ref) and list(out.keys()) == list(ref.keys())
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state)
    _assert_same_cache(out.past_key_values, ref.past_key_values)


def test_small_gpt2_second_call_reuses_the_graph_and_builds_a_new_cache():
    model, x = _gpt2(transformers.GPT2Config(**_SMALL_GPT2))
    compiled, graphs = _compile_counting(model)
    y = torch.randint(0, 1000, x.shape)
    with torch.no_grad():
        first = compiled(x)
        second = compiled(y)
        ref = model(y)
    assert len(graphs) == 1
    torch.testing.assert_close(second.last_hidden_state, ref.last_hidden_state)
    _assert_same_cache(second.past_key_values, ref.past_key_values)
    # Each call returns caches of its own, as eager does.
    assert second.past_key_values is not first.past_key_values
    assert second.past_key_values.layers[0] is not first.past_key_values.layers[0]


def test_default_gpt2_matches_eager():
    model, x = _gpt2(transformers.GPT2Config())
    compiled, graphs = _compile_counting(model)
    with torch.no_grad():
        out = compiled(x)
        ref = model(x)
    assert len(graphs) == 1
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state)
    _assert_same_cache(out.past_key_values, ref.past_key_values)


def test_small_gpt2_lm_head_matches_eager():
    model, x = _gpt2(transformers.GPT2Config(**_SMALL_GPT2), transformers.GPT2LMHeadModel)
    compiled, graphs = _compile_counting(model)
    with torch.no_grad():
        out = compiled(x)
        ref = model(x)
    assert len(graphs) == 1
    assert type(out) is type(ref) and list(out.keys()) == list(ref.keys())
    torch.testing.assert_close(out.logits, ref.logits)
    _assert_same_cache(out.past_key_values, ref.past_key_values)


def test_small_gpt2_without_cache_is_one_graph_and_matches_eager():
    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=1000,
                                     use_cache=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).eval()
    x = torch.randint(0, 1000, (2, 16))
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        ref = model(x)
        out = kiln.compile(model, backend=counting, fullgraph=True)(x)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state)
    assert len(graphs) == 1
