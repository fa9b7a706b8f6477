"""0-dim CPU tensors beside a GPU's (kiln.graph.cpu_scalars): a graph on a GPU that reads one, as
transformers' static cache does on its first update, is compiled with it copied to the GPU at
each call, where that changes nothing the program sees; otherwise it runs as eager does. The
kiln backend on a GPU: needs kilnd and CUDA (skips without)."""
import pytest
import torch

import kiln
from kiln.graph.cpu_scalars import on_device

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Cache:
    """A static cache's length as transformers keeps it: a CPU tensor until its first update."""

    def __init__(self):
        self.length = torch.tensor(0)


def prefill(x, w, cache):
    cache.length = cache.length.to(x.device)
    positions = torch.arange(x.shape[0], device=x.device) + cache.length
    cache.length.add_(x.shape[0])
    return (x @ w) * positions[:, None]


@pytest.fixture
def kiln_gpu(kilnd_cache, monkeypatch):
    monkeypatch.setattr(kiln.config, "stored_captures", False)
    kiln.reset()
    yield
    kiln.reset()


@requires_cuda
def test_a_gpu_graph_that_reads_a_cpu_number_is_compiled_and_answers_as_eager(kiln_gpu):
    w = torch.randn(16, 16, device="cuda")
    compiled = kiln.compile(prefill)
    for n in (4, 4, 4):
        x = torch.randn(n, 16, device="cuda")
        mine, theirs = Cache(), Cache()
        got, want = compiled(x, w, mine), prefill(x, w, theirs)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        # The program's cache ends as eager's: its length moved to the GPU and advanced.
        assert mine.length.device == theirs.length.device and int(mine.length) == n
    # Compiled by kilnd, not run as it is for its CPU input.
    assert kiln.debug.artifacts()


def writes_its_number(x, n):
    n.add_(1)
    return x * 2 + n


@requires_cuda
def test_a_graph_that_writes_its_cpu_number_runs_as_eager(kiln_gpu):
    compiled = kiln.compile(writes_its_number)
    for _ in range(3):
        x = torch.randn(8, device="cuda")
        mine, theirs = torch.tensor(3.0), torch.tensor(3.0)
        torch.testing.assert_close(compiled(x, mine), writes_its_number(x, theirs))
        assert mine.device.type == "cpu" and float(mine) == float(theirs) == 4.0


def returns_its_number(x, n):
    return x + n, n * 2


@requires_cuda
def test_a_graph_that_returns_a_cpu_tensor_returns_it_on_the_cpu(kiln_gpu):
    compiled = kiln.compile(returns_its_number)
    x, n = torch.randn(8, device="cuda"), torch.tensor(2.0)
    got, want = compiled(x, n), returns_its_number(x, n)
    torch.testing.assert_close(got, want)
    assert got[1].device.type == "cpu"


def _traced(fn, *examples):
    gm = torch.fx.symbolic_trace(fn)
    for node, value in zip([n for n in gm.graph.nodes if n.op == "placeholder"], examples):
        node.meta["example_value"] = value
    return gm


def test_a_cpu_graph_keeps_its_inputs():
    gm = _traced(returns_its_number, torch.randn(8), torch.tensor(2.0))
    examples = [torch.randn(8), torch.tensor(2.0)]
    same, inputs, scalars = on_device(gm, examples, [])
    assert scalars is None and same is gm and inputs is examples
