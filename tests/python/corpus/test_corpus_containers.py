"""Lists, tuples and dicts built, unpacked, mutated and returned inside one graph."""
import pytest
import torch

from .harness import Corpus, t

corpus = Corpus()


@corpus((4,), frames=1)
def return_tuple_of_results(x):
    return x.sin(), x.cos(), x.tan()


@corpus((4,), frames=1)
def return_dict_of_results(x):
    return {"mean": x.mean(), "std": x.std(), "n": x.numel()}


@corpus((4,), frames=1)
def return_list_with_python_values(x):
    return [x + 1, 3, "tag", None, (x * 2,)]


@corpus((6,), frames=1)
def unpack_chunk_into_names(x):
    a, b, c = x.chunk(3)
    return a * b + c


@corpus((8, 2), frames=1)
def star_unpack_split(x):
    first, *rest = x.split(2)
    return first, torch.cat(rest).sum(0)


@corpus(lambda: (t(3), t(3)), frames=1)
def tuple_argument_unpacked(pair):
    a, b = pair
    return a @ b


@corpus((4,), frames=1)
def list_append_then_stack(x):
    outs = []
    for k in range(1, 4):
        outs.append(x ** k)
    return torch.stack(outs, dim=0)


@corpus((3,), frames=1)
def list_extend_and_concatenate(x):
    parts = [x]
    parts.extend([x + 1, x + 2])
    parts = parts + [x * 0]
    return torch.cat(parts)


@corpus((5,), frames=1)
def python_list_slicing(x):
    layers = [x, x * 2, x * 3, x * 4, x * 5]
    return sum(v.sum() for v in layers[1:-1:2])


@corpus((4,), frames=1)
def tuple_concatenation_and_repeat(x):
    shape = (1,) + tuple(x.shape) + (1,)
    pad = (0,) * 2
    return x.reshape(shape), pad


@corpus(lambda: {"w": t(3), "b": t(3)}, frames=1)
def dict_get_with_default(params):
    w = params.get("w")
    scale = params.get("scale", 2.0)
    return w * scale + params["b"]


@corpus((3,), frames=1)
def dict_update_and_index(x):
    d = {"a": x}
    d.update(b=x * 2, c=x * 3)
    d["a"] = d["a"] + d["c"]
    return d


@corpus((2, 2), frames=1)
def nested_list_of_tuples(x):
    pairs = [(x, x.t()), (x * 2, x.t() * 2)]
    return [a @ b for a, b in pairs]


@corpus(lambda: {"x": t(3), "mask": t(3) > 0}, frames=1)
def dict_argument_batch(batch):
    x, mask = batch["x"], batch["mask"]
    return torch.where(mask, x, torch.zeros_like(x))


@corpus(lambda: [t(2, 3), t(2, 3)], (2, 3), frames=1)
def splat_list_into_cat(xs, y):
    return torch.cat([*xs, y], dim=0)


def _combine(a, b, c):
    return a * b - c


@corpus((3,), frames=1)
def call_with_star_args_list(x):
    args = [x, x + 1, x + 2]
    return _combine(*args)


@corpus((3,), frames=1)
def call_with_double_star_dict(x):
    kwargs = {"b": x * 2, "c": x}
    return _combine(x, **kwargs)


@corpus((3,), "b", frames=1)
def in_operator_on_list_of_strings(x, key):
    if key in ["a", "b"]:
        return x + 1
    return x


@corpus((3,), frames=1)
def list_pop_and_insert(x):
    stack = [x, x * 2, x * 3]
    top = stack.pop()
    stack.insert(0, top)
    return stack[0] - stack[-1]


@corpus((3,), frames=1)
def list_index_lookup(x):
    names = ["q", "k", "v"]
    return x * names.index("v")


@corpus((4, 3), frames=1)
def dict_constructor_and_keys(x):
    d = dict(rows=x.shape[0], cols=x.shape[1])
    total = 0
    for k in d.keys():
        total += d[k]
    return x * total


@corpus((3,), frames=1)
def tuple_from_list_and_list_from_range(x):
    idx = list(range(3))
    shape = tuple([1, 3])
    return x[idx].view(shape)


@corpus((3,), frames=1)
def reversed_list_iteration(x):
    fs = [x, x + 1, x + 2]
    out = x
    for v in reversed(fs):
        out = out * 2 + v
    return out


@corpus((3,), frames=1)
def reversed_list_grows_while_iterated(x):
    # A tape walked backwards while its entries append to it: eager's reverse iterator reads
    # the list live and never reaches what was appended.
    tape = [x, x + 1]
    out = x
    for v in reversed(tape):
        tape.append(v * 2)
        out = out * 2 + v
    return out, tape


@corpus((3,), frames=1, breaks=1)
def reversed_list_item_replaced_across_a_break(x):
    # The loop goes on in a resume function (which runs it in Python): the item replaced there
    # before the iterator gets to it is the one it yields.
    fs = [x, x + 1, x + 2]
    outs = []
    for v in reversed(fs):
        print("corpus: reversed")
        fs[0] = v * 10
        outs.append(v)
    return outs


@corpus((3,), frames=1)
def swap_via_tuple_assignment(x):
    a, b = x, x * 2
    for _ in range(3):
        a, b = b, a + b
    return a, b


@corpus((2, 4), frames=1)
def unpack_shape(x):
    batch, features = x.shape
    return x.reshape(features, batch)


@corpus((4,), frames=1)
def nested_unpacking(x):
    (a, b), c = (x, x + 1), x + 2
    return a + b * c


@corpus((3,), frames=1)
def dict_items_sorted_keys_build(x):
    scales = {"b": 2.0, "a": 1.0}
    out = {}
    for k in sorted(scales):
        out[k] = x * scales[k]
    return out


@corpus((3,), frames=1)
def dict_pop_with_default(x):
    cfg = {"alpha": 0.5, "beta": 2.0}
    alpha = cfg.pop("alpha")
    gamma = cfg.pop("gamma", 1.0)
    return x * alpha + gamma + len(cfg)


@corpus((2, 3), frames=1)
def list_of_shapes_compare(x):
    shapes = [tuple(x.shape), (2, 3)]
    if shapes[0] == shapes[1]:
        return x + 1
    return x


@corpus((3,), frames=1)
def list_multiplication_init(x):
    hidden = [x] * 3
    hidden[1] = hidden[1] * 5
    return hidden


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()


def test_reverse_list_iterator_outliving_the_graph_goes_on_over_the_list():
    import kiln

    def f(x, lst):
        it = reversed(lst)
        first = next(it)
        lst[0] = x * 10
        return first + 1, it

    x = torch.randn(3)
    assert kiln.explain(f)(x, [x, x]).graph_break_count == 0
    lst = [x, x + 1, x + 2]
    first, it = kiln.compile(f, backend="eager")(x, lst)
    assert type(it) is type(reversed([]))
    lst[1] = x * 5  # read live, as eager's iterator reads it
    rest = list(it)
    assert len(rest) == 2 and rest[0] is lst[1] and rest[1] is lst[0]
    torch.testing.assert_close(first, x + 3)
