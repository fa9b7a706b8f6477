"""Tensor indexing and slicing (ints, slices with steps, None, Ellipsis, tensor indices) and
the view/shape methods models use around them; one graph each."""
import pytest
import torch

from .harness import Corpus, t

corpus = Corpus()
LONG = torch.long


@corpus((4, 5), frames=1)
def int_index_rows(x):
    return x[0] + x[-1]


@corpus((6, 5), frames=1)
def slice_with_step(x):
    return x[1:5:2]


@corpus((3, 4), frames=1)
def none_inserts_dims(x):
    return x[None, :, None]


@corpus((2, 3, 4), frames=1)
def ellipsis_last_column(x):
    return x[..., -1]


@corpus((2, 3, 4), frames=1)
def ellipsis_with_new_trailing_axis(x):
    return x[..., None] * x[..., None, :]


@corpus((5, 6), frames=1)
def two_dim_slices_with_step(x):
    return x[1:3, ::2]


@corpus((4, 3), lambda: torch.tensor([3, 0, 2]), frames=1)
def long_tensor_index(x, idx):
    return x[idx]


@corpus((4, 5), lambda: torch.tensor([0, 3]), lambda: torch.tensor([1, 4]), frames=1)
def advanced_index_pairs(x, rows, cols):
    return x[rows, cols]


@corpus((4, 5), lambda: torch.tensor([4, 1]), frames=1)
def column_tensor_index(x, idx):
    return x[:, idx]


@corpus((4, 5), frames=1)
def python_list_index(x):
    return x[[0, 2]]


@corpus((8, 3), frames=1)
def slice_bound_from_shape(x):
    half = x.shape[0] // 2
    return x[:half] - x[half:]


@corpus((3, 4), lambda: torch.tensor([[0, 1], [2, 3], [1, 1]]), frames=1)
def gather_along_last_dim(x, idx):
    return torch.gather(x, 1, idx)


@corpus((5, 3), lambda: torch.tensor([4, 0]), frames=1)
def index_select_rows(x, idx):
    return x.index_select(0, idx)


@corpus((3, 4), frames=1)
def take_along_dim_of_argmax(x):
    idx = x.argmax(dim=1, keepdim=True)
    return torch.take_along_dim(x, idx, dim=1)


@corpus((2, 3, 4), frames=1)
def narrow_and_select(x):
    return x.narrow(2, 1, 2).select(1, 0)


@corpus((3, 4), frames=1)
def unbind_and_index_tuple(x):
    rows = x.unbind(0)
    return rows[1] * rows[2]


@corpus((3, 4), frames=1)
def transpose_attributes(x):
    return x.T @ x, x.mT.shape


@corpus((2, 3, 4), frames=1)
def view_permute_flatten(x):
    y = x.permute(2, 0, 1).contiguous()
    return y.view(4, -1).flatten()


@corpus((2, 6), frames=1)
def reshape_split_heads(x):
    b, d = x.shape
    return x.reshape(b, 2, d // 2).transpose(0, 1)


@corpus((4, 6), frames=1)
def chunk_then_index(x):
    return x.chunk(2, dim=1)[1]


@corpus((5, 4), frames=1)
def split_sizes_list(x):
    a, b = x.split([1, 4], dim=0)
    return b - a


@corpus((4, 4), frames=1)
def triu_causal_mask_fill(x):
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
    return x.masked_fill(mask, float("-inf")).softmax(-1)


@corpus((1, 2, 8, 8), frames=1)
def crop_borders_like_unpad(x):
    return x[:, :, 1:-1, 2:-2]


@corpus((4, 4), frames=1)
def index_with_loop_variable(x):
    return torch.stack([x[i, i] for i in range(4)])


@corpus((3, 4), frames=1)
def unsqueeze_squeeze_expand(x):
    y = x.unsqueeze(0).expand(2, 3, 4)
    return y.sum(0).squeeze()


@corpus((2, 3, 4), frames=1)
def mixed_int_slice_none_ellipsis(x):
    return x[1, ..., None, 1:3]


@corpus((5,), frames=1)
def negative_slice_bounds(x):
    return x[-3:-1] + x[:-3].sum()


@corpus((3, 4), lambda: torch.tensor([True, False, True]), frames=1)
def boolean_mask_via_where(x, keep):
    return torch.where(keep[:, None], x, x.new_zeros(()))


@corpus((6, 2), frames=1)
def view_as_and_view_dtype_shape(x):
    y = torch.arange(12.0).view_as(x)
    return x + y


@corpus((3, 4), frames=1)
def size_with_negative_dim(x):
    return x.new_ones(x.size(-2), x.size(-1)) @ x.T


@corpus(lambda: torch.arange(24.0).view(2, 3, 4), frames=1)
def tensor_scalar_index_from_arange(x):
    i = torch.tensor(1)
    return x[i], x[:, i]


@corpus((10, 4), lambda: torch.tensor([[1, 2], [3, 9]]), frames=1)
def embedding_style_two_dim_index(table, ids):
    return table[ids].mean(1)


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
