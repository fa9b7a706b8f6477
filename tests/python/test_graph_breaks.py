"""Graph breaks, resume functions, explain, export, fullgraph and run-only mode, as the seed
documents show them (TorchDynamo's tutorial and README with `kiln` in place of `dynamo`)."""
import operator

import scipy.fft
import torch
import torch.nn as nn
import torchvision

import pytest

import kiln
from kiln.testing import CompileCounter


def test_fns(fn1, fn2, args):  # the tutorial's helper (not a test: pytest ignores non-test args)
    return torch.allclose(fn1(*args), fn2(*args))


test_fns.__test__ = False


def f1(x, y):
    if x.sum() < 0:
        return -y
    return y


def test_f1_data_dependent_branch_is_right_for_both_signs():
    cnt = CompileCounter()
    dynamo_f1 = kiln.optimize(cnt)(f1)
    inp1, inp2 = torch.randn(5, 5), torch.randn(5, 5)
    assert test_fns(f1, dynamo_f1, (inp1, inp2))
    assert test_fns(f1, dynamo_f1, (-inp1, inp2))
    # sum < 0 | -y; the other branch, `return y`, has no op and so no graph to compile.
    assert cnt.frame_count == 2
    assert sum("neg" in g.code for g in cnt.graphs) == 1


def f2(x, y):
    return x + y


def test_f2_with_an_int_argument():
    cnt = CompileCounter()
    dynamo_f2 = kiln.optimize(cnt)(f2)
    inp1 = torch.randn(5, 5)
    assert test_fns(f2, dynamo_f2, (inp1, 3))
    assert cnt.frame_count == 1
    assert test_fns(f2, dynamo_f2, (inp1, 4))  # the int is guarded: a new value recompiles
    assert cnt.frame_count == 2


def f3(x):
    x = x * 2
    x = scipy.fft.dct(x.numpy())
    x = torch.from_numpy(x)
    x = x * 2
    return x


def test_f3_scipy_between_torch_ops_is_right():
    cnt = CompileCounter()
    dynamo_f3 = kiln.optimize(cnt)(f3)
    inp2 = torch.randn(5, 5)
    assert test_fns(f3, dynamo_f3, (inp2,))
    assert test_fns(f3, dynamo_f3, (torch.randn(5, 5),))
    assert cnt.frame_count >= 2  # x * 2 before numpy/scipy, x * 2 after


