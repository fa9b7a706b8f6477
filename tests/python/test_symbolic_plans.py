"""A graph captured with symbolic sizes, through the kiln backend: compiled once whole into one
kilnd artifact whose plan reads its sizes from each call's inputs (kiln.config.symbolic_plans),
which runs every size the graph's guards admit, equal to eager; graphs the IR cannot carry
exactly keep running per signature. Needs kilnd (skips without)."""
import logging
import random

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.backends import specialize


@pytest.fixture
def whole_graphs(kilnd_cache, monkeypatch):
    """The PerSignature of every dynamic graph compiled whole while the test runs."""
    made = []
    compile_whole = specialize.PerSignature.compile_whole

    def spy(self, fn, example_inputs):
        made.append(self)
        return compile_whole(self, fn, example_inputs)

    monkeypatch.setattr(specialize.PerSignature, "compile_whole", spy)
    monkeypatch.setattr(kiln.config, "specialize_in_background", False)
    # Each test traces its graphs: an earlier test's stored capture of the same code (the
    # session shares one cache directory) would be installed instead.
    monkeypatch.setattr(kiln.config, "stored_captures", False)
    return made


class Block(torch.nn.Module):
    """Attention and an MLP with layer norms over (batch, sequence, 32)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        self.norm1, self.norm2 = torch.nn.LayerNorm(32), torch.nn.LayerNorm(32)
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        y = self.norm1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.norm2(y + self.down(F.gelu(self.up(y))))


def _symbolic(artifacts):
    return [a for a in artifacts if a.plan.symbolic]


def _run_as_eager(compiled, model, batches, length=5):
    with torch.no_grad():
        for b in batches:
            x = torch.randn(b, length, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_one_plan_serves_every_batch_and_sequence_length(whole_graphs):
    model = Block().eval()
    compiled = kiln.compile(model)
    random.seed(0)
    shapes = [(random.randint(2, 9), random.randint(2, 40)) for _ in range(12)]
    with torch.no_grad():
        for i, (b, t) in enumerate(shapes):
            x = torch.randn(b, t, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
            if i == 1:  # the symbolic graph is compiled: from here on only its plan runs
                (graph,) = whole_graphs
                assert graph.whole is not None and graph.whole.symbolic

                def not_the_graph(*args):
                    raise AssertionError("the graph ran instead of its plan")

                graph.gm = not_the_graph
    assert len(kiln.debug.cache_entries(compiled)) == 2  # static, then symbolic
    (plan,) = _symbolic(kiln.debug.artifacts())
    # The add and GELU run as generated kernels over the call's rows (batch * sequence).
    assert not plan.plan.failed and plan.plan.num_kernels >= 2


class Positions(torch.nn.Module):
    """A learnt position table read up to the sequence's length (BERT's, GPT-2's): the slice's
    end is min(64, t) until the capture settles which side the calls take."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(1, 64, 32))
        self.block = Block()

    def forward(self, x):
        return self.block(x + self.table[:, :x.shape[1]])


