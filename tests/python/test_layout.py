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


def test_cuda_convolutions_take_channels_last_weights_too():
    """Traced over fake CUDA tensors (no GPU needed): on CUDA every convolution's activation and
    weight are channels-last (the weight's conversion reads a parameter only, so the prologue
    makes it once), and float16 is converted as well; the output is contiguous again."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    F = torch.nn.functional

    def f(w1, b1, w2, w3, x):
        y = torch.relu(F.conv2d(x, w1, b1, padding=1))
        z = F.conv2d(y, w2, padding=1) + y
        return F.conv2d(z, w3, padding=1, groups=8).sigmoid()

    for dtype in (torch.float32, torch.float16):
        with FakeTensorMode():
            args = [torch.empty(8, 3, 3, 3), torch.empty(8), torch.empty(8, 8, 3, 3),
                    torch.empty(8, 1, 3, 3), torch.empty(2, 3, 16, 16)]
            args = [a.to(device="cuda", dtype=dtype) for a in args]
        gm = make_fx(f, tracing_mode="fake")(*args)
        relaid = layout.channels_last(gm)
        assert relaid is not None
        convs = convolutions(relaid)
        assert len(convs) == 3
        cl = torch.channels_last
        for conv in convs:
            for v in (conv.args[0], conv.args[1], conv):
                assert v.meta["val"].is_contiguous(memory_format=cl), (conv, v)
        # The dense weights needed a copy (a clone of a placeholder), the [8, 1, 3, 3] one did not.
        weight_copies = [c.args[1] for c in convs if c.args[1].op != "placeholder"]
        assert len(weight_copies) == 2
        for copy in weight_copies:
            assert copy.target is aten.clone.default and copy.args[0].op == "placeholder"
        (out,) = [n for n in relaid.graph.nodes if n.op == "output"][0].args[0:1]
        assert torch.utils._pytree.tree_leaves(out)[0].meta["val"].is_contiguous()


def test_cuda_graphs_of_mostly_grouped_convolutions_keep_their_layout():
    """ResNeXt-like grouped convolutions (several input channels per group) are slower in NHWC
    on cuDNN: a CUDA graph whose work is mostly theirs is left alone, while depthwise ones (one
    input channel per group, MobileNet's) go channels-last."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    F = torch.nn.functional

    with FakeTensorMode():
        x = torch.empty(2, 64, 16, 16, device="cuda")
        grouped = [torch.empty(64, 64, 1, 1, device="cuda"),
                   torch.empty(64, 8, 3, 3, device="cuda"), x]     # 8 groups of 8 channels
        depthwise = [torch.empty(64, 64, 1, 1, device="cuda"),
                     torch.empty(64, 1, 3, 3, device="cuda"), x]   # 64 groups of 1

    def g(w1, w2, x):
        return F.conv2d(F.conv2d(x, w1), w2, padding=1, groups=w1.shape[0] // w2.shape[1])

    assert layout.channels_last(make_fx(g, tracing_mode="fake")(*grouped)) is None
    relaid = layout.channels_last(make_fx(g, tracing_mode="fake")(*depthwise))
    assert relaid is not None
    for conv in convolutions(relaid):
        assert conv.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)


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


def test_a_cpu_graph_returning_most_of_its_activations_keeps_eager_layout():
    # A training graph's forward returns its activations for the backward: each would be
    # copied back to eager's layout, more than the channels-last convolutions gain on the CPU.
    m = ConvNet().eval()

    def forward_with_saved(x):
        a = m.conv1(x)
        b = torch.relu(m.bn(a))
        c = m.conv2(b)
        return m.pool(torch.relu(c + b)), a, b, c

    gm, inputs = capture(forward_with_saved, torch.randn(2, 3, 16, 16))
    aten_gm, _ = lowering.to_aten(gm, inputs)
    convs = convolutions(aten_gm)
    assert len(convs) == 2
    for conv in convs:
        assert conv.args[0].meta["val"].is_contiguous()
        assert conv.meta["val"].is_contiguous()
    assert not any(n.target is aten.clone.default for n in aten_gm.graph.nodes)


def test_one_convolution_is_left_alone():
    conv = torch.nn.Conv2d(3, 4, 3).eval()
    gm, inputs = capture(conv, torch.randn(1, 3, 8, 8))
    aten_gm, _ = lowering.to_aten(gm, inputs)
    (node,) = convolutions(aten_gm)
    assert not node.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last)
    assert layout.channels_last(aten_gm) is None


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


def test_one_convolutions_result_has_eagers_strides(kilnd_cache):
    # One convolution: the graph stays NCHW (too few for the layout pass), and oneDNN's fused
    # call, which writes channels-last whatever its input, is not used for it: the result is
    # NCHW as eager's is (it came back channels-last, so that a .view() of it failed).
    conv = torch.nn.Conv2d(3, 4, 3).eval()

    def fn(x):
        return conv(x).sigmoid()

    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        out = kiln.compile(fn, backend="kiln")(x)
        expected = fn(x)
    assert kiln.debug.artifacts()
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride()
    out.view(2, -1)


