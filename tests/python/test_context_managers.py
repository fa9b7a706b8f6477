"""`with` blocks inside the captured frame: contextlib.nullcontext, a user's class with Python
__enter__/__exit__ (inlined, its state kept as eager keeps it), and torch.autocast recorded into
the graph (torch.amp._enter_autocast/_exit_autocast nodes), which runs right with the "eager"
and "aot_eager" backends and gives eager's dtypes. Each was a graph break or an eager frame."""
import contextlib
import warnings

import pytest
import torch

import kiln
from kiln.backends.registry import lookup_backend
from kiln.testing import CompileCounter


def compiled(fn, backend=None):
    """`fn` compiled, and a CompileCounter of its graphs (which `backend`, a registered name,
    then compiles)."""
    cnt = CompileCounter()

    def counted(gm, example_inputs):
        cnt(gm, example_inputs)
        return lookup_backend(backend)(gm, example_inputs) if backend else gm.forward

    return kiln.optimize(counted)(fn), cnt


def assert_one_graph_no_break(fn, *args):
    out = kiln.explain(fn)(*args)
    assert out.graph_break_count == 0, [str(r) for r in out.break_reasons]
    assert out.graph_count == 1
    return out


def scaled(x, scale):
    with contextlib.nullcontext(x * scale) as y:  # enters to its argument
        z = y + 1
    return z


def test_nullcontext_enters_to_its_argument_in_one_graph():
    x = torch.randn(4)
    fn, cnt = compiled(scaled)
    torch.testing.assert_close(fn(x, 3), scaled(x, 3))
    assert cnt.frame_count == 1
    assert_one_graph_no_break(scaled, x, 3)


class Depth:
    """A context manager with state: how deep, how often entered."""

    def __init__(self):
        self.depth = 0
        self.entered = 0

    def __enter__(self):
        self.depth += 1
        self.entered += 1
        return self

    def __exit__(self, exc_type, exc, tb):
        self.depth -= 1
        return False


def in_tracker(x, tracker):
    with tracker as t:
        y = x * (t.depth + 1)
        with tracker:
            y = y + t.depth
    return y + tracker.depth


def test_a_user_context_manager_from_outside_keeps_its_state_as_eager():
    x = torch.randn(4)
    eager_tracker, tracker = Depth(), Depth()
    fn, cnt = compiled(in_tracker)
    for _ in range(2):
        torch.testing.assert_close(fn(x, tracker), in_tracker(x, eager_tracker))
    assert (tracker.depth, tracker.entered) == (eager_tracker.depth, eager_tracker.entered)
    assert tracker.entered == 4 and tracker.depth == 0
    assert cnt.frame_count == 2  # `entered` is an int the guards pin: the second call recompiles
    assert_one_graph_no_break(in_tracker, x, Depth())


def made_in_frame(x):
    tracker = Depth()
    with tracker:
        y = x * tracker.depth
    return y, tracker.entered


def test_a_user_context_manager_made_in_the_frame():
    x = torch.randn(4)
    fn, cnt = compiled(made_in_frame)
    got, want = fn(x), made_in_frame(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] == 1
    assert_one_graph_no_break(made_in_frame, x)


