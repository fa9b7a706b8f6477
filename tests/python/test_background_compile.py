"""The "compile_in_background" stance: a miss runs eagerly at once while a worker thread captures
and compiles; later calls switch to the compiled entry when it is ready, never to a wrong one."""
import threading
import time

import pytest
import torch
from torch.testing import assert_close

import kiln
from kiln import _C


class SlowBackend:
    """A backend that takes `delay` seconds to compile and counts calls of what it returns."""

    def __init__(self, delay):
        self.delay = delay
        self.compiles = 0
        self.calls = 0
        self.threads = []

    def __call__(self, gm, example_inputs):
        self.threads.append(threading.current_thread().name)
        time.sleep(self.delay)
        self.compiles += 1
        forward = gm.forward

        def compiled(*args):
            self.calls += 1
            return forward(*args)

        return compiled


@pytest.fixture
def background():
    kiln.reset()
    with kiln.set_stance("compile_in_background"):
        yield
    kiln.wait_for_compiles(30)
    kiln.reset()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) * 2)


def first_call_of_net(backend):
    """A Net compiled with `backend` under the stance, and its input, after the first call (a
    miss: eager, checked against the module)."""
    m = Net().eval()
    compiled = kiln.compile(m, backend=backend)
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert_close(compiled(x), m(x))
    return m, compiled, x


def test_first_call_runs_eagerly_and_later_calls_switch_when_ready(background):
    torch.manual_seed(0)
    m = Net().eval()
    backend = SlowBackend(delay=2.0)
    compiled = kiln.compile(m, backend=backend)
    x = torch.randn(4, 32)
    with torch.no_grad():
        t = time.perf_counter()
        got = compiled(x)
        first = time.perf_counter() - t
        assert_close(got, m(x))
        assert first < 1.0  # not the compile's 2 s: it runs on the worker thread
        assert backend.calls == 0
        assert_close(compiled(x), m(x))  # still compiling: eager again, right again
        assert kiln.wait_for_compiles(30)
        assert backend.compiles == 1 and backend.threads == ["kiln-compile_0"]
        for _ in range(3):
            x = torch.randn(4, 32)
            assert_close(compiled(x), m(x))
        assert backend.calls == 3


def test_a_parameter_changed_while_compiling_is_seen_after_the_switch(background):
    torch.manual_seed(0)
    m = Net().eval()
    backend = SlowBackend(delay=1.0)
    compiled = kiln.compile(m, backend=backend)
    x = torch.randn(4, 32)
    with torch.no_grad():
        compiled(x)
        m.a.weight.mul_(-1)  # while the worker captures
        assert_close(compiled(x), m(x))
        kiln.wait_for_compiles(30)
        assert_close(compiled(x), m(x))
        assert backend.calls == 1


def test_an_entry_made_for_another_call_is_not_handed_out(background):
    torch.manual_seed(0)
    m = Net().eval()
    backend = SlowBackend(delay=0.5)
    compiled = kiln.compile(m, backend=backend)
    with torch.no_grad():
        compiled(torch.randn(4, 32))
        kiln.wait_for_compiles(30)
        y = torch.randn(6, 32)  # another shape: the ready entry's guards fail
        assert_close(compiled(y), m(y))
        assert backend.calls == 0
        kiln.wait_for_compiles(30)
        assert_close(compiled(y), m(y))
        assert backend.calls == 1 and backend.compiles == 2


def test_frames_called_by_an_eager_miss_are_not_captured_on_their_own(background):
    seen = []

    def backend(gm, example_inputs):
        seen.append(len(example_inputs))
        return gm.forward

    def inner(x):
        return torch.sin(x) + 1

    def outer(x):
        return inner(x) * 2

    f = kiln.compile(outer, backend=backend)
    x = torch.randn(8)
    assert_close(f(x), outer(x))
    kiln.wait_for_compiles(30)
    assert seen == [1]  # one capture, of outer with inner inlined
    assert not _C.cache_entries(inner.__code__)


def test_the_worker_captures_in_the_callers_grad_mode(background):
    torch.manual_seed(0)
    m = Net()
    backend = SlowBackend(delay=0.2)
    compiled = kiln.compile(m, backend=backend)
    x = torch.randn(4, 32)
    with torch.no_grad():
        compiled(x)
        kiln.wait_for_compiles(30)
        out = compiled(x)
    assert backend.calls == 1  # made under no_grad, so it passes under no_grad
    assert not out.requires_grad
    with torch.enable_grad():
        out = compiled(x)  # grad enabled: another entry, eager meanwhile, with autograd
        assert out.requires_grad
        out.sum().backward()
    assert m.a.weight.grad is not None


def test_a_failing_capture_leaves_the_code_running_eagerly(background, caplog):
    def backend(gm, example_inputs):
        raise RuntimeError("compiler exploded")

    def f(x):
        return x * 3

    g = kiln.compile(f, backend=backend)
    x = torch.randn(5)
    assert_close(g(x), x * 3)
    kiln.wait_for_compiles(30)
    for _ in range(2):
        assert_close(g(x), x * 3)


