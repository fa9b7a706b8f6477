"""The bound-input prologue of the "kiln" backend: what depends only on a module's parameters,
buffers and constants (batch norm folded into a convolution, oneDNN weight prepacking, creation
ops) runs once before the first call and again only after a bound tensor was modified (in place,
by load_state_dict, by `.data =`); results against eager."""
import threading

import pytest
import torch

import kiln
from kiln.state import STATE

pytestmark = pytest.mark.skipif(STATE.daemon.settings.kilnd is None,
                                reason="kilnd is not built on this machine")

ONEDNN = torch.backends.mkldnn.is_available()
CONV_TOL = dict(rtol=1e-4, atol=1e-4)
BLOCK_TOL = dict(rtol=1e-3, atol=1e-3)  # two folded convolutions in a row


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


def randomize_bn(bn):
    """Non-trivial running statistics and affine parameters, so folding is not the identity."""
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)


class ConvBnRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class BasicBlock(torch.nn.Module):
    """torchvision's ResNet BasicBlock with an identity shortcut."""

    def __init__(self, c=16):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(64, 128)
        self.act = torch.nn.GELU()
        self.l2 = torch.nn.Linear(128, 32)

    def forward(self, x):
        return self.l2(self.act(self.l1(x)))


def make_conv_bn_relu():
    m = ConvBnRelu().eval()
    randomize_bn(m.bn)
    return m


def step_ops(steps):
    """Each step as a string: the library op's name, or "kernel <symbol>"."""
    return [s.library.op if s.WhichOneof("kind") == "library" else f"kernel {s.kernel.symbol}"
            for s in steps]


def only_artifact(fn):
    """The one artifact `fn` runs: it went through kiln, and nothing recompiled."""
    arts = kiln.debug.artifacts(fn)
    assert len(arts) == 1, f"expected one artifact, got {len(arts)}"
    return arts[0]


def test_conv_bn_relu_folds_the_batch_norm_into_the_prologue():
    torch.manual_seed(0)
    m = make_conv_bn_relu()
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), **CONV_TOL)
        x2 = torch.randn(2, 3, 16, 16)
        torch.testing.assert_close(compiled(x2), m(x2), **CONV_TOL)
    plan = only_artifact(m).body.plan
    assert len(plan.prologue) > 0, "nothing was moved to the prologue"
    # Run once per parameter version, the prologue is ATen calls: nothing generated for it.
    assert all(s.HasField("library") for s in plan.prologue), step_ops(plan.prologue)
    ops = step_ops(plan.steps)
    assert not any("batch_norm" in op for op in ops), ops
    assert sum("convolution" in op for op in ops) == 1, ops
    if ONEDNN:  # one fused oneDNN convolution (bias folded, relu as its attr), and the one
        # kernel that copies its channels-last result to the NCHW layout eager returns
        assert sum(op.startswith("kernel ") for op in ops) == 1, ops
        assert any(op.startswith("mkldnn::_convolution_pointwise") for op in ops), ops


def test_residual_basic_block_matches_eager():
    torch.manual_seed(0)
    m = BasicBlock().eval()
    randomize_bn(m.bn1)
    randomize_bn(m.bn2)
    x = torch.randn(2, 16, 8, 8)
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        ref = m(x.clone())
        torch.testing.assert_close(compiled(x.clone()), ref, **BLOCK_TOL)
        torch.testing.assert_close(compiled(x.clone()), ref, **BLOCK_TOL)
    plan = only_artifact(m).body.plan
    assert len(plan.prologue) > 0
    ops = step_ops(plan.steps)
    assert not any("batch_norm" in op for op in ops), ops
    if ONEDNN:  # conv2 + bn2 + residual add + relu is one binary-fused convolution
        assert "mkldnn::_convolution_pointwise.binary" in ops, ops


def test_in_place_parameter_update_is_seen_by_the_next_call():
    torch.manual_seed(0)
    m = make_conv_bn_relu()
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        first = compiled(x)
        torch.testing.assert_close(first, m(x), **CONV_TOL)
        m.bn.running_mean.add_(0.5)
        m.conv.weight.mul_(1.1)
        second = compiled(x)
        torch.testing.assert_close(second, m(x), **CONV_TOL)
    assert not torch.allclose(first, second, rtol=1e-3, atol=1e-3)
    only_artifact(m)  # the prologue ran again; the graph was not recompiled


