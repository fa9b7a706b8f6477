"""Graph breaks in frames with free variables (closures, methods that call super()): the frame
is split at the break, its resume function runs over the frame's own cells, and every value read
or written through a cell is the one eager Python sees. Each result is compared with eager."""
import pytest
import torch

import kiln
from kiln.testing import CompileCounter


def _opaque(x):
    print("a graph break")  # print is a graph break
    return x


def test_a_closure_breaks_into_graphs_instead_of_running_eagerly():
    scale = torch.randn(5)

    def fn(x):
        x = torch.sin(x) * scale
        x = _opaque(x)
        return torch.cos(x) + scale

    cnt = CompileCounter()
    x = torch.randn(5)
    torch.testing.assert_close(kiln.optimize(cnt)(fn)(x), fn(x))
    assert cnt.frame_count == 2


def _make_counter_fn():
    count = 1

    def bump():
        nonlocal count
        print("a graph break inside the call")  # so the call runs at the break
        count += 10

    def fn(x):
        y = x * count  # the cell read before the break
        bump()  # a call that writes the cell: the graph breaks here
        return y + count  # and read again after it, in the resume function

    return fn, lambda: count


def test_a_cell_written_at_the_break_is_read_anew_after_it():
    eager, eager_count = _make_counter_fn()
    compiled, compiled_count = _make_counter_fn()
    cnt = CompileCounter()
    opt = kiln.optimize(cnt)(compiled)
    for i in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(opt(x), eager(x))
        assert compiled_count() == eager_count() == 1 + 10 * (i + 1)
    assert cnt.frame_count == 6  # both halves, for each value of the cell (guarded)


def test_two_closures_of_one_code_each_read_their_own_cells():
    def make(k):
        factor = torch.full((3,), float(k))

        def fn(x):
            y = x + factor
            _opaque(y)
            return y * factor

        return fn

    cnt = CompileCounter()
    f2, f3 = kiln.optimize(cnt)(make(2)), kiln.optimize(cnt)(make(3))
    x = torch.randn(3)
    torch.testing.assert_close(f2(x), (x + 2) * 2)
    torch.testing.assert_close(f3(x), (x + 3) * 3)
    torch.testing.assert_close(f2(x), (x + 2) * 2)


def test_two_breaks_in_a_closure_resume_twice_over_the_same_cells():
    bias = torch.ones(2)

    def fn(x):
        x = x + bias
        _opaque(x)
        x = x * 2 + bias
        _opaque(x)
        return x - bias

    cnt = CompileCounter()
    opt = kiln.optimize(cnt)(fn)
    x = torch.randn(2)
    want = (x + 1) * 2 + 1 - 1
    torch.testing.assert_close(opt(x), want)
    assert cnt.frame_count == 3


class _Base(torch.nn.Module):
    def forward(self, x):
        return x.relu()


class _Child(_Base):
    def forward(self, x):  # super() makes __class__ a free variable of this code
        y = super().forward(x) * 3
        _opaque(y)
        return super().forward(y - 1) + x


def test_a_method_that_calls_super_breaks_into_graphs():
    m = _Child()
    cnt = CompileCounter()
    opt = kiln.compile(m, backend=cnt)
    x = torch.randn(6)
    torch.testing.assert_close(opt(x), m(x))
    assert cnt.frame_count == 2


def test_a_closure_broken_on_a_data_dependent_branch_takes_both_ways():
    threshold = torch.tensor(0.0)

    def fn(x):
        if (x.sum() > threshold).item():
            return x * 2 + threshold
        return x - 1 + threshold

    cnt = CompileCounter()
    opt = kiln.optimize(cnt)(fn)
    for sign in (1, -1, 1):
        x = torch.rand(4) * sign
        torch.testing.assert_close(opt(x), fn(x))
    assert cnt.frame_count == 3  # the condition, and each way


def test_the_kiln_backend_compiles_both_halves_of_a_broken_closure(kilnd_cache):
    w = torch.randn(8, 8)

    def fn(x):
        y = torch.tanh(x @ w)
        _opaque(y)
        return (y @ w).relu()

    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(fn)(x), fn(x), rtol=1e-4, atol=1e-4)


# Frames with cell variables (locals a nested function closes over; on CPython 3.11 a
# comprehension too): after the break, the resume function makes each one a cell again.