def mixed_precision(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        # timm's efficientvit: a float32 region inside the autocast one.
        with torch.autocast(device_type=x.device.type, enabled=False):
            z = y.float() @ w
    return y, z, (y.float() + z).relu().sum()


def test_autocast_bfloat16_on_cpu_is_recorded_into_one_graph():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    out = assert_one_graph_no_break(mixed_precision, x, w)
    targets = [n.target for n in out.graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count(torch.amp._enter_autocast) == 2
    assert targets.count(torch.amp._exit_autocast) == 2
    assert not torch.is_autocast_enabled("cpu")  # capture left it as it found it


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_autocast_graph_gives_eagers_dtypes_and_values(backend):
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    fn, cnt = compiled(mixed_precision, backend)
    got = fn(x, w)
    want = mixed_precision(x, w)
    assert cnt.frame_count == 1
    assert [t.dtype for t in got] == [t.dtype for t in want] == [
        torch.bfloat16, torch.float32, torch.float32]
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    assert not torch.is_autocast_enabled("cpu")


def loss(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, w).relu()
    return y.float().square().mean()


def test_autocast_training_step_through_aot_autograd_matches_eager():
    x = torch.randn(8, 8)
    w_eager = torch.randn(8, 8, requires_grad=True)
    w = w_eager.detach().clone().requires_grad_()
    loss(x, w_eager).backward()
    fn, cnt = compiled(loss, "aot_eager")
    fn(x, w).backward()
    torch.testing.assert_close(w.grad, w_eager.grad)
    assert cnt.frame_count == 1


@torch.autocast("cpu", dtype=torch.bfloat16)
def decorated(x, w):
    return x @ w


def calls_decorated(x, w):
    return decorated(x, w) + 1


def test_an_autocast_decorator_is_one_graph():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    fn, cnt = compiled(calls_decorated)
    got, want = fn(x, w), calls_decorated(x, w)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)
    assert cnt.frame_count == 1


def cpu_amp(x, w):
    with torch.cpu.amp.autocast():  # deprecated spelling, bfloat16 by default
        return x @ w


def test_torch_cpu_amp_autocast_is_one_graph():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        fn, cnt = compiled(cpu_amp)
        assert fn(x, w).dtype == cpu_amp(x, w).dtype == torch.bfloat16
        assert cnt.frame_count == 1


def prints_inside(x, w):
    y = x.relu()
    with torch.autocast("cpu", dtype=torch.float16):
        y = y @ w
        print(end="")  # not modelled, nor a break inside the block: the frame runs eagerly
    return y


def breaks_inside(x, w):
    with torch.autocast("cpu", dtype=torch.float16):
        y = helper_that_prints(x @ w)  # the inlined call's print: a break at this CALL
    return y


def helper_that_prints(y):
    print(end="")
    return y + 1


# A guard of what stays as it was (these frames ran eagerly before too): the capture entered the
# region while tracing and must leave it, or the eager run and every later one would cast.
@pytest.mark.parametrize("fn", [prints_inside, breaks_inside])
def test_a_capture_that_ends_inside_autocast_leaves_autocast_as_it_was(fn):
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    c, cnt = compiled(fn)
    got = c(x, w)
    assert got.dtype == fn(x, w).dtype == torch.float16
    assert not torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    torch.testing.assert_close(c(x, w), fn(x, w))


def test_set_grad_enabled_as_a_context_manager_and_as_a_plain_call():
    def in_with(x):
        with torch.set_grad_enabled(False):
            y = x * 2
        z = y + x
        return y.requires_grad, z.requires_grad, z

    def plain(x):  # leaves grad mode off after the frame, as eager does
        torch.set_grad_enabled(False)
        return x * 2

    x = torch.randn(3, requires_grad=True)
    got = kiln.compile(in_with, backend="eager", fullgraph=True)(x)
    want = in_with(x)
    assert got[:2] == want[:2]
    torch.testing.assert_close(got[2], want[2])
    try:
        out = kiln.compile(plain, backend="eager", fullgraph=True)(x)
        assert not out.requires_grad and not torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)


def test_plain_set_grad_enabled_calls_are_captured_and_the_mode_holds_after_them():
    # The mode switched by a plain call and switched back later in the frame: the calls are
    # switches in the graph, each op runs under the mode eager has there, and the frame leaves
    # the mode as eager does.
    from kiln.testing import CompileCounter

    def fn(a, b):
        prev = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        a = a + 1
        ret = a + b
        torch.set_grad_enabled(prev)
        return ret, b * 2, a.requires_grad

    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    cnt = CompileCounter()
    compiled = kiln.compile(fn, backend=cnt, fullgraph=True)
    for _ in range(3):
        got, want = compiled(a, b), fn(a, b)
        assert [t.requires_grad for t in got[:2]] == [t.requires_grad for t in want[:2]] \
            == [False, True]
        assert got[2] is want[2] is False
        torch.testing.assert_close(got[:2], want[:2])
        assert torch.is_grad_enabled()
    assert cnt.frame_count == 1


def test_set_grad_enabled_calls_in_try_finally_update_a_parameter_in_place():
    def fn(param, y):
        prev = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(False)
            torch.set_grad_enabled(True)
            torch.set_grad_enabled(False)
            param.add_(y)
        finally:
            torch.set_grad_enabled(prev)

    y = torch.randn(4)
    p_eager = torch.nn.Parameter(torch.randn(4))
    p_kiln = torch.nn.Parameter(p_eager.detach().clone())
    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    for _ in range(2):
        fn(p_eager, y)
        assert compiled(p_kiln, y) is None
        torch.testing.assert_close(p_kiln.detach(), p_eager.detach())
        assert p_kiln.requires_grad and p_kiln.grad_fn is None
        assert torch.is_grad_enabled()


def test_a_plain_set_grad_enabled_call_under_no_grad_leaves_the_mode_on():
    def fn(x):
        y = x * 2
        torch.set_grad_enabled(True)
        return y, x * 3

    x = torch.randn(3, requires_grad=True)
    compiled = kiln.compile(fn, backend="eager")
    try:
        with torch.no_grad():
            got = compiled(x)
            assert torch.is_grad_enabled()
        with torch.no_grad():
            want = fn(x)
            assert torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want] == [False, True]
    torch.testing.assert_close(got, want)


def test_set_grad_enabled_with_a_non_bool_raises_as_eager_does():
    def f(x):
        with torch.set_grad_enabled(1):
            return x * 2

    x = torch.randn(3)
    with pytest.raises(TypeError):
        f(x)
    with pytest.raises(TypeError):
        kiln.compile(f, backend="eager")(x)


@kiln.assume_constant_result
def _total(t):
    return t.sum()


