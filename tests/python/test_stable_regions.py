"""Stable regions (kiln.backends.stable_regions): a graph with symbolic sizes some of which change
on every call (a decoder's cache length) has the nodes that involve only the sizes that stay
compiled per signature in regions of their own, the rest run as they are, with results equal
to eager's on every call."""
import pytest
import torch

import kiln
from kiln.backends import stable_regions as sr
from kiln.backends.specialize import PerSignature
from kiln.testing import CompileCounter


def _decode(x, cache, w):
    cache = torch.cat([cache, x], dim=1)  # one longer on every step
    scores = torch.softmax(x @ cache.transpose(1, 2), dim=-1)
    attended = scores @ cache  # (batch, 1, width): its size no longer involves the length
    h = torch.relu(attended @ w) * 2 + 1
    h = torch.tanh(h) - h.mean(-1, keepdim=True)
    return h, cache


def _dynamic_graph(fn, *args):
    """The graph kiln captures from `fn` with symbolic sizes, and a function calling it with
    `fn`'s arguments (by name; the graph takes them in its own order)."""
    backend = CompileCounter()
    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    compiled(*args)
    (gm,) = backend.graphs
    names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    order = [names.index(n.name[2:]) for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, lambda run, *a: run(*[a[i] for i in order])


class CompileStatic:
    """A static-size compiler that records the graphs it compiled and counts their runs."""

    def __init__(self):
        self.graphs, self.runs = [], 0

    def __call__(self, graph, tensors):
        self.graphs.append(graph)

        def run(*args):
            self.runs += 1
            return graph(*args)
        return run


def _decode_steps(per, gm, call, w, steps):
    """`steps` calls of the decoder step `per` (kiln's) and `gm` (as it is) on a cache one
    longer each time: their outputs equal on every call."""
    cache = torch.randn(2, 3, 8)
    for _ in range(steps):
        x = torch.randn(2, 1, 8)
        got, want = call(per, x, cache, w), call(gm, x, cache, w)
        assert len(got) == len(want)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
        cache = torch.cat([cache, x], dim=1)


def _targets(graph):
    return {getattr(n.target, "__name__", str(n.target)) for n in graph.graph.nodes}


@pytest.fixture
def in_the_call(monkeypatch):
    monkeypatch.setattr(kiln.config, "specialize_after", 2)
    monkeypatch.setattr(kiln.config, "specialize_in_background", False)


def test_the_regions_of_a_decoder_step_that_do_not_involve_its_length_are_compiled(in_the_call):
    torch.manual_seed(0)
    w = torch.randn(8, 8)
    gm, call = _dynamic_graph(_decode, torch.randn(2, 1, 8), torch.randn(2, 3, 8), w)
    compile_static = CompileStatic()
    per = PerSignature(gm, compile_static)
    _decode_steps(per, gm, call, w, sr.WINDOW + 12)
    assert per.uncompiled is not per.gm and per.uncompiled is not None
    # no signature of the whole graph came back; the region after the attention did
    assert not per.compiled
    (region,) = compile_static.graphs
    assert {"relu", "tanh"} <= _targets(region) and "cat" not in _targets(region)
    assert compile_static.runs >= 10


def test_a_region_is_compiled_on_its_second_call(monkeypatch):
    # its signature involves only sizes that stayed over the window: it will come back
    monkeypatch.setattr(kiln.config, "specialize_after", 8)
    monkeypatch.setattr(kiln.config, "specialize_in_background", False)
    w = torch.randn(8, 8)
    gm, call = _dynamic_graph(_decode, torch.randn(2, 1, 8), torch.randn(2, 3, 8), w)
    compile_static = CompileStatic()
    per = PerSignature(gm, compile_static)
    _decode_steps(per, gm, call, w, sr.WINDOW + 2)
    assert len(compile_static.graphs) == 1 and compile_static.runs >= 1


def test_a_graph_whose_every_node_involves_a_changing_size_runs_as_it_is(in_the_call):
    def f(x):
        return torch.relu(x * 2 + 1).sum(0)

    gm, call = _dynamic_graph(f, torch.randn(5, 4))
    compile_static = CompileStatic()
    per = PerSignature(gm, compile_static)
    for n in range(3, 3 + sr.WINDOW + 4):
        x = torch.randn(n, 4)
        torch.testing.assert_close(call(per, x)[0], f(x))
    assert not compile_static.graphs and per.uncompiled in (None, per.gm)


def _mode_changing(x, cache, w):
    cache = torch.cat([cache, x], dim=1)
    attended = torch.softmax(x @ cache.transpose(1, 2), dim=-1) @ cache
    h = torch.relu(attended @ w) * 2 + 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.relu(h @ w) * 3 + 1
    with torch.no_grad():
        z = torch.tanh(h) * 2 - 1 + h.sum(-1, keepdim=True)
    return (y.float() + z).exp() - h, cache


@pytest.mark.parametrize("grad", [False, True])
def test_no_region_spans_a_mode_the_graph_sets(in_the_call, grad):
    torch.manual_seed(0)
    w = torch.randn(8, 8)
    gm, call = _dynamic_graph(_mode_changing, torch.randn(2, 1, 8), torch.randn(2, 3, 8), w)
    compile_static = CompileStatic()
    per = PerSignature(gm, compile_static)
    with torch.set_grad_enabled(grad):
        _decode_steps(per, gm, call, w, sr.WINDOW + 6)
    assert compile_static.graphs
    mode_changes = {"_enter_autocast", "_exit_autocast", "_set_grad_enabled"}
    for region in compile_static.graphs:
        assert not _targets(region) & mode_changes
    # the relu before the autocast block is compiled, the block's own runs as it is in it
    relus = [n for r in compile_static.graphs for n in r.graph.nodes if n.target is torch.relu]
    assert len(relus) == 1
    # the region under the graph's no_grad is compiled on its own
    assert any("tanh" in _targets(r) for r in compile_static.graphs)


def test_sizes_that_took_several_values_in_the_window_are_the_changing_ones():
    history = sr.SizeHistory()
    for i in range(sr.WINDOW):
        history.add((torch.empty(2, 3 + i), torch.empty(4), 7, 2 + i % 2, "other"))
    assert history.full()
    # the length of the first input changed on every call; the int alternating between two
    # values is not changing enough to be taken for a length
    assert history.changing() == {(0, 1)}


def test_a_generated_sequence_with_stable_regions_matches_eager(in_the_call):
    torch.manual_seed(0)
    w = torch.randn(8, 8)

    def generate(step, x, cache, n):
        outs = []
        for _ in range(n):
            h, cache = step(x, cache, w)
            x = h[:, -1:, :]
            outs.append(x)
        return torch.cat(outs, 1)

    compiled = kiln.compile(_decode, backend="aot_eager")
    for batch, prompt in ((2, 3), (2, 5), (3, 4)):
        x, cache = torch.randn(batch, 1, 8), torch.randn(batch, prompt, 8)
        torch.testing.assert_close(generate(compiled, x, cache, sr.WINDOW + 8),
                                   generate(_decode, x, cache, sr.WINDOW + 8))


def _decoder(family):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                  max_position_embeddings=256, bos_token_id=1, eos_token_id=None,
                  pad_token_id=0)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:  # a sliding-window cache, whose layers count their tokens in an int attribute
        model = transformers.MistralForCausalLM(transformers.MistralConfig(
            sliding_window=16, **common))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.mark.parametrize("family", ["llama", "mistral"])
