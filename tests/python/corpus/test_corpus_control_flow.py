"""Control flow decided at trace time: branches on shapes, dtypes, None and constants, loops
over ranges and containers (unrolled), while loops with constant conditions, try/with blocks
that do not break. Each is one graph."""
import pytest
import torch
import torch.nn.functional as F

from .harness import Corpus, t

corpus = Corpus()


@corpus((3, 4), frames=1)
def if_on_ndim(x):
    if x.dim() == 2:
        return x.sum(-1)
    return x.sum()


@corpus((5, 2), frames=1)
def if_elif_else_on_leading_size(x):
    if x.shape[0] > 8:
        y = x * 3
    elif x.shape[0] > 4:
        y = x * 2
    else:
        y = x
    return y + 1


@corpus((4,), frames=1)
def if_on_dtype(x):
    if x.dtype == torch.float32:
        x = x.double()
    return x * 2


@corpus((4,), None, frames=1)
def optional_bias_absent(x, bias):
    y = x * 2
    if bias is not None:
        y = y + bias
    return y


@corpus((4,), (4,), frames=1)
def optional_bias_present(x, bias):
    y = x * 2
    if bias is None:
        return y
    return y + bias


@corpus((4, 4), frames=1)
def for_range_accumulates(x):
    acc = torch.zeros_like(x)
    for i in range(4):
        acc = acc + x * i
    return acc


@corpus(lambda: [t(3), t(3), t(3)], frames=1)
def for_over_list_argument(xs):
    total = xs[0]
    for v in xs[1:]:
        total = total * v
    return total


@corpus((2, 3), frames=1)
def nested_range_loops(x):
    out = x
    for i in range(2):
        for j in range(3):
            out = out + x[i, j]
    return out


@corpus((3,), frames=1)
def while_counter_loop(x):
    i = 0
    while i < 5:
        x = x * 0.9 + i
        i += 1
    return x


@corpus((6,), frames=1)
def for_with_break_and_continue(x):
    out = x
    for i in range(10):
        if i % 2 == 1:
            continue
        if i > 6:
            break
        out = out + i
    return out


@corpus((4,), frames=1)
def early_return_inside_loop(x):
    for i in range(5):
        x = x + 1
        if i == 2:
            return x * 10
    return x


@corpus((4, 4), frames=1)
def ternary_on_shape(x):
    scale = 0.5 if x.size(-1) == 4 else 2.0
    return x * scale


@corpus((3, 8), frames=1)
def boolean_operators_on_constants(x):
    n, d = x.shape
    if n > 1 and d % 2 == 0 and not n > d:
        return x.view(n, 2, d // 2)
    return x


@corpus((6,), frames=1)
def chained_comparison_on_size(x):
    if 0 < x.numel() <= 8:
        return x.softmax(0)
    return x


@corpus((4,), frames=1)
def for_else_runs_else(x):
    for i in range(3):
        if i == 5:
            break
        x = x - i
    else:
        x = x * 100
    return x


@corpus((4,), "gelu", frames=1)
def string_mode_if_chain(x, mode):
    if mode == "relu":
        return F.relu(x)
    elif mode == "gelu":
        return F.gelu(x)
    return x


@corpus((4,), "silu", frames=1)
def match_statement_on_string(x, act):
    match act:
        case "relu":
            return x.relu()
        case "silu" | "swish":
            return F.silu(x)
        case _:
            return x


@corpus((5,), frames=1)
def try_except_without_exception(x):
    try:
        y = x + 1
    except RuntimeError:
        y = x - 1
    return y * 2


@corpus((5,), frames=1)
def try_finally_without_exception(x):
    out = x
    try:
        out = out.exp()
    finally:
        out = out + 1
    return out


@corpus(lambda: torch.randn(3, 3, requires_grad=True), frames=1)
def no_grad_block_in_middle(x):
    y = x * 2
    with torch.no_grad():
        z = y * 3
    return y + z


@corpus((3, 4), frames=1)
def assert_on_shape_passes(x):
    assert x.shape[-1] == 4, "expected 4 features"
    return x.mean(-1)


@corpus((3,), frames=1)
def raise_in_branch_not_taken(x):
    if x.ndim != 1:
        raise ValueError("expected a vector")
    return x.cumsum(0)


@corpus((8,), frames=1)
def reversed_range_with_step(x):
    for i in reversed(range(0, 8, 3)):
        x = x.roll(i)
    return x


@corpus(lambda: [t(2), t(2)], lambda: [t(2), t(2)], frames=1)
def zip_two_lists(xs, ys):
    out = []
    for a, b in zip(xs, ys):
        out.append(a * b)
    return out


@corpus(lambda: {"a": t(3), "b": t(3)}, frames=1)
def dict_items_loop(d):
    total = 0
    for key, value in d.items():
        total = total + value * len(key)
    return total


@corpus(lambda: [t(4), t(4), t(4)], frames=1)
def enumerate_weights_by_position(xs):
    out = torch.zeros(4)
    for i, v in enumerate(xs, start=1):
        out += v / i
    return out


@corpus((2, 3), frames=1)
def while_true_with_constant_break(x):
    steps = 0
    while True:
        x = x @ torch.ones(3, 3) / 3
        steps += 1
        if steps == 3:
            break
    return x


@corpus((4,), 3, frames=1)
def loop_count_from_int_argument(x, n):
    for _ in range(n):
        x = torch.sin(x)
    return x


@corpus((4,), True, frames=1)
def bool_flag_argument(x, normalize):
    if normalize:
        x = x / x.norm()
    return x


@corpus((4,), frames=1)
def nested_if_in_loop(x):
    for i in range(4):
        if i < 2:
            if i == 0:
                x = x + 1
            else:
                x = x * 2
        else:
            x = x - 1
    return x


@corpus((2, 4), frames=1)
def with_enable_grad_inside_no_grad_caller(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
        z = x + 1
    return y, z


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
