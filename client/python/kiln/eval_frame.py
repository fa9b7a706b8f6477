"""The user-facing entry points over the frame hook: kiln.compile, kiln.optimize, kiln.disable,
kiln.reset, and the callback the hook calls on a cache miss."""
import functools
import logging
import operator
import types
from typing import Dict

import torch
from torch.nn.modules import module

from kiln import _C, config
from kiln.backends.registry import before_capture_hook, lookup_backend, prepare_backend, with_mode
from kiln.capture.skip_files import is_skipped, skip_code
from kiln.exc import (BackendCompilerFailed, CapturedForAnotherDevice, KilnError,
                      NothingToCompile, RecompileError, Unsupported)
from kiln.mutation_guard import GenerationTracker, install_generation_tagging
from kiln.state import STATE, counters

log = logging.getLogger("kiln")


class FrameCallback:
    """What the hook calls for a frame it has no passing entry for (see client/hook).

    `observer`, when given, is told about every entry made (observer.entry(info)) and every
    frame given up on (observer.eager(code, reason)): explain() listens this way. `mode` and
    `options` are kiln.compile's, passed to a backend that takes them (registry.with_mode)."""

    def __init__(self, backend, fullgraph: bool, observer=None, mode=None, options=None,
                 dynamic=None):
        if dynamic not in (None, True, False):
            raise TypeError(f"dynamic must be None, True or False, got {dynamic!r}")
        compiler_fn = lookup_backend(backend)
        prepare_backend(compiler_fn)
        install_generation_tagging()  # which modules the regions build (kiln.mutation_guard)
        self._before_capture = before_capture_hook(compiler_fn)
        self.backend = with_mode(compiler_fn, mode, options)
        self.backend_name = backend if isinstance(backend, str) else getattr(
            backend, "__name__", type(backend).__name__)
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.observer = observer
        self.stored = _stored_captures(compiler_fn, mode, options)
        # Frames captured for another device (kiln.graph.stand_in): code -> the guard trees of
        # its captures, each over this process's tensors. While one holds, the frame and its
        # callees run eagerly, captured already.
        self.stood_in: Dict[types.CodeType, list] = {}
        self._token = object()  # marks the entries this callback made (EntryInfo.extra)

    def __call__(self, func, code, slots):
        if is_skipped(code, func):
            return _C.SKIP
        stood = self.stood_in.get(code, ())
        if len(stood) >= config.cache_size_limit or \
                any(g.failure_reason(slots, func) is None for g in stood):
            return _C.EAGER  # captured for another device already (or as often as allowed)
        if STATE.stance == "eager_on_recompile":
            return None  # run eagerly, compile nothing
        # This callback's entries: the hook runs only those under it (another kiln.optimize's
        # backend compiled the others), so only they count towards its limit and its reasons.
        entries = [e for e in _C.cache_entries(code)
                   if e[2] is None or e[2].extra.get("owner", self._token) is self._token]
        if entries and code not in STATE.shared_module_codes and \
                _another_module_instance(entries, slots, func):
            # The code runs for several instances of one module class (a model's 12 blocks):
            # captured again with its modules guarded by structure, one entry for all of them.
            STATE.shared_module_codes.add(code)
        if entries and STATE.stance == "fail_on_recompile":
            reasons = [e[0].failure_reason(slots, func) for e in entries]
            raise RecompileError(
                f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno}) needs a new "
                "compile under the fail_on_recompile stance; guards that failed: "
                + "; ".join(r for r in reasons if r))
        if entries and config.logs("recompiles"):
            reasons = [e[0].failure_reason(slots, func) for e in entries]
            log.warning("kiln: recompiling %s: %s", code.co_qualname, "; ".join(
                r for r in reasons if r))
        if self.dynamic is None and entries and config.automatic_dynamic_shapes and \
                code not in STATE.sizes_changed_codes and _sizes_changed(entries, slots, func):
            # A frame whose inputs change size (a server's requests, a decoder's growing cache):
            # its later captures make every size of its inputs a symbol.
            STATE.sizes_changed_codes.add(code)
        if len(entries) >= config.cache_size_limit:
            if code not in STATE.warned_limit:
                STATE.warned_limit.add(code)
                reason = entries[-1][0].failure_reason(slots, func)
                log.warning("kiln: %s (%s:%d) reached cache_size_limit (%d); running it eagerly "
                            "from now on. Last guard that failed: %s", code.co_qualname,
                            code.co_filename, code.co_firstlineno, config.cache_size_limit,
                            reason)
            return _C.CACHE_FULL
        if STATE.stance == "compile_in_background" and not self.fullgraph:
            from kiln.background import BACKGROUND

            return BACKGROUND.miss(self.prepare, func, code, slots, self.install_stored)
        return self.install_stored(func, code, slots) or self.capture(func, code, slots)

    def install_stored(self, func, code, slots):
        """The entry of a stored capture that holds on this frame, or None."""
        if self.stored is None:
            return None
        entry = self.stored.install(func, code, slots)
        if entry is not None:
            entry[2].extra["owner"] = self._token
            STATE.compiled_codes.add(code)
            if self.observer is not None:
                self.observer.entry(entry[2])
        return entry

    def _dynamic(self, code):
        """Whether the capture of `code` makes its inputs' sizes symbols: True, None (only the
        dimensions a program marked) or False (none)."""
        if self.dynamic is not None:
            return self.dynamic
        if not config.assume_static_by_default or (
                config.automatic_dynamic_shapes and code in STATE.sizes_changed_codes):
            return True
        return None

    def prepare(self, func, code, slots):
        """A background miss's work (kiln.background): a capture (the miss tried the stored one
        on the call's own arguments already), then one run of its plan over zeroed inputs, so
        that the call that gets the entry runs at full speed (no prologue, no first-run setup
        left)."""
        entry = self.capture(func, code, slots)
        if isinstance(entry, tuple):
            warm = getattr(entry[2].compiled_fn, "warm", None)
            # Not in a process that uses the GPU: there the serving thread goes on queuing its
            # own kernels and recording its CUDA graphs while the worker runs, and a plan run
            # beside them was seen to crash the process (transformers' generate() on an H200,
            # the warm run of a decode step's plan). The call that gets the entry does the
            # first run instead, on its own thread, as without the stance.
            if warm is not None and not torch.cuda.is_initialized():
                try:
                    warm()
                except RuntimeError as e:  # the first call sets it up instead
                    log.debug("kiln: warming %s's plan failed: %s", code.co_qualname, e)
        return entry

    def capture(self, func, code, slots):
        """Captures and compiles the frame: the hook's entry, or SKIP when it runs eagerly."""
        if self._before_capture is not None:
            self._before_capture()
        counters["frames"]["total"] += 1
        try:
            from kiln.convert_frame import convert_frame  # the tracer: not for stored captures

            entry = convert_frame(func, code, slots, self.backend, self.backend_name,
                                  fullgraph=self.fullgraph, stored=self.stored,
                                  unspecialized_modules=code in STATE.shared_module_codes,
                                  dynamic=self._dynamic(code))
        except CapturedForAnotherDevice as e:
            log.info("kiln: %s: %s", code.co_qualname, e)
            self.stood_in.setdefault(code, []).append(e.guards)
            return _C.EAGER
        except NothingToCompile as e:  # not a break: the frame is left to Python as it is
            log.debug("kiln: %s", e)
            STATE.compiled_codes.add(code)
            return _C.SKIP
        except Unsupported as e:
            if self.fullgraph:
                raise
            log.info("kiln: running %s eagerly: %s", code.co_qualname, e)
            if self.observer is not None:
                self.observer.eager(code, e)
            STATE.compiled_codes.add(code)
            return _C.SKIP
        except BackendCompilerFailed as e:
            if self.fullgraph or config.raise_on_backend_error:
                raise
            log.warning("kiln: %s; running %s eagerly", e, code.co_qualname)
            STATE.compiled_codes.add(code)
            return _C.SKIP
        except KilnError:
            raise
        except Exception as e:  # a bug in kiln must not break the user's program
            if self.fullgraph:
                raise
            log.warning("kiln: internal error while capturing %s, running it eagerly: %s: %s",
                        code.co_qualname, type(e).__name__, e)
            STATE.compiled_codes.add(code)
            return _C.SKIP
        entry[2].extra["owner"] = self._token
        counters["frames"]["ok"] += 1
        STATE.compiled_codes.add(code)
        if self.observer is not None:
            self.observer.entry(entry[2])
        return entry


