"""How a stored capture (kiln.stored_capture) names what it holds, without any object's
address: its key (capture_key: the code object's identity, kiln's own build, torch's and
Python's versions, the compile setting), classes, functions and modules by importable name (a
function also by a digest of its code; one under a decorator through the __wrapped__ chain of
the importable one), and constant values as JSON (encode, decode). Nothing read back is
executed or unpickled: a name is resolved by import and attribute lookup, then checked.
"""
import base64
import hashlib
import importlib
import json
import reprlib
import sys
import threading
import types
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from kiln import _C
from kiln.daemon.private_files import write_private

FORMAT = b"kiln-stored-capture-1"


class NotStorable(Exception):
    """A capture (or a value in it) that a record cannot name."""


class NotInstallable(Exception):
    """A record whose structural checks fail on the live frame."""


# ---- keys -----------------------------------------------------------------------------------

def _const_text(value) -> str:
    """A canonical text of a code object's constant (frozensets sorted: their order follows
    string hashing, which differs between processes)."""
    if isinstance(value, frozenset):
        return "frozenset(" + ",".join(sorted(_const_text(v) for v in value)) + ")"
    if isinstance(value, tuple):
        return "(" + ",".join(_const_text(v) for v in value) + ",)"
    if isinstance(value, types.CodeType):
        return "code:" + code_digest(value)
    return f"{type(value).__name__}:{value!r}"


def code_digest(code: types.CodeType) -> str:
    """A digest of everything that makes `code` what it is: bytecode, constants (nested code
    too), names, argument layout, file, qualified name, line and exception tables."""
    cached = _CODE_DIGESTS.get(code)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    for part in (code.co_code, code.co_exceptiontable, code.co_linetable):
        h.update(len(part).to_bytes(8, "little") + part)
    fields = (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
              code.co_filename, code.co_qualname, code.co_firstlineno, code.co_flags,
              code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount)
    h.update(repr(fields).encode())
    h.update(",".join(_const_text(c) for c in code.co_consts).encode())
    digest = h.hexdigest()
    _CODE_DIGESTS[code] = digest
    return digest


_CODE_DIGESTS: "Dict[types.CodeType, str]" = {}


def _remembered_digest(signature: str, compute, cache_dir: Optional[Path]) -> str:
    """compute()'s hex digest, remembered in `cache_dir` under `signature` (what it depends on:
    paths, sizes, modification times), so that a start does not hash kiln's build again (its
    extension is tens of megabytes)."""
    memo = None
    if cache_dir is not None:
        memo = cache_dir / "build-digests" / hashlib.sha256(signature.encode()).hexdigest()
        try:
            text = memo.read_text().strip()
            if len(text) == 64:
                return text
        except OSError:
            pass
    digest = compute()
    if memo is not None:
        write_private(memo, digest.encode())
    return digest


def _build_files() -> List[Path]:
    root = Path(__file__).parent  # the kiln package
    return sorted([*root.rglob("*.py"), Path(_C.__file__)])


def _hash_files(files: List[Path], root: Path) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


_RUNTIME: Dict[Any, bytes] = {}
_RUNTIME_WORKERS: Dict[Any, threading.Thread] = {}


def prefetch_runtime_digest(cache_dir: Optional[Path]) -> None:
    """Starts computing runtime_digest(cache_dir) on a thread of its own unless it is known or
    under way: on a machine's first start it hashes kiln's build (tens of megabytes, while
    hashlib releases the GIL), which storing the first capture would otherwise wait for."""
    if cache_dir in _RUNTIME or cache_dir in _RUNTIME_WORKERS:
        return
    worker = threading.Thread(target=runtime_digest, args=(cache_dir,), daemon=True,
                              name="kiln-runtime-digest")
    _RUNTIME_WORKERS[cache_dir] = worker
    worker.start()


def runtime_digest(cache_dir: Optional[Path]) -> bytes:
    """kiln's build (every Python source of the package and the extension), torch's and
    Python's versions: what a stored capture was made by."""
    got = _RUNTIME.get(cache_dir)
    if got is not None:
        return got
    worker = _RUNTIME_WORKERS.get(cache_dir)
    if worker is not None and worker is not threading.current_thread() and worker.is_alive():
        worker.join()  # the prefetch (a thread of a parent process is not alive in its child)
        got = _RUNTIME.get(cache_dir)
        if got is not None:
            return got
    files = _build_files()
    root = Path(_C.__file__).parent
    signature = "|".join(f"{p}:{st.st_size}:{st.st_mtime_ns}" for p, st in
                         ((p, p.stat()) for p in files))
    h = hashlib.sha256(FORMAT)
    h.update(f"{torch.__version__}|{sys.version}|{sys.implementation.cache_tag}".encode())
    h.update(_remembered_digest(signature, lambda: _hash_files(files, root), cache_dir).encode())
    _RUNTIME[cache_dir] = got = h.digest()
    return got