def _comprehensions_around_a_break(x, n):
    scale = x.sum()
    ys = [x * (i + scale) for i in range(n)]
    y = torch.stack(ys).sum(0)
    _opaque(y)
    zs = [y + scale * i for i in range(n)]
    return torch.stack(zs).mean(0)


def test_a_frame_whose_locals_a_comprehension_reads_breaks_into_graphs():
    cnt = CompileCounter()
    x = torch.randn(3)
    torch.testing.assert_close(kiln.optimize(cnt)(_comprehensions_around_a_break)(x, 3),
                               _comprehensions_around_a_break(x, 3))
    assert cnt.frame_count == 2


def _closure_made_after_the_break(x):
    y = x + 1
    _opaque(y)
    f = lambda: y * 2  # noqa: E731  (closes over the resume function's cell for y)
    y = y + 1  # rebinding the cell: f sees it
    return f()


def _cell_bound_only_after_the_break(x, flag: bool):
    _opaque(x)
    if flag:
        late = x * 3
    g = lambda: late  # noqa: E731
    return g() if flag else x


def _argument_that_is_a_cell(x, k):
    # x and k, arguments, are cells. h, made before the break, is still live after it: no
    # resume function may hold other cells than h's, so the frame runs eagerly (the capture
    # cannot rebuild h) and h's own frame is the one graph.
    h = lambda: x * k  # noqa: E731
    first = h()
    _opaque(first)
    x = x + 1
    return h() + first


@pytest.mark.parametrize("fn,args,graphs", [
    (_closure_made_after_the_break, (torch.randn(4),), 2),
    (_cell_bound_only_after_the_break, (torch.randn(4), True), 1),  # nothing before the break
    (_cell_bound_only_after_the_break, (torch.randn(4), False), 0),  # no op at all
    (_argument_that_is_a_cell, (torch.randn(4), 3), 1),
])
def test_cells_of_a_resumed_frame_hold_what_eager_python_sees(fn, args, graphs):
    cnt = CompileCounter()
    torch.testing.assert_close(kiln.optimize(cnt)(fn)(*args), fn(*args))
    assert cnt.frame_count == graphs


# `nonlocal` assignments: pending stores of the cell, read back by the trace and replayed after
# the graph into the running frame's own cell (each closure of one code has its own).

def _make_accumulator():
    total = torch.zeros(3)
    calls = 0

    def step(x):
        nonlocal total, calls
        calls += 1
        total = total + x * calls
        _opaque(total)  # a break after the stores: the resume function reads them
        return total * 2

    return step, lambda: (total, calls)


def test_nonlocal_assignments_land_in_each_closure_s_own_cells():
    eager, eager_state = _make_accumulator()
    one, one_state = _make_accumulator()
    two, two_state = _make_accumulator()
    cnt = CompileCounter()
    opt_one, opt_two = kiln.optimize(cnt)(one), kiln.optimize(cnt)(two)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(opt_one(x), eager(x))
        torch.testing.assert_close(one_state()[0], eager_state()[0])
        assert one_state()[1] == eager_state()[1]
    torch.testing.assert_close(opt_two(torch.ones(3)), torch.full((3,), 2.0))
    assert two_state()[1] == 1 and one_state()[1] == 3  # the other closure's cells untouched
    assert cnt.frame_count >= 2  # each count a guard value; both halves of the break


def _counter():
    n = 0

    def bump(v):
        nonlocal n
        n += 1
        return v + n

    return bump, lambda: n


_BUMP, _BUMPED = _counter()


def _calls_bump(x):
    return _BUMP(x) * 2


def test_an_inlined_function_s_nonlocal_assignment_is_replayed_into_its_cell():
    cnt = CompileCounter()
    opt = kiln.optimize(cnt)(_calls_bump)
    torch.testing.assert_close(opt(torch.zeros(2)), torch.full((2,), 2.0))
    assert _BUMPED() == 1
    torch.testing.assert_close(opt(torch.zeros(2)), torch.full((2,), 4.0))
    assert _BUMPED() == 2
    assert cnt.frame_count == 2  # one graph per value of n: no break, no eager frame


# Functions the frame makes and hands out: made again after the graph over the right cells.

def _adder(x):
    y = x * 2
    return lambda z: z + y


