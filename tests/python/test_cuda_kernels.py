"""Op-level correctness of the "kiln" backend's generated CUDA kernels (kilnd's CUDA code
generator, built with NVRTC, run by the client's CUDA runtime) against eager PyTorch: every kernel
kind (pointwise scalar and vectorized paths, row-wise softmax / log_softmax / layer norm /
var_mean / long-row reductions) in float32, bfloat16 and float16, on non-contiguous, broadcast,
size-1 and empty inputs. Needs a GPU: skipped cleanly without one."""
import pytest
import torch

import kiln

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUBIN = 2  # kiln.v1.BinaryFormat.BINARY_FORMAT_CUBIN


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


def tolerance(dtype):
    return {torch.float32: (1.3e-6, 1e-5), torch.bfloat16: (1.6e-2, 1e-2),
            torch.float16: (1e-3, 1e-3)}.get(dtype, (0, 0))


def check(fn, *args, kernels=None, tol=None):
    with torch.no_grad():
        expected = fn(*args)
        out = kiln.compile(fn, backend="kiln")(*args)
        torch.cuda.synchronize()
    # The loosest tolerance of the outputs' dtypes (a tuple of results is compared as a whole).
    first = expected if isinstance(expected, torch.Tensor) else expected[0]
    rtol, atol = tol or tolerance(first.dtype)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol, equal_nan=True)
    art = kiln.debug.artifact(fn)
    assert art is not None, "the graph ran eagerly instead of through kilnd"
    assert art.body.format == CUBIN
    assert art.body.kernel_ptx
    if kernels is not None:
        assert art.plan.num_kernels == kernels
    return art