def test_a_batch_of_one_and_a_table_read_to_the_length_run_the_one_plan(whole_graphs):
    model = Positions().eval()
    compiled = kiln.compile(model)
    _run_as_eager(compiled, model, (4, 6, 1, 3, 1, 7), length=9)
    with torch.no_grad():
        for t in (5, 17, 64):
            x = torch.randn(1, t, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    # static, then one symbolic graph for every batch (1 too) and length up to the table's
    assert len(kiln.debug.cache_entries(compiled)) == 2
    (plan,) = _symbolic(kiln.debug.artifacts())
    assert not plan.plan.failed and whole_graphs[0].whole is not None
    x = torch.randn(2, 65, 32)  # past the table: eager raises, and so does the compiled model
    with pytest.raises(RuntimeError), torch.no_grad():
        model(x)
    with pytest.raises(RuntimeError), torch.no_grad():
        compiled(x)


def _read_of_a_cache(x, cache):
    # A static cache read up to the new tokens' length: the slice's end is min(t, len), which
    # the capture settles to t <= len, a guard between two sizes.
    return x * 2 + cache[:, :x.shape[1]]


def test_a_min_of_two_sizes_the_guards_settle_is_one_plan(whole_graphs):
    compiled = kiln.compile(_read_of_a_cache)
    for b, t, n in ((2, 5, 9), (3, 7, 12), (4, 6, 6), (2, 3, 20), (5, 8, 11)):
        x, cache = torch.randn(b, t, 4), torch.randn(b, n, 4)
        torch.testing.assert_close(compiled(x, cache), _read_of_a_cache(x, cache))
    (plan,) = _symbolic(kiln.debug.artifacts())
    assert not plan.plan.failed and whole_graphs[-1].whole is not None
    x, cache = torch.randn(2, 9, 4), torch.randn(2, 5, 4)  # the other side of the min
    with pytest.raises(RuntimeError):
        _read_of_a_cache(x, cache)  # eager's broadcast error ...
    with pytest.raises(RuntimeError):
        compiled(x, cache)  # ... is the compiled function's too


def test_sizes_the_trace_computes_reach_the_plan_as_expressions(whole_graphs):
    def g(x, y):
        z = torch.cat([x, y]) * 2
        return z.view(z.shape[0] * z.shape[1]), torch.arange(x.shape[0] * 2) + x.shape[1]

    compiled = kiln.compile(g)
    for n, m in ((2, 3), (4, 5), (7, 2), (3, 9)):
        x, y = torch.randn(n, 6), torch.randn(m, 6)
        for got, want in zip(compiled(x, y), g(x, y)):
            torch.testing.assert_close(got, want)
    assert len(_symbolic(kiln.debug.artifacts())) == 1
    assert whole_graphs[0].whole is not None


def test_an_in_place_op_on_a_value_the_graph_made_becomes_its_functional_op(whole_graphs):
    def f(x):
        y = x * 2
        y.add_(1)
        return y.relu()

    compiled = kiln.compile(f)
    for n in (2, 3, 5, 8):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), f(x))
    assert whole_graphs and whole_graphs[0].whole is not None
    assert _symbolic(kiln.debug.artifacts())


def _run_writing(compiled, fn):
    """Calls of a function that writes its input, at several sizes: its result and what it
    wrote into the input are eager's."""
    for n in (2, 3, 5, 8):
        x = torch.randn(n, 4)
        mine = x.clone()
        torch.testing.assert_close(compiled(mine), fn(x))
        torch.testing.assert_close(mine, x)


def test_a_write_through_a_view_of_an_input_keeps_running_per_signature(whole_graphs):
    def f(x):
        x[:, :1].add_(1)
        return x * 2

    _run_writing(kiln.compile(f), f)
    assert whole_graphs and whole_graphs[0].whole is None
    assert not _symbolic(kiln.debug.artifacts())


def _view_between_writes(x):
    x.add_(1)
    before = x[:, :1]  # taken between two writes: in eager it shows the second
    x.mul_(2)
    return before + 0


def _made_view_between_writes(x):
    y = x * 3
    y.add_(1)
    before = y[:, :1]
    y.mul_(2)
    return before + 0


@pytest.mark.parametrize("fn", [_view_between_writes, _made_view_between_writes])
def test_a_view_taken_between_two_writes_reads_what_eager_reads(whole_graphs, fn):
    _run_writing(kiln.compile(fn), fn)


def _cache_step(keys, values, length, position, k, v):
    """A decoder's static-cache step: the new key and value written into the caches at
    `position`, the count of tokens bumped, attention over the whole cache."""
    keys.index_copy_(2, position, k)
    values.index_copy_(2, position, v)
    length.add_(k.shape[2])
    scores = (k @ keys.transpose(-1, -2)).softmax(-1)
    return scores @ values, length * 1