def test_a_frame_that_adds_to_its_kwargs_gets_an_entry_for_how_it_was_called(background):
    # The worker starts once the call has returned; by then the frame has added to the **kwargs
    # dict the call made for it (transformers' config-defaults wrapper does): the worker reads
    # the dict as it was when the call began, so the entry's guards hold for the next such call.
    backend = SlowBackend(delay=0.0)

    def fn(x, **kwargs):
        kwargs.setdefault("scale", 2.0)
        return x * kwargs["scale"] + 1

    compiled = kiln.compile(fn, backend=backend)
    x = torch.randn(4)
    assert_close(compiled(x), x * 2 + 1)
    assert kiln.wait_for_compiles(30)
    assert_close(compiled(x), x * 2 + 1)
    assert backend.compiles == 1
    assert backend.calls == 1  # the entry ran: made for a call without kwargs, like this one


def test_the_stance_starts_the_worker_before_the_first_miss():
    # A miss only hands the capture to a thread that already runs: starting one inside the
    # eager call that missed would wait for it to be scheduled.
    kiln.reset()
    with kiln.set_stance("compile_in_background"):
        workers = [t for t in threading.enumerate() if t.name.startswith("kiln-compile")]
        assert workers, "no worker thread after set_stance"
        before = threading.active_count()
        backend = SlowBackend(delay=0.2)
        m, compiled, x = first_call_of_net(backend)
        assert threading.active_count() == before  # no thread started by the miss
        assert kiln.wait_for_compiles(30)
        assert backend.threads and all(n.startswith("kiln-compile") for n in backend.threads)
        with torch.no_grad():
            assert_close(compiled(x), m(x))
        assert backend.calls == 1
    kiln.reset()


def test_a_forked_child_compiles_in_the_background_with_a_worker_of_its_own():
    import os

    kiln.reset()
    with kiln.set_stance("compile_in_background"):
        m = Net().eval()
        backend = SlowBackend(delay=0.1)
        compiled = kiln.compile(m, backend=backend)
        x = torch.randn(4, 32)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its miss must be captured by a thread of its own
            status = 1
            try:
                # As DataLoader's workers do: a child forked after the parent's ops ran on
                # several OpenMP threads can hang in its first parallel op (libgomp's pool is
                # not fork-safe; seen on a 2-core machine, eager nn.Linear alone).
                torch.set_num_threads(1)
                with torch.no_grad():
                    ok = torch.allclose(compiled(x), m(x))
                    ok = ok and kiln.wait_for_compiles(30)
                    ok = ok and torch.allclose(compiled(x), m(x), atol=1e-6)
                status = 0 if ok and backend.calls == 1 else 2
            finally:
                os.write(write, bytes([status]))
                os._exit(0)
        os.close(write)
        import select

        ready, _, _ = select.select([read], [], [], 60)  # a hung child fails, not the suite
        got = os.read(read, 1) if ready else b"timeout"
        os.close(read)
        if not ready:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
        assert got == b"\x00", f"child status {got!r}"
    kiln.reset()


class BusyBackend(SlowBackend):
    """A compile that holds the GIL: `busy` seconds of Python bytecode, no sleep."""

    def __init__(self, busy):
        super().__init__(delay=0)
        self.busy = busy
        self.busy_from = None  # when the busy loop began
        self.switch_intervals = []

    def __call__(self, gm, example_inputs):
        import sys

        self.switch_intervals.append(sys.getswitchinterval())
        self.busy_from = time.perf_counter()
        end = self.busy_from + self.busy
        while time.perf_counter() < end:
            pass
        return super().__call__(gm, example_inputs)


