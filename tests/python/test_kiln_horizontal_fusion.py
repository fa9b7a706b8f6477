"""Horizontal fusion in the "kiln" backend: independent pointwise chains over one iteration space
(sharing inputs or not, next to each other in the program or split by library calls) run as one
kernel with several outputs, and return what eager returns across shapes, layouts and dtypes."""
import pytest
import torch

import kiln

SHAPES = [(7, 5), (64, 33), (2, 8, 6, 6)]
DTYPES = [torch.float32, torch.bfloat16]
LAYOUTS = ["contiguous", "transposed", "sliced"]


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


def make(shape, dtype, layout):
    """A random tensor of `shape`: contiguous, a transpose of the first and last dims, or every
    other element of a wider tensor at a storage offset."""
    if layout == "transposed":
        flipped = (shape[-1],) + tuple(shape[1:-1]) + (shape[0],)
        return torch.randn(flipped).to(dtype).transpose(0, -1)
    if layout == "sliced":
        return torch.randn(*shape[:-1], 2 * shape[-1] + 1).to(dtype)[..., 1::2]
    return torch.randn(shape).to(dtype)


def tolerances(dtype):
    return dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)


def run(fn, *args, kernels):
    """`fn` compiled by kiln on `args` against eager; the artifact runs `kernels` kernels."""
    with torch.no_grad():
        expected = fn(*args)
        got = kiln.compile(fn, backend="kiln")(*args)
    torch.testing.assert_close(got, expected, equal_nan=True, **tolerances(args[0].dtype))
    art = kiln.debug.artifact(fn)
    assert art is not None, "the graph ran eagerly instead of through kilnd"
    assert art.plan.num_kernels == kernels
    return art


def library_ops(art):
    return [s.library.op for s in art.body.plan.steps if s.WhichOneof("kind") == "library"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sin_and_cos_of_one_input_are_one_kernel(dtype, layout):
    def fn(x):
        return x.sin(), x.cos()

    for shape in SHAPES:
        run(fn, make(shape, dtype, layout), kernels=1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_activations_of_two_inputs_are_one_kernel(dtype, layout):
    def fn(x, y):
        return torch.relu(x), torch.sigmoid(y)

    for shape in SHAPES:
        run(fn, make(shape, dtype, layout), make(shape, dtype, layout), kernels=1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chains_split_by_matrix_products_are_one_kernel(dtype, layout):
    # Captured as x * 2, product, x + 1, product, tanh(y), product: each product closes the
    # kernel before it.
    def fn(x, y, w):
        return (x * 2) @ w, (x + 1) @ w, torch.tanh(y) @ w

    for rows, cols in [(7, 5), (64, 33)]:
        x, y = make((rows, cols), dtype, layout), make((rows, cols), dtype, layout)
        art = run(fn, x, y, torch.randn(cols, 6).to(dtype), kernels=1)
        products = [op for op in library_ops(art) if "mm" in op or "linear" in op]
        assert len(products) == 3, library_ops(art)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmaxes_of_two_inputs_split_by_products_are_one_row_wise_kernel(dtype):
    def fn(x, y, w):
        return torch.softmax(x, -1) @ w, torch.softmax(y * 2, -1) @ w

    for layout in LAYOUTS:
        x, y = make((64, 33), dtype, layout), make((64, 33), dtype, layout)
        run(fn, x, y, torch.randn(33, 6).to(dtype), kernels=1)


class Projections(torch.nn.Module):
    """Query, key and value projections of one input split into two heads, as attention has
    them, each with its own activation."""

    def __init__(self, dim=32):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x):
        def heads(t):
            return t.view(x.shape[0], x.shape[1], 2, -1).transpose(1, 2)

        q = heads(self.q(x) * 0.125)
        k = heads(torch.nn.functional.gelu(self.k(x)))
        v = heads(torch.sigmoid(self.v(x)))
        return q, k, v


def test_query_key_value_projections_share_one_kernel():
    # Each epilogue is read by its view before the next projection: the three products run
    # first, then one kernel for the three epilogues.
    art = run(Projections().eval(), torch.randn(2, 16, 32), kernels=1)
    steps = [s.library.op if s.WhichOneof("kind") == "library" else "kernel"
             for s in art.body.plan.steps]
    products = [i for i, op in enumerate(steps) if "linear" in op or "mm" in op]
    assert len(products) == 3 and steps.index("kernel") > max(products), steps


def test_chain_reading_a_product_of_the_other_chain_is_a_second_kernel():
    def fn(x, w):
        return torch.relu((x * 2) @ w) + 1

    run(fn, torch.randn(16, 16), torch.randn(16, 16), kernels=2)


def test_per_channel_chain_beside_an_activation_chain_matches_eager():
    # The [C] chain and the [N, C, H, W] chains have different iteration spaces: two kernels, the
    # two over the activation merged around the one over the channels.
    def fn(x, v):
        return torch.relu(x), v.exp(), torch.sigmoid(x)

    run(fn, torch.randn(2, 8, 5, 5), torch.randn(8), kernels=2)


def test_merged_kernel_writes_outputs_of_large_tensors_in_parallel():
    def fn(x, y, w):
        return (x * 2) @ w, torch.sigmoid(y) @ w, x.sin() - y

    x, y = torch.randn(256, 160), torch.randn(256, 160)
    art = run(fn, x, y, torch.randn(160, 8), kernels=1)
    assert "kiln_parallel_for(0, " in art.body.kernel_source
