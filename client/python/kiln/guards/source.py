"""Sources: where a value the capture read lives, relative to the frame.

A source gives three views of the same path: `name` for people (L['x'].weight), `guard_path`
for the C++ guard tree (nested tuples, see client/guards/guard_tree.h) and `expr` for the
transformed code, which reloads graph inputs from their sources on every call.
"""
from typing import Any

import torch


def _attr_expr(base: str, attr: str) -> str:
    """`base.attr`, or getattr for names that are not identifiers (Sequential's "0")."""
    if attr.isidentifier():
        return f"{base}.{attr}"
    return f"getattr({base}, {attr!r})"


class Source:
    # Sources are immutable once built; `_hash` remembers the hash of the chain (L['self'].layer1
    # [0].conv1.weight hashes five sources deep, and a capture hashes sources thousands of times).
    # `_path` remembers guard_path's tuple: a source's path is then one object however many
    # paths it is the parent of, which a stored record's path table recognizes by identity.
    __slots__ = ("_hash", "_path")

    @property
    def name(self) -> str:
        raise NotImplementedError

    def guard_path(self) -> tuple:
        try:
            return self._path
        except AttributeError:
            path = self._path = self._guard_path()
            return path

    def _guard_path(self) -> tuple:
        raise NotImplementedError

    def expr(self, consts) -> str:
        """A Python expression in the transformed code; `consts` interns objects it needs."""
        raise NotImplementedError

    def __eq__(self, other):
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self):
        try:
            return self._hash
        except AttributeError:
            h = self._hash = hash((type(self), self._key()))
            return h

    def _key(self):
        raise NotImplementedError

    def __repr__(self):
        return self.name


class LocalSource(Source):
    __slots__ = ("index", "local_name")

    def __init__(self, index: int, local_name: str):
        self.index = index
        self.local_name = local_name

    name = property(lambda self: f"L[{self.local_name!r}]")

    def _guard_path(self):
        return ("local", self.index)

    def expr(self, consts):
        return self.local_name

    def _key(self):
        return self.index


class GlobalSource(Source):
    """A name in the compiled frame's own globals."""

    __slots__ = ("global_name",)

    def __init__(self, global_name: str):
        self.global_name = global_name

    name = property(lambda self: f"G[{self.global_name!r}]")

    def _guard_path(self):
        return ("global", self.global_name)

    def expr(self, consts):
        # The transformed code runs with the frame's own globals, and no parameter of it can
        # shadow a name the original code read as a global.
        return self.global_name

    def _key(self):
        return self.global_name


class BuiltinSource(Source):
    __slots__ = ("builtin_name",)

    def __init__(self, builtin_name: str):
        self.builtin_name = builtin_name

    name = property(lambda self: f"B[{self.builtin_name!r}]")

    def _guard_path(self):
        return ("builtin", self.builtin_name)

    def expr(self, consts):
        return self.builtin_name

    def _key(self):
        return self.builtin_name


class ClosureSource(Source):
    """The contents of the compiled function's closure cell `index` (free variable `var`)."""

    __slots__ = ("index", "var")

    def __init__(self, index: int, var: str):
        self.index = index
        self.var = var

    name = property(lambda self: f"C[{self.var!r}]")

    def _guard_path(self):
        return ("closure", self.index)

    def expr(self, consts):
        return self.var

    def _key(self):
        return self.index


class FrameCellSource(Source):
    """The cell of the compiled frame's free variable `var` itself (not its contents): what a
    `nonlocal var` assignment writes. The transformed code reaches the running frame's own cell
    through a lambda over the same name. Never guarded (ClosureSource guards the contents)."""

    __slots__ = ("var",)

    def __init__(self, var: str):
        self.var = var

    name = property(lambda self: f"C[{self.var!r}] (its cell)")

    def _guard_path(self):
        raise TypeError("the cell of a free variable is not guarded (its contents are)")

    def expr(self, consts):
        return f"(lambda: {self.var}).__closure__[0]"

    def _key(self):
        return self.var


class ObjectSource(Source):
    """A fixed object the guards hold on to: another module's globals dict, a closure cell."""

    __slots__ = ("obj", "label")

    def __init__(self, obj: Any, label: str):
        self.obj = obj
        self.label = label

    name = property(lambda self: self.label)

    def _guard_path(self):
        return ("object", self.obj)

    def expr(self, consts):
        return consts.ref(self.obj)

    def _key(self):
        return id(self.obj)


class AttrSource(Source):
    __slots__ = ("base", "attr")

    def __init__(self, base: Source, attr: str):
        self.base = base
        self.attr = attr

    name = property(lambda self: f"{self.base.name}.{self.attr}")

    def _guard_path(self):
        return ("attr", self.base.guard_path(), self.attr)

    def expr(self, consts):
        return _attr_expr(self.base.expr(consts), self.attr)

    def _key(self):
        return (self.base, self.attr)


# The __hash__ of classes whose instances a dict finds by identity (kiln.variables.dict_keys).
IDENTITY_HASHES = (object.__hash__, torch.Tensor.__hash__)


