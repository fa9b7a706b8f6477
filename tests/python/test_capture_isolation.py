"""Nothing that compiles or runs a compiled graph is ever captured: kiln's own Python, AOT
autograd's lazy backward compile and what it runs (make_fx, FakeTensorMode, the dataclasses
they construct). A training step whose backward is compiled inside the program's own
loss.backward() (the program's frame callback installed) runs as eager does."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import kiln


def _small_convnet():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.GELU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))


def _step(m, x, y):
    loss = F.cross_entropy(m(x), y)
    loss.backward()
    return loss


def _grads(m):
    return [p.grad.clone() for p in m.parameters()]


@pytest.fixture
def captured_files(monkeypatch):
    """The file of every frame kiln captures from here on."""
    import kiln.convert_frame as cf

    files, real = [], cf.convert_frame

    def spy(func, code, *a, **k):
        files.append(code.co_filename)
        return real(func, code, *a, **k)

    monkeypatch.setattr(cf, "convert_frame", spy)
    return files


def test_a_backward_compiled_inside_the_programs_backward_is_not_captured(captured_files):
    # AOT autograd would compile the backward graph lazily, inside loss.backward() in the
    # compiled frame: torch's make_fx constructs a frozen dataclass there, whose generated
    # __init__ kiln once captured (and replayed its stores through the class's refusing
    # __setattr__: FrozenInstanceError).
    m_ref, m = _small_convnet(), _small_convnet()
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))
    step = kiln.compile(_step, backend="aot_eager")
    for _ in range(2):
        for mod in (m, m_ref):
            mod.zero_grad()
        torch.testing.assert_close(step(m, x, y), _step(m_ref, x, y))
        for g, w in zip(_grads(m), _grads(m_ref)):
            torch.testing.assert_close(g, w)
    assert captured_files and set(captured_files) == {__file__}, captured_files


def test_the_backward_graph_runs_with_capture_off(captured_files):
    # aot_eager's backward graph runs as its GraphModule's generated Python, called by
    # autograd's engine inside the compiled frame's backward(): never captured itself.
    def f(x):
        y = (x.sin() * 2).sum()
        y.backward()
        return y

    x = torch.randn(8, requires_grad=True)
    got = kiln.compile(f, backend="aot_eager")(x)
    g = x.grad.clone()
    x.grad = None
    torch.testing.assert_close(got, f(x))
    torch.testing.assert_close(g, x.grad)
    assert set(captured_files) == {__file__}, captured_files


def test_generated_code_of_torch_is_never_captured():
    from kiln.capture.skip_files import is_skipped

    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    assert is_skipped(torch.fx.graph.PythonCode.__init__.__code__,
                      torch.fx.graph.PythonCode.__init__)
    assert not is_skipped(_Frozen.__init__.__code__, _Frozen.__init__)  # the program's own
    assert not is_skipped(type(gm).forward.__code__, type(gm).forward)  # a graph it traced


@dataclasses.dataclass(frozen=True)
class _Frozen:
    a: torch.Tensor
    n: int


def _make_frozen(x):
    return _Frozen(x * 2, 3)


kiln.disable(_make_frozen, recursive=False)


def test_a_frozen_dataclass_init_captured_as_its_own_frame_stores_as_the_program_does():
    # _make_frozen runs eagerly, so the dataclass's generated __init__ is a frame of its own
    # for the hook; its object.__setattr__ stores are replayed through object.__setattr__, not
    # through the class's __setattr__ (which raises FrozenInstanceError).
    def f(x):
        return _make_frozen(x + 1)

    x = torch.randn(5)
    compiled = kiln.compile(f, backend="eager")
    for _ in range(2):
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got.a, want.a)
        assert got.n == want.n


def test_object_setattr_on_a_frozen_object_is_replayed_as_object_setattr():
    def f(x, box):
        object.__setattr__(box, "a", x * 2)
        return x + 1

    x = torch.randn(3)
    box, ref = _Frozen(torch.zeros(3), 1), _Frozen(torch.zeros(3), 1)
    got = kiln.compile(f, backend="eager")(x, box)
    want = f(x, ref)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(box.a, ref.a)
