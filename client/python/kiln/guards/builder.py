"""Collects the guards a capture installs and builds the C++ guard tree from them."""
import sys
import weakref
from typing import Dict, List, Tuple

import torch

from kiln import _C
from kiln.guards.source import ItemSource, Source, key_repr


class Guard:
    __slots__ = ("source", "kind", "value")

    def __init__(self, source: Source, kind: str, value=None):
        self.source = source
        self.kind = kind
        self.value = value

    def describe(self) -> str:
        where = self.source.name if self.source is not None else "<global state>"
        if self.kind == "CONSTANT_MATCH":
            return f"{where} CONSTANT_MATCH {self.value!r}"
        if self.kind == "TYPE_MATCH":
            return f"{where} TYPE_MATCH {getattr(self.value, '__qualname__', self.value)}"
        if self.kind == "LEN_MATCH":
            return f"{where} LEN_MATCH {self.value}"
        if self.kind == "DICT_KEYS":
            return f"{where} DICT_KEYS [{', '.join(key_repr(k) for k in self.value)}]"
        if self.kind == "TENSOR_MATCH":
            # Read below a tensor subclass's __torch_function__: describing runs no user code.
            with torch._C.DisableTorchFunctionSubclass():
                t, sizes, strides = self.tensor_spec()
                return (f"{where} TENSOR_MATCH {type(t).__name__} {t.dtype} {t.device} "
                        f"size={_dims_text(sizes)} stride={_dims_text(strides)} "
                        f"requires_grad={t.requires_grad}")
        if self.kind == "SHAPE":
            return "SHAPE " + "; ".join(text for _tree, text in self.value[2])
        if self.kind == "ID_MATCH":
            return f"{where} ID_MATCH {_short_repr(self.value)}"
        if self.kind in ("HASATTR", "NO_HASATTR", "NO_ITEM"):
            return f"{where} {self.kind} {self.value!r}"
        if self.kind == "ALIAS":
            return f"{where} IS {self.value.name}"
        if self.kind == "DISTINCT":
            return f"{', '.join(s.name for s in self.value)} DISTINCT"
        return f"{where} {self.kind}"

    def tensor_spec(self):
        """A TENSOR_MATCH's (tensor, sizes, strides): sizes and strides as the guard checks
        them, None where the SHAPE guard checks a symbolic one."""
        if isinstance(self.value, tuple):
            return self.value
        t = self.value
        return t, tuple(t.shape), t.stride()

    def check_tuple(self) -> tuple:
        kind = self.kind
        if kind == "TENSOR_MATCH":
            if isinstance(self.value, tuple):
                return ("tensor", *self.value)
            return ("tensor", self.value)
        if kind == "SHAPE":
            return ("shape", *self.value)
        if kind == "ID_MATCH":
            return ("id", self.value)
        if kind == "TYPE_MATCH":
            return ("type", self.value)
        if kind == "CONSTANT_MATCH":
            return ("constant", self.value)
        if kind == "LEN_MATCH":
            return ("len", self.value)
        if kind == "DICT_KEYS":
            return ("dict_keys", tuple(self.value))
        if kind == "GLOBAL_STATE":
            return ("global_state",)
        if kind == "HASATTR":
            return ("has_attr", self.value)
        if kind == "NO_HASATTR":
            return ("no_attr", self.value)
        if kind == "NO_ITEM":
            return ("no_item", self.value)
        if kind == "ALIAS":
            return ("is", self.value.guard_path())
        if kind == "DISTINCT":
            return ("distinct", tuple(s.guard_path() for s in self.value))
        raise ValueError(f"unknown guard kind {kind}")


def _dims_text(dims) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + \
        ("," if len(dims) == 1 else "") + ")"


def _short_repr(value) -> str:
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if name is not None:
        return f"<{type(value).__name__} {name}>"
    return f"<{type(value).__name__} at {id(value):#x}>"


