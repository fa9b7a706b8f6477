"""What a program tells the capture about its functions (kiln.decorators, and torch's own
spellings of the same markings): graph_break, disallow_in_graph, allow_in_graph,
assume_constant_result, disable() as a decorator and disable(recursive=False); and
optimize(disable=True), its unknown keywords, run(fn). Every compiled result is compared with
eager on random inputs."""
import gc

import pytest
import torch

import kiln
from kiln import decorators
from kiln.testing import CompileCounter


def _targets(cnt):
    return [n.target for gm in cnt.graphs for n in gm.graph.nodes if n.op == "call_function"]


def _cos_break_cos(x):
    x = torch.cos(x)
    kiln.graph_break()
    return torch.cos(x) + 1


def test_graph_break_splits_the_graph_and_the_answer_is_eager_s():
    cnt = CompileCounter()
    x = torch.randn(4, 5)
    torch.testing.assert_close(kiln.optimize(cnt)(_cos_break_cos)(x), _cos_break_cos(x))
    assert cnt.frame_count == 2
    assert _targets(cnt).count(torch.cos) == 2


def test_graph_break_under_fullgraph_is_an_error_naming_it():
    with pytest.raises(kiln.exc.Unsupported, match="graph_break"):
        kiln.optimize("eager", nopython=True)(_cos_break_cos)(torch.randn(3))


def _sin_torch_break_sin(x):
    x = torch.sin(x)
    torch._dynamo.graph_break()
    return torch.sin(x) * 2


def test_torch_dynamo_graph_break_in_a_program_written_for_torch_compile_breaks_too():
    import torch._dynamo  # noqa: F401  (the program's own import)

    cnt = CompileCounter()
    x = torch.randn(6)
    torch.testing.assert_close(kiln.optimize(cnt)(_sin_torch_break_sin)(x),
                               _sin_torch_break_sin(x))
    assert cnt.frame_count == 2


@pytest.fixture
def sub_disallowed():
    kiln.disallow_in_graph(torch.sub)
    yield
    decorators.unmark(torch.sub)


def test_disallow_in_graph_makes_each_call_of_a_torch_op_a_graph_break(sub_disallowed):
    def fn(a):
        a = torch.add(a, 1)
        a = torch.sub(a, 1)
        return torch.add(a, 2)

    cnt = CompileCounter()
    x = torch.randn(3, 3)
    torch.testing.assert_close(kiln.optimize(cnt)(fn)(x), fn(x))
    assert cnt.frame_count == 2
    assert torch.sub not in _targets(cnt) and _targets(cnt).count(torch.add) == 2


_helper_calls = []


def _helper(a):
    _helper_calls.append(1)
    return a * 3


def _calls_helper(a):
    return _helper(a.relu()) - 1


@pytest.fixture
def helper_disallowed():
    kiln.disallow_in_graph(_helper)
    _helper_calls.clear()
    yield
    decorators.unmark(_helper)


def test_disallow_in_graph_of_a_user_function_runs_it_between_two_graphs(helper_disallowed):
    cnt = CompileCounter()
    x = torch.randn(8)
    torch.testing.assert_close(kiln.optimize(cnt)(_calls_helper)(x), _calls_helper(x))
    # The caller before the call and after it, and the helper's own frame, captured when it
    # runs at the break like any frame kiln meets.
    assert cnt.frame_count == 3 and len(_helper_calls) == 2  # at the break, and by eager



def _scaled(a):
    b = a.relu()
    return b * 2 + b.sum()


@pytest.fixture
def scaled_allowed():
    kiln.allow_in_graph(_scaled)
    yield
    decorators.unmark(_scaled)


def test_allow_in_graph_puts_the_call_in_the_graph_as_one_node(scaled_allowed):
    def fn(a):
        return _scaled(a) + 1

    cnt = CompileCounter()
    x = torch.randn(4, 4)
    torch.testing.assert_close(kiln.optimize(cnt)(fn)(x), fn(x))
    assert cnt.frame_count == 1
    assert _targets(cnt)[0] is _scaled and len(_targets(cnt)) == 2


