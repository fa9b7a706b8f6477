"""Op-level correctness of the "kiln" backend's generated kernels: every fused pointwise op and
fused pattern against eager PyTorch on random inputs, across shapes (broadcast, size-1, empty,
0-d), layouts (transposed, sliced with an offset) and dtypes (float32, bfloat16, int64, bool)."""
import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


def check(op, *args, kernels=None, rtol=None, atol=None, ref=None):
    def fn(*a):
        return op(*a)

    with torch.no_grad():
        expected = fn(*args) if ref is None else ref
        out = kiln.compile(fn, backend="kiln")(*args)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol, equal_nan=True)
    art = kiln.debug.artifact(fn)
    assert art is not None, "the graph ran eagerly instead of through kilnd"
    if kernels is not None:
        assert art.plan.num_kernels == kernels
    return art


def randn(*shape, dtype=torch.float32):
    return torch.randn(shape).to(dtype)


# What a float32 GEMM runs as: oneDNN's where torch has it (Target.cpu_onednn).
LINEAR = ("mkldnn::_linear_pointwise" if torch.backends.mkldnn.is_available()
          and hasattr(torch.ops.mkldnn, "_linear_pointwise") else "aten::mm")


def library_ops(art):
    return [s.library.op for s in art.body.plan.steps if s.WhichOneof("kind") == "library"]


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": lambda x: torch.log(x.abs()),
    "log1p": lambda x: torch.log1p(x.abs()), "expm1": torch.expm1,
    "sqrt": lambda x: torch.sqrt(x.abs()), "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1),
    "reciprocal": lambda x: torch.reciprocal(x + 3), "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "round": torch.round,
    "sign": torch.sign, "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu, "hardswish": torch.nn.functional.hardswish,
    "hardsigmoid": torch.nn.functional.hardsigmoid, "hardtanh": torch.nn.functional.hardtanh,
    "leaky_relu": lambda x: torch.nn.functional.leaky_relu(x, 0.2),
    "clamp": lambda x: torch.clamp(x, -0.5, 0.7), "clamp_min": lambda x: x.clamp(min=0.1),
    "clamp_max": lambda x: x.clamp(max=0.1), "pow2": lambda x: x ** 2, "pow3": lambda x: x ** 3,
    "pow_half": lambda x: x.abs() ** 0.5, "pow_other": lambda x: x.abs() ** 1.7,
    "square_mul": lambda x: x * x,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op_matches_eager(name):
    fn = UNARY[name]
    x = randn(6, 7) * 3
    check(lambda t: fn(t) + 0.0, x, kernels=1)


BINARY = {
    "add": torch.add, "add_alpha": lambda a, b: torch.add(a, b, alpha=2.5), "sub": torch.sub,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=0.5), "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 0.5), "div_trunc": lambda a, b: torch.div(
        a, b.abs() + 0.5, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b.abs() + 0.5, rounding_mode="floor"),
    "maximum": torch.maximum, "minimum": torch.minimum,
    "pow": lambda a, b: torch.pow(a.abs() + 0.1, b),
    "where": lambda a, b: torch.where(a > b, a, b * 2), "eq": lambda a, b: (a == b) | (a > 0),
    "ne": lambda a, b: a != b, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical": lambda a, b: torch.logical_and(a > 0, b > 0) | torch.logical_not(a > b),
    "scalar_ops": lambda a, b: (a + 1.5) * 2 - b / 4,
    "rsub": lambda a, b: 1 - a * b,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op_matches_eager(name):
    fn = BINARY[name]
    a, b = randn(5, 8), randn(5, 8)
    b[0, :3] = a[0, :3]  # some equal elements for the comparisons
    check(fn, a, b)


@pytest.mark.parametrize("shapes", [
    ((4, 5), (5,)), ((4, 1), (1, 6)), ((2, 3, 4, 5), (1, 3, 1, 1)), ((3, 1, 5), (4, 1)),
    ((), ()), ((7,), ()), ((0, 4), (4,)), ((1, 1), (1, 1)),
], ids=lambda s: "x".join(map(str, s)))
def test_broadcast_shapes_match_eager(shapes):
    a, b = randn(*shapes[0]), randn(*shapes[1])
    check(lambda x, y: torch.tanh(x * y + x) - y, a, b)


