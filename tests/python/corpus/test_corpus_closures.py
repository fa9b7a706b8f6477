"""Closures: functions closing over outer values, inner functions that capture the compiled
frame's locals (cell variables), late binding in loops, decorators. A graph break in a frame
with cell variables runs that whole frame eagerly (its callees are still captured)."""
import functools

import pytest
import torch

from .harness import Corpus, t

corpus = Corpus()


def _make_scaler(s):
    def scale(x):
        return x * s
    return scale


_triple = _make_scaler(3.0)


@corpus((3,), frames=1)
def closure_over_float(x):
    return _triple(x) + 1


def _make_bias(b):
    return lambda x: x + b


_add_bias = _make_bias(torch.arange(3.0))


@corpus((3,), frames=1)
def closure_over_tensor(x):
    return _add_bias(x) * 2


def _make_counter_fn():
    count = 0

    def step(x):
        nonlocal count
        count += 1
        return x * count

    return step


@corpus((3,), frames=1)
def inner_function_captures_local(x):
    factor = 2.0

    def scaled(v):
        return v * factor

    return scaled(x) + scaled(x + 1)


@corpus((3,), frames=1)
def inner_function_captures_tensor_local(x):
    base = x.exp()

    def shifted(v):
        return v - base

    return shifted(x), shifted(x * 2)


@corpus((3,), frames=1)
def nested_closure_two_levels(x):
    a = 2.0

    def outer(v):
        b = 3.0

        def inner(w):
            return w * a + b

        return inner(v)

    return outer(x)


@corpus((3,), frames=1)
def nonlocal_counter_in_inner_function(x):
    n = 0

    def bump(v):
        nonlocal n
        n += 1
        return v + n

    y = bump(x)
    y = bump(y)
    return y * n


@corpus((3,), frames=1)
def lambdas_late_binding_in_loop(x):
    fns = [lambda v: v * i for i in range(3)]
    return [f(x) for f in fns]


@corpus((3,), frames=1)
def lambdas_default_argument_binding(x):
    fns = [lambda v, i=i: v * i for i in range(3)]
    return [f(x) for f in fns]


@corpus((3,), frames=1)
def closure_returned_from_inner_factory(x):
    def make(p):
        return lambda v: v ** p

    square, cube = make(2), make(3)
    return square(x) + cube(x)


def _log_calls(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * 1.0
    return wrapper


@_log_calls
def _decorated(x, shift=0.0):
    return x.relu() + shift


@corpus((3,), frames=1)
def decorated_helper_with_wraps(x):
    return _decorated(x, shift=1.0)


@corpus((3,), frames=1)
def global_closure_factory_called_in_frame(x):
    f = _make_scaler(0.5)
    return f(x)


@corpus((3,), frames=1)
def closure_over_module(x):
    lin = _LIN

    def apply(v):
        return lin(v).relu()

    return apply(x)


_LIN = torch.nn.Linear(3, 3)


@corpus((3,), frames=1)
def closure_mutating_captured_list(x):
    outs = []

    def record(v):
        outs.append(v * 2)

    record(x)
    record(x + 1)
    return torch.stack(outs)


@corpus((3,), frames=1)
def closure_capturing_loop_accumulator(x):
    total = x

    def add(v):
        return total + v

    for _ in range(2):
        total = add(x)
    return total


@corpus((3,), frames=1)
def closure_reads_argument_of_compiled_frame(x):
    def use():
        return x.sin()

    return use() * 2


# Breaks in a frame with cell variables: the frame runs eagerly, its callees are captured.


@corpus((3,), frames=1, breaks=1)
def print_in_frame_with_inner_function(x):
    k = 3.0

    def mul(v):
        return v * k

    print("corpus: closure frame")
    return mul(x)


# The caller runs eagerly (`add`, made before the break, is live after it); `add`, run as its
# own frame, assigns its free variable: a store replayed into its cell (no tensor op: no graph).
@corpus((3,), frames=0, breaks=1)
def item_in_frame_with_nonlocal(x):
    acc = 0.0

    def add(v):
        nonlocal acc
        acc += v

    add(x.sum().item())
    return x * acc


# On CPython 3.11 `y` is read by the comprehension, so it is a cell variable: the resume
# function after the print makes it a cell again, and the comprehension is inlined there.
@corpus((4,), frames=2, breaks=1)
def comprehension_capturing_local_makes_it_a_cell(x):
    y = x * 2
    print("corpus: comprehension capture")
    return [y[i] for i in range(2)]


@corpus(lambda: torch.ones(3), frames=1, breaks=1)
def tensor_branch_in_frame_with_closure(x):
    s = 2.0

    def f(v):
        return v * s

    if x.sum() > 0:
        return f(x)
    return x


# A break in a closure called from the root is a break at the call; the closure (a function
# with free variables) then runs as its own frame, which breaks too: its resume function runs
# over the closure's own cells.

def _make_printing(s):
    def fn(v):
        w = v * s
        print("corpus: printing closure")
        return w + 1
    return fn


_printing = _make_printing(2.0)


@corpus((3,), frames=4, breaks=2)
def break_inside_called_closure(x):
    a = x.cos()
    b = _printing(a)
    return b.sin()


@corpus((3,), frames=1)
def partial_of_user_function(x):
    f = functools.partial(_partial_target, scale=3.0)
    return f(x)


def _partial_target(x, scale):
    return x * scale


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
