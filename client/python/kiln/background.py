"""Compiling in the background (the "compile_in_background" stance): a frame the hook misses
runs its stored capture when one holds on it (installed at once: loading it is neither a capture
nor a compile), and otherwise runs eagerly at once, with everything it calls; when it has
returned, a worker thread captures and compiles it, and runs the plan once; a later call of
that code finds the entry ready and switches to it. A serving process never stalls a request on
a capture or a compile, and the call that missed does not share the CPU with that work.

The worker's work is Python and holds the GIL; a serving thread that waits without it (for the
GPU: torch.cuda.synchronize, a copy to the host) takes it back only when the interpreter asks the
holder to let go, after its switch interval (5 ms by default). While the worker has work, the
process's switch interval is lowered to WORKER_SWITCH_INTERVAL_S, so a request waits a fraction
of a millisecond for the GIL instead; it is restored when the worker is idle again, unless
someone else changed it meanwhile.

On a GPU the missed call has only queued its kernels when it returns: the worker waits (without
the GIL) for an event recorded on the caller's stream at that point before it starts, so that
its work, the plan's first run and CUDA graph capture among it, neither queues GPU work beside
the request's nor takes the GIL from the thread that waits for the request's results.

The worker captures from the first call's argument slots, under that thread's grad, inference
and autocast modes (torch keeps them per thread). The entry it makes is used only by a call
whose guards it passes, like any other: what the eager call changed meanwhile can only make it
miss, never run wrongly."""
import contextlib
import functools
import inspect
import logging
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, Optional

import torch

from kiln import _C

log = logging.getLogger("kiln")

# The switch interval while the worker has work: how long a serving thread may wait for the GIL
# the worker holds (each forced switch costs microseconds).
WORKER_SWITCH_INTERVAL_S = 2e-4


def fx_tracing_flag_per_thread() -> None:
    """Makes torch.fx's "a symbolic trace is under way" a per-thread flag where this torch keeps
    it for the whole process (older releases; newer ones keep it per thread). The worker lowers
    graphs through make_fx, an FX trace: with one flag for the process, every other thread sees
    a trace under way meanwhile, and a torch.compile'd function called on a serving thread then
    refuses to run ("Detected that you are using FX to symbolically trace a dynamo-optimized
    function"). As newer torch does: Tracer.trace sets a thread-local flag too, and the module's
    readers of the flag (is_fx_tracing, is_fx_symbolic_tracing, wherever they were imported) read
    that one. Done once, before the worker starts."""
    st = torch.fx._symbolic_trace
    if hasattr(st, "_is_fx_tracing_tls") or not hasattr(st, "_is_fx_tracing_flag") or \
            getattr(st.Tracer.trace, "_kiln_per_thread", False):
        return
    tls = threading.local()
    original_trace = st.Tracer.trace

    @functools.wraps(original_trace)
    def trace(self, *args, **kwargs):
        prior = getattr(tls, "flag", False)
        tls.flag = True
        try:
            return original_trace(self, *args, **kwargs)
        finally:
            tls.flag = prior

    def is_fx_tracing() -> bool:
        return getattr(tls, "flag", False)

    def is_fx_symbolic_tracing() -> bool:
        return getattr(tls, "flag", False) and not torch.compiler.is_compiling()

    # Capture reads these as it reads torch's own (kiln.variables.torch): the flag guarded,
    # is_fx_symbolic_tracing False while compiling. They are never inlined (kiln's code).
    is_fx_tracing._kiln_fx_tracing_tls = tls
    is_fx_symbolic_tracing._kiln_fx_symbolic_tracing = True
    for reader in (is_fx_tracing, is_fx_symbolic_tracing):
        reader.__module__ = st.__name__
    trace._kiln_per_thread = True
    st.Tracer.trace = trace
    readers = {}
    for name, reader in (("is_fx_tracing", is_fx_tracing),
                         ("is_fx_symbolic_tracing", is_fx_symbolic_tracing)):
        original = getattr(st, name, None)
        if original is not None:
            readers[id(original)] = (original, reader)
    for module in list(sys.modules.values()):
        if module is None or not getattr(module, "__name__", "").startswith("torch"):
            continue
        for name, value in list(vars(module).items()):
            found = readers.get(id(value))
            if found is not None and found[0] is value:
                setattr(module, name, found[1])