def test_transposed_and_offset_inputs_match_eager():
    base = randn(9, 12)
    a = base.t()                  # non-contiguous strides
    b = randn(20, 12)[3:12].t()   # storage offset and a row stride
    check(lambda x, y: torch.relu(x - y) * 2, a, b, kernels=1)


def test_channels_last_input_matches_eager():
    x = randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
    w = randn(8)
    check(lambda t, s: torch.sigmoid(t * s.view(1, 8, 1, 1) + 1), x, w)


@pytest.mark.parametrize("make", [
    lambda: randn(2, 3, 20, 24),                     # an image batch going channels-last
    lambda: randn(2, 3, 20, 30)[:, :, :, 3:27],      # ... sliced, with an offset
    lambda: torch.randint(-5, 5, (1, 2, 9, 40)),     # int64, 2 channels
], ids=["nchw", "sliced", "int64"])
def test_few_channel_result_in_channels_last_matches_eager(make):
    # The result's innermost dim is short (2-3 channels): the kernel loops over the input's
    # contiguous dim innermost instead.
    check(lambda x: (x * 2).contiguous(memory_format=torch.channels_last), make(), kernels=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64,
                                   torch.int32, torch.uint8, torch.bool])
def test_dtypes_match_eager(dtype):
    if dtype == torch.bool:
        a, b = torch.rand(6, 5) > 0.5, torch.rand(6, 5) > 0.5

        def fn(x, y):
            return (x & y) | ~y
    elif dtype.is_floating_point:
        a, b = randn(6, 5, dtype=dtype), randn(6, 5, dtype=dtype)

        def fn(x, y):
            return torch.relu(x * y + x) - y
    else:
        a, b = torch.randint(0, 20, (6, 5), dtype=dtype), torch.randint(0, 20, (6, 5), dtype=dtype)

        def fn(x, y):
            return torch.maximum(x * y + x, y) - y
    check(fn, a, b)


def test_type_promotion_int_times_float_matches_eager():
    a = torch.randint(-5, 5, (4, 6))
    b = randn(4, 6)
    check(lambda x, y: x * y + x / 2, a, b)


def test_casts_fuse_and_match_eager():
    a = randn(4, 6) * 10
    check(lambda x: (x.to(torch.int64) * 3).to(torch.float32) + x.to(torch.bfloat16).float(), a)


def test_nan_and_inf_propagate_like_eager():
    a = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0, -2.0, 0.0])
    b = torch.tensor([1.0, float("nan"), 2.0, float("inf"), -3.0, -0.0])
    check(lambda x, y: torch.stack([torch.relu(x), torch.maximum(x, y), torch.minimum(x, y),
                                    x.clamp(-1, 1), torch.where(x > y, x, y)]), a, b)


def test_layer_norm_gelu_block_fuses_pointwise_parts():
    ln = torch.nn.LayerNorm(64).eval()
    lin = torch.nn.Linear(64, 64).eval()

    def fn(x):
        return torch.nn.functional.gelu(ln(lin(x))) + x

    art = check(fn, randn(8, 64), rtol=1e-4, atol=1e-4)
    # One GEMM, then bias, layer norm, GELU and the residual add in one row-wise kernel (the
    # decomposition's "* 1" for alpha and beta are dropped).
    assert library_ops(art) == [LINEAR]
    assert art.plan.num_kernels == 1


@pytest.mark.parametrize("transposed_weight", [True, False])
@pytest.mark.parametrize("contiguous_input", [True, False])
def test_matrix_products_with_weights_match_eager(transposed_weight, contiguous_input):
    w = randn(48, 32) if transposed_weight else randn(32, 48)
    x = randn(16, 32) if contiguous_input else randn(32, 16).t()

    def fn(a, b):
        return torch.relu((a @ (b.t() if transposed_weight else b)) * 0.5)

    art = check(fn, x, w, rtol=1e-4, atol=1e-4)
    # (A transpose view of the weight may precede it: views are metadata steps.)
    assert [op for op in library_ops(art) if op not in ("aten::permute", "aten::t")] == [LINEAR]


