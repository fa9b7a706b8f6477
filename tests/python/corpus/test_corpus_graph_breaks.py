"""Graph breaks at the root frame: an untraceable call or a branch on a tensor's value ends the
graph, the instruction runs in Python and the rest of the frame is captured again."""
import logging
import math
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import Corpus

corpus = Corpus()
log = logging.getLogger("kiln.corpus")


@corpus((4, 4), frames=2, breaks=1, fullgraph_raises=True)
def print_between_two_ops(x):
    y = torch.relu(x) + 1
    print("corpus: between")
    return y * 2


@corpus((4,), frames=1, breaks=1)
def print_first_then_ops(x):
    print("corpus: first")
    return x.sin().cos()


@corpus((4,), frames=1, breaks=1)
def ops_then_print_last(x):
    y = x.exp()
    print("corpus: last")
    return y


@corpus((3, 3), frames=3, breaks=2)
def two_prints_three_graphs(x):
    a = x @ x
    print("corpus: one")
    b = a.tanh()
    print("corpus: two")
    return b - a




@corpus((5,), frames=2, breaks=1)
def logging_call_between_ops(x):
    h = x * 3
    log.debug("corpus: %s", "hidden")
    return h.sigmoid()


@corpus((4,), frames=2, breaks=1, fullgraph_raises=True)
def item_then_more_ops(x):
    s = x.sum() * 2
    v = s.item()
    return x + v


@corpus((6,), frames=2, breaks=1)
def tolist_then_tensor_ops(x):
    y = x.abs()
    vals = y.tolist()
    return y * len(vals)


@corpus((3, 4), frames=2)
def numpy_roundtrip_between_ops(x):
    y = x * 2
    z = torch.from_numpy(np.tanh(y.numpy()))
    return z + 1


@corpus((8,), frames=3, breaks=1, sets=[[lambda: torch.ones(8)], [lambda: -torch.ones(8)]])
def branch_on_tensor_sum_both_ways(x):
    y = x * 2
    if y.sum() > 0:
        y = y + 1
    else:
        y = y - 1
    return y.relu()


@corpus(lambda: torch.ones(4), frames=2, breaks=1, fullgraph_raises=True)
def branch_on_tensor_value_returns_early(x):
    if x.mean() > 0:
        return x.cos()
    return x.sin()


@corpus((4,), frames=2, breaks=1)
def numpy_call_in_middle_result_unused_by_graph(x):
    y = x * 2
    arr = y.numpy()
    return y + 1


@corpus((4,), frames=1, breaks=2)
def ndarray_attribute_in_resume_runs_the_resume_eagerly(x):
    y = x * 2
    arr = y.numpy()
    return y + arr.shape[0]


@corpus((3, 5), frames=2)
def numpy_function_of_shape(x):
    y = x.relu()
    n = int(np.prod(y.shape))
    return y * n


def _print_then_ops(y):
    z = y + 1
    print("corpus: in callee")
    return z * 2


@corpus((4,), frames=4, breaks=2)
def callee_with_print_breaks_root_at_call(x):
    a = x.sin()
    b = _print_then_ops(a)
    return b.cos()


def _print_first(y):
    print("corpus: callee first")
    return y * 2


@corpus((4,), frames=3, breaks=2)
def callee_breaking_before_its_ops(x):
    a = x.sin()
    b = _print_first(a)
    return b.cos()


def _inner_h(z):
    e = z.exp()
    print("corpus: innermost")
    return e.log()


def _middle_g(y):
    c = y * 2
    d = _inner_h(c)
    return d * 3


@corpus((4,), frames=6, breaks=3)
def break_two_calls_deep(x):
    a = x + 1
    b = _middle_g(a)
    return b - 1


def _sign_fix(y):
    if y.max() > 0:
        return y
    return -y


@corpus(lambda: torch.ones(4), frames=3, breaks=2)
def tensor_branch_in_callee(x):
    a = x * 2
    b = _sign_fix(a)
    return b + 1


@corpus((4,), frames=0, breaks=1)
def break_inside_try_runs_frame_eagerly(x):
    y = x * 2
    try:
        print("corpus: in try")
        y = y + 1
    except ValueError:
        y = y - 1
    return y