def _thread_modes():
    """The calling thread's modes that change what a capture records."""
    autocast = []
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                autocast.append((device, torch.get_autocast_dtype(device)))
        except (TypeError, AttributeError, RuntimeError):
            pass
    return torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast


@contextlib.contextmanager
def _in_modes(modes):
    grad, inference, autocast = modes
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.inference_mode(inference))
        stack.enter_context(torch.set_grad_enabled(grad))
        for device, dtype in autocast:
            stack.enter_context(torch.autocast(device, dtype=dtype))
        yield


def _end_of_call_on_gpu():
    """A blocking-sync CUDA event recorded on the current stream of the current device when
    CUDA is in use in this process (None otherwise): done when the GPU work the calling thread
    has queued so far is."""
    if not torch.cuda.is_initialized():
        return None
    try:
        event = torch.cuda.Event(blocking=True)  # its waiter sleeps instead of spinning a core
        event.record()
    except RuntimeError as e:  # a broken context: the worker's own CUDA work will say so
        log.debug("kiln: no end-of-call event for the background worker: %s", e)
        return None
    return event


def _as_called(code, slots: tuple) -> tuple:
    """`slots` with the frame's **kwargs dict copied: the call made that dict for this frame
    alone, and the frame may add to it (transformers' config-defaults wrapper does) before the
    worker reads it; everything else is the caller's objects, whose later state the entry's
    guards check when it is handed out."""
    if not code.co_flags & inspect.CO_VARKEYWORDS:
        return slots
    at = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS)
    if at >= len(slots) or type(slots[at]) is not dict:
        return slots
    return slots[:at] + (dict(slots[at]),) + slots[at + 1:]