def test_batch_norm_relu_after_convolution_is_one_kernel():
    conv = torch.nn.Conv2d(3, 8, 3, bias=False).eval()
    bn = torch.nn.BatchNorm2d(8).eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)

    def fn(x):
        return torch.relu(bn(conv(x)))

    art = check(fn, randn(2, 3, 10, 10), rtol=1e-4, atol=1e-4)
    # The per-channel statistics are folded views read by the same kernel as the normalisation.
    big = [s for s in art.body.plan.steps if s.WhichOneof("kind") == "kernel"]
    assert len(big) <= 2


F = torch.nn.functional
CONV_ACTIVATIONS = {
    "relu": (torch.relu, "relu"), "hardswish": (F.hardswish, "hardswish"),
    "silu": (F.silu, "swish"), "sigmoid": (torch.sigmoid, "sigmoid"), "tanh": (torch.tanh, "tanh"),
    "hardsigmoid": (F.hardsigmoid, "hardsigmoid"), "relu6": (F.relu6, "hardtanh"),
    "hardtanh_int": (lambda t: F.hardtanh(t, -2, 3), "hardtanh"),
}
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


@pytest.mark.skipif(not ONEDNN, reason="torch without oneDNN's fused convolution")
@pytest.mark.parametrize("name", sorted(CONV_ACTIVATIONS))
def test_activation_after_convolution_is_its_post_op(name):
    act, attr = CONV_ACTIVATIONS[name]
    conv = torch.nn.Conv2d(8, 16, 3, padding=1).eval()
    bn = torch.nn.BatchNorm2d(16).eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)

    def fn(x):
        return act(bn(conv(x)))

    x = randn(2, 8, 9, 9)
    art = check(fn, x, rtol=1e-4, atol=1e-4)
    convs = [s.library for s in art.body.plan.steps if s.WhichOneof("kind") == "library"
             and s.library.op == "mkldnn::_convolution_pointwise"]
    assert len(convs) == 1 and convs[0].args[7].string_value == attr
    # One kernel: the copy of oneDNN's channels-last result to the NCHW value the graph returns,
    # as eager's (the batch-norm fold runs in the prologue).
    per_call = [s for s in art.body.plan.steps if s.WhichOneof("kind") == "kernel"]
    assert len(per_call) == 1
    with torch.no_grad():
        assert kiln.compile(fn, backend="kiln")(x).stride() == fn(x).stride()


@pytest.mark.skipif(not ONEDNN, reason="torch without oneDNN's fused convolution")
def test_activation_without_an_equal_post_op_stays_a_kernel():
    # hardtanh with fractional bounds and leaky_relu have no integral-scalar post-op here: the
    # convolution stays plain and a kernel applies them.
    conv = torch.nn.Conv2d(4, 6, 1).eval()
    for act in (lambda t: F.hardtanh(t, -0.5, 0.5), lambda t: F.leaky_relu(t, 0.2)):
        kiln.reset()
        art = check(lambda x: act(conv(x)), randn(1, 4, 5, 5), rtol=1e-4, atol=1e-4)
        convs = [s.library for s in art.body.plan.steps if s.WhichOneof("kind") == "library"
                 and s.library.op == "mkldnn::_convolution_pointwise"]
        per_call = [s for s in art.body.plan.steps if s.WhichOneof("kind") == "kernel"]
        # The activation's kernel (it also gives the NCHW layout of the channels-last result).
        assert convs[0].args[7].string_value == "none" and len(per_call) == 1


def test_intermediate_used_twice_is_materialised_once():
    def fn(x):
        y = torch.exp(x) + 1
        return y * 2, y.sum()

    check(fn, randn(16, 16))


def test_softmax_over_rows_and_mean_over_columns_match_eager():
    def fn(x):
        return torch.softmax(x * 2, dim=-1) + x.mean(dim=0, keepdim=True)

    # The row softmax is one kernel with its prologue; mean over the leading dim is not a
    # trailing reduction, so it stays a library call.
    art = check(fn, randn(6, 10), rtol=1e-5, atol=1e-5)
    assert library_ops(art) == ["aten::mean.dim"]


