"""One entry per layer class: a module's forward reached through many instances of one class
shares its entry (parameters and buffers are graph inputs, guards check the structure the trace
read), so a model of many identical blocks never meets cache_size_limit; instances that differ
in what the trace read get entries of their own."""
import logging

import pytest
import torch

import kiln
from kiln.testing import CompileCounter


@kiln.disable
def _eager_boundary(x):
    """A call kiln leaves to Python: blocks called after it are frames of their own."""
    return x


class Block(torch.nn.Module):
    def __init__(self, d, bias=True, eps=1e-5):
        super().__init__()
        self.lin = torch.nn.Linear(d, d, bias=bias)
        self.norm = torch.nn.LayerNorm(d, eps=eps)
        self.scale = 1.0

    def forward(self, x):
        return x + self.scale * torch.relu(self.lin(self.norm(x)))


def _run_blocks(blocks, x):
    for b in blocks:
        x = _eager_boundary(b(x))
    return x


def _compiled_blocks(blocks, cnt):
    return [kiln.compile(b, backend=cnt) for b in blocks]


def test_twelve_blocks_of_one_class_share_one_entry_after_the_first(caplog):
    torch.manual_seed(0)
    blocks = [Block(16).eval() for _ in range(12)]
    x = torch.randn(4, 16)
    cnt = CompileCounter()
    compiled = _compiled_blocks(blocks, cnt)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(3):
            torch.testing.assert_close(_run_blocks(compiled, x), _run_blocks(blocks, x))
    assert len(kiln.debug.cache_entries(Block.forward)) == 2  # the first block's, then all's
    assert cnt.frame_count == 2
    assert "cache_size_limit" not in caplog.text


def test_instances_that_differ_in_what_the_trace_read_get_entries_of_their_own():
    torch.manual_seed(0)
    blocks = [Block(16), Block(16), Block(16, bias=False), Block(16, eps=1e-2), Block(16)]
    blocks[4].scale = 3.0
    blocks[1].train()  # training is guarded too (LayerNorm does not care, the guard does)
    for b in blocks:
        b.eval() if b is not blocks[1] else None
    x = torch.randn(4, 16)
    cnt = CompileCounter()
    compiled = _compiled_blocks(blocks, cnt)
    for _ in range(2):
        for b, c in zip(blocks, compiled):
            torch.testing.assert_close(c(x), b(x))
    # One each: the first block's own, then by structure the training one, the one without a
    # bias, the one with another eps and the one with another scale.
    assert len(kiln.debug.cache_entries(Block.forward)) == 5
    assert cnt.frame_count == 5


def test_a_shared_entry_reads_each_instances_parameters_on_every_call():
    torch.manual_seed(0)
    blocks = [Block(8).eval() for _ in range(3)]
    x = torch.randn(2, 8)
    compiled = _compiled_blocks(blocks, CompileCounter())
    for c in compiled:
        c(x)
    with torch.no_grad():
        blocks[2].lin.weight.mul_(-1)  # in place
    blocks[1].lin.weight = torch.nn.Parameter(torch.randn(8, 8))  # replaced
    blocks[0].lin.bias = None  # gone: that instance no longer has the structure
    for b, c in zip(blocks, compiled):
        torch.testing.assert_close(c(x), b(x))


def test_a_shared_entry_trains_each_instance(caplog):
    torch.manual_seed(0)
    blocks = [Block(8) for _ in range(4)]
    ref = [Block(8) for _ in range(4)]
    for b, r in zip(blocks, ref):
        r.load_state_dict(b.state_dict())
    compiled = _compiled_blocks(blocks, "aot_eager")
    x = torch.randn(2, 8)
    _run_blocks(compiled, x).sum().backward()
    _run_blocks(ref, x).sum().backward()
    for b, r in zip(blocks, ref):
        for p, q in zip(b.parameters(), r.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


class Conv(torch.nn.Module):
    def __init__(self, stride):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 3, stride=stride, padding=1)

    def forward(self, x):
        return self.conv(x).relu()


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_torch_nn_constants_are_guarded_when_instances_share_an_entry(backend):
    # torch.nn's own constants (a convolution's stride) are left unguarded under an identity
    # guard; a shared entry must guard them, or stride 2 would run stride 1's graph.
    torch.manual_seed(0)
    convs = [Conv(1).eval(), Conv(1).eval(), Conv(2).eval(), Conv(2).eval()]
    x = torch.randn(1, 3, 8, 8)
    compiled = [kiln.compile(c, backend=backend) for c in convs]
    with torch.no_grad():
        for _ in range(2):
            for c, ref in zip(compiled, convs):
                torch.testing.assert_close(c(x), ref(x))


def test_a_model_copied_on_every_call_is_compiled_once_for_its_structure():
    # copy.deepcopy(model) on each call: the entry specialised to the first copy dies with it;
    # the code's next capture guards the copies by structure, and the breaks of every entry at
    # one place share one resume function, so later calls reuse what was compiled.
    import copy

    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))

    def fn(m, x):
        return copy.deepcopy(m)(x)

    m1, m2 = make(), make()
    x = torch.randn(2, 4)
    cnt = CompileCounter()
    compiled = kiln.optimize(cnt)(fn)
    for m in (m1, m1, m1, m2, m2, m2):
        torch.testing.assert_close(compiled(m, x), fn(m, x))
    assert cnt.frame_count <= 2


def test_two_optimize_wrappers_with_one_backend_share_entries_and_count_only_their_own():
    def f(x):
        return x + 1

    cnt = CompileCounter()
    x = torch.randn(3)
    kiln.optimize(cnt)(f)(x)
    kiln.optimize(cnt)(f)(x)
    assert cnt.frame_count == 1  # one backend: one entry, as under torch.compile
    others = [CompileCounter() for _ in range(9)]
    for other in others:  # each its own backend: entries of the others do not count
        torch.testing.assert_close(kiln.optimize(other)(f)(x), f(x))
    assert [c.frame_count for c in others] == [1] * 9


def test_another_object_dying_drops_the_entry_but_keeps_modules_specialized():
    # The entry's guard tree drops it when any object it holds by identity dies; only a module's
    # death means the code's modules come and go (a deepcopy per call), so only that one makes
    # its later captures guard modules by structure.
    import gc

    from kiln.state import STATE

    m = torch.nn.Linear(3, 3)

    def f(x, fn):
        return m(x) + fn(x)

    fn = lambda v: v * 2  # noqa: E731
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x, fn), f(x, fn))
    assert len(kiln.debug.cache_entries(f)) == 1
    del fn
    gc.collect()
    assert kiln.debug.cache_entries(f) == []
    assert f.__code__ not in STATE.shared_module_codes
