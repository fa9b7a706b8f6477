"""Residual adds accumulated into the residual's own memory (mkldnn::_convolution_pointwise_
.binary, compiler/passes/onednn_passes.h AccumulateResidualsInPlace): results equal eager's call
after call, and a residual anyone can still see (read again, returned, the caller's input) keeps
its values."""
import pytest
import torch
import torchvision

import kiln
from kiln.state import STATE

pytestmark = [
    pytest.mark.skipif(STATE.daemon.settings.kilnd is None,
                       reason="kilnd is not built on this machine"),
    pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch without oneDNN"),
    pytest.mark.usefixtures("kilnd_cache"),  # conftest resets kiln around every test
]

TOL = dict(rtol=1e-3, atol=1e-3)
INPLACE = "mkldnn::_convolution_pointwise_.binary"
BINARY = "mkldnn::_convolution_pointwise.binary"


def randomized(m):
    with torch.no_grad():
        for bn in m.modules():
            if isinstance(bn, torch.nn.BatchNorm2d):
                bn.running_mean.uniform_(-1, 1)
                bn.running_var.uniform_(0.5, 2)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)
    return m.eval()


def plan_ops(fn):
    arts = kiln.debug.artifacts(fn)
    assert len(arts) == 1, f"expected one artifact, got {len(arts)}"
    return [s.library.op for s in arts[0].body.plan.steps if s.WhichOneof("kind") == "library"]


def bottlenecks():
    """Two torchvision Bottlenecks: the first with a strided 1x1 projection, the second with
    the first one's output as its identity (read by its conv1, then by its sum)."""
    from torchvision.models.resnet import Bottleneck

    down = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 1, stride=2, bias=False),
                               torch.nn.BatchNorm2d(32))
    return randomized(torch.nn.Sequential(Bottleneck(16, 8, stride=2, downsample=down),
                                          Bottleneck(32, 8)))


def test_bottleneck_residuals_are_accumulated_into_and_match_eager_every_call():
    torch.manual_seed(0)
    m = bottlenecks()
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        for _ in range(3):  # the memory written into is the next call's too
            x = torch.randn(2, 16, 12, 12)
            x_before = x.clone()
            torch.testing.assert_close(compiled(x), m(x), **TOL)
            assert torch.equal(x, x_before), "the caller's input was written"
    ops = plan_ops(m)
    assert ops.count(INPLACE) == 2, ops  # the projection, then block 1's output


class ReadAgain(torch.nn.Module):
    """relu(conv2(relu(conv1(x))) + r) * r, r = conv3(x): r is read after the sum."""

    def __init__(self, returns_residual=False):
        super().__init__()
        self.c1 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(8, 8, 1)
        self.returns_residual = returns_residual

    def forward(self, x):
        out = self.c2(torch.relu(self.c1(x)))
        r = self.c3(x)
        y = torch.relu(out + r)
        if self.returns_residual:
            return y, r
        return y * r


@pytest.mark.parametrize("returns_residual", [False, True], ids=["read-after", "returned"])
def test_a_residual_still_visible_after_the_sum_keeps_its_values(returns_residual):
    torch.manual_seed(0)
    m = ReadAgain(returns_residual).eval().to(memory_format=torch.channels_last)
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last)
            torch.testing.assert_close(compiled(x), m(x), **TOL)
    ops = plan_ops(m)
    assert INPLACE not in ops, ops
    assert BINARY in ops, ops


def test_resnet18_with_in_place_residuals_matches_eager():
    torch.manual_seed(0)
    m = randomized(torchvision.models.resnet18(num_classes=10))
    compiled = kiln.compile(m, backend="kiln")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 3, 64, 64)
            torch.testing.assert_close(compiled(x), m(x), rtol=2e-3, atol=2e-3)
    ops = plan_ops(m)
    # BasicBlocks: the 3 projected blocks' projections and the blocks whose identity is the
    # previous block's output (all but the first block, whose identity is the max-pool's).
    assert ops.count(INPLACE) >= 3, ops
