"""The user-facing entry points over the frame hook: kiln.compile, kiln.optimize, kiln.disable,
kiln.reset, and the callback the hook calls on a cache miss."""
import functools
import logging
import weakref

import torch

from kiln import _C, config
from kiln.backends.registry import lookup_backend
from kiln.convert_frame import convert_frame, is_skipped
from kiln.exc import BackendCompilerFailed, KilnError, Unsupported

log = logging.getLogger("kiln")

# Every code object kiln made entries for or gave up on, so kiln.reset() can forget them.
_compiled_codes: "weakref.WeakSet" = weakref.WeakSet()
_warned_limit: "weakref.WeakSet" = weakref.WeakSet()


class FrameCallback:
    """What the hook calls for a frame it has no passing entry for (see client/hook)."""

    def __init__(self, backend, fullgraph: bool):
        self.backend = lookup_backend(backend)
        self.backend_name = backend if isinstance(backend, str) else getattr(
            backend, "__name__", type(backend).__name__)
        self.fullgraph = fullgraph

    def __call__(self, func, code, slots, cache_full):
        if is_skipped(code):
            return _C.SKIP
        if cache_full:
            return None
        entries = [e for e in _C.cache_entries(code)]
        if entries and config.logs("recompiles"):
            reasons = [e[0].failure_reason(slots, func) for e in entries]
            log.warning("kiln: recompiling %s: %s", code.co_qualname, "; ".join(
                r for r in reasons if r))
        if len(entries) >= config.cache_size_limit:
            if code not in _warned_limit:
                _warned_limit.add(code)
                reason = entries[-1][0].failure_reason(slots, func)
                log.warning("kiln: %s (%s:%d) reached cache_size_limit (%d); running it eagerly "
                            "from now on. Last guard that failed: %s", code.co_qualname,
                            code.co_filename, code.co_firstlineno, config.cache_size_limit,
                            reason)
            return _C.CACHE_FULL
        try:
            entry = convert_frame(func, code, slots, self.backend, self.backend_name,
                                  fullgraph=self.fullgraph)
        except Unsupported as e:
            if self.fullgraph:
                raise
            log.info("kiln: running %s eagerly: %s", code.co_qualname, e)
            _compiled_codes.add(code)
            return _C.SKIP
        except BackendCompilerFailed as e:
            if self.fullgraph:
                raise
            log.warning("kiln: %s; running %s eagerly", e, code.co_qualname)
            _compiled_codes.add(code)
            return _C.SKIP
        except KilnError:
            raise
        except Exception as e:  # a bug in kiln must not break the user's program
            if self.fullgraph:
                raise
            log.warning("kiln: internal error while capturing %s, running it eagerly: %s: %s",
                        code.co_qualname, type(e).__name__, e)
            _compiled_codes.add(code)
            return _C.SKIP
        _compiled_codes.add(code)
        return entry


class OptimizedModule(torch.nn.Module):
    """A compiled nn.Module: calls go through kiln, everything else reaches the original."""

    def __init__(self, mod: torch.nn.Module, callback: FrameCallback):
        super().__init__()
        self._orig_mod = mod
        self.__dict__["_kiln_region"] = _C.FrameRegion(mod, callback)

    def __call__(self, *args, **kwargs):
        return self._kiln_region(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._kiln_region(*args, **kwargs)

    def __getattr__(self, name):
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._modules["_orig_mod"], name)

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"


def _wrap(target, callback):
    if isinstance(target, torch.nn.Module):
        return OptimizedModule(target, callback)
    if not callable(target):
        raise TypeError(f"kiln.compile expects a function or an nn.Module, got "
                        f"{type(target).__name__}")
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
    dynamic, mode, options: accepted for compatibility; kiln specializes on static shapes.
    """
    if mode is not None and mode not in ("default", "reduce-overhead", "max-autotune",
                                         "max-autotune-no-cudagraphs"):
        raise ValueError(f"unknown mode {mode!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError("options must be a dict")
    backend = backend if backend is not None else config.default_backend
    callback = FrameCallback(backend, fullgraph)
    if model is None:
        return lambda m: _wrap(m, callback)
    return _wrap(model, callback)


class OptimizeContext:
    """kiln.optimize(backend): a decorator, and a context manager capturing the frames called
    inside its block."""

    def __init__(self, callback: FrameCallback):
        self.callback = callback
        self._prior = []

    def __call__(self, fn):
        return _wrap(fn, self.callback)

    def __enter__(self):
        self._prior.append(_C.set_eval_frame(self.callback))
        return self

    def __exit__(self, *exc):
        _C.set_eval_frame(self._prior.pop())
        return False


def optimize(backend="eager", nopython: bool = False, **kwargs):
    """The TorchDynamo spelling: kiln.optimize("eager")(fn), @kiln.optimize(my_compiler),
    `with kiln.optimize(...):`. nopython=True is fullgraph=True."""
    return OptimizeContext(FrameCallback(backend, fullgraph=nopython))


class _Disabled:
    def __init__(self):
        self._prior = []

    def __enter__(self):
        self._prior.append(_C.set_eval_frame(None))
        return self

    def __exit__(self, *exc):
        _C.set_eval_frame(self._prior.pop())
        return False


def disable(fn=None):
    """Runs `fn` (or the `with` block) without kiln, even inside a compiled region."""
    if fn is None:
        return _Disabled()
    region = _C.FrameRegion(fn, None)
    try:
        functools.update_wrapper(region, fn)
    except (AttributeError, TypeError):
        pass
    return region


def reset():
    """Forgets every compiled entry: the next call of any compiled function captures again."""
    for code in list(_compiled_codes):
        _C.reset_code(code)
    _compiled_codes.clear()
    _warned_limit.clear()