def test_an_allowed_function_compiles_with_the_kiln_backend_and_trains(scaled_allowed, kilnd_cache):
    lin = torch.nn.Linear(16, 16)

    def fn(a):
        return _scaled(lin(a)) + 1

    x = torch.randn(8, 16)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(fn)(x), fn(x), rtol=1e-4, atol=1e-4)
    xg = x.clone().requires_grad_()
    kiln.compile(fn)(xg).square().sum().backward()
    got = xg.grad.clone()
    xg.grad = None
    fn(xg).square().sum().backward()
    torch.testing.assert_close(got, xg.grad, rtol=1e-4, atol=1e-4)


def test_assume_constant_result_runs_the_function_once_at_capture_and_folds_it():
    calls = []

    @kiln.assume_constant_result
    def factor(k):
        calls.append(k)
        return k * 1.5

    def fn(a):
        return a * factor(2)

    cnt = CompileCounter()
    opt = kiln.optimize(cnt)(fn)
    x, y = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(opt(x), x * 3.0)
    torch.testing.assert_close(opt(y), y * 3.0)
    assert calls == [2]  # once, at capture: the compiled code does not call it
    assert cnt.frame_count == 1 and factor not in _targets(cnt)


@torch.compiler.assume_constant_result
def _limit():
    return 7


def _clamped(a):
    return a.clamp(max=_limit())


def test_torch_compiler_assume_constant_result_is_read_too():
    cnt = CompileCounter()
    x = torch.randn(10) * 20
    torch.testing.assert_close(kiln.optimize(cnt)(_clamped)(x), x.clamp(max=7))
    assert cnt.frame_count == 1 and _limit not in _targets(cnt)


def test_assume_constant_result_with_a_tensor_argument_runs_on_its_value_once_and_keeps_it():
    @kiln.assume_constant_result
    def norm(t):
        return float(t.norm())

    def fn(a):
        return a / norm(a)

    cnt = CompileCounter()
    x, y = torch.randn(6), torch.randn(6)
    opt = kiln.optimize(cnt)(fn)
    torch.testing.assert_close(opt(x), fn(x))
    # As the program promised (and as torch.compile does): the value taken at capture stays.
    torch.testing.assert_close(opt(y), y / float(x.norm()))
    assert cnt.frame_count == 1 and norm not in _targets(cnt)


@kiln.assume_constant_result
def _positives(t):
    return int((t > 0).sum())


def _doubled_then_counted(x, w):
    x.mul_(2)  # an update of an input before the call: the function sees it
    y = torch.nn.functional.dropout(torch.mm(x, w), 0.5, training=True)
    return y * _positives(y) + _positives(x)


def test_assume_constant_result_of_computed_tensors_sees_the_program_s_values_and_changes_none():
    cnt = CompileCounter()
    opt = kiln.optimize(cnt)(_doubled_then_counted)
    x, w = torch.randn(5, 4), torch.randn(4, 3)
    mine, theirs = x.clone(), x.clone()
    torch.manual_seed(0)
    got = opt(mine, w)
    torch.manual_seed(0)
    want = _doubled_then_counted(theirs, w)
    # The graph computed the helper's arguments on copies, under the random state it starts
    # from: the caller's tensor is doubled once, and the dropout mask is eager's.
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(mine, theirs)
    assert torch.is_grad_enabled()
    assert cnt.frame_count == 1 and _positives not in _targets(cnt)