_KEYED_BY_VALUE = ("HASATTR", "NO_HASATTR", "NO_ITEM", "ALIAS", "DISTINCT")


class GuardSet:
    """The guards of one capture, deduplicated by (source, kind)."""

    def __init__(self):
        self._guards: Dict[Tuple, Guard] = {}

    def add(self, source: Source, kind: str, value=None):
        if kind == "CONSTANT_MATCH" and isinstance(value, tuple):
            # The native check compares single constants: a tuple (torch.Size included) is
            # guarded as its type, its length and each item.
            self.add(source, "TYPE_MATCH", type(value))
            self.add(source, "LEN_MATCH", len(value))
            for i, item in enumerate(value):
                self.add(ItemSource(source, i), "CONSTANT_MATCH", item)
            return
        # Several of these can sit on one source (two attributes looked up, two other objects
        # it is compared with): the value is part of what makes one distinct.
        key = (source, kind, value) if kind in _KEYED_BY_VALUE else (source, kind)
        if key not in self._guards:
            self._guards[key] = Guard(source, kind, value)

    def replace(self, source: Source, kind: str, value) -> None:
        """Sets the value of the guard (source, kind), which must be keyed by kind alone."""
        self._guards[(source, kind)] = Guard(source, kind, value)

    def __iter__(self):
        return iter(self._guards.values())

    def __len__(self):
        return len(self._guards)

    def describe(self) -> List[str]:
        return [g.describe() for g in self]

    def build(self, descriptions: List[str] = None, code=None):
        """The native guard tree (kiln._C.GuardManager) checking every guard; `descriptions`,
        when given, are describe()'s, already computed. With `code`, the tree holds the objects
        of its ID_MATCH guards weakly, and the death of one drops the tree's entry from that
        code's cache: the entry could never pass again, and what it holds (a graph module with
        a deleted model's weights) is freed with it."""
        # An entry specialised to a module that dies (a copy.deepcopy of the model made on
        # every call) is for a module that will never come again: the code's next capture
        # guards its modules by structure (eval_frame's shared_module_codes).
        modules = [g.value for g in self
                   if g.kind == "ID_MATCH" and isinstance(g.value, torch.nn.Module)]
        on_dead, manager_ref = entry_dropper(code, modules) if code is not None else (None, None)
        manager = _C.GuardManager(on_dead=on_dead)
        if manager_ref is not None:
            manager_ref.append(weakref.ref(manager))
        descriptions = descriptions or self.describe()
        for g, text in zip(self, descriptions):
            path = g.source.guard_path() if g.source is not None else ("local", 0)
            manager.add(path, g.check_tuple(), text)
        return manager


def entry_dropper(code, modules=()):
    """The on_dead callback of an entry's guard tree (see GuardSet.build), and the list its
    manager's weak reference goes into once the manager exists. It holds nothing strongly: a
    callback must not keep the code or the tree alive. When one of `modules` (the entry's
    module identities) is what died, the code's later captures guard its modules by structure
    (kiln.state's shared_module_codes); another object's death only drops the entry."""
    from kiln.state import STATE

    code_ref = weakref.ref(code)
    module_refs = [weakref.ref(m) for m in modules]
    manager_ref = []
    # Held here: at interpreter exit the modules' attributes (sys's included) are gone.
    drop_entry, is_finalizing = _C.drop_entry, sys.is_finalizing

    def on_dead(_dead_ref):
        if is_finalizing():  # the objects die as the interpreter exits: nothing to drop
            return
        code_now = code_ref()
        manager = manager_ref[0]() if manager_ref else None
        if code_now is not None and manager is not None:
            drop_entry(code_now, manager)
            if any(r() is None for r in module_refs):
                STATE.shared_module_codes.add(code_now)

    return on_dead, manager_ref


CONSTANT_TYPES = (type(None), bool, int, float, str, bytes, torch.dtype, torch.device,
                  torch.memory_format, torch.layout)


def is_guardable_constant(value) -> bool:
    return type(value) in CONSTANT_TYPES
