"""0-dim CPU tensors beside a GPU's (kiln.graph.cpu_scalars): a graph on a GPU that reads one, as
transformers' static cache does on its first update, is compiled with it copied to the GPU at
each call, where that changes nothing the program sees; otherwise it runs as eager does. The
kiln backend on a GPU: needs kilnd and CUDA (skips without)."""
import operator

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


def adds_to_its_number(x, n):
    n += 1
    return x * 2 + n


def stores_into_its_number(x, n):
    n[...] = 4
    return x * 2 + n


@requires_cuda
@pytest.mark.parametrize("fn", [writes_its_number, adds_to_its_number, stores_into_its_number])
def test_a_graph_that_writes_its_cpu_number_runs_as_eager(kiln_gpu, fn):
    compiled = kiln.compile(fn)
    for _ in range(3):
        x = torch.randn(8, device="cuda")
        mine, theirs = torch.tensor(3.0), torch.tensor(3.0)
        torch.testing.assert_close(compiled(x, mine), fn(x, theirs))
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


# The rules on fake tensors (a fake CUDA tensor needs no GPU), as the capture's graphs carry them.

def _on_a_fake_gpu(fn):
    """on_device's answer for `fn(x, n)`, x a (fake) CUDA vector and n a 0-dim CPU tensor, its
    graph's values as a capture records them; and that graph. `fn` is a function to trace, or
    a graph module (what fx cannot trace: n += 1 and n[...] = 3 as the capture records them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode()
    with mode:
        x = torch.empty(8, device="cuda")
    n = mode.from_tensor(torch.tensor(2.0))
    gm = fn if isinstance(fn, torch.fx.GraphModule) else torch.fx.symbolic_trace(fn)
    FakeTensorProp(gm, mode).propagate(x, n)
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]
    return on_device(gm, [x, n], []), gm


def reads_its_number(x, n):
    return x * n + n.to(x.device)


def test_a_number_only_read_is_taken_on_the_gpu_in_a_copy_of_the_graph():
    (converted, examples, scalars), gm = _on_a_fake_gpu(reads_its_number)
    assert scalars is not None and scalars.positions == [1]
    assert examples[1].device.type == "cuda" and examples[1].dim() == 0
    placeholders = [n for n in converted.graph.nodes if n.op == "placeholder"]
    assert placeholders[1].meta["example_value"].device.type == "cuda"
    # The program's graph keeps its own values: it is what runs where the compile fails.
    assert converted is not gm
    assert [n for n in gm.graph.nodes if n.op == "placeholder"][1].meta[
        "example_value"].device.type == "cpu"


def _writes_then_scales(write, *write_args):
    """The graph of `write(n, *write_args); return x * n`, as the capture records n += 1
    (operator.iadd) and n[...] = 3 (operator.setitem)."""
    graph = torch.fx.Graph()
    x, n = graph.placeholder("x"), graph.placeholder("n")
    graph.call_function(write, (n, *write_args))
    graph.output(graph.call_function(operator.mul, (x, n)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


adds_to_it = _writes_then_scales(operator.iadd, 1)
stores_into_it = _writes_then_scales(operator.setitem, Ellipsis, 3)


def adds_to_it_by_method(x, n):
    return x * n.add_(1)


@pytest.mark.parametrize("fn", [adds_to_it, stores_into_it, adds_to_it_by_method,
                                returns_its_number],
                         ids=["iadd", "setitem", "add_", "returns_it"])
def test_a_graph_that_writes_or_returns_a_cpu_tensor_is_left_as_it_is(fn):
    (same, _examples, scalars), gm = _on_a_fake_gpu(fn)
    assert scalars is None and same is gm