class FlattenedConvNet(torch.nn.Module):
    """Two convolutions whose result is flattened by a view: a view that a channels-last
    result does not allow."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 4)

    def forward(self, x):
        y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(y.view(y.shape[0], -1))


def test_a_graph_whose_views_refuse_channels_last_keeps_eager_layout(kilnd_cache):
    # The view of the second convolution's result fails on its channels-last form: the pass
    # leaves the graph as traced rather than failing the compile, and the answer is eager's.
    m = FlattenedConvNet().eval()
    x = torch.randn(2, 3, 8, 8)
    gm, inputs = capture(m, x)
    aten_gm, _ = lowering.to_aten(gm, inputs)
    assert len(convolutions(aten_gm)) == 2
    for conv in convolutions(aten_gm):
        assert conv.args[0].meta["val"].is_contiguous()
        assert not conv.meta["val"].is_contiguous(memory_format=torch.channels_last)
    kiln.reset()
    with torch.no_grad():
        expected = m(x)
        out = kiln.compile(m, backend="kiln")(x)
    assert kiln.debug.artifacts(), "the graph ran eagerly instead of through kilnd"
    torch.testing.assert_close(out, expected)


class FlatConvNet(torch.nn.Module):
    """Parameters on the module itself, so that torch.fx.symbolic_trace reads them as get_attr
    nodes (the form kiln's lowering binds as parameters)."""

    def __init__(self):
        super().__init__()
        P = torch.nn.Parameter
        self.w1, self.w2 = P(torch.randn(16, 3, 3, 3)), P(torch.randn(16, 16, 3, 3))
        self.gamma, self.beta = P(torch.randn(16)), P(torch.randn(16))
        self.register_buffer("mean", torch.randn(16))
        self.register_buffer("var", torch.rand(16))
        self.fc = P(torch.randn(10, 16))

    def forward(self, x):
        F = torch.nn.functional
        y = F.batch_norm(F.conv2d(x, self.w1, padding=1), self.mean, self.var, self.gamma,
                         self.beta)
        y = torch.relu(F.conv2d(torch.relu(y), self.w2, padding=1) + y)
        return F.linear(F.max_pool2d(y, 2).mean((2, 3)), self.fc)


def test_a_cuda_convnet_compiles_channels_last_for_sm_90_without_a_gpu(kilnd_cache, monkeypatch):
    """The whole CUDA pipeline on fake CUDA tensors, compile only: the batch norm folds into a
    channels-last weight that the prologue writes, every activation between the convolutions is
    channels-last, and NVRTC builds the kernels into a cubin."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from kiln.backends import kiln_backend

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    with FakeTensorMode():
        with torch.device("cuda"):
            m = FlatConvNet().eval()
        x = torch.empty(2, 3, 16, 16, device="cuda")
    gm = torch.fx.symbolic_trace(m)
    try:
        with torch.no_grad():
            art = kiln_backend.compile_graph(gm, [x], cuda_graphs=False, load=False)
    except kiln_backend.CompileFailed as e:
        if "builds no CUDA kernels" in str(e):
            pytest.skip(f"kilnd has no NVRTC here: {e}")
        raise
    assert art.body.format == 2  # BINARY_FORMAT_CUBIN
    assert art.body.kernel_binary and art.body.kernel_ptx
    plan = art.body.plan
    values = {v.id: v.meta for v in plan.values}

    def channels_last(meta):
        n, c, h, w = meta.sizes
        return list(meta.strides) == [c * h * w, 1, w * c, c]

    convs = [s.library for s in plan.steps
             if s.WhichOneof("kind") == "library" and s.library.op == "aten::convolution"]
    assert len(convs) == 2
    prologue_outputs = set(plan.prologue_outputs)
    for call in convs:
        x_id, w_id = call.args[0].value, call.args[1].value
        assert channels_last(values[x_id]) and channels_last(values[w_id])
        assert channels_last(values[call.outputs[0]])
        assert w_id in prologue_outputs  # the weight's conversion (and fold) runs once
    # The batch norm was folded: the prologue computes a bias from the norm's statistics, which
    # the kernel reading the first convolution's result adds (ATen's convolution would add it in
    # a pass of its own): the convolution is called without one.
    first = next(i for i, s in enumerate(plan.steps)
                 if s.WhichOneof("kind") == "library" and s.library.op == "aten::convolution")
    assert convs[0].args[2].WhichOneof("kind") == "none"
    reader = plan.steps[first + 1]
    assert reader.WhichOneof("kind") == "kernel"
    assert convs[0].outputs[0] in reader.kernel.args
    assert any(a in prologue_outputs for a in reader.kernel.args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("groups", [1, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_compiled_convnet_matches_eager_on_cuda(kilnd_cache, groups, dtype):
    m = ConvNet(groups=groups).eval().to(device="cuda", dtype=dtype)
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 16, 16, device="cuda", dtype=dtype)
    with torch.no_grad():
        expected = m(x)
        compiled = kiln.compile(m, backend="kiln")
        out = compiled(x).clone()
        y = torch.randn_like(x)
        out_y, expected_y = compiled(y).clone(), m(y)  # a replay with another input
    assert kiln.debug.artifacts(), "the graph ran eagerly instead of through kilnd"
    # cuDNN picks other algorithms for NHWC than for NCHW; float32 convolutions use TF32.
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out, expected, **tol)
    torch.testing.assert_close(out_y, expected_y, **tol)
    assert out.stride() == expected.stride()