def test_writes_into_its_inputs_are_updates_of_one_plan_for_every_size(whole_graphs):
    compiled = kiln.compile(_cache_step)
    torch.manual_seed(0)
    for batch, cache_len in ((2, 6), (3, 9), (4, 7), (2, 12), (5, 10)):
        caches = [torch.randn(batch, 2, cache_len, 8) for _ in range(2)]
        length = torch.zeros(1, dtype=torch.long)
        mine = [c.clone() for c in caches] + [length.clone()]
        for step in range(3):
            position = torch.tensor([step])
            k, v = torch.randn(batch, 2, 1, 8), torch.randn(batch, 2, 1, 8)
            expected = _cache_step(*caches, length, position, k, v)
            got = compiled(*mine, position, k, v)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
            # The caller's own tensors hold the writes, as eager's do.
            for a, b in zip(mine, caches + [length]):
                torch.testing.assert_close(a, b)
    (plan,) = _symbolic(kiln.debug.artifacts())
    assert plan.plan.symbolic
    assert any(g.whole is not None for g in whole_graphs)


def test_a_view_taken_before_a_write_into_an_input_is_read_as_eager_reads_it(whole_graphs):
    def f(x, y):
        before = x[:, :1]  # a view: in eager it shows the write below
        x.mul_(2)
        return before + y

    compiled = kiln.compile(f)
    for n in (2, 3, 5, 8):
        x, y = torch.randn(n, 4), torch.randn(n, 1)
        mine = x.clone()
        torch.testing.assert_close(compiled(mine, y), f(x, y))
        torch.testing.assert_close(mine, x)
    assert not _symbolic(kiln.debug.artifacts())


def _with_sizes(x):
    """Sizes among the results (a cache's batch size stored on its first call), and a number
    that is an expression of them."""
    return (x * 2).relu(), x.shape[0], x.shape[1] * 2


def test_sizes_it_returns_are_read_from_each_calls_inputs(whole_graphs):
    def f(x):
        y, rows, _ = _with_sizes(x)
        return y, rows

    compiled = kiln.compile(f)
    for b, t in ((2, 5), (3, 7), (4, 6), (6, 9), (5, 4)):
        x = torch.randn(b, t)
        (got, rows), (expected, eager_rows) = compiled(x), f(x)
        torch.testing.assert_close(got, expected)
        assert rows == eager_rows and type(rows) is int
    (plan,) = _symbolic(kiln.debug.artifacts())
    assert len(plan.body.plan.outputs) == 1  # the size is no output of the plan


def test_a_number_that_is_no_inputs_size_keeps_the_graph_per_signature(whole_graphs):
    compiled = kiln.compile(_with_sizes)
    for b, t in ((2, 5), (3, 7), (4, 6)):
        x = torch.randn(b, t)
        got, expected = compiled(x), _with_sizes(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:]
    assert not _symbolic(kiln.debug.artifacts())


def _last_positions(x, w):
    """A language model's head: the last position of each sequence (a view whose storage offset
    is (t - 1) * 32), normalised by kernels that read it, projected by a library call; beside it
    a slice at a constant position, whose offset is static."""
    h = torch.tanh(x) * 2
    last = h[:, -1:, :]
    return torch.nn.functional.layer_norm(last + 1, (32,)) @ w, h[:, 1:3].sum(-1)


