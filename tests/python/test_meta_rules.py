"""The capture's metadata shortcuts (kiln/graph/meta_rules.py) give exactly what running the op on
fakes gives, and what eager's real result has: shapes, strides, dtype, device."""
import itertools
import operator

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kiln
from kiln.graph import output_graph
from kiln.graph.meta_rules import conv2d_result, shortcut
from kiln.testing import CompileCounter

CL = torch.channels_last
CONFIGS = list(itertools.product(
    [(3, 8, 1), (8, 8, 8), (8, 16, 2), (1, 4, 1)],  # (in, out, groups): plain, depthwise, grouped
    [1, 3], [1, 2], [0, 1], [1, 2], [False, True],    # kernel, stride, padding, dilation, bias
    ["contiguous", "channels_last"], ["contiguous", "channels_last"], [torch.float32]))
CONFIGS += [((8, 16, 2), 3, 2, 1, 1, True, "channels_last", "contiguous", torch.bfloat16),
            ((3, 8, 1), 1, 1, 0, 1, False, "contiguous", "contiguous", torch.bfloat16)]


@pytest.mark.parametrize("channels,k,stride,pad,dil,bias,x_format,w_format,dtype", CONFIGS)
def test_conv2d_result_matches_the_fake_and_the_real_convolution(
        channels, k, stride, pad, dil, bias, x_format, w_format, dtype):
    cin, cout, groups = channels
    mode = FakeTensorMode()
    x = torch.randn(2, cin, 9, 9, dtype=dtype)
    w = torch.randn(cout, cin // groups, k, k, dtype=dtype)
    x = x.to(memory_format=CL) if x_format == "channels_last" else x
    w = w.to(memory_format=CL) if w_format == "channels_last" else w
    b = torch.randn(cout, dtype=dtype) if bias else None
    args = (mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(b) if bias else None,
            stride, pad, dil, groups)
    got = conv2d_result(mode, args, {})
    with mode:
        fake = torch.conv2d(*args)
    real = torch.conv2d(x, w, b, stride, pad, dil, groups)
    assert got is not None
    assert (got.shape, got.stride(), got.dtype, got.device) == \
        (fake.shape, fake.stride(), fake.dtype, fake.device)
    assert (got.shape, got.stride()) == (real.shape, real.stride())


def test_conv2d_rule_declines_what_it_cannot_be_sure_of():
    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(1, 4, 8, 8))
    w = mode.from_tensor(torch.randn(4, 4, 3, 3))
    grad_w = mode.from_tensor(torch.randn(4, 4, 3, 3, requires_grad=True))
    assert conv2d_result(mode, (x, w, None, 1, "same"), {}) is None  # string padding
    assert conv2d_result(mode, (x, w), {"stride": 2}) is None         # keywords
    assert conv2d_result(mode, (x, w, None, 1, 0, 1, 3), {}) is None  # groups do not divide
    assert conv2d_result(mode, (x, w, None, 1, 0, 1, 1.0), {}) is None
    small = mode.from_tensor(torch.randn(1, 4, 2, 2))
    assert conv2d_result(mode, (small, w), {}) is None                # empty output: the op raises
    with torch.enable_grad():
        assert conv2d_result(mode, (x, grad_w), {}) is None           # result would need grad
    with torch.no_grad():
        assert conv2d_result(mode, (x, grad_w), {}) is not None


def test_capture_of_a_resnet_takes_the_convolution_shortcut_and_matches_eager(monkeypatch):
    import torchvision

    ran_on_fakes = []
    real_run_fake = output_graph.OutputGraph._run_fake

    def counting(self, kind, target, *rest):
        ran_on_fakes.append(target)
        return real_run_fake(self, kind, target, *rest)

    monkeypatch.setattr(output_graph.OutputGraph, "_run_fake", counting)
    m = torchvision.models.resnet18(num_classes=10).eval()
    counter = CompileCounter()
    compiled = kiln.compile(m, backend=counter)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x))
    assert counter.frame_count == 1
    assert torch.conv2d not in ran_on_fakes, "a convolution ran on fakes"


def test_shortcut_gives_a_new_fake_like_the_input_for_a_same_shaped_pointwise_op():
    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(3, 4))
    y = shortcut(mode, "call_function", torch.relu, (x,), {})
    assert y is not x  # another tensor: `torch.relu(x) is x` is False
    assert (y.shape, y.stride(), y.dtype, y.device) == (x.shape, x.stride(), x.dtype, x.device)
    assert shortcut(mode, "call_function", torch.matmul, (x, x.t()), {}) is None


def test_shortcut_gives_the_input_itself_where_the_op_returns_it():
    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(3, 4))
    assert shortcut(mode, "call_method", "add_", (x, 1.0), {}) is x
    assert shortcut(mode, "call_method", "contiguous", (x,), {}) is x
    assert shortcut(mode, "call_function", operator.iadd, (x, x), {}) is x


def test_shortcut_leaves_contiguous_of_a_channels_last_tensor_to_the_fakes():
    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last))
    assert shortcut(mode, "call_method", "contiguous", (x,), {}) is None


def test_shortcut_leaves_ops_on_tensors_needing_grad_to_the_fakes():
    # Their results are no leaves and have a grad_fn: only running the op gives that.
    mode = FakeTensorMode()
    x = mode.from_tensor(torch.randn(3, 4, requires_grad=True))
    with torch.enable_grad():
        assert shortcut(mode, "call_function", torch.relu, (x,), {}) is None
    with torch.no_grad():
        assert shortcut(mode, "call_function", torch.relu, (x,), {}) is None
