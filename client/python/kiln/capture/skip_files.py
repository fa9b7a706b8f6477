"""Which code kiln leaves to CPython: frames it never captures, and library functions the
symbolic executor calls as opaque (a graph break) instead of tracing into them."""
import os
import sysconfig
import types
import weakref

import torch


def _dir_of(module_file: str) -> str:
    return os.path.dirname(os.path.abspath(module_file)) + os.sep


_TORCH_DIR = _dir_of(torch.__file__)
_KILN_DIR = _dir_of(os.path.dirname(os.path.abspath(__file__)))
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                      for k in ("stdlib", "platstdlib")})
_THIRD_PARTY_SKIPPED = ("numpy", "scipy", "_pytest", "pytest", "pluggy", "typing_extensions")
_TORCH_NN_MODULES_DIR = os.path.join(_TORCH_DIR, "nn", "modules") + os.sep


# Code the program asked kiln to leave to CPython (kiln.disable(fn, recursive=False)).
_skipped_codes = weakref.WeakSet()


def skip_code(fn) -> None:
    """Leaves `fn`'s own frame to CPython wherever it runs: never captured, never inlined (a call
    of it is a graph break); the frames it calls are captured as usual."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        raise TypeError(f"kiln.disable(recursive=False) expects a Python function, got "
                        f"{type(fn).__name__}")
    _skipped_codes.add(code)


def is_skipped(code, func=None) -> bool:
    """True for code kiln leaves to CPython: its own, torch's internals, the standard library,
    what the program marked (skip_code), a module's body, and code that kiln or torch generated
    at run time (a dataclass's __init__, an FX graph's forward): `func`'s globals name the module
    that made it."""
    if code in _skipped_codes:
        return True
    if code.co_name == "<module>":  # an import's body, or source exec'd as a module
        return True
    filename = code.co_filename
    if func is not None and not os.path.isabs(filename):
        owner = getattr(func, "__globals__", {}).get("__name__") or ""
        if owner.split(".", 1)[0] in ("torch", "kiln"):
            return True
    if filename.startswith(_KILN_DIR):
        return True
    if filename.startswith(_TORCH_DIR):
        # torch.nn's modules are models too: their forward methods are captured.
        return not (filename.startswith(_TORCH_NN_MODULES_DIR) and code.co_name == "forward")
    if filename.startswith(_STDLIB_DIRS) and "site-packages" not in filename:
        return True
    if filename.startswith("<") and filename.startswith(("<frozen", "<kiln")):
        return True
    for pkg in _THIRD_PARTY_SKIPPED:  # a package, or a single-module distribution
        if f"{os.sep}site-packages{os.sep}{pkg}{os.sep}" in filename or \
                filename.endswith(f"{os.sep}site-packages{os.sep}{pkg}.py"):
            return True
    return False


# Standard-library modules whose functions are pure enough to trace into (reading an enum's
# value, typing.cast, a dataclass helper, contextlib.nullcontext's methods); the rest of the
# standard library has effects kiln would lose (logging handlers, time, I/O) and is called at a
# graph break instead.
_TRACEABLE_STDLIB = ("typing.py", "enum.py", "dataclasses.py", "abc.py", "contextlib.py",
                     os.path.join("collections", "__init__.py"))


def is_torch_file(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR)


def traces_into(code) -> bool:
    """Whether the executor may inline a function of `code`: not one the program marked
    (skip_code), nor one of the libraries above that kiln calls at a graph break."""
    if code in _skipped_codes:
        return False
    filename = code.co_filename
    if filename.startswith(_TORCH_DIR):
        return True
    if filename.startswith(_KILN_DIR):
        return False
    if filename.startswith(_STDLIB_DIRS) and "site-packages" not in filename:
        return filename.endswith(_TRACEABLE_STDLIB)
    for pkg in _THIRD_PARTY_SKIPPED:
        if f"{os.sep}site-packages{os.sep}{pkg}{os.sep}" in filename:
            return False
    return True