@corpus((4,), frames=2, breaks=1)
def break_inside_no_grad_block_resumes_inside_the_block(x):
    y = x.exp()
    with torch.no_grad():
        v = y.sum().item()
    return y * v


@corpus((4,), frames=1, breaks=1)
def break_in_frame_with_a_live_closure_runs_eagerly_callee_captured(x):
    scale = 2.0

    def inner(v):
        return v * scale

    y = inner(x)
    print("corpus: closure frame")
    return inner(y) + 1


@corpus((4,), frames=2, breaks=1)
def break_in_frame_with_a_dead_closure_resumes_without_it(x):
    # `inner` is never read after the break: the resume function does not take it, so the
    # closure the capture cannot rebuild does not stop the frame from splitting.
    scale = 2.0

    def inner(v):
        return v * scale

    y = inner(x)
    print("corpus: closure frame")
    return y + 1


def _try_print(v):
    try:
        print("corpus: try in callee")
        y = v + 1
    finally:
        pass
    return y


@corpus((4,), frames=2, breaks=2)
def callee_that_runs_eagerly(x):
    a = x + 1
    b = _try_print(a)
    return b * 2


@corpus(lambda: torch.ones(3, 3), frames=2, breaks=1)
def bool_of_any(x):
    if x.any():
        return x * 2
    return x


@corpus(lambda: torch.ones(3), lambda: torch.ones(3), frames=3, breaks=2)
def two_tensor_conditions_joined_by_and(x, y):
    if (x > 0).all() and y.sum() > 0:
        return x + y
    return x - y


@corpus((5,), frames=2, breaks=1)
def int_of_tensor(x):
    y = x * 2
    n = int(y.abs().sum())
    return y + n


@corpus((4, 3), frames=2, breaks=1)
def loss_item_checked_with_math_isfinite(x):
    loss = (x ** 2).mean()
    value = loss.item()
    if math.isfinite(value):
        return loss * 2
    return loss


@corpus((4,), frames=1, breaks=1)
def print_of_shape_then_return_computed(x):
    y = x + 1
    print("corpus:", y.shape)
    return y


@corpus((6,), frames=2, breaks=1)
def item_used_as_python_float_in_branch(x):
    m = x.mean().item()
    y = x.abs()
    if m > 0:
        return y - m
    return y + m


@corpus((4,), frames=2, breaks=1)
def break_then_return_tuple(x):
    y = x.sin()
    print("corpus: tuple")
    return y, y.cos()


@corpus((4,), (4,), frames=2, breaks=1)
def many_live_locals_across_break(x, y):
    a = x + y
    b = x * y
    c = x - y
    print("corpus: live locals")
    return a + b + c


@corpus((3, 3), frames=1, breaks=2, xfail="kiln: a call of time.perf_counter (a C function) "
         "runs the whole frame eagerly instead of breaking the graph at the call")
def timing_calls_around_matmul(x):
    t0 = time.perf_counter()
    y = x @ x
    elapsed = time.perf_counter() - t0
    return y


# On CPython 3.11 `x` is captured by the list comprehension, so it is a cell variable: the
# resume function after the break at .tolist() makes it a cell again, holding the value it had.
@corpus(lambda: torch.tensor([2, 0, 1]), (3, 4), frames=1, breaks=1)
def tolist_indices_then_gather_rows(idx, x):
    rows = idx.tolist()
    return torch.stack([x[r] for r in rows])


class PrintInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        print("corpus: forward")
        return h.relu()


corpus((2, 4), frames=2, breaks=1, fullgraph_raises=True)(PrintInForward)


class _BreakingChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        print("corpus: child")
        return h.relu()