def test_load_state_dict_between_calls_is_seen():
    torch.manual_seed(0)
    m = make_conv_bn_relu()
    other = make_conv_bn_relu()
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        first = compiled(x)
        torch.testing.assert_close(first, m(x), **CONV_TOL)
        m.load_state_dict(other.state_dict())
        out = compiled(x)
        ref = other(x)
        torch.testing.assert_close(m(x), ref)
        torch.testing.assert_close(out, ref, **CONV_TOL)
    assert not torch.allclose(first, out, rtol=1e-3, atol=1e-3)
    only_artifact(m)


def test_replacing_parameter_data_is_seen():
    torch.manual_seed(0)
    m = make_conv_bn_relu()
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        first = compiled(x)
        torch.testing.assert_close(first, m(x), **CONV_TOL)
        m.conv.weight.data = torch.randn_like(m.conv.weight)
        out = compiled(x)
        torch.testing.assert_close(out, m(x), **CONV_TOL)
    assert not torch.allclose(first, out, rtol=1e-3, atol=1e-3)
    only_artifact(m)


def test_mlp_with_prepacked_weights_matches_eager_after_an_update():
    torch.manual_seed(0)
    m = Mlp().eval()
    x = torch.randn(8, 64)
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        first = compiled(x)
        torch.testing.assert_close(first, m(x), rtol=1e-4, atol=1e-4)
        m.l1.weight.add_(0.1)
        out = compiled(x)
        torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(first, out, rtol=1e-3, atol=1e-3)
    art = only_artifact(m)
    assert len(art.body.plan.prologue) > 0, "the linear weights were not prepared in a prologue"


def test_concurrent_calls_share_the_prologue_snapshot():
    torch.manual_seed(0)
    m = make_conv_bn_relu()
    compiled = kiln.compile(m, backend="kiln")
    n_threads, n_calls = 4, 10
    inputs = [[torch.randn(2, 3, 16, 16) for _ in range(n_calls)] for _ in range(n_threads)]
    with torch.no_grad():
        torch.testing.assert_close(compiled(inputs[0][0]), m(inputs[0][0]), **CONV_TOL)
        # The threads' first calls find the parameter changed and race to re-run the prologue.
        m.bn.running_mean.add_(0.25)
        expected = [[m(x) for x in xs] for xs in inputs]
    start = threading.Barrier(n_threads)
    errors = []

    def worker(i):
        try:
            start.wait(timeout=60)
            with torch.no_grad():  # grad mode is per thread
                for x, ref in zip(inputs[i], expected[i]):
                    torch.testing.assert_close(compiled(x), ref, **CONV_TOL)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors
    only_artifact(m)


def test_arange_built_inside_the_graph_matches_eager():
    def f(x):
        return x + torch.arange(x.shape[-1], dtype=x.dtype)

    torch.manual_seed(0)
    compiled = kiln.compile(f, backend="kiln")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 9)
            torch.testing.assert_close(compiled(x), f(x))
    only_artifact(f)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_on_a_gpu_the_small_prologue_steps_run_on_the_host_and_match_eager(autocast):
    # The folded batch norms' per-channel scale and shift are computed on the host (no ATen CUDA
    # kernel eager never ran is loaded on a process's first call); the results, and those after
    # a statistic changes in place, are eager's.
    torch.manual_seed(0)
    m = BasicBlock().eval()
    randomize_bn(m.bn1)
    randomize_bn(m.bn2)
    m = m.cuda()
    x = torch.randn(2, 16, 8, 8, device="cuda")
    tol = dict(rtol=5e-2, atol=5e-2) if autocast else dict(rtol=1e-2, atol=1e-2)
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        torch.testing.assert_close(compiled(x.clone()).float(), m(x.clone()).float(), **tol)
        plan = only_artifact(m).plan
        first = plan.host_prologue_steps
        assert first > 0
        m.bn2.running_var.mul_(1.5)
        m.bn1.bias.add_(0.25)
        torch.testing.assert_close(compiled(x.clone()).float(), m(x.clone()).float(), **tol)
        assert plan.host_prologue_steps == 2 * first
        assert plan.prologue_runs == 2
