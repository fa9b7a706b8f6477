"""Which torch.nn modules a compiled region made: GenerationTracker, as torch._dynamo has it.

A module built while a kiln region runs (a `copy.deepcopy(model)` in a compiled function, an
inner network a meta-learning step builds per call, a layer made inside `with kiln.optimize()`)
is new on every call. Guarded by identity, as a module made beforehand is, each call would fail
the guard and capture the frame again until `cache_size_limit`; so the capture guards such a
module by structure from its first capture (kiln.variables.builder), one entry for all of them.

Modules are tagged when they are built (torch.nn.Module.__init__) and when they are copied or
unpickled (__setstate__): both are wrapped once, when kiln first installs a region. Each entry
into a `with kiln.optimize(...)` block starts a generation; a module's generation value is the
one in force when it was built.
"""
import threading
import weakref

import torch

from kiln import _C

__all__ = ["GenerationTracker", "built_in_a_region", "install_generation_tagging"]


class GenerationTracker:
    """torch._dynamo.mutation_guard.GenerationTracker's interface: `generation`, tag(module),
    get_generation_value(module) (-1 for a module built before kiln tagged any), check(module)
    (built in the current generation)."""

    generation = 0
    generation_values: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
    # Modules built or copied while a kiln region ran (kiln's hook installed on the thread).
    in_region: "weakref.WeakSet" = weakref.WeakSet()
    _lock = threading.Lock()

    @classmethod
    def tag(cls, module) -> None:
        try:
            with cls._lock:
                cls.generation_values[module] = cls.generation
                if _C.get_eval_frame() is not None:
                    cls.in_region.add(module)
        except TypeError:  # a module class that refuses weak references: left untagged
            pass

    @classmethod
    def get_generation_value(cls, module) -> int:
        return cls.generation_values.get(module, -1)

    @classmethod
    def check(cls, module) -> bool:
        return cls.get_generation_value(module) == cls.generation

    @classmethod
    def next_generation(cls) -> None:
        with cls._lock:
            cls.generation += 1


def built_in_a_region(module) -> bool:
    """Whether `module` was built (or copied) while a kiln region ran."""
    try:
        return module in GenerationTracker.in_region
    except TypeError:
        return False


_installed = False


def install_generation_tagging() -> None:
    """Wraps torch.nn.Module.__init__ and __setstate__ (once) so that each module built or
    copied from now on is tagged (GenerationTracker.tag)."""
    global _installed
    if _installed:
        return
    module = torch.nn.Module
    init, setstate = module.__init__, module.__setstate__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        GenerationTracker.tag(self)

    def __setstate__(self, state):
        setstate(self, state)
        GenerationTracker.tag(self)

    for wrapper, original in ((__init__, init), (__setstate__, setstate)):
        wrapper.__qualname__ = original.__qualname__
        wrapper.__doc__ = original.__doc__
        wrapper.__wrapped__ = original
    module.__init__ = __init__
    module.__setstate__ = __setstate__
    _installed = True