class BackgroundCompiler:
    """One worker thread for the process's background captures (they share the GIL and kilnd:
    one at a time is as fast as several, and leaves the serving threads their share)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: Dict[object, object] = {}  # code -> Future
        self._done: Dict[object, object] = {}     # code -> entry tuple or _C.SKIP
        self._executor: Optional[ThreadPoolExecutor] = None

    def miss(self, capture, func, code, slots, install=None):
        """The hook's answer for a miss of `code`: the entry the worker made for it when ready
        and its guards pass on this frame; else the entry of a stored capture that holds on
        this frame, from `install(func, code, slots)` (entry or None), at once: loading one is
        no capture and no compile, and the worker would read the call's arguments only after
        the call changed them (a decoder's cache grows by the token it ran), so that the
        stored guards fail there and it captures anew; otherwise eager: _C.EAGER while a
        capture is under way, or (_C.EAGER, start) with the capture submitted by start() once
        this call is over. `capture(func, code, slots)` is the callback's own (entry or
        _C.SKIP)."""
        with self._lock:
            done = self._done.pop(code, None)
            if done is not None:
                if done is _C.SKIP:
                    return done
                if done[0].check(slots, func):
                    return done
                # Made for a call unlike this one (another shape, say): capture this one too.
            if code in self._pending:
                return _C.EAGER
        if install is not None:
            entry = install(func, code, slots)
            if entry is not None:
                return entry
        with self._lock:
            if code in self._pending:  # another thread's miss meanwhile
                return _C.EAGER
            self._worker()
            started = Future()  # pending from now: other calls meanwhile run eagerly
            self._pending[code] = started
        modes = _thread_modes()
        slots = _as_called(code, slots)

        def start():
            with self._lock:
                if self._pending.get(code) is not started:
                    return  # forgotten meanwhile (kiln.reset)
                work = self._executor.submit(self._work, capture, func, code, slots, modes,
                                             _end_of_call_on_gpu())
            work.add_done_callback(lambda f: started.set_result(None))

        return _C.EAGER, start

    def _worker(self) -> ThreadPoolExecutor:
        """The executor of the worker thread (under the lock)."""
        if self._executor is None:
            fx_tracing_flag_per_thread()
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-compile")
        return self._executor

    def start_worker(self) -> None:
        """Starts the worker thread now, idle (kiln.set_stance("compile_in_background")): a
        miss then only hands it the capture. Starting the thread inside the call that missed
        waits for the new thread to be scheduled and take the GIL (up to the interpreter's
        5 ms switch interval), which that call, an eager one, should not pay."""
        if self._executor is not None:  # its thread runs, or a miss is starting it
            return
        with self._lock:
            executor = self._worker()
        executor.submit(lambda: None).result()

    def _after_fork_in_child(self) -> None:
        """A forked child has no worker thread (its executor's thread was the parent's) and no
        lock another thread holds: both anew, started when the child needs them. Captures the
        parent had under way are the parent's: those codes miss here and are captured again."""
        self._lock = threading.Lock()
        self._executor = None
        self._pending = {}

    @contextlib.contextmanager
    def _yielding_the_gil(self):
        """The worker's work, under a short switch interval (the module's docstring says why);
        the worker is one thread, so nothing else enters this meanwhile."""
        before = sys.getswitchinterval()
        sys.setswitchinterval(min(before, WORKER_SWITCH_INTERVAL_S))
        lowered = sys.getswitchinterval()  # as the interpreter keeps it (whole microseconds)
        try:
            yield
        finally:
            if sys.getswitchinterval() == lowered:  # else someone chose another one meanwhile
                sys.setswitchinterval(before)

    @contextlib.contextmanager
    def _as_the_caller(self, modes, call_done):
        """The worker's context for work a call handed it: after the GPU work the call had
        queued (`call_done`, an event or None), under the call's modes, yielding the GIL."""
        if call_done is not None:
            call_done.synchronize()  # releases the GIL while it waits
        with self._yielding_the_gil(), _in_modes(modes):
            yield

    def _work(self, capture, func, code, slots, modes, call_done):
        try:
            with self._as_the_caller(modes, call_done):
                result = capture(func, code, slots)
        except BaseException as e:  # noqa: a failure here must leave the code to run eagerly
            log.warning("kiln: background capture of %s failed, running it eagerly: %s: %s",
                        code.co_qualname, type(e).__name__, e)
            result = _C.SKIP
        with self._lock:
            self._done[code] = result
            self._pending.pop(code, None)

    def submit(self, work, key) -> Future:
        """Runs `work()` on the worker, under the calling thread's modes and after the work it
        has queued on the GPU so far, as a miss's capture would: for a compile a call asked
        for that should not stall it (a graph's specialisation for a shape). Pending under
        `key` until done (wait() waits for it too)."""
        modes, call_done = _thread_modes(), _end_of_call_on_gpu()
        with self._lock:
            done = Future()
            self._pending[key] = done

            def run():
                try:
                    with self._as_the_caller(modes, call_done):
                        done.set_result(work())
                except BaseException as e:  # noqa: the caller decides what a failure means
                    done.set_exception(e)
                finally:
                    with self._lock:
                        if self._pending.get(key) is done:
                            del self._pending[key]

            self._worker().submit(run)
        return done

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until no capture is under way (or `timeout` seconds passed): True when none
        is."""
        with self._lock:
            futures = list(self._pending.values())
        from concurrent.futures import wait

        _, not_done = wait(futures, timeout=timeout)
        return not not_done

    def forget(self) -> None:
        """Drops finished entries not yet handed out (kiln.reset)."""
        with self._lock:
            self._done.clear()


BACKGROUND = BackgroundCompiler()
os.register_at_fork(after_in_child=BACKGROUND._after_fork_in_child)