def bar(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


def test_bar_gives_exactly_three_graphs_over_both_branch_directions():
    graphs = []

    def custom_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    opt_bar = kiln.optimize(custom_backend)(bar)
    inp1, inp2 = torch.randn(10), torch.randn(10)
    inp2[0] = 1.0  # make the two calls take different directions for sure
    if inp2.sum() < 0:
        inp2 = -inp2
    torch.testing.assert_close(opt_bar(inp1, inp2), bar(inp1, inp2))
    torch.testing.assert_close(opt_bar(inp1, -inp2), bar(inp1, -inp2))
    assert len(graphs) == 3
    ops = [sorted(str(n.target) for n in g.graph.nodes if n.op == "call_function")
           for g in graphs]
    assert any("<built-in method abs of type object" in " ".join(o) for o in ops)
    # Running again in either direction compiles nothing new.
    opt_bar(inp1, inp2)
    opt_bar(inp1, -inp2)
    assert len(graphs) == 3


def test_toy_example_debug_output_shows_resume_functions(capsys):
    kiln.config.debug = True

    def toy_example(a, b):
        x = a / (torch.abs(a) + 1)
        if b.sum() < 0:
            b = b * -1
        return x * b

    cnt = CompileCounter()
    opt = kiln.optimize(cnt)(toy_example)
    for _ in range(20):
        a, b = torch.randn(10), torch.randn(10)
        torch.testing.assert_close(opt(a, b), toy_example(a, b))
    err = capsys.readouterr().err
    assert "__resume_at_" in err
    assert "ORIGINAL BYTECODE" in err and "MODIFIED BYTECODE" in err and "GUARDS:" in err
    assert cnt.frame_count == 3


class DynamicModule(nn.Module):
    def forward(self, x: torch.Tensor):
        if x.sum() > 0:
            return x * x
        return 3 * x


def test_dynamic_module_gives_its_three_graphs():
    graphs = []

    def collect_graphs(gm, samples):
        graphs.append(gm.graph)
        return gm.forward

    model = kiln.compile(DynamicModule(), backend=collect_graphs)
    x = torch.ones(10)
    torch.testing.assert_close(model(x), x * x)
    torch.testing.assert_close(model(-x), 3 * -x)
    assert len(graphs) == 3
    srcs = [g.python_code("self").src for g in graphs]
    assert any("sum" in s and "gt" in s for s in srcs)
    assert any("mul" in s for s in srcs)


def test_explain_names_the_if_line_as_the_break():
    explanation, out_guards, graphs, ops_per_graph, break_reasons, verbose = kiln.explain(
        bar, torch.randn(10), torch.randn(10))
    assert len(graphs) == 2  # the first graph and the branch taken
    assert len(break_reasons) == 1
    if_line = bar.__code__.co_firstlineno + 2
    assert f"line {if_line}" in break_reasons[0].where
    assert "if b.sum() < 0:" in break_reasons[0].where
    assert "Graph Break Count: 1" in verbose
    assert any("TENSOR_MATCH" in g for g in out_guards)
    out = kiln.explain(bar)(torch.randn(10), torch.randn(10))
    assert out.graph_count == 2 and out.graph_break_count == 1
    assert out.op_count == sum(len(o) for o in out.ops_per_graph)


def test_nopython_raises_on_bar_with_the_source_line():
    opt_bar = kiln.optimize("eager", nopython=True)(bar)
    with pytest.raises(kiln.exc.Unsupported) as info:
        opt_bar(torch.randn(10), torch.randn(10))
    assert "if b.sum() < 0:" in str(info.value)
    assert f"line {bar.__code__.co_firstlineno + 2}" in str(info.value)


def test_export_fails_on_bar_and_succeeds_on_resnet18():
    with pytest.raises(kiln.exc.Unsupported):
        kiln.export(bar, torch.randn(10), torch.randn(10))
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        model_exp = kiln.export(model, x)
        gm, guards = model_exp
        torch.testing.assert_close(model_exp[0](x), model(x), rtol=1e-4, atol=1e-4)
        x2 = torch.randn(2, 3, 64, 64)
        torch.testing.assert_close(gm(x2), model(x2), rtol=1e-4, atol=1e-4)
    assert any("TENSOR_MATCH" in g for g in guards)


def _aten_ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_an_aten_graph_export_has_only_aten_ops_and_the_function_s_answers():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        gm, guards = kiln.export(model, x, aten_graph=True)
        targets = [t for t in _aten_ops(gm) if t is not operator.getitem]  # multi-output ops
        assert targets and all(isinstance(t, torch._ops.OpOverload) and
                               t.namespace == "aten" for t in targets)
        assert torch.ops.aten.convolution.default in targets
        x2 = torch.randn(2, 3, 64, 64)
        torch.testing.assert_close(gm(x2), model(x2), rtol=1e-4, atol=1e-4)
    assert any("TENSOR_MATCH" in g for g in guards)


def _two_transposes(x):
    return x.t() + x.t()


def test_an_aten_graph_export_applies_the_decomposition_table():
    x = torch.randn(5, 4)
    plain, _ = kiln.export(_two_transposes, x, aten_graph=True)
    assert _aten_ops(plain).count(torch.ops.aten.t.default) == 2
    swapped, _ = kiln.export(_two_transposes, x, aten_graph=True,
                             decomposition_table={torch.ops.aten.t.default: torch.cos})
    assert torch.ops.aten.t.default not in _aten_ops(swapped)
    torch.testing.assert_close(swapped(x), x.cos() * 2)


def _bump(x):
    x.add_(1)
    return x * 2


def test_an_aten_graph_export_runs_the_function_once_and_keeps_its_in_place_update():
    x = torch.zeros(3)
    gm, _ = kiln.export(_bump, x, aten_graph=True)
    torch.testing.assert_close(x, torch.ones(3))  # the capture's own call, not a second one
    y = torch.zeros(3)
    torch.testing.assert_close(gm(y), torch.full((3,), 2.0))
    torch.testing.assert_close(y, torch.ones(3))


def test_export_options_that_do_not_apply_are_clear_errors():
    with pytest.raises(ValueError, match="aten_graph=True"):
        kiln.export(_two_transposes, torch.randn(2, 2), decomposition_table={})
    with pytest.raises(ValueError, match="static"):
        kiln.export(_two_transposes, torch.randn(2, 2), aten_graph=True, tracing_mode="symbolic")


def test_run_only_mode_uses_compiled_entries_and_compiles_nothing():
    cnt = CompileCounter()
    opt = kiln.optimize(cnt)(bar)
    a, b = torch.randn(10), torch.ones(10)
    opt(a, b)  # compiles the first graph and the b >= 0 branch
    n = cnt.frame_count
    with kiln.run():
        torch.testing.assert_close(opt(a, b), bar(a, b))  # hits
        torch.testing.assert_close(opt(a, -b), bar(a, -b))  # miss: runs eagerly
        x4 = torch.randn(4)
        torch.testing.assert_close(opt(x4, x4.abs()), bar(x4, x4.abs()))  # new shape: eager
    assert cnt.frame_count == n
    opt(a, -b)  # outside run(): compiles the other branch
    assert cnt.frame_count == n + 1


def test_fail_on_recompile_raises_and_lists_the_failed_guard():
    opt = kiln.compile(f2, backend=CompileCounter())
    opt(torch.randn(3), 1)
    with kiln.set_stance("fail_on_recompile"):
        opt(torch.randn(3), 1)  # a hit is fine
        with pytest.raises(kiln.exc.RecompileError) as info:
            opt(torch.randn(3), 2)
    assert "L['y']" in str(info.value)
    opt(torch.randn(3), 2)  # the stance is back to default


def test_force_eager_ignores_compiled_entries():
    calls = []

    def backend(gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm.forward(*args)

        return run

    opt = kiln.compile(f2, backend=backend)
    x = torch.randn(3)
    opt(x, 1)
    assert len(calls) == 1
    with kiln.set_stance("force_eager"):
        torch.testing.assert_close(opt(x, 1), x + 1)
    assert len(calls) == 1
    opt(x, 1)
    assert len(calls) == 2


def test_unknown_stance_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown stance"):
        kiln.set_stance("sometimes")


def test_no_grad_block_inside_compiled_function_is_one_graph_switching_grad_mode():
    lin = nn.Linear(4, 4)

    def f(x):
        with torch.no_grad():
            y = lin(x)
        z = lin(x)
        return y, z

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(2, 4)
    y, z = opt(x)
    ye, ze = f(x)
    torch.testing.assert_close(y, ye)
    torch.testing.assert_close(z, ze)
    assert (y.requires_grad, z.requires_grad) == (False, True)
    assert torch.is_grad_enabled()
    assert cnt.frame_count == 1


def test_break_inside_with_block_splits_the_frame_and_restores_grad_mode(capsys):
    def f(x):
        y = x * 2
        with torch.no_grad():
            print("kiln-test: inside no_grad")
            y = y + 1
        return y

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = torch.randn(3, requires_grad=True)
    got, want = opt(x), f(x)
    torch.testing.assert_close(got, want)
    assert got.requires_grad == want.requires_grad
    assert torch.is_grad_enabled()
    assert cnt.frame_count == 2
    assert capsys.readouterr().out.count("kiln-test: inside no_grad") == 2


class _Tally:
    count = 0


_TALLY = _Tally()


def _counts_and_doubles(x):
    _TALLY.count = _TALLY.count + 1
    return x * 2


def test_export_refuses_a_function_that_assigns_attributes_its_graph_cannot():
    with pytest.raises(kiln.exc.Unsupported, match=r"assigns G\['_TALLY'\]\.count"):
        kiln.export(_counts_and_doubles, torch.randn(3))
    # Compiled, the assignment is replayed each call.
    before = _TALLY.count
    opt = kiln.compile(_counts_and_doubles, backend=CompileCounter())
    torch.testing.assert_close(opt(torch.ones(2)), torch.full((2,), 2.0))
    assert _TALLY.count == before + 1


def test_a_frame_that_runs_no_torch_op_is_left_to_python_not_cached_per_argument():
    # A config's __getattribute__ reached as a frame of its own once per attribute name made an
    # entry per name (a constant guard each) until cache_size_limit; a frame with no op and
    # nothing to replay runs as written from then on, and what it calls is still captured.
    class Config:
        def __init__(self):
            for i in range(12):
                setattr(self, f"a{i}", float(i))

        def __getattribute__(self, key):
            return object.__getattribute__(self, key)

    cfg = Config()

    def read(c, key):
        return getattr(c, key)

    cnt = CompileCounter()
    compiled = kiln.optimize(cnt)(read)
    for _ in range(2):
        for i in range(12):
            assert compiled(cfg, f"a{i}") == float(i)
    assert kiln.debug.cache_entries(read) == []
    assert cnt.frame_count == 0

    def uses_torch(c, x):
        return x * c.a2

    x = torch.randn(3)
    torch.testing.assert_close(kiln.optimize(cnt)(uses_torch)(cfg, x), x * 2.0)
    assert cnt.frame_count == 1


@kiln.disable
def _break_here(x):
    return x


@pytest.mark.parametrize("kind", ["list", "tuple", "range", "modules"])
def test_the_rest_of_a_loop_a_break_interrupts_runs_in_python_and_its_calls_are_captured(kind):
    # Captured, the rest of the loop was one graph per turn, each guarded on how far the loop
    # got (a per-class loop of detection postprocessing reached cache_size_limit). It runs as
    # Python now, as TorchDynamo runs such a frame, and what it calls is captured as usual.
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(4))

    def f(x, items):
        for i, item in enumerate(items):
            if kind == "modules":
                x = item(x)
            else:
                x = x * item + i
            x = _break_here(x)
        return x

    def items():
        return {"list": [1.0, 2.0, 3.0], "tuple": (1.0, 2.0, 3.0), "range": range(1, 4),
                "modules": layers}[kind]

    x = torch.randn(4)
    cnt = CompileCounter()
    compiled = kiln.optimize(cnt)(f)
    for _ in range(2):
        got, want = items(), items()
        torch.testing.assert_close(compiled(x, got), f(x, want))
        assert got == want or kind == "modules"
    # the first turn's graph; for modules, Linear.forward's own two (an instance, then any)
    assert cnt.frame_count == {"list": 1, "tuple": 1, "range": 1, "modules": 3}[kind]
    (resume,) = _resume_functions(kiln.debug.cache_entries(f))
    assert kiln.debug.cache_entries(resume) == []
    if kind == "modules":
        assert kiln.debug.cache_entries(torch.nn.Linear.forward)


@pytest.mark.parametrize("with_break", [False, True])
def test_a_list_that_grows_while_enumerate_iterates_it_gives_eagers_answer(with_break):
    # enumerate(lst) was a copy of lst's items made when the loop began: an item appended in the
    # loop was never reached (a wrong answer), with or without a graph break in the loop.
    def f(x, items):
        for i, item in enumerate(items):
            x = x * item + i
            if i == 0:
                items.append(0.5)
            if with_break:
                x = _break_here(x)
        return x

    x = torch.randn(3)
    got, want = [1.0, 2.0], [1.0, 2.0]
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x, got), f(x, want))
    assert got == want