def _keyed_by_identity(key) -> bool:
    """Whether `key` is an object a dict finds by identity (a tensor, a module), which a source
    holds itself rather than spelling it."""
    return key is not None and type(key).__hash__ in IDENTITY_HASHES


def key_repr(key) -> str:
    """A dict key as names and guard descriptions show it: an object found by identity by its
    class and address (a tensor's repr would print its values)."""
    if _keyed_by_identity(key):
        return f"<{type(key).__name__} at {id(key):#x}>"
    return repr(key)


class ItemSource(Source):
    __slots__ = ("base", "key")

    def __init__(self, base: Source, key):
        self.base = base
        self.key = key

    name = property(lambda self: f"{self.base.name}[{key_repr(self.key)}]")

    def _guard_path(self):
        return ("item", self.base.guard_path(), self.key)

    def expr(self, consts):
        if _keyed_by_identity(self.key):
            return f"{self.base.expr(consts)}[{consts.ref(self.key)}]"
        return f"{self.base.expr(consts)}[{self.key!r}]"

    def _key(self):
        # An object found by identity is compared by identity (a tensor's == compares values).
        key = ("id", id(self.key)) if _keyed_by_identity(self.key) else self.key
        return (self.base, type(self.key), key)


class DictItemSource(Source):
    """An item of a dict subclass's own storage (dict.__getitem__), read without the class's
    Python __getitem__ (a ModelOutput's runs Python that reads the source again)."""

    __slots__ = ("base", "key")

    def __init__(self, base: Source, key):
        self.base = base
        self.key = key

    name = property(lambda self: f"dict.__getitem__({self.base.name}, {self.key!r})")

    def _guard_path(self):
        return ("dict_item", self.base.guard_path(), self.key)

    def expr(self, consts):
        return f"{consts.ref(dict.__getitem__)}({self.base.expr(consts)}, {self.key!r})"

    def _key(self):
        return (self.base, type(self.key), self.key)


class ModuleMemberSource(Source):
    """An nn.Module's submodule, parameter or buffer: read from its registry dict, not through
    nn.Module.__getattr__, so guards stay in C++."""

    __slots__ = ("base", "attr", "registry")

    def __init__(self, base: Source, attr: str, registry: str):
        self.base = base
        self.attr = attr
        self.registry = registry  # "_modules", "_parameters" or "_buffers"

    name = property(lambda self: f"{self.base.name}.{self.attr}")

    def _guard_path(self):
        return ("item", ("item", ("instance_dict", self.base.guard_path()), self.registry),
                self.attr)

    def expr(self, consts):
        # From the registry itself: `module.weight` would run Module.__getattr__ (Python) for
        # each parameter the graph takes as an input, on every call.
        return f"{self.base.expr(consts)}.{self.registry}[{self.attr!r}]"

    def _key(self):
        return (self.base, self.attr)


class InstanceAttrSource(Source):
    """An attribute found in an object's own __dict__ (read without descriptors). The
    transformed code reads it the same way: `obj.attr` would run the class's __getattribute__,
    which may be the very frame being compiled (a config class mapping attribute names)."""

    __slots__ = ("base", "attr")

    def __init__(self, base: Source, attr: str):
        self.base = base
        self.attr = attr

    name = property(lambda self: f"{self.base.name}.{self.attr}")

    def _guard_path(self):
        return ("item", ("instance_dict", self.base.guard_path()), self.attr)

    def expr(self, consts):
        return (f"{consts.ref(object.__getattribute__)}({self.base.expr(consts)}, "
                f"'__dict__')[{self.attr!r}]")

    def _key(self):
        return (self.base, self.attr)


class InstanceDictSource(Source):
    """base.__dict__, read from the object without descriptors."""

    __slots__ = ("base",)

    def __init__(self, base: Source):
        self.base = base

    name = property(lambda self: f"{self.base.name}.__dict__")

    def _guard_path(self):
        return ("instance_dict", self.base.guard_path())

    def expr(self, consts):
        return f"{consts.ref(object.__getattribute__)}({self.base.expr(consts)}, '__dict__')"

    def _key(self):
        return self.base


class TypeSource(Source):
    """type(base): where class attributes of an instance are read."""

    __slots__ = ("base",)

    def __init__(self, base: Source):
        self.base = base

    name = property(lambda self: f"type({self.base.name})")

    def _guard_path(self):
        return ("type", self.base.guard_path())

    def expr(self, consts):
        return f"type({self.base.expr(consts)})"

    def _key(self):
        return self.base


class WeakRefCallSource(Source):
    """base(): what a weakref.ref refers to, None once it died (torch.nn.RNN keeps its flat
    weights so)."""

    __slots__ = ("base",)

    def __init__(self, base: Source):
        self.base = base

    name = property(lambda self: f"{self.base.name}()")

    def _guard_path(self):
        return ("weakref", self.base.guard_path())

    def expr(self, consts):
        return f"{self.base.expr(consts)}()"

    def _key(self):
        return self.base