@pytest.mark.parametrize("whole", [False, True], ids=["regions", "whole"])
def test_generate_with_the_dynamic_cache_compiles_regions_and_matches_eager(
        kilnd_cache, monkeypatch, family, whole):
    import copy

    monkeypatch.setattr(kiln.config, "specialize_in_background", False)
    # With the graph's plan for every size (symbolic_plans), calls no signature's compile serves
    # run that plan and no region is cut; without it, the regions over the batch are compiled.
    monkeypatch.setattr(kiln.config, "symbolic_plans", whole)
    model = _decoder(family)
    compiled = copy.deepcopy(model)
    compiled.forward = kiln.compile(compiled.forward)
    settings = dict(max_new_tokens=sr.WINDOW + 16, do_sample=False, disable_compile=True,
                    return_dict_in_generate=True, output_logits=True)
    for batch, prompt in ((2, 9), (2, 21), (3, 6)):
        ids = torch.randint(2, 500, (batch, prompt))
        mask = torch.ones_like(ids)
        with torch.no_grad():
            want = model.generate(input_ids=ids, attention_mask=mask, **settings)
            got = compiled.generate(input_ids=ids, attention_mask=mask, **settings)
        assert torch.equal(got.sequences, want.sequences)
        for g, e in zip(got.logits, want.logits):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    # the decoder step's regions over the batch (or its plan for every size) were compiled by
    # kilnd; no frame recompiled per step until the cache size limit (Mistral's window adds
    # graphs where its cache stops growing: its branches on the length)
    # (Mistral's sliding-window cache reads its window at an offset of the token count: the
    # view's storage offset is an expression of the sizes in the plan.)
    symbolic = [a for a in kiln.debug.artifacts() if a.plan.symbolic]
    assert bool(symbolic) == whole
    if symbolic:
        assert all(a.plan.num_kernels > 0 for a in symbolic)
    else:
        assert len(kiln.debug.artifacts()) >= 3
    limit = 4 if family == "llama" else kiln.config.cache_size_limit - 1
    assert all(len(e) <= limit for e in _entries_per_code())


def _entries_per_code():
    from kiln.state import STATE

    return [kiln.debug.cache_entries(code) for code in STATE.compiled_codes]