def _failed_guard(entries, slots, func, kind: str):
    """(text, why) of the first failing guard of each entry whose text is one of the entry's
    `kind` guards (an info.extra set of guard texts), in turn."""
    for manager, _code, info, *_ in entries:
        texts = info.extra.get(kind) if info is not None else None
        if not texts:
            continue
        reason = manager.failure_reason(slots, func) or ""
        # A reason is the failed guard's text, ": ", then why (the text may hold ": " too).
        text = next((t for t in texts if reason.startswith(t + ": ")), None)
        if text is not None:
            yield text, reason[len(text) + 2:]


def _another_module_instance(entries, slots, func) -> bool:
    """Whether an entry of the frame failed only because a module it was captured for is not
    the one this call has (its first failing guard is an nn.Module's identity)."""
    return any(True for _ in _failed_guard(entries, slots, func, "module_identity_guards"))


def _sizes_changed(entries, slots, func) -> bool:
    """Whether an entry of the frame failed on the size of one of its inputs: a tensor input's
    size or stride, the SHAPE guard (kiln.graph.symbolic_shapes), or the value of an int
    argument (the entry's input_size_guards), not a parameter's shape."""
    return any(" TENSOR_MATCH " not in text or why.startswith(("size mismatch", "stride mismatch"))
               for text, why in _failed_guard(entries, slots, func, "input_size_guards"))