def key_parts(code: types.CodeType, compile_setting: str, cache_dir: Optional[Path]) -> dict:
    """What a capture key is made of, each part by name (explain_miss compares them)."""
    return {"kiln": runtime_digest(cache_dir).hex(), "torch": torch.__version__,
            "python": sys.version.split()[0], "setting": compile_setting,
            "code": code_digest(code)}


def capture_key(code: types.CodeType, compile_setting: str, cache_dir: Optional[Path]) -> str:
    parts = key_parts(code, compile_setting, cache_dir)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def location_key(code: types.CodeType) -> str:
    """Where a code object is, whatever its content: the captures stored for it under any key
    are listed there (CaptureStore.locate), for explain_miss."""
    return hashlib.sha256(f"{code.co_filename}|{code.co_qualname}".encode()).hexdigest()


def nearest_difference(now: dict, stored: List[dict]) -> str:
    """Which parts of the key differ between `now` and the stored entry nearest to it."""
    if not stored:
        return "no capture was ever stored for this code"
    best = min(stored, key=lambda other: sum(other.get(k) != v for k, v in now.items()))
    names = {"kiln": "kiln's build", "torch": "torch's version", "python": "Python's version",
             "setting": "the compile setting (backend, CUDA graphs)",
             "code": "the code (its file changed)"}
    diff = [f"{names[k]} ({str(best.get(k))[:16]} stored, {str(v)[:16]} now)"
            for k, v in now.items() if best.get(k) != v]
    return "the nearest stored capture differs in " + "; ".join(diff) if diff else \
        "a capture under this very key was stored, then lost"


# ---- naming objects ---------------------------------------------------------------------------

# Module-level objects without a qualified name that guards reach by identity (torch.nn's global
# hook dicts), found by scanning these modules.
_SCANNED_MODULES = ("torch.nn.modules.module",)
# Where builtin functions bound to a class (torch.relu) are exported.
_FUNCTION_MODULES = ("torch", "torch.nn.functional", "torch._C._nn", "torch.special",
                     "torch.linalg", "torch.fft", "math", "operator", "builtins")


def _resolve(module: str, qualname: str):
    if "<locals>" in qualname:
        raise NotInstallable(f"{module}.{qualname} is not importable")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise NotInstallable(f"cannot import {module}: {e}") from None
    for part in qualname.split(".") if qualname else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise NotInstallable(f"{module} has no {qualname}") from None
    return obj