def randn(*shape, dtype=torch.float32):
    return torch.randn(shape, device="cuda").to(dtype)


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4096,), (64, 1024), (3, 5, 7), (1,), ()])
def test_pointwise_chain_matches_eager(dtype, shape):
    # (4096,) and (64, 1024) take the vector path; (3, 5, 7) leaves a scalar tail.
    x, y = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    check(lambda a, b: torch.nn.functional.gelu(a * b + 1).sigmoid() - a, x, y, kernels=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_view_takes_the_scalar_path(dtype):
    x = randn(4097, dtype=dtype)[1:]  # data pointer 2 or 4 bytes past an aligned one
    check(lambda a: torch.relu(a) * 2 + 1, x, kernels=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_operands(dtype):
    x, bias, col = randn(32, 100, dtype=dtype), randn(100, dtype=dtype), randn(32, 1, dtype=dtype)
    check(lambda a, b, c: torch.tanh(a + b) * c, x, bias, col, kernels=1)


def _rows(case, dtype):
    """[64, 96]-sized operands whose rows are: contiguous; a slice of longer rows; those rows
    past an offset of 4 elements (whole vectors of float32, half ones of 16-bit types); rows of
    100 (no whole number of 16-bit vectors)."""
    return {"contiguous": lambda: randn(64, 96, dtype=dtype),
            "row-stride": lambda: randn(64, 104, dtype=dtype)[:, :96],
            "row-offset": lambda: randn(64, 100, dtype=dtype)[:, 4:],
            "part-vectors": lambda: randn(64, 101, dtype=dtype)[:, :100]}[case]()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["contiguous", "row-stride", "row-offset", "part-vectors"])
def test_bias_and_column_over_rows(dtype, case):
    # The vector path over two dims where the rows hold whole vectors (a bias read as vectors
    # along the row, a column once per vector), the scalar path where they do not.
    x = _rows(case, dtype)
    bias, col = randn(x.shape[1], dtype=dtype), randn(x.shape[0], 1, dtype=dtype)
    check(lambda a, b, c: torch.relu(a + b) * c, x, bias, col, kernels=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_bias_and_residual(dtype):
    # A convolution's bias and a residual over a channels-last activation (resnet's blocks).
    x = randn(8, 64, 14, 14, dtype=dtype).contiguous(memory_format=torch.channels_last)
    r = randn(8, 64, 14, 14, dtype=dtype).contiguous(memory_format=torch.channels_last)
    bias = randn(64, dtype=dtype)
    check(lambda a, b, c: torch.relu(a + b.view(1, -1, 1, 1) + c), x, bias, r, kernels=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_operands(dtype):
    x = randn(64, 48, dtype=dtype).t()           # transposed
    y = randn(48, 128, dtype=dtype)[:, ::2]       # strided
    check(lambda a, b: torch.exp(a - b) + a * b, x, y, kernels=1)


def test_size_one_and_empty_dims():
    check(lambda a, b: a * b + 1, randn(8, 1, 16), randn(1, 1, 16), kernels=1)
    check(lambda a: torch.relu(a) + 1, randn(0, 16))


def test_int64_and_bool():
    a = torch.randint(-5, 5, (1000,), device="cuda")
    b = torch.randint(-5, 5, (1000,), device="cuda")
    check(lambda x, y: ((x + y) * 3, (x > y) | (y == 0)), a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 1000), (8, 4, 33), (128, 32)])
def test_softmax_and_log_softmax(dtype, shape):
    x = randn(*shape, dtype=dtype) * 4
    check(lambda a: torch.softmax(a, dim=-1), x)
    check(lambda a: torch.log_softmax(a, dim=-1), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(dtype):
    x = randn(128, 768, dtype=dtype)
    w, b = randn(768, dtype=dtype), randn(768, dtype=dtype)
    check(lambda a, ww, bb: torch.nn.functional.layer_norm(a, (768,), ww, bb), x, w, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_var_mean_and_std(dtype):
    x = randn(32, 4, 256, dtype=dtype) + 3
    check(lambda a: torch.var_mean(a, dim=(1, 2)), x)
    check(lambda a: (a.std(dim=-1, keepdim=True), a.mean(dim=-1)), x)


def test_amax_amin_propagate_nan():
    x = randn(64, 300)
    x[3, 7] = float("nan")
    check(lambda a: (a.amax(dim=-1), a.amin(dim=-1)), x)


def test_long_rows_loop_over_the_row():
    x = randn(64, 100000)
    check(lambda a: (a * a).sum(dim=-1), x)


def test_non_contiguous_reduction_input():
    x = randn(256, 64).t()  # rows of 256 elements, 64 apart
    check(lambda a: torch.softmax(a, dim=-1), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_reductions_over_height_and_width(dtype):
    # The kept channel dim is the one adjacent in memory: a column kernel. 3 x 40 rows is not a
    # whole number of 32-row tiles; the squeeze-excite form (mean, then a product with the full
    # tensor) and a two-pass variance.
    x = randn(3, 40, 7, 9, dtype=dtype).contiguous(memory_format=torch.channels_last)
    hs = torch.nn.functional.hardswish
    check(lambda a: hs(a).mean(dim=(2, 3), keepdim=True) * a, x)
    check(lambda a: (a.var(dim=(2, 3)), a.amax(dim=(2, 3), keepdim=True)), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_is_aten_attention_choosing_its_kernel_for_the_real_inputs(dtype):
    # BERT's form: an additive mask; the plan calls aten::scaled_dot_product_attention (which
    # picks flash / memory-efficient / math for these inputs), its epilogue is a generated kernel.
    q, k, v = (randn(2, 4, 64, 32, dtype=dtype) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 64, device="cuda", dtype=dtype)
    mask[1, :, :, 48:] = -10000.0
    art = check(lambda a, b, c, m: torch.nn.functional.scaled_dot_product_attention(
        a, b, c, attn_mask=m) * 2 + 1, q, k, v, mask)
    ops = [s.library.op for s in art.body.plan.steps if s.WhichOneof("kind") == "library"]
    assert ops == ["aten::scaled_dot_product_attention"]
    # GPT-2's form: causal, no mask.
    check(lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(
        a, b, c, is_causal=True).relu(), q, k, v)


DEPTHWISE = {  # (channels, height, width, kernel, stride, padding, dilation)
    "3x3": (16, 14, 14, (3, 3), (1, 1), (1, 1), (1, 1)),
    "5x5 stride 2": (24, 15, 13, (5, 5), (2, 2), (2, 2), (1, 1)),
    "3x5 uneven": (8, 9, 11, (3, 5), (2, 1), (1, 2), (1, 1)),
    "dilated, no padding": (12, 12, 12, (3, 3), (1, 1), (0, 0), (2, 2)),
    "window over a 1x1 plane": (40, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("case", sorted(DEPTHWISE))
def test_depthwise_convolution_and_its_epilogue(dtype, channels_last, case, monkeypatch):
    # A generated kernel computes the window sum, adds the bias and applies hardswish; no
    # convolution is left to cuDNN. Eager's fp32 convolution without TF32, for a like result.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    c, h, w, k, stride, padding, dilation = DEPTHWISE[case]
    x = randn(3, c, h, w, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight, bias = randn(c, 1, *k, dtype=dtype), randn(c, dtype=dtype)

    def fn(a, wt, b):
        y = torch.nn.functional.conv2d(a, wt, b, stride, padding, dilation, groups=c)
        return torch.nn.functional.hardswish(y)

    # Sums of up to 25 products in another order than cuDNN's: float32 within 2e-5; a 16-bit
    # sum may round to the neighbouring value, which the bias add and hardswish (slope up to
    # 1.5) carry on: three units in the last place.
    tol = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2.4e-2, 2.4e-2),
           torch.float16: (3e-3, 3e-3)}[dtype]
    art = check(fn, x, weight, bias, kernels=1, tol=tol)
    ops = [s.library.op for s in art.body.plan.steps if s.WhichOneof("kind") == "library"]
    assert "aten::convolution" not in ops


def test_depthwise_convolution_of_a_strided_view_and_an_empty_batch():
    # The input is a channel slice of a larger tensor (strides of the base); an empty batch
    # launches a kernel that does nothing.
    base = randn(2, 32, 10, 10)
    weight = randn(16, 1, 3, 3)
    fn = lambda a, wt: torch.nn.functional.conv2d(a[:, 8:24], wt, padding=1, groups=16).relu()
    check(fn, base, weight)
    check(fn, randn(0, 32, 10, 10), weight)


@pytest.mark.parametrize("dtype", DTYPES)
def test_depthwise_block_of_a_module_reads_its_weight_copied_channels_innermost(dtype, monkeypatch):
    # A MobileNet block: its parameters are bound, so the depthwise weight (batch norm folded
    # into it) is copied channels innermost by the plan's prologue and read per tap as vectors
    # by the channels-last kernel; three convolutions make the graph channels-last.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch.manual_seed(0)
    nn = torch.nn
    block = nn.Sequential(
        nn.Conv2d(16, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 5, stride=2, padding=2, groups=64, bias=False), nn.BatchNorm2d(64),
        nn.Hardswish(), nn.Conv2d(64, 24, 1)).cuda().eval().to(dtype)
    for m in block:
        if isinstance(m, nn.BatchNorm2d):  # statistics of a trained network, not the identity
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    x = randn(4, 16, 20, 20, dtype=dtype)
    tol = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-2, 5e-2),
           torch.float16: (5e-3, 5e-3)}[dtype]
    art = check(block, x, tol=tol)
    ops = [s.library.op for s in art.body.plan.steps if s.WhichOneof("kind") == "library"]
    assert ops.count("aten::convolution") == 2, ops  # the two 1x1 ones stay with cuDNN
    with torch.no_grad():  # a changed parameter: the prologue copies the weight again
        block[3].weight.mul_(-1)
    check(block, x, tol=tol)
