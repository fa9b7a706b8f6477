"""Symbolic sizes in the capture (kiln.graph.symbolic_shapes): automatic dynamic shapes,
dynamic=True/False, the mark_* functions in kiln's and torch's spellings, the SHAPE guard a
capture installs, and results equal to eager's on every size, 0 and 1 included."""
import logging

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.graph.symbolic_shapes import ConstraintViolation


class Counting:
    """An "eager" backend that counts the graphs it was given and keeps them."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                               torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)).eval()


def _entries(fn):
    return kiln.debug.cache_entries(fn)


def _guards(fn):
    return [g for e in _entries(fn) for g in e.guards]


def test_ten_batch_sizes_compile_at_most_twice():
    model = _mlp()
    backend = Counting()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for b in (2, 3, 5, 8, 13, 21, 34, 55, 89, 144):
            x = torch.randn(b, 16)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(backend.graphs) == 2  # static for the first size, symbolic from the second


def test_ten_sequence_lengths_compile_at_most_twice():
    torch.manual_seed(0)
    attn = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()

    def f(x):
        out, _ = attn(x, x, x, need_weights=False)
        return F.layer_norm(out + x, (32,))

    backend = Counting()
    compiled = kiln.compile(f, backend=backend)
    with torch.no_grad():
        for t in (3, 4, 7, 9, 16, 17, 31, 64, 100, 128):
            x = torch.randn(2, t, 32)
            torch.testing.assert_close(compiled(x), f(x), rtol=1e-4, atol=1e-5)
    assert len(backend.graphs) == 2


def test_sizes_read_as_python_values_stay_symbolic():
    def f(x, y):
        b, t = x.shape
        z = x.reshape(b * t) * 2
        if b > 3:  # a branch on a size guards the relation, not the value
            z = z + 1
        return z.sum() + y.sum() + x.size(-1), b * 2, len(y)

    backend = Counting()
    compiled = kiln.compile(f, backend=backend)
    for n in (4, 5, 7, 9, 40):
        x, y = torch.randn(n, 3), torch.randn(n + 1)
        got, want = compiled(x, y), f(x, y)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:] and type(got[1]) is int
    assert len(backend.graphs) == 2
    shape = [g for g in _guards(compiled) if g.startswith("SHAPE")]
    assert shape and "L['x'].size()[0] > 3" in shape[0]
    # the other side of the branch is another graph
    x, y = torch.randn(2, 3), torch.randn(3)
    torch.testing.assert_close(compiled(x, y)[0], f(x, y)[0])
    assert len(backend.graphs) == 3


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7])
def test_sizes_zero_and_one_are_answered_as_eager_does(n):
    model = _mlp()
    compiled = kiln.compile(model, backend=Counting())
    with torch.no_grad():
        for b in (4, 6, n, 5, n):  # the symbolic entry exists before n is seen
            x = torch.randn(b, 16)
            torch.testing.assert_close(compiled(x), model(x))


def test_a_batch_of_one_runs_the_symbolic_graph_and_zero_and_other_ones_are_specialised():
    backend = Counting()
    compiled = kiln.compile(lambda x: x * 2 + x.shape[0] + x.shape[1], backend=backend)
    for b, t in ((4, 3), (5, 6)):
        compiled(torch.randn(b, t))
    shape = [g for g in _guards(compiled) if g.startswith("SHAPE")]
    # the batch admits 1, the other size (a length) starts at 2 as torch's do
    assert shape and "L['x'].size()[0] >= 1" in shape[0] and "L['x'].size()[1] >= 2" in shape[0]
    for b, t in ((1, 4), (0, 4), (1, 7), (3, 1)):
        x = torch.randn(b, t)
        torch.testing.assert_close(compiled(x), x * 2 + b + t)
    assert len(backend.graphs) == 4  # (4, 3), symbolic (batch 1 too), batch 0, length 1


def _batch_of_one_differs(x, w):
    # A branch on the size and a broadcast against a weight: both ask `s == 1` of the trace.
    y = x @ w
    if y.shape[0] == 1:
        return y * 3
    return y.softmax(0)


def test_a_trace_that_asks_whether_a_size_is_one_guards_the_answer():
    backend = Counting()
    compiled = kiln.compile(_batch_of_one_differs, backend=backend)
    w = torch.randn(4, 3)
    for b in (4, 5, 7):
        x = torch.randn(b, 4)
        torch.testing.assert_close(compiled(x, w), _batch_of_one_differs(x, w))
    assert len(backend.graphs) == 2
    assert any("Ne(L['x'].size()[0], 1)" in g or "L['x'].size()[0] > 1" in g or
               "L['x'].size()[0] >= 2" in g for g in _guards(compiled) if g.startswith("SHAPE"))
    x = torch.randn(1, 4)  # the symbolic graph's branch is not this one: a graph of its own
    torch.testing.assert_close(compiled(x, w), _batch_of_one_differs(x, w))
    assert len(backend.graphs) == 3


def _last_position_head(h, w):
    # A language model's head on the last position: F.linear of a (b, 1, d) slice. Its meta
    # kernel folds the slice through a reshape that asks whether b is 1 (a view or a copy); the
    # op's result is the same new tensor either way.
    return F.linear(h[:, -1:, :], w)


def test_an_ops_own_question_whether_a_batch_is_one_is_no_guard_where_its_result_is_the_same():
    backend = Counting()
    compiled = kiln.compile(_last_position_head, backend=backend)
    w = torch.randn(6, 8)
    for b, t in ((4, 5), (3, 7), (1, 9), (1, 4), (2, 3)):
        h = torch.randn(b, t, 8)
        torch.testing.assert_close(compiled(h, w), _last_position_head(h, w))
    assert len(backend.graphs) == 2  # static, then symbolic: the batches of 1 too
    shape = [g for g in _guards(compiled) if g.startswith("SHAPE")]
    assert shape and "L['h'].size()[0] >= 1" in shape[0] and "Ne(" not in shape[0]


def _folded(x, y):
    # y expanded over x's batch and folded: eager returns a view of y when the batch is 1 and
    # a copy otherwise.
    return y.unsqueeze(0).expand(x.shape[0], 2, 8).reshape(-1, 8)


def test_an_ops_question_whether_a_batch_is_one_stays_a_guard_where_its_result_differs():
    backend = Counting()
    compiled = kiln.compile(_folded, backend=backend)
    y = torch.randn(2, 8)
    for b in (4, 3, 5):
        x = torch.randn(b, 3)
        out = compiled(x, y)
        torch.testing.assert_close(out, _folded(x, y))
        assert out.data_ptr() != y.data_ptr()
    assert any("Ne(L['x'].size()[0], 1)" in g for g in _guards(compiled) if g.startswith("SHAPE"))
    out = compiled(torch.randn(1, 3), y)
    torch.testing.assert_close(out, y)
    assert out.data_ptr() == y.data_ptr()  # a view of y, as eager's
    assert len(backend.graphs) == 3


@torch.library.custom_op("kiln_test_dynamic::asks_its_own_size", mutates_args=())
def _asks_its_own_size(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_asks_its_own_size.register_fake
def _(x):
    from torch.fx.experimental import _config as fx_config

    if fx_config.backed_size_oblivious and isinstance(x.shape[1], torch.SymInt):
        # As torch 2.11's setitem into a slice to a symbolic end, traced size-obliviously: its
        # view's length is a symbol of its own, which it then compares with the input's.
        u = x.shape[1].node.shape_env.create_unbacked_symint()
        bool(u == x.shape[1])
    return torch.empty_like(x)


def _through_an_op_that_asks(x):
    return torch.ops.kiln_test_dynamic.asks_its_own_size.default(x) * 2


def test_an_op_that_asks_of_a_size_its_own_view_made_runs_again_as_torch_compile_traces():
    backend = Counting()
    compiled = kiln.compile(_through_an_op_that_asks, backend=backend, dynamic=True)
    for n in (5, 7, 9):
        x = torch.randn(2, n)
        torch.testing.assert_close(compiled(x), _through_an_op_that_asks(x))
    # One symbolic graph holding the op (it ran eagerly, "failed on fake inputs", before).
    assert len(backend.graphs) == 1
    assert sum(n.op == "call_function" for n in backend.graphs[0].graph.nodes) == 2


def test_a_batch_of_one_after_another_batch_is_a_symbol_of_the_next_graph():
    backend = Counting()
    model = _mlp()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for b in (4, 1, 6, 3, 1):  # the recompile sees 1: a symbol, since 4 was seen there
            x = torch.randn(b, 16)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(backend.graphs) == 2


def _attend(q, k, v):
    # transformers' way: the flag is computed from a size (a SymBool under symbolic sizes).
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1)


def test_a_flag_computed_from_sizes_is_decided_for_the_op_and_guarded():
    backend = Counting()
    compiled = kiln.compile(_attend, backend=backend)
    for t in (5, 7, 9, 1, 3):
        q, k, v = (torch.randn(2, 4, t, 8) for _ in range(3))
        torch.testing.assert_close(compiled(q, k, v), _attend(q, k, v))
    # static, symbolic (is_causal True while t > 1), then t == 1: another graph (not causal);
    # each the whole function, the attention in it (no break at the op)
    assert len(backend.graphs) == 3
    assert all("scaled_dot_product_attention" in gm.code for gm in backend.graphs)


def test_a_broken_equality_recompiles_and_raises_as_eager_does():
    backend = Counting()
    compiled = kiln.compile(lambda x, y: x + y, backend=backend)
    for n in (3, 4, 5):
        x, y = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(compiled(x, y), x + y)
    assert len(backend.graphs) == 2
    assert any("L['x'].size()[0]" in g and "L['y'].size()[0]" in g and "==" in g
               for g in _guards(compiled) if g.startswith("SHAPE"))
    with pytest.raises(RuntimeError, match="must match the size"):
        compiled(torch.randn(6), torch.randn(7))
    x, y = torch.randn(5, 6), torch.randn(6)  # broadcasting: yet another graph, right
    torch.testing.assert_close(compiled(x, y), x + y)


def test_dynamic_true_compiles_symbolic_from_the_first_call():
    backend = Counting()
    compiled = kiln.compile(lambda x: torch.relu(x) * x.shape[1], backend=backend, dynamic=True)
    for shape in ((3, 4), (5, 6), (7, 2), (9, 9)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), torch.relu(x) * shape[1])
    assert len(backend.graphs) == 1


def test_dynamic_false_compiles_each_shape():
    backend = Counting()
    compiled = kiln.compile(lambda x: torch.relu(x) + 1, backend=backend, dynamic=False)
    for n in (3, 4, 5, 6):
        compiled(torch.randn(n))
    assert len(backend.graphs) == 4
    assert not any(g.startswith("SHAPE") for g in _guards(compiled))


@pytest.mark.parametrize("spelling", ["kiln", "torch"])
def test_mark_dynamic_makes_the_first_compile_symbolic(spelling):
    if spelling == "torch":
        from torch._dynamo import mark_dynamic as mark
    else:
        mark = kiln.mark_dynamic
    backend = Counting()
    compiled = kiln.compile(lambda x: (x * 2).sum(0), backend=backend)
    for n in (3, 8, 11):
        x = torch.randn(n, 4)
        mark(x, 0)
        torch.testing.assert_close(compiled(x), (x * 2).sum(0))
    assert len(backend.graphs) == 1


def test_mark_dynamic_range_is_guarded():
    backend = Counting()
    compiled = kiln.compile(lambda x: x.cos(), backend=backend)
    x = torch.randn(8)
    kiln.mark_dynamic(x, 0, min=4, max=16)
    compiled(x)
    shape = [g for g in _guards(compiled) if g.startswith("SHAPE")]
    assert "L['x'].size()[0] >= 4" in shape[0] and "L['x'].size()[0] <= 16" in shape[0]
    for n in (4, 16):
        compiled(torch.randn(n))
    assert len(backend.graphs) == 1
    x = torch.randn(17)
    torch.testing.assert_close(compiled(x), x.cos())  # outside the range: another compile
    assert len(backend.graphs) == 2


@pytest.mark.parametrize("mark", ["mark_dynamic", "maybe_mark_dynamic"])
def test_a_dimension_the_program_specialises_is_an_error_only_if_marked_dynamic(mark):
    def f(x):
        if x.shape[0] == 4:
            return x + 1
        return x - 1

    compiled = kiln.compile(f, backend=Counting())
    x = torch.randn(4)
    getattr(kiln, mark)(x, 0)
    if mark == "mark_dynamic":
        with pytest.raises(ConstraintViolation, match="marked dynamic"):
            compiled(x)
    else:
        torch.testing.assert_close(compiled(x), x + 1)


def test_mark_static_under_dynamic_true():
    backend = Counting()
    compiled = kiln.compile(lambda x: x * 3, backend=backend, dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, 4)
        kiln.mark_static(x, 0)
        compiled(x)
    assert len(backend.graphs) == 2


def test_marks_check_their_arguments():
    with pytest.raises(IndexError):
        kiln.mark_dynamic(torch.randn(3), 1)
    with pytest.raises(TypeError):
        kiln.mark_dynamic([1, 2], 0)
    with pytest.raises(ValueError):
        kiln.mark_dynamic(torch.randn(3, 3), 0, min=5, max=4)


def test_a_symbolic_size_lives_across_a_graph_break():
    def f(x):
        b = x.shape[0]
        y = x * 2
        kiln.graph_break()
        return y.reshape(b, -1) + b

    backend = Counting()
    compiled = kiln.compile(f, backend=backend)
    for n in (3, 4, 6, 9):
        x = torch.randn(n, 2, 2)
        torch.testing.assert_close(compiled(x), f(x))


def test_parameters_stay_static():
    model = _mlp()
    backend = Counting()
    compiled = kiln.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        compiled(torch.randn(3, 16))
    guards = _guards(compiled)
    assert not any("weight" in g and "?" in g for g in guards)


def test_the_shape_guard_is_logged(capsys):
    kiln.config.log = frozenset({"guards"})
    compiled = kiln.compile(lambda x: x + 1, backend=Counting(), dynamic=True)
    compiled(torch.randn(5))
    text = capsys.readouterr().err
    assert "TENSOR_MATCH Tensor torch.float32 cpu size=(?,)" in text
    assert "SHAPE L['x'].size()[0] >= 2" in text


def test_explain_lists_the_shape_guard():
    def f(x):
        return x.sum(0) * x.shape[0]

    x = torch.randn(6, 3)
    kiln.mark_dynamic(x, 0)
    report = kiln.explain(f)(x)
    assert any(str(g).startswith("SHAPE") for g in report.out_guards)


def test_kiln_backend_specialises_per_shape_with_one_capture(kilnd_cache, monkeypatch):
    monkeypatch.setattr(kiln.config, "specialize_after", 2)
    # The same count whether or not the plan for every size is ready by then (it compiles on
    # the background worker, racing the calls; once ready, specialize_after_whole counts).
    monkeypatch.setattr(kiln.config, "specialize_after_whole", 2)
    model = _mlp()
    compiled = kiln.compile(model)
    with torch.no_grad():
        for b in (2, 3, 5, 3, 9, 5, 3):
            x = torch.randn(b, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(_entries(compiled)) == 2
    assert kiln.wait_for_compiles(timeout=120)
    # the static graph for 2, then 3 and 5 once each was called again (specialize_after=2),
    # and the symbolic graph once for every size (kiln.config.symbolic_plans)
    artifacts = kiln.debug.artifacts()
    assert sorted(a.plan.symbolic for a in artifacts) == [False, False, False, True]


def test_an_int_argument_that_changes_becomes_a_symbol():
    def f(x, n, m):
        return x * n + m, n * 2

    backend = Counting()
    compiled = kiln.compile(f, backend=backend)
    for n, m in ((3, 3), (4, 4), (5, 9), (7, 7), (1, 1), (0, 2), (12, 12)):
        x = torch.randn(4)
        got, want = compiled(x, n, m), f(x, n, m)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] and type(got[1]) is int
    assert len(backend.graphs) == 2
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x, True, 2)[0], f(x, True, 2)[0])  # a bool is no int
    assert len(backend.graphs) == 3


def test_an_int_used_as_a_python_value_is_specialised_and_guarded():
    def f(x, n):
        for _ in range(n):
            x = x + 1
        return x

    compiled = kiln.compile(f, backend=Counting())
    for n in (2, 3, 4, 3, 2):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, n), f(x, n))


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_a_specialised_graph_keeps_in_place_updates_whose_result_is_unused(backend, request,
                                                                           monkeypatch):
    if backend == "kiln":
        request.getfixturevalue("kilnd_cache")
    monkeypatch.setattr(kiln.config, "specialize_after", 1)

    def step(x, cache, length):
        cache.index_copy_(0, torch.arange(x.shape[0]) + length, x)  # result unused
        length.add_(x.shape[0])
        return cache[: x.shape[0]].sum(0) * 2, x.shape[0]

    compiled = kiln.compile(step, backend=backend)
    for n in (2, 3, 4, 3, 5):
        x = torch.randn(n, 4)
        want_cache, got_cache = torch.zeros(16, 4), torch.zeros(16, 4)
        want_len, got_len = torch.tensor(1), torch.tensor(1)
        want = step(x, want_cache, want_len)
        got = compiled(x, got_cache, got_len)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1]
        torch.testing.assert_close(got_cache, want_cache)
        assert got_len.item() == want_len.item()


def test_a_pad_by_an_amount_computed_from_a_size_stays_in_the_graph():
    def f(x, mask):
        pad = (8 - x.shape[-1] % 8) % 8  # a mask padded to a multiple of 8, as attention does
        return F.pad(x, (0, pad), value=-1.0) * 2, torch.nn.functional.pad(mask, (0, pad))

    backend = Counting()
    compiled = kiln.compile(f, backend=backend)
    for n in (5, 6, 9, 13, 12):
        x, mask = torch.randn(2, n), torch.ones(2, 1, n)
        for got, want in zip(compiled(x, mask), f(x, mask)):
            torch.testing.assert_close(got, want)
    assert len(backend.graphs) == 2  # no break at the pad


def test_marks_of_size_one_are_symbols_and_of_size_zero_an_error():
    backend = Counting()
    compiled = kiln.compile(lambda x: x * 2, backend=backend)
    for mark in (kiln.mark_unbacked, kiln.maybe_mark_dynamic):
        x = torch.randn(1, 3)
        mark(x, 0)
        torch.testing.assert_close(compiled(x), x * 2)
    # mark_dynamic of a size 1 is a symbol that admits 1: one graph for both sizes.
    backend = Counting()
    compiled = kiln.compile(lambda x: x * 3, backend=backend)
    for b in (1, 5):
        x = torch.randn(b, 3)
        kiln.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), x * 3)
    assert len(backend.graphs) == 1
    x = torch.randn(0, 3)
    kiln.mark_dynamic(x, 0)
    with pytest.raises(ConstraintViolation, match="has size 0"):
        kiln.compile(lambda x: x * 4, backend=Counting())(x)


def test_an_int_input_handed_on_at_a_break_with_no_graph_is_the_programs_value():
    seen = []

    def read(n):
        print("test: reads", n)
        return n

    def f(x, n):
        seen.append(read(n))  # a break before any op: the frame's graph is empty
        return x + n

    backend = Counting()
    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (5, 6):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, n), x + n)
    assert seen == [5, 6]
    assert backend.graphs  # the resume function's x + n is compiled, not run eagerly


def test_max_and_min_of_sizes_stay_symbolic():
    def f(x, n):
        w = max(x.shape[0] // 2, 1, n)
        h = min(x.shape[0], n * 2)
        return x[:h] * w, w, h

    backend = Counting()
    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for size, n in ((6, 2), (9, 3), (10, 7), (4, 5)):
        x = torch.randn(size)
        got, want = compiled(x, n), f(x, n)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:]
    assert len(backend.graphs) == 1


class _Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


def test_instances_of_a_block_that_differ_in_width_stay_static():
    # The third instance fails its entry on a parameter's shape, not an input's: a graph per
    # width, static (a symbolic one would run PyTorch's kernels under a static-size backend
    # until its signature's specialize_after-th call).
    blocks = [_Block(w) for w in (4, 4, 8, 16)]
    backend = Counting()  # one backend: the blocks share the callback and its entries
    compiled = [kiln.compile(b, backend=backend) for b in blocks]
    with torch.no_grad():
        for _ in range(2):
            for b, c in zip(blocks, compiled):
                x = torch.randn(3, b.lin.in_features)
                torch.testing.assert_close(c(x), b(x))
    guards = _guards(compiled[0])
    assert not any(g.startswith("SHAPE") for g in guards), guards
    assert not any("?" in g for g in guards if "TENSOR_MATCH" in g)


def test_an_input_that_changes_size_under_shared_block_entries_is_made_symbolic():
    blocks = [_Block(8) for _ in range(3)]
    backend = Counting()
    compiled = [kiln.compile(b, backend=backend) for b in blocks]
    with torch.no_grad():
        for n in (2, 3, 5, 7):
            for b, c in zip(blocks, compiled):
                x = torch.randn(n, 8)
                torch.testing.assert_close(c(x), b(x))
    assert any(g.startswith("SHAPE") for g in _guards(compiled[0]))


def test_a_specialisation_compiles_in_the_background_while_calls_run_the_graph(monkeypatch):
    import threading

    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.backends.specialize import PerSignature

    monkeypatch.setattr(kiln.config, "specialize_after", 2)
    monkeypatch.setattr(kiln.config, "specialize_in_background", True)
    gm = make_fx(lambda x: (torch.relu(x) * 2,))(torch.randn(4, 3))
    started, release, seen, compiled_runs = threading.Event(), threading.Event(), [], []

    def compile_static(graph, tensors):
        seen.append(tensors)
        started.set()
        tensors[0].fill_(float("nan"))  # a compile that wrote to what it was given
        assert release.wait(60)

        def fn(*a):
            compiled_runs.append(1)
            return graph(*a)
        return fn

    per = PerSignature(gm, compile_static)
    x = torch.randn(4, 3)
    before = x.clone()
    for _ in range(4):  # the second call starts the compile; none of them waits for it
        torch.testing.assert_close(per(x)[0], torch.relu(before) * 2)
    assert started.wait(60)
    torch.testing.assert_close(per(x)[0], torch.relu(before) * 2)  # still compiling: not waited for
    assert len(seen) == 1 and not compiled_runs
    # the compile had tensors like the call's, not the call's own
    assert seen[0][0].shape == x.shape and seen[0][0].stride() == x.stride()
    assert seen[0][0].data_ptr() != x.data_ptr()
    torch.testing.assert_close(x, before)
    release.set()
    assert kiln.wait_for_compiles(timeout=60)
    torch.testing.assert_close(per(x)[0], torch.relu(before) * 2)
    assert compiled_runs == [1] and len(seen) == 1


def test_a_specialisation_compiles_in_the_call_when_background_is_off(monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.backends.specialize import PerSignature

    monkeypatch.setattr(kiln.config, "specialize_after", 2)
    monkeypatch.setattr(kiln.config, "specialize_in_background", False)
    gm = make_fx(lambda x: (x + 1,))(torch.randn(5))
    runs = []

    def compile_static(graph, tensors):
        def fn(*a):
            runs.append(1)
            return graph(*a)
        return fn

    per = PerSignature(gm, compile_static)
    x = torch.randn(5)
    per(x)
    assert not runs
    torch.testing.assert_close(per(x)[0], x + 1)
    assert runs == [1]


class _Cache:
    """A decoder cache's bookkeeping: an int attribute updated on every step."""

    def __init__(self):
        self.length = 0


