"""The frame hook and the API around it: regions, disable, threads, recursion, generators,
reset, the backend registry."""
import operator
import textwrap
import threading

import pytest
import torch

import kiln
from kiln import _C
from kiln.testing import CompileCounter


def add_one(x):
    return x + 1


def test_hook_is_installed_only_inside_a_compiled_region():
    seen = []

    def probe():
        seen.append(_C.get_eval_frame())
        return torch.ones(1)

    cnt = CompileCounter()
    opt = kiln.compile(probe, backend=cnt)
    assert _C.get_eval_frame() is None
    probe()
    assert seen[-1] is None
    opt()
    assert _C.get_eval_frame() is None


def test_callees_of_a_compiled_function_are_captured_too():
    def outer(x):
        return inner(x) * 2

    def inner(x):
        return torch.sin(x)

    cnt = CompileCounter()
    opt = kiln.compile(outer, backend=cnt)
    x = torch.randn(5)
    torch.testing.assert_close(opt(x), outer(x))
    assert cnt.frame_count == 1 and cnt.op_count == 2  # inner is inlined


def test_disable_decorator_runs_function_eagerly_inside_a_region():
    calls = []

    @kiln.disable
    def helper(x):
        calls.append(_C.get_eval_frame())
        return x * 3

    def f(x):
        return helper(x)

    # f's frame calls helper, a C-level FrameRegion the executor cannot inline: f runs eagerly.
    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x), x * 3)
    assert calls and calls[-1] is None
    assert cnt.frame_count == 0


def test_disable_context_manager_turns_capture_off_in_block():
    cnt = CompileCounter()
    with kiln.optimize(cnt):
        with kiln.disable():
            assert _C.get_eval_frame() is None
            add_one(torch.randn(2))
        assert _C.get_eval_frame() is not None
    assert cnt.frame_count == 0
    assert _C.get_eval_frame() is None


def test_optimize_context_manager_captures_calls_in_block():
    cnt = CompileCounter()
    x = torch.randn(4)
    with kiln.optimize(cnt):
        out = add_one(x)
    torch.testing.assert_close(out, x + 1)
    assert cnt.frame_count == 1


def test_generators_run_eagerly_and_correctly():
    def gen(x):
        yield x + 1
        yield x + 2

    def f(x):
        return list(gen(x))

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = torch.randn(3)
    out = opt(x)
    torch.testing.assert_close(out[0], x + 1)
    torch.testing.assert_close(out[1], x + 2)