def _stored_captures(compiler_fn, mode, options):
    """The stored captures of frames compiled by the "kiln" backend with these options (None
    for other backends: their compiled callables are Python objects no record can name)."""
    from kiln.backends import kiln_backend
    from kiln.stored_capture import StoredCaptures
    from kiln.stored_names import prefetch_runtime_digest

    if not config.stored_captures or compiler_fn is not kiln_backend.kiln:
        return None
    prefetch_runtime_digest(STATE.daemon.settings.cache_dir)
    cuda_graphs = kiln_backend.cuda_graphs_wanted(mode, options)
    return StoredCaptures(f"kiln|cuda_graphs={int(cuda_graphs)}", cuda_graphs)


def _module_call():
    """What torch.nn.Module.__call__ consults before it calls forward, for the region's check
    that a call would go straight to forward (client/hook/eval_frame.c, module_forward)."""
    hooks = (module._global_backward_pre_hooks, module._global_backward_hooks,
             module._global_forward_hooks, module._global_forward_pre_hooks)
    return (torch.nn.Module.__call__, torch.nn.Module._call_impl, hooks)


class OptimizedModule(torch.nn.Module):
    """A compiled nn.Module: calls go through kiln, everything else reaches the original."""

    def __init__(self, mod: torch.nn.Module, callback: FrameCallback):
        super().__init__()
        self._orig_mod = mod
        self.__dict__["_kiln_region"] = _C.FrameRegion(mod, callback, module_call=_module_call())

    # The region itself (C) is what a call reaches, found by a C getter: no Python frame of
    # kiln's per call.
    __call__ = property(operator.attrgetter("_kiln_region"))

    def forward(self, *args, **kwargs):
        return self._kiln_region(*args, **kwargs)

    def __getattr__(self, name):
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._modules["_orig_mod"], name)

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"


def _prepare_stored(target, callback) -> None:
    """kiln.compile on a warm cache: the stored capture of the frame a call of `target` runs
    first (a module's forward, a function, a bound method) prepared now, so that the first call
    runs at full speed (StoredCaptures.prepare)."""
    if callback.stored is None or not config.prepare_stored_captures:
        return
    if isinstance(target, torch.nn.Module):
        func = None if "forward" in target.__dict__ else getattr(type(target), "forward", None)
        bound_self = target
    elif isinstance(target, types.MethodType):
        func, bound_self = target.__func__, target.__self__
    else:
        func, bound_self = target, None
    if not isinstance(func, types.FunctionType):
        return
    had_client = STATE.daemon.has_client()
    try:
        callback.stored.prepare(func, bound_self=bound_self)
    finally:
        # kiln.compile leaves no gRPC channel open: a server that compiles and then forks its
        # workers shares none with them (gRPC does not survive a fork); the first call that
        # needs kilnd opens one, in whichever process makes it. A kilnd found down stays known
        # as down: the first call does not wait on it a second time.
        if not had_client:
            STATE.daemon.close(keep_down=True)