def test_an_int_attribute_of_an_argument_that_changes_becomes_a_symbol():
    def step(cache, x):
        cache.length += x.shape[0]
        return x * cache.length + 1

    backend = Counting()
    compiled = kiln.compile(step, backend=backend)
    ours, theirs = _Cache(), _Cache()
    for n in range(1, 15):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(ours, x), step(theirs, x))
        assert ours.length == theirs.length and type(ours.length) is int
    assert len(backend.graphs) == 2  # the first length's, then one for every length


def test_an_int_attribute_of_a_module_that_changes_stays_a_constant():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 2

        def forward(self, x):
            return x * self.k

    m = Scale()
    backend = Counting()
    compiled = kiln.compile(m, backend=backend)
    for k in (2, 3, 4):
        m.k = k
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), x * k)
    assert len(backend.graphs) == 3
    assert not any(isinstance(n.meta.get("example_value"), torch.SymInt)
                   for g in backend.graphs for n in g.graph.nodes if n.op == "placeholder")


class _Calls(torch.nn.Module):
    """Counts its calls in a plain int attribute, and uses the count."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(6, 6)
        self.calls = 0

    def forward(self, x):
        y = self.layer(x) + self.calls
        self.calls += 1
        return F.relu(y)


@pytest.mark.parametrize("backend_name", ["eager", "kiln"])
def test_an_int_attribute_a_module_increments_on_every_call_becomes_a_symbol(backend_name):
    # Each call sees a new count: as a constant it would be captured again on every call until
    # cache_size_limit, then run eagerly. Captured for 0, for 1, then once for every count.
    ours, theirs = _Calls(), _Calls()
    backend = Counting() if backend_name == "eager" else "kiln"
    compiled = kiln.compile(ours, backend=backend)
    x = torch.randn(4, 6)
    for _ in range(kiln.config.cache_size_limit + 4):
        torch.testing.assert_close(compiled(x), theirs(x))
        assert ours.calls == theirs.calls and type(ours.calls) is int
    assert len(_entries(compiled)) == 3
    if backend_name == "eager":
        symbols = [n for n in backend.graphs[-1].graph.nodes if n.op == "placeholder"
                   and isinstance(n.meta.get("example_value"), torch.SymInt)]
        assert len(symbols) == 1


def test_a_modules_int_attribute_equal_to_an_input_size_stays_a_constant_in_a_dynamic_capture():
    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = 4

        def forward(self, x):
            return x.reshape(x.shape[0], self.heads, -1).sum(-1)

    m = Heads()
    backend = Counting()
    compiled = kiln.compile(m, backend=backend)
    # 4: the first (static) capture's input has the attribute's value as a size; the sizes
    # then change and the next capture makes them symbols, but not the attribute.
    for rows in (4, 6, 9):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(x), m(x))
    symbols = [n for g in backend.graphs for n in g.graph.nodes if n.op == "placeholder"
               and isinstance(n.meta.get("example_value"), torch.SymInt)
               and "heads" in n.name]
    assert symbols == []


def test_an_int_attribute_a_module_increments_stays_a_constant_under_dynamic_false():
    ours, theirs = _Calls(), _Calls()
    backend = Counting()
    compiled = kiln.compile(ours, backend=backend, dynamic=False)
    x = torch.randn(4, 6)
    for _ in range(4):
        torch.testing.assert_close(compiled(x), theirs(x))
    assert len(backend.graphs) == 4
    assert not any(isinstance(n.meta.get("example_value"), torch.SymInt)
                   for g in backend.graphs for n in g.graph.nodes if n.op == "placeholder")


def test_only_the_int_attributes_that_changed_become_symbols():
    class Window:
        def __init__(self):
            self.length, self.size = 5, 4

    def step(cache, x):
        cache.length += 1
        return x[-cache.size:] * cache.length

    backend = Counting()
    compiled = kiln.compile(step, backend=backend)
    ours, theirs = Window(), Window()
    for _ in range(6):
        x = torch.randn(10)
        torch.testing.assert_close(compiled(ours, x), step(theirs, x))
        assert ours.length == theirs.length
    assert len(backend.graphs) == 2
    symbols = [n for n in backend.graphs[-1].graph.nodes if n.op == "placeholder"
               and isinstance(n.meta.get("example_value"), torch.SymInt)]
    assert len(symbols) == 1  # the length; the window's size stayed a constant


class _StaticCache:
    """A static cache: a buffer of `capacity` positions and that capacity as an int, made anew
    with more room for a longer request."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.buf = torch.zeros(2, capacity, 4)