def test_recursive_function_gives_right_answer():
    def fact(n, x):
        if n == 0:
            return x
        return fact(n - 1, x * n)

    cnt = CompileCounter()
    opt = kiln.compile(fact, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(opt(4, x), x * 24)


def test_threads_each_compile_and_run_correctly():
    cnt = CompileCounter()
    opt = kiln.compile(add_one, backend=cnt)
    errors = []

    def worker(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            for _ in range(50):
                x = torch.randn(8, generator=g)
                torch.testing.assert_close(opt(x), x + 1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert 1 <= cnt.frame_count <= 4
    assert _C.get_eval_frame() is None


def test_first_captures_of_a_process_race_from_many_threads_without_deadlock():
    # A fresh interpreter: the executor's and decoder's tables are built by whichever capture
    # comes first. Eight threads capture at once, with collections forced at every allocation
    # so threads switch inside that first build; each result is checked against eager.
    import subprocess
    import sys

    code = textwrap.dedent("""
        import gc, threading, torch, kiln
        gc.set_threshold(1)
        barrier = threading.Barrier(8)
        errors = []
        def make(k):
            def f(x):
                y = x * k
                g = lambda t: t + y
                with torch.no_grad():
                    return g(torch.sin(x))
            return f
        def worker(k):
            try:
                f = make(k)
                opt = kiln.compile(f, backend="eager")
                barrier.wait()
                x = torch.randn(4)
                torch.testing.assert_close(opt(x), f(x))
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("errors", errors)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "errors []"


def test_exception_in_compiled_code_propagates_and_leaves_hook_off():
    def f(x, y):
        return x @ y

    opt = kiln.compile(f, backend="eager")
    with pytest.raises(RuntimeError):
        opt(torch.randn(2, 3), torch.randn(2, 3))
    assert _C.get_eval_frame() is None


def test_reset_drops_entries_and_recompiles():
    cnt = CompileCounter()
    opt = kiln.compile(add_one, backend=cnt)
    x = torch.randn(2)
    opt(x)
    opt(x)
    assert cnt.frame_count == 1
    kiln.reset()
    assert kiln.debug.cache_entries(add_one) == []
    opt(x)
    assert cnt.frame_count == 2


def test_backend_registry_lists_eager_and_registers_new_backends():
    assert "eager" in kiln.list_backends()

    @kiln.register_backend
    def my_test_backend(gm, example_inputs):
        return gm.forward

    assert "my_test_backend" in kiln.list_backends()
    opt = kiln.compile(add_one, backend="my_test_backend")
    torch.testing.assert_close(opt(torch.zeros(2)), torch.ones(2))
    with pytest.raises(kiln.exc.InvalidBackend):
        kiln.compile(add_one, backend="no_such_backend")


def test_the_aot_eager_backend_runs_aot_autograd_s_graphs_forward_and_backward():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.LayerNorm(4))
    seen = []
    from kiln.backends import aot

    real = aot.compile_aten_graph

    def spy(gm, example_inputs, compile_inference):
        seen.append({n.target for n in gm.graph.nodes if n.op == "call_function"})
        return real(gm, example_inputs, compile_inference)

    x = torch.randn(3, 4, requires_grad=True)
    try:
        aot.compile_aten_graph = spy
        out = kiln.compile(m, backend="aot_eager")(x)
    finally:
        aot.compile_aten_graph = real
    out.square().sum().backward()
    got = x.grad.clone()
    x.grad = None
    m(x).square().sum().backward()
    torch.testing.assert_close(got, x.grad)
    # AOT autograd's forward graph: ATen ops, not the captured torch functions.
    assert seen and all(isinstance(t, torch._ops.OpOverload) or t is operator.getitem
                        for t in seen[0])


def test_a_backend_gets_ready_each_time_it_is_chosen_not_when_registered():
    readied = []

    @kiln.register_backend(name="readied_backend", prepare=lambda: readied.append(1))
    def readied_backend(gm, example_inputs):
        return gm.forward

    assert readied == []
    opt = kiln.compile(add_one, backend="readied_backend")
    assert readied == [1]
    with kiln.optimize(readied_backend):
        pass
    assert readied == [1, 1]
    torch.testing.assert_close(opt(torch.zeros(2)), torch.ones(2))
    assert readied == [1, 1]  # calls and captures do not prepare again


def test_kiln_backend_imports_its_messages_at_compile_and_neither_grpc_nor_a_channel(tmp_path):
    # kiln.compile readies what the first call would otherwise import (the kiln.v1 messages a
    # stored capture's artifact is read with), not gRPC: a process whose artifacts are in its
    # cache directory never talks to kilnd. A process that forks after kiln.compile() shares no
    # gRPC channel with its children. (A cache directory of its own: one that holds stored
    # captures has kiln.compile ask kilnd for their artifacts.)
    import os
    import subprocess
    import sys

    code = ("import sys, kiln\n"
            "assert 'grpc' not in sys.modules\n"
            "kiln.compile(lambda x: x + 1, backend='eager')\n"
            "assert 'kiln.v1.graph_pb2' not in sys.modules, 'the eager backend readied kiln.v1'\n"
            "kiln.compile(lambda x: x + 1, backend='kiln')\n"
            "from kiln.state import STATE\n"
            "print('grpc' in sys.modules, 'kiln.v1.graph_pb2' in sys.modules,\n"
            "      STATE.daemon._client is None)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("KILN_DAEMON", "XDG_RUNTIME_DIR", "KILN_MAC_KEY_FILE")}
    env["KILN_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "True"]


def test_failing_backend_falls_back_to_eager_with_a_warning(caplog):
    def broken(gm, example_inputs):
        raise RuntimeError("backend exploded")

    opt = kiln.compile(add_one, backend=broken)
    x = torch.randn(3)
    with caplog.at_level("WARNING", logger="kiln"):
        torch.testing.assert_close(opt(x), x + 1)
    assert "backend exploded" in caplog.text
    with pytest.raises(kiln.exc.BackendCompilerFailed):
        kiln.compile(lambda x: x * 2, backend=broken, fullgraph=True)(x)


def test_compiled_function_keeps_name_and_binds_as_method():
    class Holder:
        @kiln.optimize("eager")
        def method(self, x):
            return x * 2

    assert Holder.method.__name__ == "method"
    x = torch.randn(3)
    torch.testing.assert_close(Holder().method(x), x * 2)


class _StackProbe(torch.nn.Module):
    """forward breaks its graph at record(): the frames above forward are those of the call."""

    def __init__(self):
        super().__init__()
        self.frames = []

    def record(self):
        import sys

        f, names = sys._getframe(1), []
        while f is not None:
            names.append(f.f_code.co_name)
            f = f.f_back
        self.frames.append(names)

    def forward(self, x):
        self.record()
        return x * 2


def test_a_compiled_module_without_hooks_goes_straight_to_forward():
    # Module.__call__ would call forward and nothing else: the region calls forward itself,
    # without Module.__call__'s two Python frames.
    m = _StackProbe()
    opt = kiln.compile(m, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(opt(x), x * 2)
    assert "_wrapped_call_impl" not in m.frames[-1] and "_call_impl" not in m.frames[-1]
    m(x)  # eagerly it goes through Module.__call__, which is what the test rules out above
    assert "_call_impl" in m.frames[-1]


@pytest.mark.parametrize("register", [
    lambda m, hook: m.register_forward_hook(hook),
    lambda m, hook: m.register_forward_pre_hook(lambda mod, args: hook(mod, args, None)),
    lambda m, hook: torch.nn.modules.module.register_module_forward_hook(hook),
    lambda m, hook: torch.nn.modules.module.register_module_forward_pre_hook(
        lambda mod, args: hook(mod, args, None)),
], ids=["forward_hook", "forward_pre_hook", "global_forward_hook", "global_forward_pre_hook"])
def test_a_hook_registered_after_compile_goes_through_module_call(register):
    m = _StackProbe()
    opt = kiln.compile(m, backend="eager")
    x = torch.randn(3)
    opt(x)
    seen = []
    handle = register(m, lambda mod, args, out: seen.append(mod) if mod is m else None)
    try:
        torch.testing.assert_close(opt(x), x * 2)
    finally:
        handle.remove()
    assert seen == [m] and "_call_impl" in m.frames[-1]
    opt(x)
    assert seen == [m] and "_call_impl" not in m.frames[-1]  # removed: straight to forward


def test_a_module_class_with_its_own_call_is_called_through_it():
    class Doubling(_StackProbe):
        def __call__(self, x):
            return super().__call__(x) * 3

    m = Doubling()
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(m, backend="eager")(x), x * 6)


def test_a_module_class_with_its_own_call_impl_is_called_through_it():
    class Tripling(_StackProbe):
        def _call_impl(self, *args, **kwargs):
            return super()._call_impl(*args, **kwargs) * 3

    m = Tripling()
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(m, backend="eager")(x), x * 6)


def test_a_module_compiled_by_module_compile_calls_its_compiled_call():
    m = _StackProbe()
    calls = []
    m._compiled_call_impl = lambda *a: calls.append(a) or m._call_impl(*a)
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(m, backend="eager")(x), x * 2)
    assert len(calls) == 1


def test_a_compiled_module_traced_by_torch_jit_goes_through_module_call():
    # Under torch.jit.trace, Module.__call__ calls _slow_forward (which records scopes), not
    # forward: the region must leave the call to it.
    import warnings

    m = _StackProbe()
    opt = kiln.compile(m, backend="eager")
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace is deprecated
        traced = torch.jit.trace(opt, (x,), check_trace=False)
    assert "_slow_forward" in m.frames[-1]
    torch.testing.assert_close(traced(x), x * 2)


def test_a_region_refuses_a_malformed_module_call():
    with pytest.raises(TypeError, match="module_call"):
        _C.FrameRegion(torch.nn.ReLU(), None, module_call=(1, 2))


def test_eager_then_after_runs_after_the_frame_returned_or_raised(monkeypatch):
    """The answer (EAGER, after): the frame and its callees run eagerly without a callback, then
    after() runs, also when the frame raised (whose exception still propagates); a failing
    after() is reported as unraisable, never raised in the frame's place."""
    events = []
    asked = []

    def callee(x):
        events.append("callee")
        return x * 2

    def fn(x, fail=False):
        events.append("frame")
        if fail:
            raise ValueError("from the frame")
        return callee(x) + 1

    def callback(func, code, slots):
        asked.append(code.co_name)
        return _C.EAGER, lambda: events.append("after")

    region = _C.FrameRegion(fn, callback)
    assert region(torch.ones(2)).tolist() == [3.0, 3.0]
    assert events == ["frame", "callee", "after"]
    assert asked == ["fn"]  # callee ran without a callback
    events.clear()
    with pytest.raises(ValueError, match="from the frame"):
        region(torch.ones(2), True)
    assert events == ["frame", "after"]

    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", lambda u: unraisable.append(u.exc_value))

    def failing_after():
        raise RuntimeError("from after")

    region = _C.FrameRegion(fn, lambda func, code, slots: (_C.EAGER, failing_after))
    assert region(torch.ones(2)).tolist() == [3.0, 3.0]
    assert [str(e) for e in unraisable] == ["from after"]


def test_raise_on_backend_error_makes_a_failing_backend_raise(monkeypatch):
    def broken(gm, example_inputs):
        raise RuntimeError("duck!")

    monkeypatch.setattr(kiln.config, "raise_on_backend_error", True)
    with pytest.raises(kiln.exc.BackendCompilerFailed, match="duck"):
        kiln.optimize(broken)(lambda x: x + 1)(torch.randn(2))


def test_counters_count_frames_captured_and_compiled():
    kiln.counters.clear()

    def f(x):
        return x * 2

    kiln.optimize("eager")(f)(torch.randn(2))
    assert kiln.counters["frames"]["total"] == 1
    assert kiln.counters["frames"]["ok"] == 1