def _wrap(target, callback):
    # kiln.compile of what kiln.compile made: the outermost decides (torch.compile unwraps so,
    # innermost_fn). A region called at run time installs its own callback.
    while (type(target) is _C.FrameRegion and target.callback is not None) or \
            isinstance(target, OptimizedModule):
        target = target._orig_mod if isinstance(target, OptimizedModule) else target.fn
    if isinstance(target, torch.nn.Module):
        wrapped = OptimizedModule(target, callback)
        _prepare_stored(target, callback)
        return wrapped
    if not callable(target):
        raise TypeError(f"kiln.compile expects a function or an nn.Module, got "
                        f"{type(target).__name__}")
    _prepare_stored(target, callback)
    region = _C.FrameRegion(target, callback)
    try:
        functools.update_wrapper(region, target)
    except (AttributeError, TypeError):
        pass
    return region


def compile(model=None, *, backend=None, fullgraph: bool = False, dynamic=None, mode=None,
            options=None):
    """Like torch.compile: returns `model` (a function or nn.Module) compiled by kiln.

    backend: a registered name ("eager", ...) or a callable (gm, example_inputs) -> callable.
    fullgraph: raise kiln.exc.Unsupported instead of running a frame eagerly.
    dynamic: None (the default) compiles static sizes first and, for a frame called again with
    another size of an input, makes every size of its inputs a symbol (one graph for all of
    them); True makes every size of every input a symbol from the first compile; False keeps
    sizes static (a compile per shape). kiln.mark_dynamic and its relatives mark dimensions of
    a tensor (kiln.graph.symbolic_shapes).
    mode, options: passed to the "kiln" backend, where they choose CUDA graphs: on by default
    (kiln.config.cuda_graphs), "reduce-overhead" on, "max-autotune-no-cudagraphs" off, and
    options={"triton.cudagraphs": bool} either way; other backends ignore them.
    With KILN_DISABLE=1 (or TORCH_COMPILE_DISABLE=1) in the environment, `model` is returned as
    it is.
    """
    if mode is not None and mode not in ("default", "reduce-overhead", "max-autotune",
                                         "max-autotune-no-cudagraphs"):
        raise ValueError(f"unknown mode {mode!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError("options must be a dict")
    if config.disabled():  # KILN_DISABLE=1 and torch's spellings of it
        return (lambda m: m) if model is None else model
    backend = backend if backend is not None else config.default_backend
    callback = _shared_callback(backend, fullgraph, mode, options, dynamic)
    if model is None:
        return lambda m: _wrap(m, callback)
    return _wrap(model, callback)


# kiln.compile's callbacks by what they do: every call of kiln.compile with the same backend and
# settings shares one, so that their frames share entries (a model's blocks compiled one by one,
# as regional compilation and FSDP2 do, reuse each other's entries as under torch.compile).
_CALLBACKS: Dict[tuple, FrameCallback] = {}


def _shared_callback(backend, fullgraph, mode, options, dynamic=None) -> FrameCallback:
    try:
        key = (backend, fullgraph, mode, frozenset((options or {}).items()), dynamic)
        hash(key)
    except TypeError:  # an unhashable backend or option: a callback of its own
        return FrameCallback(backend, fullgraph, mode=mode, options=options, dynamic=dynamic)
    callback = _CALLBACKS.get(key)
    if callback is None:
        callback = _CALLBACKS[key] = FrameCallback(backend, fullgraph, mode=mode,
                                                   options=options, dynamic=dynamic)
    return callback


class OptimizeContext:
    """kiln.optimize(backend): a decorator, and a context manager capturing the frames called
    inside its block."""

    def __init__(self, callback: FrameCallback):
        self.callback = callback
        self._prior = []

    def __call__(self, fn):
        return _wrap(fn, self.callback)

    def __enter__(self):
        GenerationTracker.next_generation()  # modules built in the block are new ones
        self._prior.append(_C.set_eval_frame(self.callback))
        return self

    def __exit__(self, *exc):
        _C.set_eval_frame(self._prior.pop())
        return False


def optimize(backend="eager", nopython: bool = False, *, disable: bool = False, dynamic=None):
    """The TorchDynamo spelling: kiln.optimize("eager")(fn), @kiln.optimize(my_compiler),
    `with kiln.optimize(...):`. nopython=True is fullgraph=True; disable=True compiles nothing
    (the decorator returns the function as it is, the block runs as without it), as KILN_DISABLE=1
    does (kiln.config.disabled); dynamic as kiln.compile's."""
    if disable or config.disabled():
        return _NotOptimized()
    return OptimizeContext(_shared_callback(backend, nopython, None, None, dynamic))


class _NotOptimized:
    """kiln.optimize(..., disable=True): a decorator and a context manager that do nothing."""

    def __call__(self, fn):
        return fn

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Disabled:
    """kiln.disable(): a context manager, and a decorator like kiln.disable itself."""

    def __init__(self):
        self._prior = []

    def __call__(self, fn):
        return disable(fn)

    def __enter__(self):
        self._prior.append(_C.set_eval_frame(None))
        return self

    def __exit__(self, *exc):
        _C.set_eval_frame(self._prior.pop())
        return False


def disable(fn=None, recursive: bool = True):
    """Runs `fn` (or the `with` block) without kiln, even inside a compiled region: a call of
    it from a captured frame is a graph break. recursive=False leaves only `fn`'s own frame to
    CPython (it is never captured, a call of it is a graph break) and still captures the frames
    it calls; `fn` is returned as it is."""
    if not recursive:
        if fn is None:
            return functools.partial(disable, recursive=False)
        skip_code(fn)
        return fn
    if fn is None:
        return _Disabled()
    region = _C.FrameRegion(fn, None)
    try:
        functools.update_wrapper(region, fn)
    except (AttributeError, TypeError):
        pass
    return region


class _Stance:
    """set_stance's result: the stance is already in force; as a context manager (or
    decorator) it puts the previous one back on exit."""

    def __init__(self, stance, prior):
        self.stance = stance
        self.prior = prior

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        set_stance(self.prior)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prior = set_stance(self.stance).prior
            try:
                return fn(*args, **kwargs)
            finally:
                set_stance(prior)

        # A capture that reaches a call of the wrapper traces `fn` itself: the outermost
        # compiled region decides, as for a call of a compiled function (torch's
        # _torchdynamo_inline); the stance only chooses what runs outside a capture.
        wrapper.__kiln_inline__ = fn
        set_stance(self.prior)
        return wrapper


def set_stance(stance: str = "default"):
    """How compiled functions behave from now on (process-wide):
    "default": compile on a miss; "eager_on_recompile": use what is compiled, run misses
    eagerly and compile nothing (serving); "fail_on_recompile": raise RecompileError naming
    the failed guards instead of compiling again; "force_eager": ignore kiln entirely;
    "compile_in_background": a miss installs its stored capture at once when one holds, and
    otherwise runs eagerly at once (it and all it calls) while a worker thread captures and
    compiles it, then (in a process not using CUDA) runs the plan once over zeroed inputs (its
    prologue and first-run setup), and later calls switch to the compiled code when it is
    ready (kiln.wait_for_compiles waits for the worker)."""
    prior = STATE.stance
    STATE.stance = stance  # checks it, and sets the hook's force_eager flag with it
    if stance == "compile_in_background":
        from kiln.background import BACKGROUND

        BACKGROUND.start_worker()  # now, not inside the first call that misses
    return _Stance(stance, prior)


def run(fn=None):
    """Run-only mode: `with kiln.run():` uses only what is already compiled (guards are still
    checked); a miss runs eagerly and nothing is compiled. kiln.run(fn) returns `fn` wrapped to
    run that way, leaving the stance of other calls as it is."""
    if fn is not None:
        return _Stance("eager_on_recompile", STATE.stance)(fn)
    return set_stance("eager_on_recompile")


def wait_for_compiles(timeout=None) -> bool:
    """Waits until no background capture (the "compile_in_background" stance) is under way, or
    `timeout` seconds passed; True when none is."""
    from kiln.background import BACKGROUND

    return BACKGROUND.wait(timeout)


def reset():
    """Forgets every compiled entry: the next call of any compiled function captures again."""
    from kiln.background import BACKGROUND

    # Work the worker has under way (a capture, a graph's specialisation) finishes first, with
    # the daemon and settings it started with: none of it lands after the reset.
    BACKGROUND.wait(timeout=config.reset_waits_for_compiles_s)
    BACKGROUND.forget()
    for code in list(STATE.compiled_codes):
        _C.reset_code(code)
    STATE.reset()
    _CALLBACKS.clear()
