"""The "kiln" backend end to end: capture -> lowering -> a real kilnd (started by the client in a
private cache directory) -> verified artifact -> the C++ runtime; results against eager."""
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.backends import kiln_backend
from kiln.daemon import client as daemon_client
from kiln.state import STATE

KILND = STATE.daemon.settings.kilnd


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


def run_kiln(fn, *args):
    compiled = kiln.compile(fn, backend="kiln")
    with torch.no_grad():
        return compiled(*args), fn(*args)


class ConvBnRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean(dim=(2, 3)))


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(32, 64)
        self.ln = torch.nn.LayerNorm(64)
        self.l2 = torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.l2(self.ln(torch.nn.functional.gelu(self.l1(x))))


def test_pointwise_chain_runs_as_one_generated_kernel():
    def f(x, y):
        return torch.relu(x * 2.0 + y) - torch.sigmoid(x)

    x, y = torch.randn(64, 33), torch.randn(33)
    out, ref = run_kiln(f, x, y)
    torch.testing.assert_close(out, ref)
    art = kiln.debug.artifact(f)
    assert art is not None, "the graph did not go through the kiln backend"
    assert art.plan.num_kernels == 1 and art.plan.num_library_calls == 0


@pytest.mark.parametrize("make,shape", [(ConvBnRelu, (2, 3, 16, 16)), (Mlp, (8, 32))])
def test_modules_with_parameters_match_eager(make, shape):
    torch.manual_seed(0)
    m = make().eval()
    if isinstance(m, ConvBnRelu):  # non-trivial running statistics
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(*shape)
    out, ref = run_kiln(m, x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    art = kiln.debug.artifact(m)
    assert art is not None and art.plan.num_kernels >= 1
    # A second input of the same shape reuses the artifact; the result is still right.
    x2 = torch.randn(*shape)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(m, backend="kiln")(x2), m(x2), rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.int64])
def test_other_dtypes_match_eager(dtype):
    def f(x, y):
        return (x + y) * y - x

    if dtype.is_floating_point:
        x, y = torch.randn(17, 9, dtype=dtype), torch.randn(17, 9, dtype=dtype)
    else:
        x, y = torch.randint(-50, 50, (17, 9)), torch.randint(-50, 50, (17, 9))
    out, ref = run_kiln(f, x, y)
    torch.testing.assert_close(out, ref)


def test_non_contiguous_and_broadcast_inputs_match_eager():
    def f(x, b):
        return torch.tanh(x.t() * b + 1)

    x, b = torch.randn(12, 20), torch.randn(1, 12)
    out, ref = run_kiln(f, x, b)
    torch.testing.assert_close(out, ref)


def test_recompile_for_new_shape_gets_a_new_artifact():
    def f(x):
        return torch.exp(x) * 3

    c = kiln.compile(f, backend="kiln", dynamic=False)  # a graph per shape
    with torch.no_grad():
        for n in (5, 7):
            x = torch.randn(n, 4)
            torch.testing.assert_close(c(x), f(x))
    assert len({a.key for a in kiln.debug.artifacts()}) == 2


def test_an_artifact_takes_tensors_of_its_own_device_only():
    # A plan given another device's memory would not fail cleanly (a GPU plan handed a module's
    # parameters still on the CPU): the check that guards every load refuses it.
    from kiln.daemon import artifact as art

    def f(x):
        return torch.relu(x) * 2

    x = torch.randn(6, 5)
    run_kiln(f, x)
    body = kiln.debug.artifact(f).body
    art.check_inputs(body, [x])
    with pytest.raises(art.ArtifactRejected, match="meta"):
        art.check_inputs(body, [torch.empty(6, 5, device="meta")])


def test_artifact_is_inspectable(capsys):
    def f(x):
        return torch.relu(x) + 1

    run_kiln(f, torch.randn(8))
    text = kiln.debug.format_artifact(kiln.debug.artifact(f))
    assert "kernel" in text and "artifact" in text


def test_a_graph_that_needs_autograd_compiles_a_forward_and_a_backward_graph():
    def f(x):
        return (x * 3).tanh().sum()

    x = torch.randn(5, requires_grad=True)
    out = kiln.compile(f, backend="kiln")(x)
    out.backward()
    x_eager = x.detach().clone().requires_grad_()
    f(x_eager).backward()
    torch.testing.assert_close(out, f(x.detach()))
    torch.testing.assert_close(x.grad, x_eager.grad)
    # Torch's AOT autograd split it; kilnd compiled each half (tanh's backward is pointwise).
    assert len(kiln.debug.artifacts()) == 2


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 8))


