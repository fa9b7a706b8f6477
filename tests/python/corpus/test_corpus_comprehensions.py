"""List, dict and set comprehensions and generator expressions (each runs as a nested
function in 3.11), captured inline into the caller's single graph."""
import pytest
import torch
import torch.nn as nn

from .harness import Corpus, t

corpus = Corpus()


@corpus((3,), frames=1)
def list_comp_over_range(x):
    return torch.stack([x * i for i in range(4)])


@corpus(lambda: [t(2), t(2), t(2)], frames=1)
def list_comp_over_argument_list(xs):
    return [v.relu() for v in xs]


@corpus((3,), frames=1)
def list_comp_with_constant_condition(x):
    return torch.cat([x + i for i in range(6) if i % 2 == 0])


@corpus((2, 2), frames=1)
def nested_list_comp(x):
    grid = [[x * i + j for j in range(2)] for i in range(2)]
    return torch.stack([torch.stack(row) for row in grid])


@corpus((3,), frames=1)
def dict_comp_of_powers(x):
    return {f"p{k}": x ** k for k in range(1, 4)}


@corpus((3,), frames=1)
def set_comp_of_shapes(x):
    dims = {d * 2 for d in (1, 2, 2, 3)}
    return x * len(dims)


@corpus(lambda: [t(3), t(3)], frames=1)
def generator_into_tuple_for_cat(xs):
    return torch.cat(tuple(v * 2 for v in xs))


@corpus(lambda: [t(3), t(3), t(3)], frames=1)
def generator_into_sum(xs):
    return sum(v.pow(2).sum() for v in xs)


@corpus((2, 3, 4), frames=1)
def any_all_over_shape_generators(x):
    if any(s > 3 for s in x.shape) and all(s > 1 for s in x.shape):
        return x.mean(-1)
    return x


@corpus(lambda: [t(2), t(2)], lambda: [t(2), t(2)], frames=1)
def comp_over_zip(xs, ys):
    return [a @ b for a, b in zip(xs, ys)]


@corpus(lambda: [t(3), t(3), t(3)], frames=1)
def comp_over_enumerate(xs):
    return torch.stack([v * i for i, v in enumerate(xs)]).sum(0)


@corpus(lambda: {"a": t(2), "b": t(2)}, frames=1)
def dict_comp_over_items_transforming_values(d):
    return {k: v.exp() for k, v in d.items()}


@corpus((3,), frames=1)
def comp_referencing_local_without_break(x):
    scale = x.abs() + 1
    return [scale * i for i in range(3)]


@corpus((4, 4), frames=1)
def comp_over_tensor_rows_by_index(x):
    return torch.stack([x[i].sum() for i in range(x.shape[0])])


@corpus((3,), frames=1)
def comp_calling_user_function(x):
    return [_poly(x, d) for d in (1, 2, 3)]


def _poly(x, d):
    return x ** d + d


_HEADS = nn.ModuleList([nn.Linear(3, 2) for _ in range(3)])


@corpus((4, 3), frames=1)
def comp_over_module_list(x):
    return torch.cat([h(x) for h in _HEADS], dim=-1)


@corpus((3,), frames=1)
def comp_with_tuple_targets_and_filter(x):
    pairs = [(1, 0.5), (2, 0.0), (3, 2.0)]
    return [x * a + b for a, b in pairs if b != 0.0]


@corpus((6,), frames=1)
def comp_over_split_chunks(x):
    return [c.sum() for c in x.split(2)]


@corpus((3,), frames=1)
def dict_from_generator_of_pairs(x):
    return dict((name, x * i) for i, name in enumerate(["a", "b"]))


@corpus((2, 3), frames=1)
def list_of_sizes_comp(x):
    sizes = [x.size(d) for d in range(x.dim())]
    return x.reshape(sizes[::-1])


@corpus((3,), frames=1)
def max_over_generator_of_ints(x):
    widest = max(len(name) for name in ("q", "key", "value"))
    return x * widest


@corpus((3,), frames=1)
def nested_generator_flatten(x):
    groups = [[x, x + 1], [x + 2]]
    return torch.stack([v for g in groups for v in g])


@corpus((3,), frames=1)
def comp_with_walrus(x):
    return [y for i in range(3) if (y := x * i) is not None]


@corpus((3,), frames=1)
def sorted_over_generator(x):
    keys = sorted(k for k in {"b": 1, "a": 2})
    return {k: x * len(k) for k in keys}


@corpus(lambda: [t(3), t(3)], frames=1)
def list_comp_in_return_tuple(xs):
    return tuple([v.sin() for v in xs]), len(xs)


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