def test_a_request_waiting_without_the_gil_gets_it_back_while_the_worker_compiles(background):
    # A serving thread that blocks without the GIL (a GPU sync, a copy to the host: a sleep
    # here) must not wait the interpreter's 5 ms switch interval for the busy worker to let go.
    import sys

    from kiln.background import WORKER_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    busy = BusyBackend(busy=1.5)
    first_call_of_net(busy)
    waits = []
    deadline = time.perf_counter() + 30
    while len(waits) < 40 and time.perf_counter() < deadline:
        t = time.perf_counter()
        time.sleep(0.001)
        if busy.busy_from is not None and busy.busy_from < t:  # slept while the worker was busy
            waits.append(time.perf_counter() - t)
    assert len(waits) == 40
    assert kiln.wait_for_compiles(30)
    assert busy.switch_intervals == [pytest.approx(WORKER_SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == before  # restored once the worker is idle
    waits.sort()
    # With the default interval each wake-up would wait about 5 ms for the worker.
    assert waits[len(waits) // 2] < 0.0035, waits


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_worker_starts_after_the_gpu_work_the_missed_call_queued():
    # The missed call returns with its kernels queued; the worker's work (a plan's first run, a
    # CUDA graph capture) must not start beside them.
    from kiln.background import BackgroundCompiler

    worker = BackgroundCompiler()
    began = []
    request_done = torch.cuda.Event()

    def capture(func, code, slots):
        began.append(request_done.query())
        return _C.SKIP

    def f(x):
        return x + 1

    answer = worker.miss(capture, f, f.__code__, (torch.zeros(1, device="cuda"),))
    assert answer[0] is _C.EAGER
    torch.cuda._sleep(200_000_000)  # the missed call's GPU work: a kernel spinning ~0.1 s
    request_done.record()
    answer[1]()  # the call is over
    assert not request_done.query()  # (else this test shows nothing)
    assert worker.wait(30)
    assert began == [True]


class _Warmed:
    """A compiled function with a plan's warm(): records the thread of each warm run."""

    def __init__(self, forward):
        self.forward = forward
        self.warmed = []

    def __call__(self, *args):
        return self.forward(*args)

    def warm(self):
        self.warmed.append(threading.current_thread().name)


@pytest.mark.parametrize("gpu_in_use", [False, True])
def test_the_worker_warms_a_plan_only_where_no_gpu_work_runs_beside_it(background, monkeypatch,
                                                                       gpu_in_use):
    made = []

    def backend(gm, example_inputs):
        made.append(_Warmed(gm.forward))
        return made[-1]

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: gpu_in_use)
    m, compiled, x = first_call_of_net(backend)
    assert kiln.wait_for_compiles(30)
    with torch.no_grad():
        assert_close(compiled(x), m(x))
    assert len(made) == 1
    # With the GPU in use, the first call that gets the entry sets the plan up on its own thread.
    assert made[0].warmed == ([] if gpu_in_use else [made[0].warmed[0]])
    assert all(t != threading.current_thread().name for t in made[0].warmed)


def test_an_fx_trace_on_the_worker_is_not_seen_by_other_threads(monkeypatch):
    # The worker lowers graphs through make_fx, an FX trace. Where torch keeps "a trace is
    # under way" for the whole process (torch 2.11), a torch.compile'd function called on a
    # serving thread meanwhile refused to run ("...symbolically trace a dynamo-optimized
    # function"). A newer torch keeps it per thread: it is made process-wide here, as 2.11 has
    # it, and everything the fix replaces is put back afterwards.
    import sys

    import torch.fx._symbolic_trace as fx_trace
    from kiln.background import fx_tracing_flag_per_thread

    monkeypatch.delattr(fx_trace, "_is_fx_tracing_tls", raising=False)
    monkeypatch.setattr(fx_trace, "_is_fx_tracing_flag", False, raising=False)
    monkeypatch.setattr(fx_trace, "_set_is_fx_tracing",
                        lambda v: setattr(fx_trace, "_is_fx_tracing_flag", v), raising=False)
    monkeypatch.setattr(fx_trace, "_get_is_fx_tracing", lambda: fx_trace._is_fx_tracing_flag,
                        raising=False)
    monkeypatch.setattr(fx_trace.Tracer, "trace", fx_trace.Tracer.trace)
    readers = {id(fx_trace.is_fx_tracing), id(fx_trace.is_fx_symbolic_tracing)}
    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "__name__", "").startswith("torch"):
            for name, value in list(vars(module).items()):
                if id(value) in readers:
                    monkeypatch.setattr(module, name, value)
    fx_tracing_flag_per_thread()  # what starting the worker does
    inside, go, seen = threading.Event(), threading.Event(), []

    def traced(x):
        seen.append(fx_trace.is_fx_tracing())
        inside.set()
        go.wait(30)
        return x + 1

    tracer = threading.Thread(target=lambda: torch.fx.symbolic_trace(traced))
    tracer.start()
    try:
        assert inside.wait(30)
        assert not fx_trace.is_fx_symbolic_tracing()
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: x * 2, backend="eager")
        x = torch.randn(3)
        assert_close(compiled(x), x * 2)
    finally:
        go.set()
        tracer.join()
    assert seen == [True]  # the tracing thread itself sees its trace

    # kiln's capture reads the replaced readers as it reads torch's: no break, the flag guarded.
    def f(x):
        if fx_trace.is_fx_tracing() or fx_trace.is_fx_symbolic_tracing():
            return x - 1
        return x + 1

    explained = kiln.explain(f)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [str(r) for r in explained.break_reasons]
    compiled = kiln.compile(f)
    assert_close(compiled(x), x + 1)
    flag = fx_trace.is_fx_tracing._kiln_fx_tracing_tls
    flag.flag = True  # this thread now in a trace: the guard sends it to the other branch
    try:
        assert_close(compiled(x), x - 1)
    finally:
        flag.flag = False
