"""The channels-last layout pass of the "kiln" backend's lowering (kiln.graph.layout): which
graphs it rewrites, that every later value's metadata is what the ops produce, that outputs keep
eager's layout, and that compiled results equal eager ones."""
import pytest
import torch

import kiln
from kiln.graph import layout, lowering

aten = torch.ops.aten


class ConvNet(torch.nn.Module):
    def __init__(self, groups=1):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=groups)
        self.pool = torch.nn.MaxPool2d(2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv1(x)))
        return self.pool(torch.relu(self.conv2(y) + y))


def capture(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    kiln.compile(fn, backend=backend)(*args)
    assert len(graphs) == 1
    return graphs[0]


def convolutions(gm):
    return [n for n in gm.graph.nodes if n.target is aten.convolution.default]


@pytest.mark.parametrize("groups", [1, 8])
def test_two_convolutions_run_channels_last_and_outputs_stay_contiguous(groups):
    m = ConvNet(groups=groups).eval()
    x = torch.randn(2, 3, 16, 16)
    gm, inputs = capture(m, x)
    aten_gm, _ = lowering.to_aten(gm, inputs)
    convs = convolutions(aten_gm)
    assert len(convs) == 2
    cl = torch.channels_last
    for conv in convs:
        assert conv.args[0].meta["val"].is_contiguous(memory_format=cl)
        assert conv.meta["val"].is_contiguous(memory_format=cl)
    # Weights: a dense one stays as it is (no copy per call), a grouped one is converted.
    assert convs[0].args[1].meta["val"].is_contiguous()
    assert convs[1].args[1].meta["val"].is_contiguous(memory_format=cl) == (groups > 1)
    outs = [n for n in aten_gm.graph.nodes if n.op == "output"][0].args[0]
    (out,) = torch.utils._pytree.tree_leaves(outs)
    assert out.meta["val"].is_contiguous()


def test_metadata_after_the_pass_matches_real_execution():
    m = ConvNet(groups=8).eval()
    x = torch.randn(2, 3, 12, 12)
    gm, inputs = capture(m, x)
    aten_gm, params = lowering.to_aten(gm, inputs)
    seen = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            value = super().run_node(n)
            if isinstance(value, torch.Tensor):
                seen[n] = value
            return value

    with torch.no_grad():
        Recorder(aten_gm).run(*params, *inputs)
    assert seen
    for node, value in seen.items():
        fake = node.meta["val"]
        assert value.shape == fake.shape, node
        assert value.stride() == fake.stride(), node


def test_one_convolution_is_left_alone():
    conv = torch.nn.Conv2d(3, 4, 3).eval()
    gm, inputs = capture(conv, torch.randn(1, 3, 8, 8))
    aten_gm, params = lowering.to_aten(gm, inputs)
    (node,) = convolutions(aten_gm)
    assert not node.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)
    assert layout.channels_last(aten_gm, [*params, *inputs]) is None


def test_transposed_and_3d_convolutions_are_left_alone():
    m = torch.nn.Sequential(torch.nn.ConvTranspose2d(3, 4, 3), torch.nn.ConvTranspose2d(4, 4, 3))
    gm, inputs = capture(m.eval(), torch.randn(1, 3, 8, 8))
    aten_gm, _ = lowering.to_aten(gm, inputs)
    for node in convolutions(aten_gm):
        assert node.args[0].meta["val"].is_contiguous()
    m3 = torch.nn.Sequential(torch.nn.Conv3d(2, 2, 3), torch.nn.Conv3d(2, 2, 3)).eval()
    gm, inputs = capture(m3, torch.randn(1, 2, 6, 6, 6))
    aten_gm, _ = lowering.to_aten(gm, inputs)
    for node in convolutions(aten_gm):
        assert node.args[0].meta["val"].is_contiguous()


@pytest.mark.parametrize("groups", [1, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_convnet_matches_eager(kilnd_cache, groups, dtype):
    m = ConvNet(groups=groups).eval().to(dtype)
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    with torch.no_grad():
        expected = m(x)
        out = kiln.compile(m, backend="kiln")(x)
    assert kiln.debug.artifacts(), "the graph ran eagerly instead of through kilnd"
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(out, expected, **tol)
    assert out.stride() == expected.stride()


def test_intermediate_activation_output_keeps_eager_layout(kilnd_cache):
    conv1, conv2 = torch.nn.Conv2d(3, 4, 3).eval(), torch.nn.Conv2d(4, 4, 3).eval()

    def fn(x):
        y = conv1(x)
        return y, conv2(y).sigmoid()

    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        expected = fn(x)
        out = kiln.compile(fn, backend="kiln")(x)
    assert kiln.debug.artifacts()
    for o, e in zip(out, expected):
        torch.testing.assert_close(o, e)
        assert o.stride() == e.stride()