REDUCTIONS = {
    "sum": lambda x: (x * 3).sum(dim=-1),
    "sum_keepdim": lambda x: torch.sum(x.exp(), dim=-1, keepdim=True) - x,
    "mean_two_dims": lambda x: x.mean(dim=(-2, -1), keepdim=True) + x,
    "amax": lambda x: x.amax(dim=-1, keepdim=True),
    "amin": lambda x: x.amin(dim=-1) * 2,
    "var": lambda x: x.var(dim=-1, keepdim=True),
    "var_unbiased_0": lambda x: torch.var(x + 1, dim=-1, correction=0),
    "var_mean": lambda x: torch.var_mean(x, dim=-1, keepdim=True),
    "std": lambda x: x.std(dim=-1),
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x - 1, dim=-1),
    "all_dims": lambda x: x.sum() + 0,
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("shape", [(4, 5, 33), (1, 1, 7), (3, 2, 2)])
def test_fused_reduction_matches_eager(name, shape):
    art = check(REDUCTIONS[name], randn(*shape), rtol=1e-5, atol=1e-5)
    assert not [op for op in library_ops(art) if "sum" in op or "amax" in op or "amin" in op
                or "var" in op or "mean" in op or "softmax" in op], library_ops(art)


@pytest.mark.parametrize("name", ["sum", "amax", "var_mean", "softmax"])
def test_fused_reduction_of_transposed_and_sliced_inputs_matches_eager(name):
    base = randn(40, 24)
    check(REDUCTIONS[name], base.t(), rtol=1e-5, atol=1e-5)
    check(REDUCTIONS[name], base[3:, 5:17], rtol=1e-5, atol=1e-5)
    check(REDUCTIONS[name], randn(6, 1, 9).expand(6, 4, 9), rtol=1e-5, atol=1e-5)


# Reductions whose kept dim is the contiguous one: lane kernels (RowKernel) reduce 16 kept
# values at once. Channels-last means over H and W (as squeeze-excitation pools do), a column
# reduction of a transposed matrix, kept sizes that are and are not multiples of the lanes.
LANE_CASES = {
    "channels_last_mean": (lambda x: x.mean(dim=(-2, -1), keepdim=True) * x,
                           lambda: randn(2, 40, 7, 5).to(memory_format=torch.channels_last)),
    "channels_last_hardswish_mean": (
        lambda x: torch.nn.functional.hardswish(x).mean(dim=(2, 3)),
        lambda: randn(3, 16, 9, 9).to(memory_format=torch.channels_last)),
    "transposed_sum": (lambda x: (x * 3).sum(dim=-1), lambda: randn(50, 20).t()),
    "transposed_amax": (lambda x: x.amax(dim=-1, keepdim=True) - x, lambda: randn(30, 33).t()),
    "transposed_amin": (lambda x: x.amin(dim=-1), lambda: randn(30, 8).t()),
    "transposed_var_mean": (lambda x: torch.var_mean(x, dim=-1, keepdim=True),
                            lambda: randn(17, 24).t()),
    "transposed_std": (lambda x: x.std(dim=-1), lambda: randn(17, 40).t()),
    "transposed_softmax": (lambda x: torch.softmax(x, dim=-1), lambda: randn(12, 45).t()),
    "transposed_log_softmax": (lambda x: torch.log_softmax(x - 1, dim=-1),
                               lambda: randn(64, 32).t()),
}


@pytest.mark.parametrize("name", sorted(LANE_CASES))
def test_reduction_over_strided_dims_of_a_contiguous_kept_dim_uses_lanes(name):
    fn, make = LANE_CASES[name]
    art = check(fn, make(), rtol=1e-5, atol=1e-5)
    assert "kiln_v" in art.body.kernel_source, "expected a lane kernel"


def test_lane_reductions_propagate_nan_and_inf_like_eager():
    x = randn(20, 24)
    x[0, 3] = float("nan")
    x[1, 0] = float("inf")
    x[2, 5] = -float("inf")
    for name in ("transposed_amax", "transposed_amin", "transposed_sum", "transposed_softmax",
                 "transposed_std"):
        check(LANE_CASES[name][0], x.clone().t())