class _Nonzeros(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    @kiln.assume_constant_result
    def where(self, t):
        return {"rows": (torch.nonzero(t), t.sum()), "none": None}

    def forward(self, x):
        found = self.where(self.linear(x))
        rows, total = found["rows"]
        return [r * total for r in rows], found["none"]


@pytest.mark.parametrize("aten_graph", [False, True])
def test_assume_constant_result_returning_tensors_is_a_constant_of_an_exported_graph(aten_graph):
    model = _Nonzeros()
    x = torch.randn(2, 2)
    with torch.no_grad():
        want = model(x)
        gm, _ = kiln.export(model, x, aten_graph=aten_graph)
        got = gm(x)
        assert len(got[0]) == len(want[0]) and got[1] is None
        for g, w in zip(got[0], want[0]):
            torch.testing.assert_close(g, w)
        # Another input: the tensors taken at capture, as TorchDynamo's export bakes them in.
        for g, w in zip(gm(torch.randn(2, 2))[0], want[0]):
            torch.testing.assert_close(g, w)


@kiln.disable()
def _eager_only(a):
    return torch.sin(a) * 10


def _calls_eager_only(a):
    a = a + 1
    a = _eager_only(a)
    return a + 1


def test_disable_with_parentheses_is_a_decorator_and_a_graph_break():
    cnt = CompileCounter()
    x = torch.randn(4, 5)
    torch.testing.assert_close(kiln.optimize(cnt)(_calls_eager_only)(x), _calls_eager_only(x))
    assert cnt.frame_count == 2 and torch.sin not in _targets(cnt)


def _inner(a):
    return a * 3 - 1


def _skipped(a):
    return _inner(a).cos()


def _calls_skipped(a):
    return _skipped(a + 1) + 2


def test_disable_not_recursive_leaves_only_the_function_s_own_frame_eager():
    assert kiln.disable(_skipped, recursive=False) is _skipped
    cnt = CompileCounter()
    x = torch.randn(7)
    torch.testing.assert_close(kiln.optimize(cnt)(_calls_skipped)(x), _calls_skipped(x))
    # The caller before the call, the caller after it, and _inner (called by the skipped
    # frame): cos, in the skipped frame itself, is in no graph.
    assert cnt.frame_count == 3
    assert torch.cos not in _targets(cnt)


def test_optimize_with_disable_true_compiles_nothing():
    cnt = CompileCounter()
    x = torch.randn(3)
    fn = kiln.optimize(cnt, disable=True)(_cos_break_cos)
    assert fn is _cos_break_cos
    with kiln.optimize(cnt, disable=True):
        torch.testing.assert_close(fn(x), _cos_break_cos(x))
    assert cnt.frame_count == 0


@pytest.mark.parametrize("variable", ["KILN_DISABLE", "TORCH_COMPILE_DISABLE",
                                      "TORCHDYNAMO_DISABLE"])
def test_the_environment_s_disable_switch_compiles_nothing(monkeypatch, variable):
    cnt = CompileCounter()
    x = torch.randn(3)
    monkeypatch.setenv(variable, "1")
    fn = kiln.optimize(cnt)(_cos_break_cos)
    compiled = kiln.compile(_cos_break_cos, backend=cnt)
    module = torch.nn.Linear(3, 2)
    assert fn is _cos_break_cos and compiled is _cos_break_cos
    assert kiln.compile(backend=cnt)(module) is module
    with kiln.optimize(cnt):
        torch.testing.assert_close(_cos_break_cos(x), torch.cos(torch.cos(x)) + 1)
    torch.testing.assert_close(module(x), torch.nn.functional.linear(x, module.weight,
                                                                     module.bias))
    assert cnt.frame_count == 0
    monkeypatch.setenv(variable, "0")  # any other value compiles
    torch.testing.assert_close(kiln.optimize(cnt)(_cos_break_cos)(x), _cos_break_cos(x))
    assert cnt.frame_count == 2


def test_optimize_rejects_keywords_it_does_not_know():
    with pytest.raises(TypeError, match="guard_fail_fn"):
        kiln.optimize("eager", guard_fail_fn=print)


def test_run_of_a_function_uses_only_its_compiled_entries_and_leaves_the_stance_alone():
    cnt = CompileCounter()
    fn = kiln.optimize(cnt)(lambda a: torch.relu(a.cos() + a.sin()))
    fn(torch.randn(4))
    run_only = kiln.run(fn)
    x = torch.randn(4, 4)
    torch.testing.assert_close(run_only(x), torch.relu(x.cos() + x.sin()))  # a miss: eager
    assert cnt.frame_count == 1
    fn(x)  # the stance outside is the default one: this call compiles
    assert cnt.frame_count == 2


def test_a_run_only_function_called_from_a_captured_frame_is_traced_into():
    # The outermost compiled region decides, as for a compiled function: the run-only wrapper
    # is traced as the function it wraps (a call of kiln's own wrapper would break the graph).
    @kiln.run()
    def sine(x):
        return torch.sin(x) * 10

    cnt = CompileCounter()
    outer = kiln.optimize(cnt, nopython=True)(lambda x: torch.relu(sine(x) + 1))
    x = torch.randn(4, 5)
    torch.testing.assert_close(outer(x), torch.relu(torch.sin(x) * 10 + 1))
    assert cnt.frame_count == 1 and cnt.op_count == 4
    assert torch.sin in _targets(cnt)


def test_a_marked_function_that_dies_leaves_no_marking_behind():
    def temporary(a):
        return a

    kiln.allow_in_graph(temporary)
    key = id(temporary)
    assert decorators.marking(temporary) == decorators.ALLOW
    del temporary
    gc.collect()
    assert key not in decorators._marked


def test_marking_something_not_callable_is_a_clear_error():
    with pytest.raises(TypeError, match="expects a callable"):
        kiln.allow_in_graph(3)


class _Inner(torch.nn.Module):
    def forward(self, x):
        return x.cos() * 2


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()

    def forward(self, x):
        return self.inner(x + 1) - 1


@pytest.fixture
def inner_forward_skipped():
    from kiln.capture import skip_files

    kiln.disable(_Inner.forward, recursive=False)
    yield
    skip_files._skipped_codes.discard(_Inner.forward.__code__)


def test_disable_not_recursive_holds_where_a_module_call_reaches_the_method(inner_forward_skipped):
    cnt = CompileCounter()
    m, x = _Outer(), torch.randn(3)
    torch.testing.assert_close(kiln.compile(m, backend=cnt)(x), m(x))
    assert cnt.frame_count == 2 and torch.cos not in _targets(cnt)


def test_nested_compiled_regions_the_outermost_decides_and_is_traced_through():
    from kiln.testing import CompileCounter

    def fn(x):
        return x * 2 + 1

    inner_cnt, outer_cnt = CompileCounter(), CompileCounter()
    nested = kiln.optimize(outer_cnt)(kiln.optimize(inner_cnt)(fn))
    x = torch.randn(3)
    torch.testing.assert_close(nested(x), fn(x))
    assert (inner_cnt.frame_count, outer_cnt.frame_count) == (0, 1)
    # A compiled function called from a captured frame is traced into: one graph.
    inner = kiln.compile(fn, backend="eager")
    cnt = CompileCounter()
    out = kiln.optimize(cnt, nopython=True)(lambda x: torch.relu(inner(x)))(x)
    torch.testing.assert_close(out, torch.relu(fn(x)))
    assert cnt.frame_count == 1 and cnt.op_count == 3


def test_a_disabled_function_called_under_fullgraph_names_itself():
    @kiln.disable
    def off(x):
        return x + 100

    with pytest.raises(kiln.exc.Unsupported, match="off, which kiln.disable"):
        kiln.optimize("eager", nopython=True)(lambda x: off(x * 2))(torch.randn(2))


def test_a_compiled_function_called_at_run_time_inside_another_region_uses_its_own_backend():
    # kiln.compile of a compiled function unwraps it (the outermost decides); one called while
    # another region runs a frame eagerly installs its own callback, as torch.compile's does.
    from kiln.testing import CompileCounter

    def fn(x):
        return x * 2 + 1

    inner_cnt, outer_cnt = CompileCounter(), CompileCounter()
    inner = kiln.optimize(inner_cnt)(fn)

    def helper(x):  # its own frame runs as written (recursive=False): it calls `inner` there
        return inner(x)

    kiln.disable(helper, recursive=False)
    x = torch.randn(3)
    torch.testing.assert_close(kiln.optimize(outer_cnt)(lambda x: helper(x) - 1)(x), fn(x) - 1)
    assert inner_cnt.frame_count == 1