class SubmoduleBreaksParent(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.child = _BreakingChild()
        self.post = nn.Linear(4, 2)

    def forward(self, x):
        a = self.pre(x)
        b = self.child(a)
        return self.post(b)


corpus((3, 4), frames=4, breaks=2)(SubmoduleBreaksParent)


class NormClipBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.norm() > 1e3:
            x = x / x.norm()
        return self.lin(x)


corpus((2, 4), frames=2, breaks=1)(NormClipBranch)


class HelperMethodPrints(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def helper(self, y):
        print("corpus: helper")
        return y.relu()

    def forward(self, x):
        a = self.lin(x)
        b = self.helper(a)
        return b * 2


corpus((2, 4), frames=3, breaks=2)(HelperMethodPrints)


@corpus((4,), frames=2, breaks=1)
def tensor_condition_in_while_header_once(x):
    y = x * 2
    while y.sum() > 1e9:
        y = y / 2
    return y + 1


@corpus((2, 3), frames=2, breaks=1)
def logging_info_when_disabled(x):
    y = x.t()
    log.info("corpus: shape %s", tuple(y.shape))
    return y.contiguous() * 2


@corpus((4,), frames=2, breaks=1)
def print_with_kwargs_sep_end(x):
    y = x.neg()
    print("a", "b", sep="-", end="\n")
    return y.exp()


@corpus(lambda: torch.ones(3), frames=3, breaks=2)
def chained_comparison_on_tensor_in_if(x):
    s = x.sum()
    if 0 < s < 100:
        return x * 2
    return x


# A chained comparison as a value (not an `if`) jumps on the first comparison's tensor too
# (JUMP_IF_FALSE_OR_POP on 3.11): the graph breaks there.
@corpus(lambda: torch.ones(3), frames=2, breaks=1)
def chained_comparison_on_tensor_as_value(x):
    s = x.sum()
    return 0 < s < 5


@corpus(lambda: torch.ones(3), frames=2, breaks=1)
def tensor_and_expression_as_value(x):
    mask = (x > 0).all()
    chosen = mask and x * 2
    return chosen


# Breaks inside callees reached through different call shapes (keywords, *args, calls nested in
# expressions and literals): the root must resume with its value stack intact.


def _scaled_print(y, scale=1.0, *, shift=0.0):
    z = y * scale
    print("corpus: scaled")
    return z + shift


@corpus((3,), frames=4, breaks=2)
def callee_break_called_with_keywords(x):
    a = x.sin()
    return _scaled_print(a, scale=2.0, shift=1.0) * 3


@corpus((3,), frames=4, breaks=2)
def callee_break_called_with_star_args(x):
    args = (x.cos(), 3.0)
    kwargs = {"shift": 2.0}
    return _scaled_print(*args, **kwargs) - 1


@corpus((3,), frames=3, breaks=2)
def callee_break_inside_arithmetic_expression(x):
    return x + _scaled_print(x) * x.exp()


@corpus((3,), frames=4, breaks=2)
def callee_break_inside_list_literal(x):
    return [x, _scaled_print(x + 1), x * 2]


@corpus((3,), frames=4, breaks=2)
def callee_break_inside_dict_literal(x):
    return {"a": x, "b": _scaled_print(x + 1), "c": x * 2}


@corpus((3,), frames=2, breaks=2)
def callee_break_inside_conditional_expression(x):
    return _scaled_print(x) if x.dim() == 1 else x


def _print_then_pair(y):
    print("corpus: pair")
    return y + 1, y * 2


@corpus((3,), frames=2, breaks=2)
def callee_break_result_unpacked(x):
    a, b = _print_then_pair(x)
    return a * b


def _mutate_around_print(y):
    y.add_(1)
    print("corpus: mutate")
    y.mul_(3)


@corpus((3,), frames=3, breaks=2)
def callee_mutates_argument_around_its_break(x):
    _mutate_around_print(x)
    return x * 2


def _branch_with_k(y, k):
    if y.sum() > 0:
        return y * k
    return y - k


# Each call of the callee runs as its own frame; the second (k=3.0, the other direction) reuses
# its first graph (y.sum() > 0 reads no k: k is not guarded there) and compiles the other
# branch's resume function: 2 + 1 graphs and 1 break from the callee (the second call's break is
# its cached entry's), 2 graphs and 2 breaks at the root.
@corpus(lambda: torch.ones(3), frames=5, breaks=3)
def callee_tensor_branch_called_twice_with_keywords(x):
    return _branch_with_k(x, k=2.0) + _branch_with_k(-x, k=3.0)


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()


# Indexing by a boolean mask (BINARY_SUBSCR whose result's size is the data's): the graph breaks
# at the subscript, which runs in Python, and the frame goes on in a resume function.
@corpus((5, 4), (20, 4), frames=2, breaks=2)
def boolean_mask_indexing_breaks_at_the_subscript(scores, boxes):
    s = scores.flatten()
    keep = s > 0.5
    s = s[keep]
    b = boxes[keep]
    return s * 2, b + 1, s.sum()