def test_an_int_attribute_equal_to_a_size_becomes_a_symbol_when_the_frame_does():
    def prefill(cache, x):
        n = x.shape[1]
        cache.buf[:, :n] = x
        return cache.buf[:, :n].cumsum(1) * cache.capacity + cache.buf[:, n:].sum(1, True)

    backend = Counting()
    compiled = kiln.compile(prefill, backend=backend)
    # The capacity stays 16 while the prompt's length changes (the frame's sizes become
    # symbols), then a longer prompt brings a cache with more room: no graph for it.
    for capacity, n in ((16, 5), (16, 7), (16, 12), (32, 20), (48, 40)):
        ours, theirs = _StaticCache(capacity), _StaticCache(capacity)
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(compiled(ours, x), prefill(theirs, x))
        torch.testing.assert_close(ours.buf, theirs.buf)
    assert len(backend.graphs) == 2
    symbols = [n for n in backend.graphs[-1].graph.nodes if n.op == "placeholder"
               and isinstance(n.meta.get("example_value"), torch.SymInt)]
    assert len(symbols) == 1  # the capacity


def test_size_oblivious_reasoning_is_on_for_kilns_thread_alone():
    # kiln traces with torch's backed_size_oblivious on; a torch.compile trace in another
    # thread meanwhile reads the process's own setting.
    import threading

    from torch.fx.experimental import _config

    from kiln.graph.symbolic_shapes import size_oblivious

    before = _config.backed_size_oblivious
    inside, other = [], []
    started, read = threading.Event(), threading.Event()

    def elsewhere():
        started.wait(10)
        other.append(_config.backed_size_oblivious)
        read.set()

    t = threading.Thread(target=elsewhere)
    t.start()
    with size_oblivious():
        inside.append(_config.backed_size_oblivious)
        started.set()
        read.wait(10)
    t.join(10)
    assert inside == [True] and other == [before] and _config.backed_size_oblivious == before