def _resume_functions(entries):
    return {c for e in entries for c in (e.info.resume_codes or ())}


def test_a_loop_whose_every_turn_breaks_compiles_its_calls_not_its_turns():
    # One graph per turn of the loop (torchvision's batched NMS: one per class) until
    # cache_size_limit; now the turns after the first run as Python and each block's forward is
    # captured in its own frame: two entries for six blocks, none again on the second call.
    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(6))

    def f(x, blocks):
        for block in blocks:
            x = _break_here(block(x))
        return x

    x = torch.randn(4)
    cnt = CompileCounter()
    compiled = kiln.optimize(cnt)(f)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, layers), f(x, layers))
    assert cnt.frame_count == 3
    (resume,) = _resume_functions(kiln.debug.cache_entries(f))
    assert kiln.debug.cache_entries(resume) == []
    assert len(kiln.debug.cache_entries(nn.Linear.forward)) == 2


def test_a_local_dead_after_a_break_is_not_passed_to_the_resume_function():
    # `k` is never read after the break: the resume function does not take it, so it neither
    # guards its value (an unbound local the trace never reads has no guard) nor recompiles
    # when it changes.
    def f(x, items):
        k = len(items)
        y = x * k
        y = _break_here(y)
        return y + 1

    x = torch.randn(3)
    compiled = kiln.optimize(CompileCounter())(f)
    for n in (1, 2, 3):
        torch.testing.assert_close(compiled(x, [0] * n), f(x, [0] * n))
    (resume,) = _resume_functions(kiln.debug.cache_entries(f))
    entries = kiln.debug.cache_entries(resume)
    assert len(entries) == 1
    assert [g for g in entries[0].guards if "L['k']" in g] == []


@kiln.disable
def _left_to_python(x):
    return x


def _formats_its_locals(x, name):
    y = _left_to_python(x + 1)  # a graph break: the rest runs in a resume function
    label = "spec_{name}".format(**locals())
    return y * 2, label, sorted(locals())


def _formats_its_locals_with_a_closure(x, name):
    k = 3

    def inner():
        return k

    y = _left_to_python(x + 1)
    return y, "{name}".format(**locals()), sorted(locals())


@pytest.mark.parametrize("fn", [_formats_its_locals, _formats_its_locals_with_a_closure])
def test_locals_after_a_graph_break_are_the_programs(fn):
    """locals() is the traced function's own (a resume function's stack parameters are not the
    program's); where kiln cannot build it (cells), neither the call nor a break at it runs in
    the transformed code's frame, whose locals are others."""
    x = torch.randn(3)
    want = fn(x, "a")
    got = kiln.compile(fn, backend="eager")(x, "a")
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:]