def test_a_view_at_a_position_that_depends_on_the_sizes_is_one_plan(whole_graphs):
    compiled = kiln.compile(_last_positions)
    w = torch.randn(32, 8)
    for b, t in ((2, 5), (3, 7), (4, 6), (6, 9), (5, 4), (2, 3)):
        x = torch.randn(b, t, 32)
        for got, want in zip(compiled(x, w), _last_positions(x, w)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # The view's offset is an expression of the sequence length in the plan, not a reason to
    # run the graph per signature.
    (plan,) = _symbolic(kiln.debug.artifacts())
    assert not plan.plan.failed
    assert whole_graphs[0].whole is not None and whole_graphs[0].whole.symbolic
    offsets = [v.meta.storage_offset_expr for v in plan.body.plan.values
               if v.meta.HasField("storage_offset_expr")]
    assert offsets


def _sized_by(x, n):
    """A tensor whose size is an int argument (a static cache allocated at max_cache_len)."""
    return x.sum(1, keepdim=True) + torch.zeros(x.shape[0], n, 3)


def test_an_int_that_changes_is_a_size_of_one_plan_for_every_value(whole_graphs):
    compiled = kiln.compile(_sized_by)
    for b, n in ((2, 5), (3, 7), (4, 9), (5, 6), (6, 11), (2, 2), (3, 1), (4, 0), (2, 8)):
        x = torch.randn(b, 4, 3)
        torch.testing.assert_close(compiled(x, n), _sized_by(x, n))
    # The number is an input's size (an empty carrier of it), not a compile per value (0 and 1,
    # and a number equal to the batch, are captures of their own, as torch's are).
    (plan,) = [a for a in _symbolic(kiln.debug.artifacts()) if len(a.body.plan.inputs) == 2]
    assert len(kiln.debug.artifacts()) <= 4


def _scaled_by(x, n):
    return x * n + n


def test_an_int_that_may_be_negative_keeps_the_graph_per_signature(whole_graphs):
    compiled = kiln.compile(_scaled_by)
    for n in (3, -4, 7, -2, 5, 0):
        x = torch.randn(4, 3)
        torch.testing.assert_close(compiled(x, n), _scaled_by(x, n))
    assert not _symbolic(kiln.debug.artifacts())


def test_a_plan_whose_lowering_takes_the_batch_as_two_or_more_serves_only_those(
        whole_graphs, monkeypatch):
    # As the choice of an attention kernel on a GPU does: the lowering asks whether the batch
    # is 1, which the capture did not.
    from kiln.graph import lowering

    to_ir = lowering.to_ir

    def asking(aten_gm, *args, **kwargs):
        x = next((n.meta["val"] for n in aten_gm.graph.nodes
                  if n.op == "placeholder" and getattr(n.meta.get("val"), "dim", int)() == 3),
                 None)
        if x is not None and isinstance(x.shape[0], torch.SymInt):  # a symbolic graph's
            bool(x.shape[0] != 1)
        return to_ir(aten_gm, *args, **kwargs)

    monkeypatch.setattr(lowering, "to_ir", asking)
    model = Block().eval()
    compiled = kiln.compile(model)
    _run_as_eager(compiled, model, (4, 6, 3))
    (graph,) = whole_graphs
    floors = []
    graph.when_whole(lambda whole: floors.append(whole.floors))
    assert graph.whole is not None and floors == [[(0, 0, 2)]]
    ran, plan = [], graph.whole
    graph.whole = lambda *a: (ran.append(a[0].shape[0]), plan(*a))[1]
    _run_as_eager(compiled, model, (1, 5, 1, 2))
    assert ran == [5, 2]  # the batches of 1 ran without it, as eager
    assert len(kiln.debug.cache_entries(compiled)) == 2  # static, then symbolic (batch 1 too)


def test_why_a_graph_has_no_plan_for_every_size_is_said_under_the_cache_log(
        whole_graphs, monkeypatch, caplog):
    # Its capture is then not stored for other processes: KILN_LOG=cache says why.
    monkeypatch.setattr(kiln.config, "log", frozenset({"cache"}))
    compiled = kiln.compile(_scaled_by)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for n in (3, -4, 7):
            x = torch.randn(4, 3)
            torch.testing.assert_close(compiled(x, n), _scaled_by(x, n))
    assert not _symbolic(kiln.debug.artifacts())
    assert any("not compiled for every size" in r.getMessage() and "negative" in r.getMessage()
               for r in caplog.records)


def test_symbolic_plans_can_be_turned_off(whole_graphs, monkeypatch):
    monkeypatch.setattr(kiln.config, "symbolic_plans", False)
    model = Block().eval()
    compiled = kiln.compile(model)
    _run_as_eager(compiled, model, (2, 3, 4))
    assert not _symbolic(kiln.debug.artifacts())


def test_the_whole_compile_runs_in_the_background_while_calls_run_the_graph(kilnd_cache):
    model = Block().eval()
    compiled = kiln.compile(model)
    _run_as_eager(compiled, model, (2, 3, 4))
    assert kiln.wait_for_compiles(timeout=120)
    assert len(_symbolic(kiln.debug.artifacts())) == 1
    _run_as_eager(compiled, model, (6, 9), length=7)


class DecoderLayer(torch.nn.Module):
    """A decoder layer's shape of work over (batch, sequence, 64): an RMS norm (a row reduction),
    a projection viewed as heads and transposed, pointwise work over the transposed heads, a
    residual and a gated MLP."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(d))
        self.q = torch.nn.Linear(d, d, bias=False)
        self.gate, self.up = torch.nn.Linear(d, 96, bias=False), torch.nn.Linear(d, 96, bias=False)
        self.down = torch.nn.Linear(96, d, bias=False)

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = self.weight * h.to(x.dtype)
        b, t, d = x.shape
        q = self.q(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        q = q * 0.5 + torch.tanh(q)
        y = x + q.transpose(1, 2).reshape(b, t, d)
        return y + self.down(F.silu(self.gate(y)) * self.up(y))


DEVICES = [("cpu", torch.float32)] + ([("cuda", torch.float32), ("cuda", torch.bfloat16)]
                                      if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_kernels_over_the_calls_rows_match_eager_at_every_size(whole_graphs, device, dtype):
    model = DecoderLayer().to(device, dtype).eval()
    compiled = kiln.compile(model)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    random.seed(1)
    shapes = [(3, 5), (4, 7)] + [(random.randint(2, 9), random.randint(2, 70)) for _ in range(8)]
    with torch.no_grad():
        for b, t in shapes + [(1, 9), (5, 1)]:
            x = torch.randn(b, t, 64, device=device, dtype=dtype)
            torch.testing.assert_close(compiled(x), model(x), **tol)
    plans = _symbolic(kiln.debug.artifacts())
    assert plans, "no graph compiled over symbolic sizes"
    # The norm's row kernel and pointwise kernels over the call's rows, not op by op (sizes 1
    # specialise: a second graph may be symbolic in the other dim).
    for a in plans:
        assert not a.plan.failed and a.plan.num_kernels >= 2, a.plan.num_kernels


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def shape_budget():
    """Sets the process's budget of per-shape graphs for one test (restored after)."""
    from kiln.state import STATE, _shape_graph_bytes

    pool = STATE.cuda_graph_pool()
    yield pool.set_shape_budget
    pool.set_shape_budget(kiln.config.cuda_graph_shapes, _shape_graph_bytes())


def _whole_plan(whole_graphs):
    (graph,) = [g for g in whole_graphs if g.whole is not None]
    return graph.whole


@requires_cuda
def test_a_symbolic_plan_on_a_gpu_replays_one_graph_per_shape(whole_graphs):
    model = Block().cuda().eval()
    compiled = kiln.compile(model)
    shapes = [(2, 5), (3, 7), (4, 9), (2, 11), (5, 6)]
    with torch.no_grad():
        compiled(torch.randn(2, 3, 32, device="cuda"))  # the static first capture
        for n_pass in range(3):
            for b, t in shapes:
                x = torch.randn(b, t, 32, device="cuda")
                first = compiled(x)
                kept = first.clone()
                again = compiled(torch.randn(b, t, 32, device="cuda"))
                # A replay's outputs are the caller's own: the next replay leaves them alone.
                torch.testing.assert_close(first, kept)
                torch.testing.assert_close(first, model(x), rtol=1e-4, atol=1e-4)
                assert again.shape == first.shape
    plan = _whole_plan(whole_graphs)
    stats = plan.cuda_graph_shapes
    # A small block's launches take the GPU as long as its work: graphs pay. Every shape the
    # plan ran after its first timed calls was recorded once and replayed since.
    assert stats["gate"] == "record"
    assert plan.cuda_graph == "captured"
    assert stats["graphs"] == stats["captures"] and stats["evictions"] == 0
    assert len(shapes) - 1 <= stats["graphs"] <= len(shapes)
    assert stats["bytes"] > 0


@requires_cuda
def test_shapes_past_the_budget_run_without_a_graph_and_idle_ones_make_room(whole_graphs,
                                                                            shape_budget):
    shape_budget(2, 0)
    model = Block().cuda().eval()
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled(torch.randn(2, 3, 32, device="cuda"))
        cycle = [(2, 5), (3, 7), (4, 9), (5, 6)]
        for _ in range(3):  # a cycle of four shapes: the first two keep their graphs
            for b, t in cycle:
                x = torch.randn(b, t, 32, device="cuda")
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        plan = _whole_plan(whole_graphs)
        stats = plan.cuda_graph_shapes
        assert stats["graphs"] == 2 and stats["evictions"] == 0
        # The program moves on to other shapes: the two graphs idle out and new shapes get them.
        for _ in range(16):  # 32 calls: more than 4 * 2 + 16 since either graph's last
            for b, t in ((6, 3), (7, 4)):
                x = torch.randn(b, t, 32, device="cuda")
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        stats = plan.cuda_graph_shapes
        assert stats["graphs"] == 2 and stats["evictions"] == 2


@requires_cuda
def test_a_plan_whose_gpu_work_outlasts_its_launches_records_no_graphs(whole_graphs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda().eval()
    compiled = kiln.compile(model)
    with torch.no_grad():
        for n in (2048, 3072, 2560, 3584, 2304, 2816, 3328, 2048, 3072, 2560):
            x = torch.randn(n, 4096, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)
    plan = _whole_plan(whole_graphs)
    assert plan.cuda_graph_shapes["gate"] == "plain" and plan.cuda_graph_shapes["graphs"] == 0
    assert plan.cuda_graph == "off"


class Scaled(torch.nn.Module):
    """x @ (w * 2): the scaled weight is the plan's prologue (a value of its parameters)."""

    def __init__(self, n=512):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(n, n, device="cuda"), requires_grad=False)

    def forward(self, x):
        return torch.relu(x @ (self.w * 2))


@requires_cuda
def test_the_graphs_of_one_plan_share_its_prologue_and_all_read_it_recomputed(whole_graphs):
    model = Scaled()
    compiled = kiln.compile(model)
    rows = (3, 5, 7, 9, 11, 13)

    def check():
        for n in rows:
            x = torch.randn(n, 512, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)

    with torch.no_grad():
        compiled(torch.randn(2, 512, device="cuda"))  # the static first capture
        check()
        check()
        plan = _whole_plan(whole_graphs)
        stats = plan.cuda_graph_shapes
        assert stats["gate"] == "record" and stats["graphs"] >= 4
        prologue = 512 * 512 * 4
        # One copy of the scaled weight for all the graphs, not one each.
        assert prologue <= stats["bytes"] < 2 * prologue
        model.w.add_(1)  # the prologue is recomputed: every graph reads the new values
        check()
        assert plan.cuda_graph_shapes["captures"] == stats["captures"]


@requires_cuda
def test_a_signature_called_often_is_not_specialised_while_graphs_replay_per_shape(
        whole_graphs):
    model = Block().cuda().eval()
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled(torch.randn(2, 3, 32, device="cuda"))
        for b, t in [(3, 7), (4, 9), (2, 11), (5, 6)] + [(3, 5)] * (
                2 * kiln.config.specialize_after_whole):
            x = torch.randn(b, t, 32, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    (graph,) = [g for g in whole_graphs if g.whole is not None]
    assert graph.whole.cuda_graph_shapes["gate"] == "record"
    # The shape's graph replays the plan's launches: no static compile of the signature.
    assert not graph.compiled
