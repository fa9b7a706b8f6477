"""The registry of named backends and the built-in ones."""
import functools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from kiln.exc import InvalidBackend

CompilerFn = Callable[[torch.fx.GraphModule, list], Callable]

_BACKENDS: Dict[str, CompilerFn] = {}


@dataclass(frozen=True)
class _Hooks:
    """What register_backend was told of a backend beyond its function (see there)."""
    prepare: Optional[Callable[[], None]] = None
    takes_mode: bool = False
    before_capture: Optional[Callable[[], None]] = None
    static_shapes: bool = False
    # For a static-shapes backend: compiles a graph with symbolic sizes whole, for every size in
    # their ranges, (gm, example_inputs, mode, options) -> a callable, or None where it cannot.
    symbolic: Optional[Callable] = None


_NO_HOOKS = _Hooks()
# id(compiler_fn) -> its hooks (registered functions stay in _BACKENDS: ids are stable)
_HOOKS: Dict[int, _Hooks] = {}


def register_backend(compiler_fn: CompilerFn = None, name: str = None,
                     prepare: Optional[Callable[[], None]] = None, takes_mode: bool = False,
                     before_capture: Optional[Callable[[], None]] = None,
                     static_shapes: bool = False, symbolic: Optional[Callable] = None):
    """Registers `compiler_fn` under `name` (default: its __name__); usable as a decorator.
    `prepare`, when given, runs each time the backend is chosen (kiln.compile, kiln.optimize):
    work every first call would otherwise pay, such as imports. It must not raise.
    `takes_mode`: compiler_fn(gm, example_inputs, mode=..., options=...) receives kiln.compile's
    mode and options (see with_mode). `before_capture`, when given, runs before each frame is
    traced for the backend: it starts what the graph's compile will wait on, to go on beside
    the capture. It must neither raise nor block. `static_shapes`: compiler_fn compiles graphs
    with static sizes only; a graph with symbolic sizes reaches it once per concrete signature
    of its inputs (kiln.backends.specialize), and, when it gives `symbolic`, that compiles the
    graph whole for the calls no signature's compile serves yet. Other backends get the
    symbolic graph itself, as torch.compile's do."""
    if compiler_fn is None:
        return lambda fn: register_backend(fn, name, prepare, takes_mode, before_capture,
                                           static_shapes, symbolic)
    key = name or compiler_fn.__name__
    if key in _BACKENDS and _BACKENDS[key] is not compiler_fn:
        raise InvalidBackend(f"a backend named {key!r} is already registered")
    _BACKENDS[key] = compiler_fn
    hooks = _Hooks(prepare, takes_mode, before_capture, static_shapes, symbolic)
    if hooks != _NO_HOOKS:
        _HOOKS[id(compiler_fn)] = hooks
    return compiler_fn


def with_mode(compiler_fn: CompilerFn, mode: Optional[str], options: Optional[dict]) -> CompilerFn:
    """`compiler_fn` bound to kiln.compile's `mode` and `options` when it was registered to take
    them and either is given; otherwise `compiler_fn` itself (other backends ignore both, as
    kiln.compile documents)."""
    if not _HOOKS.get(id(compiler_fn), _NO_HOOKS).takes_mode or (mode is None and not options):
        return compiler_fn
    return functools.partial(compiler_fn, mode=mode, options=dict(options or {}))


def prepare_backend(compiler_fn: CompilerFn) -> None:
    """Runs what `compiler_fn` registered to get ready, if anything."""
    prepare = _HOOKS.get(id(compiler_fn), _NO_HOOKS).prepare
    if prepare is not None:
        prepare()


def before_capture_hook(compiler_fn: CompilerFn) -> Optional[Callable[[], None]]:
    """What `compiler_fn` registered to start before a frame is traced for it, or None."""
    return _HOOKS.get(id(compiler_fn), _NO_HOOKS).before_capture


def static_shapes_only(compiler_fn: CompilerFn) -> bool:
    """Whether `compiler_fn` (or the backend with_mode bound) compiles static sizes only."""
    fn = compiler_fn.func if isinstance(compiler_fn, functools.partial) else compiler_fn
    return _HOOKS.get(id(fn), _NO_HOOKS).static_shapes


def symbolic_compiler(compiler_fn: CompilerFn) -> Optional[Callable]:
    """What compiles a symbolic graph whole for `compiler_fn` (bound to its mode and options
    when with_mode bound them): (gm, example_inputs) -> a callable or None; None when the
    backend has no such compile."""
    fn, mode, options = compiler_fn, None, None
    if isinstance(compiler_fn, functools.partial):
        fn = compiler_fn.func
        mode, options = compiler_fn.keywords.get("mode"), compiler_fn.keywords.get("options")
    symbolic = _HOOKS.get(id(fn), _NO_HOOKS).symbolic
    if symbolic is None:
        return None
    return functools.partial(symbolic, mode=mode, options=options)


def lookup_backend(backend) -> CompilerFn:
    """A callable for `backend`, given as a registered name or as a callable."""
    if callable(backend):
        return backend
    if isinstance(backend, str) and backend in _BACKENDS:
        return _BACKENDS[backend]
    raise InvalidBackend(f"unknown backend {backend!r}; registered: {', '.join(list_backends())}")


def list_backends() -> List[str]:
    return sorted(_BACKENDS)


@register_backend(name="eager")
def eager(gm: torch.fx.GraphModule, example_inputs: list):
    """Runs the captured graph with PyTorch's own kernels."""
    return gm.forward


@register_backend(name="aot_eager", static_shapes=True)
def aot_eager(gm: torch.fx.GraphModule, example_inputs: list):
    """The captured graph through torch's AOT autograd (functionalized ATen graphs; a forward and
    a backward graph where it needs autograd), each run by PyTorch's own kernels: what the
    "kiln" backend compiles, with kilnd left out (for telling a capture's fault from a
    compiler's)."""
    from kiln.backends.aot import through_aot_autograd

    return through_aot_autograd(gm, example_inputs, lambda aten_gm, inputs: aten_gm.forward)


@register_backend(name="inductor", static_shapes=True)
def inductor(gm: torch.fx.GraphModule, example_inputs: list):
    """PyTorch's own Inductor compiler on kiln's captured graph (what torch.compile uses), so
    the seeds' `optimize("inductor")` examples run and kiln's capture can be compared with it."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)