def test_a_value_computed_inside_an_autocast_block_leaves_torchs_autocast_state_as_it_was():
    # assume_constant_result runs the graph so far on the real inputs: it entered the open
    # autocast block and never left it (torch's nesting count stayed one up, so its cast cache
    # was never cleared).
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
            c = _total(y)
        return y.float() * c

    x, w = torch.randn(4, 4), torch.randn(4, 4)
    got = kiln.compile(f, backend="eager")(x, w)
    depth = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    assert depth == 1 and not torch.is_autocast_enabled("cpu")
    torch.testing.assert_close(got, f(x, w), rtol=1e-2, atol=1e-1)


# -- a graph break inside a grad-mode block ------------------------------------------------------


# Reads a tensor's data: a graph break, at a call of no Python frame of its own.
_data_dependent = torch.Tensor.tolist


def _grads_like_eager(fn, *args, backend=None):
    """fn compiled and eager on the same inputs, under the grad mode the caller has: equal
    values, requires_grad and grad mode afterwards; returns the CompileCounter."""
    mode = torch.is_grad_enabled()
    expected = fn(*args)
    assert torch.is_grad_enabled() == mode
    opt, cnt = compiled(fn, backend)
    for _ in range(2):  # the second call runs the entries the first made
        got = opt(*args)
        assert torch.is_grad_enabled() == mode
        for g, e in zip(got, expected):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(g, e)
                assert g.requires_grad == e.requires_grad
            else:
                assert g == e
    return cnt


@pytest.mark.parametrize("backend", [None, "kiln"])
@pytest.mark.parametrize("outer_grad", [True, False])
def test_a_break_inside_no_grad_resumes_inside_the_block(kilnd_cache, backend, outer_grad):
    """The break's instruction runs without grad, the resume function starts inside the block
    and leaves it as the program does: values computed after the block require grad again."""
    def fn(a, b):
        x = a + b
        with torch.no_grad():
            x2 = x + 1
            total = _data_dependent(x2)
            x3 = x2 * 2
            inside = torch.is_grad_enabled()
        y = x * 3
        return x2, x3, y, total, inside, torch.is_grad_enabled()

    a = torch.randn(5, requires_grad=True)
    with torch.set_grad_enabled(outer_grad):
        cnt = _grads_like_eager(fn, a, torch.randn(5), backend=backend)
    assert cnt.frame_count == 2


def test_nested_grad_blocks_with_a_break_in_the_innermost():
    def fn(a):
        with torch.no_grad():
            with torch.no_grad():
                x = a + 1
                with torch.enable_grad():
                    total = _data_dependent(x)
                    y = a * 2
                    mode = torch.is_grad_enabled()
                z = a * 3
        return x, y, z, a * 4, total, mode

    cnt = _grads_like_eager(fn, torch.randn(4, requires_grad=True))
    assert cnt.frame_count == 2


def test_a_break_inside_no_grad_that_raises_leaves_grad_mode_as_eager_does():
    def opaque_failure(t):
        raise KeyError(f"from inside the block: {t.tolist()}")

    def fn(a):
        y = a * 2
        with torch.no_grad():
            opaque_failure(y)
        return y

    def later_failure(a):
        y = a * 2
        with torch.no_grad():
            _data_dependent(y)
            z = {}["missing"]  # in the resume function, inside the block
        return z

    for program in (fn, later_failure):
        opt = kiln.compile(program, backend="eager")
        for _ in range(2):
            with pytest.raises(KeyError):
                opt(torch.randn(3, requires_grad=True))
            assert torch.is_grad_enabled()


def test_a_break_inside_a_user_context_manager_runs_the_frame_as_written():
    """Its __exit__ may suppress the exception: the transformed code cannot stand in for the
    block's handler, so the frame runs eagerly, with eager's results."""
    log = []

    class Tracking:
        def __enter__(self):
            log.append("enter")

        def __exit__(self, *exc):
            log.append("exit")
            return True  # suppresses

    def fn(a):
        with Tracking():
            _data_dependent(a)
            raise ValueError
        return a + 1

    got = kiln.compile(fn, backend="eager")(torch.ones(2))
    torch.testing.assert_close(got, torch.ones(2) + 1)
    assert log == ["enter", "exit"]


def test_a_data_dependent_and_breaks_the_graph_instead_of_the_frame():
    """`p and q` over tensors (JUMP_IF_FALSE_OR_POP on 3.11): the value is tested once, in
    Python, and the frame resumes on either side of it."""
    def fn(a, b):
        ok = a.sum() > b.sum() and a.sum() > 0
        either = a.sum() < b.sum() or b.sum() > 0
        return (a + 1 if ok else a - 1), ok, either

    opt, cnt = compiled(fn)
    for a, b in ((torch.ones(3), -torch.ones(3)), (-torch.ones(3), torch.ones(3)),
                 (torch.ones(3), 2 * torch.ones(3))):
        got, want = opt(a, b), fn(a, b)
        torch.testing.assert_close(got[0], want[0])
        assert bool(got[1]) == bool(want[1]) and bool(got[2]) == bool(want[2])
        assert type(got[1]) is type(want[1]) and type(got[2]) is type(want[2])
    assert cnt.frame_count >= 2