def test_training_steps_of_a_compiled_model_match_eager_ones():
    eager, trained = _mlp(0), _mlp(0)
    compiled = kiln.compile(trained, backend="kiln")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_k = torch.optim.SGD(trained.parameters(), lr=0.1, momentum=0.9)
    for _ in range(4):  # the parameters change in place between the steps
        x, y = torch.randn(16, 32), torch.randn(16, 8)
        loss_e = torch.nn.functional.mse_loss(eager(x), y)
        loss_k = torch.nn.functional.mse_loss(compiled(x), y)
        torch.testing.assert_close(loss_k, loss_e, rtol=1e-5, atol=1e-6)
        for loss, opt in ((loss_e, opt_e), (loss_k, opt_k)):
            opt.zero_grad()
            loss.backward()
            opt.step()
    for pe, pk in zip(eager.parameters(), trained.parameters()):
        torch.testing.assert_close(pk, pe, rtol=1e-5, atol=1e-6)
    assert len(kiln.debug.artifacts()) == 2  # one forward, one backward, for every step
    with torch.no_grad():  # inference on the same model: another entry, its own graph
        x = torch.randn(3, 32)
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-6)
    assert len(kiln.debug.artifacts()) == 3


class _ConvTrainNet(torch.nn.Module):
    """The ops of a convolutional network's training step: convolutions (the first one's input
    needs no gradient: convolution_backward's output_mask leaves it undefined), batch norm with
    batch statistics and running-statistics updates, max pooling, adaptive average pooling."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.relu(self.bn2(self.conv2(x))) + x
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def test_training_steps_of_a_convolutional_network_compile_both_graphs(caplog):
    torch.manual_seed(0)
    eager = _ConvTrainNet()
    trained = _ConvTrainNet()
    trained.load_state_dict(eager.state_dict())
    compiled = kiln.compile(trained, backend="kiln")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_k = torch.optim.SGD(trained.parameters(), lr=0.05)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(3):
            x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))
            for model, opt in ((eager, opt_e), (compiled, opt_k)):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    assert not [r for r in caplog.records if "eagerly" in r.getMessage()]
    assert len(kiln.debug.artifacts()) == 2  # the forward graph and the backward graph
    for pe, pk in zip(eager.parameters(), trained.parameters()):
        torch.testing.assert_close(pk, pe, rtol=1e-4, atol=1e-5)
    for be, bk in zip(eager.buffers(), trained.buffers()):  # running statistics, batch counts
        torch.testing.assert_close(bk, be, rtol=1e-4, atol=1e-5)


def test_no_daemon_runs_eagerly_with_one_warning(caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_DAEMON", f"unix://{tmp_path}/nobody.sock")
    kiln.reset()  # the settings are read again: a client of the daemon that is not there
    try:
        with caplog.at_level(logging.WARNING, logger="kiln"):
            for n in (3, 4, 5):  # three graphs, one warning
                x = torch.randn(n)
                out, ref = run_kiln(lambda t: t * 2 + 1, x)
                torch.testing.assert_close(out, ref)
        warnings = [r for r in caplog.records if "eagerly" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
        assert "daemon" in warnings[0].getMessage()
    finally:
        monkeypatch.delenv("KILN_DAEMON")
        kiln.reset()


def test_artifact_under_another_mac_key_is_refused(caplog, monkeypatch, tmp_path):
    key = tmp_path / "other.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    STATE.daemon.client().ensure_running()  # kilnd runs, with the cache directory's key
    monkeypatch.setenv("KILN_MAC_KEY_FILE", str(key))
    kiln.reset()  # the client's settings are read again: it verifies with the other key
    with caplog.at_level(logging.WARNING, logger="kiln"):
        out, ref = run_kiln(lambda t: t - 5, torch.randn(6))
    torch.testing.assert_close(out, ref)
    assert kiln.debug.artifacts() == []
    assert any("MAC" in r.getMessage() for r in caplog.records)


def test_readable_mac_key_is_refused(monkeypatch, tmp_path):
    key = tmp_path / "loose.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
    with pytest.raises(daemon_client.DaemonUnavailable, match="group or others"):
        daemon_client.read_mac_key(key)


def test_fresh_process_gets_every_artifact_from_the_cache(kilnd_cache):
    script = textwrap.dedent("""
        import json, torch, kiln
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        m.eval()
        x = torch.randn(3, 16)
        with torch.no_grad():
            out = kiln.compile(m, backend="kiln")(x)
            torch.testing.assert_close(out, m(x))
        arts = kiln.debug.artifacts()
        print(json.dumps({"n": len(arts), "hits": sum(a.cache_hit for a in arts),
                          "index": sum(a.index_hit for a in arts)}))
    """)
    env = dict(os.environ)
    results = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        import json

        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert results[0]["n"] == 1
    assert results[1] == {"n": 1, "hits": 1, "index": 1}


# -- the client's graph index (structure key -> cache key) ---------------------------------------

def _compile_recording_index(monkeypatch, fn, *args):
    """Compiles and runs `fn` through a fresh kiln; returns the index entries it wrote."""
    # The index is what these tests exercise: no stored capture may answer before it.
    monkeypatch.setattr(kiln.config, "stored_captures", False)
    from kiln.daemon.graph_index import GraphIndex

    written = []
    put = GraphIndex.put

    def recording_put(self, skey, key):
        written.append((self, skey, key))
        put(self, skey, key)

    monkeypatch.setattr(GraphIndex, "put", recording_put)
    kiln.reset()
    out, ref = run_kiln(fn, *args)
    torch.testing.assert_close(out, ref)
    monkeypatch.setattr(GraphIndex, "put", put)
    return written


def _forbid_lowering(monkeypatch):
    from kiln.graph import lowering

    def no_lowering(*args, **kwargs):
        raise AssertionError("the graph was lowered")

    monkeypatch.setattr(lowering, "lower", no_lowering)


def test_index_hit_fetches_the_artifact_without_lowering(monkeypatch):
    def f(x):
        return torch.sigmoid(x) * 5 - x

    x = torch.randn(9, 7)
    assert len(_compile_recording_index(monkeypatch, f, x)) == 1
    kiln.reset()
    _forbid_lowering(monkeypatch)
    out, ref = run_kiln(f, torch.randn(9, 7))
    torch.testing.assert_close(out, ref)
    (art,) = kiln.debug.artifacts()
    assert art.index_hit and art.cache_hit and art.aten_graph is None


def test_index_entry_copied_from_another_graph_is_not_used(monkeypatch):
    """Two graphs with identical inputs: an entry that maps one to the other's artifact would
    pass every input check, so the entry itself must not verify."""
    def add_one(x):
        return x + 1

    def double(x):
        return x * 2

    x = torch.randn(5, 3)
    (entry_add,) = _compile_recording_index(monkeypatch, add_one, x)
    (entry_double,) = _compile_recording_index(monkeypatch, double, x)
    index, skey_add, key_add = entry_add
    _, skey_double, key_double = entry_double
    path = index._path(skey_add)
    for forged in (index._path(skey_double).read_text(),  # the other graph's whole entry
                   key_double,                             # a bare key, no tag
                   f"{key_double} {'0' * 64}",             # a made-up tag
                   "garbage"):
        path.write_text(forged)
        kiln.reset()
        out, ref = run_kiln(add_one, x)
        torch.testing.assert_close(out, ref)
        (art,) = kiln.debug.artifacts()
        assert not art.index_hit and art.key == key_add, forged


def test_index_entry_whose_artifact_does_not_fit_is_lowered_again(monkeypatch):
    """Even a verified entry (written with the MAC key) for an artifact of other input metadata
    is refused by the input check, and the graph is lowered and compiled as if new."""
    def f(x):
        return torch.cos(x) + x

    (entry_small,) = _compile_recording_index(monkeypatch, f, torch.randn(4, 4))
    (entry_big,) = _compile_recording_index(monkeypatch, f, torch.randn(6, 2))
    index, skey_small, key_small = entry_small
    index.put(skey_small, entry_big[2])
    assert index.get(skey_small) == entry_big[2]
    kiln.reset()
    x = torch.randn(4, 4)
    out, ref = run_kiln(f, x)
    torch.testing.assert_close(out, ref)
    (art,) = kiln.debug.artifacts()
    assert not art.index_hit and art.key == key_small
    assert index.get(skey_small) == key_small  # the entry is repaired


def test_structure_key_is_withheld_where_graph_code_does_not_pin_the_computation():
    from kiln.graph import lowering

    class WithSubmodule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) + 1

    x = torch.randn(2, 4)
    traced = torch.fx.symbolic_trace(WithSubmodule())  # leaves a call_module node
    assert lowering.structure_key(traced, [x]) is None

    def user_fn(t):
        return t * 3

    graph = torch.fx.Graph()
    inp = graph.placeholder("x")
    graph.output(graph.call_function(user_fn, (inp,)))
    assert lowering.structure_key(torch.fx.GraphModule(torch.nn.Module(), graph), [x]) is None

    def plain(t):
        return torch.relu(t) + 1

    keyed = torch.fx.symbolic_trace(plain)
    key = lowering.structure_key(keyed, [x])
    assert key is not None and key == lowering.structure_key(keyed, [torch.randn(2, 4)])
    with torch.autocast("cpu", dtype=torch.bfloat16):  # tracing would record other ops
        assert lowering.structure_key(keyed, [x]) != key


def test_daemon_compiler_version_is_known_after_health():
    client = STATE.daemon.client()
    client.ensure_running()
    assert client.compiler_version