def _getter_and_setter(x):
    n = x + 1

    def get():
        return n

    def put(v):
        nonlocal n
        n = v

    return get, put


def _factorial_maker(x):
    def fact(k):  # closes over its own cell
        return 1 if k <= 1 else k * fact(k - 1)

    return fact, x + 1


def _annotated(x):
    def h(a: int) -> int:
        return a

    return h, x * 2


def test_a_function_the_frame_returns_is_made_again_over_its_own_cells():
    cnt = CompileCounter()
    add = kiln.optimize(cnt)(_adder)(torch.ones(2))
    torch.testing.assert_close(add(torch.ones(2)), torch.full((2,), 3.0))
    assert cnt.frame_count == 1  # captured, not run eagerly
    get, put = kiln.optimize(CompileCounter())(_getter_and_setter)(torch.zeros(2))
    torch.testing.assert_close(get(), torch.ones(2))
    put(torch.full((2,), 7.0))  # one cell for both, as eager makes it
    torch.testing.assert_close(get(), torch.full((2,), 7.0))
    fact, _ = kiln.optimize(CompileCounter())(_factorial_maker)(torch.ones(1))
    assert fact(5) == 120
    for made in (_getter_and_setter, _factorial_maker):
        assert kiln.debug.cache_entries(made.__code__)  # captured, not run eagerly
    h, _ = kiln.optimize(CompileCounter())(_annotated)(torch.ones(1))
    assert h.__annotations__ == {"a": int, "return": int}  # rebuilt with its annotations
    assert kiln.debug.cache_entries(_annotated.__code__)


def test_a_returned_function_over_the_frame_s_free_variable_sees_it_rebound_later():
    k = torch.ones(1) * 3

    def make(x):
        x = x * 1  # an op: the frame has a graph, and its entry rebuilds the lambda
        return lambda: x * k  # x: make's own cell; k: the enclosing function's

    cnt = CompileCounter()
    fn = kiln.optimize(cnt)(make)(torch.ones(1) * 2)
    torch.testing.assert_close(fn(), torch.tensor([6.0]))
    k = torch.ones(1) * 10  # noqa: F841  (read through the cell by fn)
    torch.testing.assert_close(fn(), torch.tensor([20.0]))
    assert kiln.debug.cache_entries(make.__code__)  # captured, not eager


def _made_before_a_break(x):
    scale = x * 2

    def times(v):
        return v * scale

    _opaque(scale)  # the function over the frame's cell outlives this break
    return times(x)


def test_a_function_over_the_frame_s_cell_alive_at_a_break_runs_the_frame_eagerly():
    x = torch.randn(3)
    torch.testing.assert_close(kiln.optimize(CompileCounter())(_made_before_a_break)(x),
                               x * x * 2)
    assert not kiln.debug.cache_entries(_made_before_a_break.__code__)


_V0 = torch.randn(10)


def _three_levels():
    v1 = torch.randn(10)

    def fn2(*args, **kwargs):
        v2 = torch.randn(10) + args[0] + kwargs["b"]

        def fn3(v3=torch.randn(10)):
            def fn4():  # over a global, and cells of three executors
                return _V0 + v1 + v2 + v3 + 1

            return fn4

        return fn3

    return fn2(1, b=2)()


def _factory_with_a_cell():
    k = torch.ones(1)

    def make(x):
        return lambda: x + k  # k: make's free variable, a real cell of _factory_with_a_cell

    return make, lambda: k


_MAKE, _K = _factory_with_a_cell()


def _calls_the_factory(x):
    return _MAKE(x * 2)  # inlined: its lambda is made over make's own cell


def test_functions_made_in_inlined_calls_are_made_again_over_the_cells_they_close_over():
    cnt = CompileCounter()
    torch.manual_seed(0)
    got = kiln.optimize(cnt, nopython=True)(_three_levels)()
    torch.manual_seed(0)
    want = _three_levels()
    torch.testing.assert_close(got(), want())
    assert cnt.frame_count == 1
    lam = kiln.optimize(CompileCounter())(_calls_the_factory)(torch.ones(1))
    torch.testing.assert_close(lam(), torch.tensor([3.0]))
    assert lam.__closure__[1] is _MAKE.__closure__[0] or lam.__closure__[0] is \
        _MAKE.__closure__[0]  # the factory's very cell, shared with it