def test_lane_reductions_in_bfloat16_match_eager():
    x = randn(2, 24, 6, 6, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    art = check(LANE_CASES["channels_last_mean"][0], x, rtol=2e-2, atol=2e-2)
    assert "kiln_v" in art.body.kernel_source


@pytest.mark.parametrize("name", ["sum", "mean_two_dims", "var", "softmax", "amax"])
def test_fused_reduction_in_bfloat16_matches_eager(name):
    check(REDUCTIONS[name], randn(8, 3, 40, dtype=torch.bfloat16), rtol=2e-2, atol=2e-2)


def test_reductions_propagate_nan_and_inf_like_eager():
    x = randn(4, 8)
    x[0, 3] = float("nan")
    x[1, 0] = float("inf")
    x[2, 5] = -float("inf")
    for name in ("amax", "amin", "sum", "softmax", "var"):
        check(REDUCTIONS[name], x.clone())


def test_reductions_over_empty_or_size_one_dims_run_as_library_calls():
    check(REDUCTIONS["sum"], randn(3, 0))
    check(REDUCTIONS["amax"], randn(0, 4))
    check(REDUCTIONS["sum_keepdim"], randn(5, 1))


def test_layer_norm_with_residual_prologue_is_one_kernel():
    ln = torch.nn.LayerNorm(96).eval()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)

    def fn(x, r):
        h = x + r
        return ln(h), h

    art = check(fn, randn(2, 16, 96), randn(2, 16, 96), rtol=1e-5, atol=1e-5, kernels=1)
    assert library_ops(art) == []


def test_layer_norm_bfloat16_matches_eager():
    ln = torch.nn.LayerNorm(64).eval().to(torch.bfloat16)
    check(lambda x: ln(x * 2), randn(4, 10, 64, dtype=torch.bfloat16), rtol=2e-2, atol=2e-2)


def test_attention_scores_softmax_fuses_scale_and_mask():
    mask = torch.zeros(1, 1, 1, 16)
    mask[..., 12:] = -1e9

    def fn(q, k):
        scores = q @ k.transpose(-1, -2) / 8.0 + mask
        return torch.softmax(scores, dim=-1)

    art = check(fn, randn(2, 4, 16, 8), randn(2, 4, 16, 8), rtol=1e-5, atol=1e-5)
    assert art.plan.num_kernels == 1


def test_large_rows_run_in_parallel_and_match_eager():
    check(lambda x: torch.softmax(x, dim=-1) * torch.var(x, dim=-1, keepdim=True),
          randn(512, 300), rtol=1e-5, atol=1e-5, kernels=1)


def test_large_tensor_runs_in_parallel_and_matches_eager():
    a, b = randn(256, 1024), randn(1024)
    check(lambda x, y: torch.sigmoid(x + y) * x, a, b, kernels=1)


PADS = {
    "last_dim": (lambda: randn(3, 5), (1, 2), 0.0),
    "crop_and_pad_2d": (lambda: randn(2, 3, 6, 7), (1, 2, -1, 3), 1.5),
    "three_dims": (lambda: randn(1, 2, 3, 4, 5), (1, 1, 2, 0, 0, 3), -2.0),
    "int64": (lambda: torch.randint(-9, 9, (4, 6)), (2, 2, 1, 1), 7),
    "bfloat16": (lambda: randn(2, 5, 6, dtype=torch.bfloat16), (0, 3), 0.5),
    "channels_last": (lambda: randn(2, 4, 5, 5).to(memory_format=torch.channels_last),
                      (1, 1, 1, 1), 0.0),
    "sliced": (lambda: randn(6, 9)[1:5, 2:8], (3, 0, 0, 2), 1.0),
}


@pytest.mark.parametrize("name", sorted(PADS))
def test_constant_pad_is_a_library_call_that_matches_eager(name):
    """aten::constant_pad_nd (swin's window padding, attention masks padded on a GPU) is ATen's
    pad, called by the plan between generated kernels, where it made the whole graph eager."""
    make, pad, value = PADS[name]
    x = make()

    def fn(t):
        padded = torch.nn.functional.pad(t * 2, pad, value=value)
        return padded + 1, padded.sum(-1)

    art = check(fn, x)
    assert "aten::constant_pad_nd" in library_ops(art)
