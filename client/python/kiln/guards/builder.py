"""Collects the guards a capture installs and builds the C++ guard tree from them."""
from typing import Dict, List, Tuple

import torch

from kiln import _C
from kiln.guards.source import ItemSource, Source


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
            return f"{where} DICT_KEYS {list(self.value)!r}"
        if self.kind == "TENSOR_MATCH":
            t = self.value
            return (f"{where} TENSOR_MATCH {type(t).__name__} {t.dtype} {t.device} "
                    f"size={tuple(t.shape)} stride={t.stride()} requires_grad={t.requires_grad}")
        if self.kind == "ID_MATCH":
            return f"{where} ID_MATCH {_short_repr(self.value)}"
        return f"{where} {self.kind}"

    def check_tuple(self) -> tuple:
        kind = self.kind
        if kind == "TENSOR_MATCH":
            return ("tensor", self.value)
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
        raise ValueError(f"unknown guard kind {kind}")


def _short_repr(value) -> str:
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if name is not None:
        return f"<{type(value).__name__} {name}>"
    return f"<{type(value).__name__} at {id(value):#x}>"


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
        key = (source, kind)
        if key not in self._guards:
            self._guards[key] = Guard(source, kind, value)

    def __iter__(self):
        return iter(self._guards.values())

    def __len__(self):
        return len(self._guards)

    def describe(self) -> List[str]:
        return [g.describe() for g in self]

    def build(self, descriptions: List[str] = None):
        """The native guard tree (kiln._C.GuardManager) checking every guard; `descriptions`,
        when given, are describe()'s, already computed."""
        manager = _C.GuardManager()
        descriptions = descriptions or self.describe()
        for g, text in zip(self, descriptions):
            path = g.source.guard_path() if g.source is not None else ("local", 0)
            manager.add(path, g.check_tuple(), text)
        return manager


CONSTANT_TYPES = (type(None), bool, int, float, str, bytes, torch.dtype, torch.device,
                  torch.memory_format, torch.layout)


def is_guardable_constant(value) -> bool:
    return type(value) in CONSTANT_TYPES