def name_of(obj) -> Optional[list]:
    """[kind, module, qualname(, code digest)] naming `obj` so that _named finds this very
    object, or None; ["wrapped", module, qualname, depth, code digest] for a function found
    `depth` steps down the __wrapped__ chain of the importable object of that name."""
    if isinstance(obj, types.ModuleType):
        if sys.modules.get(obj.__name__) is obj:
            return ["module", obj.__name__, ""]
        return None
    if type(obj) is dict and isinstance(obj.get("__name__"), str):
        # A module's globals (where an inlined function from another module reads its names).
        mod = sys.modules.get(obj["__name__"])
        if mod is not None and vars(mod) is obj:
            return ["globals", obj["__name__"], ""]
        return None
    owner = getattr(obj, "__objclass__", None)  # slot wrappers, method descriptors
    module = getattr(owner if owner is not None else obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<locals>" not in qualname:
        try:
            found = _resolve(module, qualname)
        except NotInstallable:
            found = None
        if found is obj:
            if isinstance(obj, types.FunctionType):
                return ["function", module, qualname, code_digest(obj.__code__)]
            return ["named", module, qualname]
        depth = _wrapped_depth(found, obj) if isinstance(obj, types.FunctionType) else None
        if depth is not None:
            return ["wrapped", module, qualname, depth, code_digest(obj.__code__)]
    name = getattr(obj, "__name__", None)
    if isinstance(name, str) and isinstance(obj, types.BuiltinFunctionType):
        # torch.relu and kin: bound to torch._C._VariableFunctions, exported by a module.
        for module in (getattr(obj, "__module__", None), *_FUNCTION_MODULES):
            mod = sys.modules.get(module) if isinstance(module, str) else None
            if mod is not None and getattr(mod, name, None) is obj:
                return ["named", module, name]
    for name in _SCANNED_MODULES:
        mod = sys.modules.get(name)
        for attr, value in (vars(mod).items() if mod is not None else ()):
            if value is obj and not attr.startswith("__"):
                return ["named", name, attr]
    return None


# How many decorators deep a function is looked for under an importable one (name_of).
_WRAPPED_DEPTH = 8


def _wrapped(obj):
    """What functools.wraps recorded that `obj` wraps (its own __wrapped__), or None."""
    return getattr(obj, "__dict__", {}).get("__wrapped__")


def _wrapped_depth(outer, function) -> Optional[int]:
    """How many __wrapped__ steps lead from `outer` to `function`, or None. functools.wraps
    names a decorator's wrapper as what it wraps, so of two stacked decorators (torch.no_grad()
    over transformers' dynamic_rope_update on a rotary embedding's forward) only the outer one
    is found by that name; the inner one and the function itself are its __wrapped__ chain."""
    current = outer
    for depth in range(1, _WRAPPED_DEPTH + 1):
        current = _wrapped(current)
        if current is None:
            return None
        if current is function:
            return depth
    return None


def resolve_name(desc: list):
    if desc[0] == "globals":
        return vars(_resolve(desc[1], ""))
    obj = _resolve(desc[1], desc[2])
    if desc[0] == "wrapped":
        depth = desc[3] if len(desc) == 5 else None
        if type(depth) is not int or not 0 < depth <= _WRAPPED_DEPTH:
            raise NotInstallable(f"malformed name {desc!r}")
        for _ in range(depth):
            obj = _wrapped(obj)
        if not isinstance(obj, types.FunctionType) or code_digest(obj.__code__) != desc[4]:
            raise NotInstallable(f"{desc[1]}.{desc[2]}'s wrapped function {depth} deep is not "
                                 f"the function captured")
    if desc[0] == "function":
        if not isinstance(obj, types.FunctionType) or code_digest(obj.__code__) != desc[3]:
            raise NotInstallable(f"{desc[1]}.{desc[2]} is not the function captured")
    return obj


# ---- values -------------------------------------------------------------------------------------

_DTYPES = {str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_MEMORY_FORMATS = {str(m): m for m in (torch.contiguous_format, torch.channels_last,
                                        torch.channels_last_3d, torch.preserve_format)}
_LAYOUTS = {str(x): x for x in (torch.strided, torch.sparse_coo, torch._mkldnn)}


def encode(value):
    """A JSON value standing for a constant, or a named object."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return {"float": repr(value)}
    if type(value) is bytes:
        return {"bytes": base64.b64encode(value).decode()}
    if type(value) is tuple:
        return {"tuple": [encode(v) for v in value]}
    if type(value) is torch.dtype:
        return {"dtype": str(value)}
    if type(value) is torch.device:
        return {"device": str(value)}
    if type(value) is torch.memory_format:
        return {"memory_format": str(value)}
    if type(value) is torch.layout:
        return {"layout": str(value)}
    if value is Ellipsis:
        return {"ellipsis": True}
    name = name_of(value)
    if name is None:
        raise NotStorable(f"a {type(value).__name__} that has no importable name "
                          f"({reprlib.repr(value)})")
    return {"object": name}


def decode(value):
    if value is None or type(value) in (bool, int, str):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise NotInstallable(f"malformed value {value!r}")
    (kind, v), = value.items()
    try:
        if kind == "float":
            return float(v)
        if kind == "bytes":
            return base64.b64decode(v)
        if kind == "tuple":
            return tuple(decode(x) for x in v)
        if kind == "dtype":
            return _DTYPES[v]
        if kind == "device":
            return torch.device(v)
        if kind == "memory_format":
            return _MEMORY_FORMATS[v]
        if kind == "layout":
            return _LAYOUTS[v]
        if kind == "ellipsis":
            return Ellipsis
        if kind == "object":
            return resolve_name(v)
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise NotInstallable(f"malformed {kind} value {v!r}: {e}") from None
    raise NotInstallable(f"unknown value kind {kind!r}")
