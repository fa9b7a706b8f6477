"""Tuples, lists, dicts, slices and iterators built or read by the frame."""
import collections
import contextlib
import itertools
import reprlib
import threading
from typing import Dict, List

from kiln.exc import Unsupported
from kiln.variables.base import (BoundContainerMethod, VariableTracker, constant_args, walked,
                                 walking)
from kiln.variables.constant import BoundBuiltinMethod, ConstantVariable
from kiln.variables.dict_keys import IdentityKey, find_key, key_tracker, tracker_key
from kiln.variables.exceptions import traced_exception


class _MutationState(threading.local):
    """Per thread (captures in two threads must not count each other's mutations):
    `mutations` counts mutations of containers made in the frame; a graph break cannot resume
    after an instruction that mutated one (the rolled-back trace would disagree with the
    object). Every mutable tracker the frame makes takes the next serial. The root frame's
    checkpoint before a breakable instruction records the next serial to come: a tracker made
    after it is unreachable from the checkpoint's state (reaching it would have mutated an
    older one), so a rollback drops it whole and mutating it needs no count."""

    def __init__(self):
        self.mutations = 0
        self.next_serial = 0
        self.checkpoint_serial = 0


_state = _MutationState()


def new_serial() -> int:
    _state.next_serial += 1
    return _state.next_serial


def mark_checkpoint():
    _state.checkpoint_serial = _state.next_serial + 1


def mutation_count() -> int:
    return _state.mutations


@contextlib.contextmanager
def counting_every_mutation():
    """Within it, a mutation of any tracker made before it counts (mutation_count), however
    late after the last checkpoint that tracker was made; one made within it does not."""
    saved = _state.checkpoint_serial
    _state.checkpoint_serial = _state.next_serial + 1
    try:
        yield
    finally:
        _state.checkpoint_serial = saved


def note_mutation(serial: int):
    """Counts a mutation of the tracker with `serial`, unless it postdates the checkpoint."""
    if serial < _state.checkpoint_serial:
        _state.mutations += 1


def note_container_mutation(container: "ContainerVariable"):
    """Counts a mutation of `container`. One read from outside the frame (a source) is
    reachable from the checkpoint's state however late its tracker was made (a call inlined
    after the checkpoint read it), and its final items are replayed into the program's object:
    mutating it always counts, so that no graph break rolls back past it."""
    container.version += 1  # iterators over its items taken before now are stale
    note_mutation(container.serial if container.source is None else -1)


class ContainerVariable(VariableTracker):
    """A tuple, list or dict: made by the frame, or read from outside it (then read-only to the
    executor, except the arguments CPython makes fresh for each call: *args, **kwargs)."""

    # Its guards (type, length) do not pin which object it is.
    identity_pinned = False

    def __init__(self, source=None):
        super().__init__(source)
        self.mutable = source is None
        self.serial = new_serial()
        self.outside_object = None  # the object read from outside the frame, if it was
        self.outside_guarded = False  # ... under guards (ContainerMemo.remember)
        self.outside_memo = None  # the ContainerMemo that remembers it
        self.replayed = False  # mutated by the frame: replayed into it after the graph
        self.version = 0  # mutations so far (ListIteratorVariable's watch)

    def values(self) -> List[VariableTracker]:
        raise NotImplementedError

    def _replay_outside(self) -> bool:
        """Lets the frame mutate this container from outside it, its final contents assigned
        into it in place after the graph (side_effects.replay_statements), where that is exact:
        a plain list or dict, read under guards and through this one tracker (another tracker of
        the same object would not see the mutation). False where it is not."""
        if not (type(self) in (ListVariable, ConstDictVariable) and self.source is not None
                and self.python_type() in (list, dict, collections.OrderedDict,
                                           collections.defaultdict)
                and self.outside_guarded
                and self.outside_memo.other_tracker(self) is None):
            return False
        self.mutable = True
        self.replayed = True
        return True

    def identity(self, tx):
        # A container from outside is the object it was read from; one the frame made is its
        # tracker.
        return self.outside_object if self.outside_object is not None else self

    def owned_by_frame(self):
        self.mutable = True

    def _items_known(self) -> bool:
        """Whether the trace knows for certain which items there are: the frame made the
        container, or read it under guards (its length, its keys), so that a missing key or
        index raises as surely in eager."""
        return (self.source is None and self.outside_object is None) or self.outside_guarded

    def contains_tensor(self) -> bool:
        if walked(self):
            return False
        with walking(self):
            return any(v.contains_tensor() for v in self.values())

    def truth(self, tx):
        return len(self.values()) > 0

    def length(self, tx):
        return len(self.values())


class BaseListVariable(ContainerVariable):
    def __init__(self, items: List[VariableTracker], source=None):
        super().__init__(source)
        self.items = list(items)

    def overrides_torch_function(self) -> bool:
        if walked(self):
            return False
        with walking(self):
            return any(v.overrides_torch_function() for v in self.items)

    def values(self):
        return self.items

    def as_python_constant(self):
        with walking(self):
            return self.python_type()(v.as_python_constant() for v in self.items)

    def as_fx_arg(self):
        with walking(self):
            items = [v.as_fx_arg() for v in self.items]
        return items if self.python_type() is list else tuple(items)

    def as_fake_arg(self):
        with walking(self):
            items = [v.as_fake_arg() for v in self.items]
        return items if self.python_type() is list else tuple(items)

    def unpack(self, tx):
        return list(self.items)

    def contains(self, tx, item):
        if item.contains_tensor():
            raise Unsupported("`tensor in container` compares tensors' values")
        if not item.is_python_constant():
            raise Unsupported("`in` with a non-constant item")
        target = item.as_python_constant()
        for v in self.items:
            if not v.is_python_constant():
                raise Unsupported("`in` over a container with non-constant items")
            if v.as_python_constant() == target:
                return ConstantVariable(True)
        return ConstantVariable(False)

    def reconstruct(self, codegen) -> str:
        if self.source is not None and (not self.mutable or self.replayed):
            # The program's own object: it may be mutated or compared by identity later (a
            # replayed list gets its new items in place).
            return codegen.source(self.source)
        return self.build(codegen)

    def build(self, codegen) -> str:
        """A new object with this one's items (a temporary for a list: one object however
        often the transformed code reaches it)."""
        parts = "".join(codegen(v) + ", " for v in self.items)
        return f"({parts})"

    def getitem(self, tx, index: VariableTracker):
        key = index.as_python_constant()
        if isinstance(key, slice):
            return type(self)(self.items[key])
        try:
            return self.items[key]
        except IndexError:
            if type(key) is int and self._items_known():
                kind = "list" if issubclass(self.python_type(), list) else "tuple"
                raise traced_exception(IndexError, f"{kind} index out of range") from None
            raise Unsupported(f"{self.python_type().__name__} index {key!r} out of "
                              "range") from None
        except TypeError as e:
            raise Unsupported(f"{self.python_type().__name__} index {key!r}: {e}") from None

    def var_getattr(self, tx, name):
        if not hasattr(self.python_type(), name):
            raise Unsupported(f"{self.python_type().__name__} has no attribute {name!r}")
        return BoundContainerMethod(self, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "index" and not kwargs:
            const = constant_args(args, kwargs)
            if const is not None and self.is_python_constant():
                return ConstantVariable(self.as_python_constant().index(*const[0]))
        if name == "count" and self.is_python_constant():
            const = constant_args(args, kwargs)
            if const is not None:
                return ConstantVariable(self.as_python_constant().count(*const[0]))
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        raise Unsupported(f"{self.python_type().__name__}.{name}()")

    @reprlib.recursive_repr()
    def __repr__(self):
        return f"{type(self).__name__}({self.items!r})"


class TupleVariable(BaseListVariable):
    def python_type(self):
        return tuple


class NamedTupleVariable(TupleVariable):
    """A namedtuple or a torch.return_types structseq (values, indices): a tuple whose items
    are also attributes."""

    def __init__(self, items, tuple_type, source=None):
        super().__init__(items, source)
        self.tuple_type = tuple_type
        self.is_collections = hasattr(tuple_type, "_fields")
        fields = getattr(tuple_type, "_fields", None)
        if fields is None:
            # structseq: its member descriptors, ordered by the position each one reads.
            names = [n for n in dir(tuple_type)
                     if type(getattr(tuple_type, n, None)).__name__ == "member_descriptor"]
            probe = tuple_type(tuple(range(tuple_type.n_sequence_fields)))
            fields = tuple(sorted(names, key=lambda n: getattr(probe, n)))
        self.fields = fields

    def python_type(self):
        return self.tuple_type

    def as_python_constant(self):
        with walking(self):
            values = tuple(v.as_python_constant() for v in self.items)
        return self.tuple_type._make(values) if self.is_collections else self.tuple_type(values)

    def var_getattr(self, tx, name):
        if name in self.fields:
            return self.items[self.fields.index(name)]
        return super().var_getattr(tx, name)

    def build(self, codegen) -> str:
        items = "".join(codegen(v) + ", " for v in self.items)
        cls = codegen.constant(self.tuple_type)
        return f"{cls}._make(({items}))" if self.is_collections else f"{cls}(({items}))"


class SetVariable(ConstantVariable):
    """A set built in the frame, of constants. Trace-time methods act on the real set."""

    def python_type(self):
        return set

    fresh_object = True  # made in the frame (a set read from outside is no SetVariable)

    def var_getattr(self, tx, name):
        if name in ("add", "discard", "remove", "update", "clear", "pop",
                    "difference_update", "intersection_update"):
            _state.mutations += 1
        return super().var_getattr(tx, name) if not callable(getattr(self.value, name, None)) \
            else BoundBuiltinMethod(self, name)

    def identity(self, tx):
        return self

    def reconstruct(self, codegen) -> str:
        return codegen.temp(self, lambda: f"set({codegen.constant(frozenset(self.value))})")


class ListVariable(BaseListVariable):
    def python_type(self):
        return list

    def _check_mutable(self):
        if not self.mutable and not self._replay_outside():
            raise Unsupported(f"mutation of {self.source.name}, a list from outside the frame "
                              "read also where its reads are not guarded")
        note_container_mutation(self)

    def delitem(self, tx, index):
        key = index.as_python_constant()
        try:
            self.items[key]
        except (IndexError, TypeError) as e:
            raise Unsupported(f"del of item {key!r}: {type(e).__name__} while tracing") from None
        self._check_mutable()
        del self.items[key]

    def replay(self, codegen, target: str) -> str:
        """The statement that gives the list from outside the frame its final items."""
        return f"{target}[:] = [{', '.join(codegen(v) for v in self.items)}]"

    def call_method(self, tx, name, args, kwargs):
        if name in ("append", "extend", "insert", "pop", "clear", "reverse"):
            self._check_mutable()
            if name == "append":
                self.items.append(args[0])
            elif name == "extend":
                self.items.extend(args[0].unpack(tx))
            elif name == "insert":
                self.items.insert(args[0].as_python_constant(), args[1])
            elif name == "pop":
                idx = args[0].as_python_constant() if args else -1
                return self.items.pop(idx)
            elif name == "clear":
                self.items.clear()
            elif name == "reverse":
                self.items.reverse()
            return ConstantVariable(None)
        if name == "copy":
            return ListVariable(self.items)
        return super().call_method(tx, name, args, kwargs)

    def setitem(self, tx, index, value):
        self._check_mutable()
        key = index.as_python_constant()
        if isinstance(key, slice):
            self.items[key] = value.unpack(tx)
        else:
            self.items[key] = value

    def build(self, codegen) -> str:
        return codegen.temp(self, lambda: "[" + ", ".join(codegen(v) for v in self.items) + "]")


class SliceVariable(VariableTracker):
    def __init__(self, parts: List[VariableTracker]):
        super().__init__(None)
        self.parts = parts

    def python_type(self):
        return slice

    def as_python_constant(self):
        return slice(*(p.as_python_constant() for p in self.parts))

    def contains_tensor(self) -> bool:
        return any(p.contains_tensor() for p in self.parts)

    def as_fx_arg(self):
        return slice(*(p.as_fx_arg() for p in self.parts))

    def as_fake_arg(self):
        return slice(*(p.as_fake_arg() for p in self.parts))

    def reconstruct(self, codegen) -> str:
        return "slice(" + ", ".join(codegen(p) for p in self.parts) + ")"


class ConstDictVariable(ContainerVariable):
    """A dict (or OrderedDict, defaultdict); values are trackers. Its keys (`items`' keys) are
    constants' own values, or IdentityKeys for objects a dict compares by identity (tensors,
    modules: kiln.variables.dict_keys), found as CPython finds them."""

    def __init__(self, items: Dict, user_type=dict, source=None, default_factory=None):
        super().__init__(source)
        self.items = dict(items)
        self.user_type = user_type
        # A defaultdict's default_factory (a tracker), called for a key __getitem__ misses.
        self.default_factory = default_factory

    @classmethod
    def built(cls, tx, flat: List[VariableTracker]) -> "ConstDictVariable":
        """BUILD_MAP: the dict of key, value, key, value... in order (a later equal key keeps
        the first one's place and takes the later value)."""
        d = cls({})
        for i in range(0, len(flat), 2):
            d.items[d._key(tx, flat[i])] = flat[i + 1]
        return d

    def map_add(self, tx, key, value):
        """MAP_ADD: a dict comprehension's own dict takes an item."""
        self.items[self._key(tx, key)] = value

    def update_from(self, tx, other):
        """DICT_UPDATE / DICT_MERGE: the items of `other`, in its order."""
        if not isinstance(other, ConstDictVariable):
            raise Unsupported("dict update from a non-dict")
        for k, v in list(other.items.items()):
            self.items[self._key(tx, key_tracker(tx, k))] = v

    def _key(self, tx, vt):
        """The key `vt` is in this dict: the stored key it finds, if any (a dict keeps the key
        first stored under an equal one), or its own."""
        key = tracker_key(tx, vt)
        if type(key) is IdentityKey:
            found = find_key(tx, self.items, key)
            return key if found is None else found
        return key

    def key_trackers(self, tx) -> List[VariableTracker]:
        return [key_tracker(tx, k) for k in self.items]

    def values(self):
        return list(self.items.values())

    def contains_tensor(self) -> bool:
        if walked(self):
            return False
        return super().contains_tensor() or any(
            type(k) is IdentityKey and k.vt is not None and k.vt.contains_tensor()
            for k in self.items)

    def _check_mutable(self):
        if not self.mutable and not self._replay_outside():
            raise Unsupported(f"mutation of {self.source.name}, a {self.user_type.__name__} "
                              "from outside the frame")
        note_container_mutation(self)

    def delitem(self, tx, index):
        key = self._key(tx, index)
        if key not in self.items:
            raise self._key_error(key)
        self._check_mutable()
        del self.items[key]

    def _key_error(self, key, missing: bool = False):
        """What looking up `key`, absent, raises: the KeyError itself where the items are known
        (with `missing`, for __getitem__, where the dict has no __missing__), else
        Unsupported."""
        if self._items_known() and type(key) is not IdentityKey and not (
                missing and hasattr(self.user_type, "__missing__")):
            return traced_exception(KeyError, key)
        return Unsupported(f"KeyError {key!r} while tracing")

    def replay(self, codegen, target: str) -> str:
        """The statement that gives the dict from outside the frame its final items, in their
        order."""
        items = ", ".join(f"{_build_key(codegen, k)}: {codegen(v)}"
                          for k, v in self.items.items())
        return f"{target}.clear(); {target}.update({{{items}}})"

    def python_type(self):
        return self.user_type

    def _constant_items(self, convert) -> dict:
        with walking(self):
            return {_constant_key(k): convert(v) for k, v in self.items.items()}

    def as_python_constant(self):
        items = self._constant_items(lambda v: v.as_python_constant())
        if self.user_type is collections.defaultdict:
            return collections.defaultdict(self.default_factory.as_python_constant(), items)
        return items

    def as_fx_arg(self):
        return self._constant_items(lambda v: v.as_fx_arg())

    def as_fake_arg(self):
        return self._constant_items(lambda v: v.as_fake_arg())

    def contains(self, tx, item):
        return ConstantVariable(self._key(tx, item) in self.items)

    def unpack(self, tx):
        return self.key_trackers(tx)

    def reconstruct(self, codegen) -> str:
        if self.source is not None and (not self.mutable or self.replayed):
            return codegen.source(self.source)
        if self.user_type not in (dict, collections.OrderedDict, collections.defaultdict):
            raise Unsupported(f"rebuilding a {self.user_type.__name__}")

        def build():
            items = "{" + ", ".join(f"{_build_key(codegen, k)}: {codegen(v)}"
                                    for k, v in self.items.items()) + "}"
            if self.user_type is dict:
                return items
            cls = codegen.constant(self.user_type)
            if self.user_type is collections.defaultdict:
                return f"{cls}({codegen(self.default_factory)}, {items})"
            # An OrderedDict made in the frame: its order is the order the items were set.
            return f"{cls}({items})"

        return codegen.temp(self, build)

    def getitem(self, tx, index):
        key = self._key(tx, index)
        if key in self.items:
            return self.items[key]
        if self.user_type is collections.defaultdict and self._items_known():
            return self._missing(tx, key, index)
        raise self._key_error(key, missing=True)

    def _missing(self, tx, key, index):
        """defaultdict.__missing__: default_factory's value, stored under the key; KeyError
        where default_factory is None."""
        factory = self.default_factory
        if factory.is_python_constant() and factory.as_python_constant() is None:
            raise self._key_error(key)
        value = factory.call_function(tx, [], {})
        self._check_mutable()
        # The factory may have stored the key itself: __missing__ overwrites it.
        self.items[self._key(tx, index)] = value
        return value

    def setitem(self, tx, index, value):
        key = self._key(tx, index)
        self._check_mutable()
        self.items[key] = value

    def var_getattr(self, tx, name):
        if name == "default_factory" and self.user_type is collections.defaultdict:
            return self.default_factory
        return BoundContainerMethod(self, name)

    def call_method(self, tx, name, args, kwargs):
        if name in ("items", "keys", "values"):
            if name == "items":
                view = ListVariable([TupleVariable([key_tracker(tx, k), v])
                                     for k, v in self.items.items()])
            elif name == "keys":
                view = ListVariable(self.key_trackers(tx))
            else:
                view = ListVariable(list(self.items.values()))
            # A view reads the dict live as it is iterated: the copy is iterated as long as the
            # dict keeps its keys (and, for values and items, its values).
            view.view_of = (self, name == "keys")
            view.view_kind = name
            return view
        if name == "get":
            key = self._key(tx, args[0])
            if key in self.items:
                return self.items[key]
            return args[1] if len(args) > 1 else ConstantVariable(None)
        if name == "__contains__":
            return self.contains(tx, args[0])
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "pop":
            key = self._key(tx, args[0])  # found once: a lookup may guard
            if len(args) == 1 and key not in self.items:
                raise self._key_error(key)  # before any mutation
        if name in ("update", "pop", "setdefault", "clear", "__setitem__"):
            self._check_mutable()
            if name == "update":
                other = args[0] if args else None
                if isinstance(other, ConstDictVariable):
                    self.update_from(tx, other)
                elif other is not None:  # an iterable of (key, value) pairs
                    for pair in other.unpack(tx):
                        k, v = pair.unpack(tx)
                        self.items[self._key(tx, k)] = v
                for k, v in kwargs.items():
                    self.items[k] = v
                return ConstantVariable(None)
            if name == "pop":
                if key in self.items:
                    return self.items.pop(key)
                if len(args) > 1:
                    return args[1]
                raise Unsupported(f"KeyError {key!r} while tracing")
            if name == "setdefault":
                key = self._key(tx, args[0])
                if key not in self.items:
                    self.items[key] = args[1] if len(args) > 1 else ConstantVariable(None)
                return self.items[key]
            if name == "__setitem__":
                self.items[self._key(tx, args[0])] = args[1]
                return ConstantVariable(None)
            self.items.clear()
            return ConstantVariable(None)
        if name == "copy":
            return ConstDictVariable(self.items, user_type=self.user_type,
                                     default_factory=self.default_factory)
        raise Unsupported(f"{self.user_type.__name__}.{name}()")


def _constant_key(key):
    """A key of ConstDictVariable.items as the Python object it is, for a dict of constants;
    Unsupported for one the graph computes or the frame made."""
    if type(key) is IdentityKey:
        if key.vt is None:
            return key.obj  # from outside the frame, pinned by its dict's guard
        return key.vt.as_python_constant()
    return key


def _build_key(codegen, key) -> str:
    """A key of ConstDictVariable.items in the transformed code."""
    if type(key) is IdentityKey:
        return codegen(key.vt) if key.vt is not None else codegen.constant(key.obj)
    return codegen.constant(key)


class ListIteratorVariable(VariableTracker):
    """An iterator the frame made (GET_ITER, iter(), enumerate(), a generator run to its end):
    loops over known-length things unroll at trace time, next() advances it.

    Over a list it is a list iterator: it reads the list's items live at its position (so a list
    that grows while it is iterated is seen as eager sees it) and is rebuilt after the graph as an
    iterator over that very list at that position. Over anything else it holds the items it will
    yield. Its position is state: advancing an iterator made before a graph break's checkpoint is
    a mutation like any other."""

    def __init__(self, items: List[VariableTracker], origin: "ListVariable" = None,
                 over=()):
        super().__init__(None)
        self._items = None if origin is not None else list(items)
        self.origin = origin
        self.index = 0
        self.serial = new_serial()
        # The containers whose items `items` copies (enumerate(lst), zip, iter(dict)), with
        # their versions then: eager's iterator reads them live (a list that grows is seen, a
        # dict that changes size raises), so a copy is only right while they are unchanged.
        self._watch = [(c, _state_of(c, keys_only)) for c, keys_only in _containers_of(over)]
        # Over a dict's items() or values(): (the dict, the view's kind, its keys). Eager's
        # iterator reads each value when it gets there (a value replaced while the dict is
        # iterated is seen), and only a change of the keys stops it.
        self.live_dict = None
        # What took every item left at once where eager takes them one by one (zip, map,
        # enumerate, any...: see taken_lazily): eager's iterator would still hold some.
        self.drained_by = None

    @classmethod
    def of(cls, tx, obj: VariableTracker) -> "ListIteratorVariable":
        """iter(obj): an iterator is its own iterator; a list is iterated live."""
        if isinstance(obj, ListIteratorVariable):
            return obj
        if type(obj) is ListVariable and getattr(obj, "view_of", None) is None:
            return cls([], origin=obj)
        if getattr(obj, "view_kind", None) in ("items", "values"):
            d = obj.view_of[0]
            d.key_trackers(tx)  # a key read with a dict from outside gets its tracker now
            it = cls([], over=())
            it._watch = [(d, _state_of(d, True))]
            it.live_dict = (d, obj.view_kind, list(d.items))
            return it
        return cls(obj.unpack(tx), over=(obj,))

    def reads(self) -> list:
        """(container, keys_only) for each container whose items this iterator yields: what a
        copy of its items (zip over it, say) holds only while they are unchanged."""
        out = [(c, isinstance(state, tuple)) for c, state in self._watch]
        if self.origin is not None:
            out.append((self.origin, False))
        if self.live_dict is not None:  # a copy of its items holds the values as they are now
            out.append((self.live_dict[0], False))
        return out

    def _check_unchanged(self):
        for container, state in self._watch:
            if _state_of(container, isinstance(state, tuple)) != state:
                raise Unsupported("a container changed while an iterator over it was in use "
                                  "(eager reads it live)")

    @property
    def items(self) -> List[VariableTracker]:
        if self.live_dict is not None:
            d, kind, keys = self.live_dict
            if kind == "values":
                return [d.items[k] for k in keys]
            return [TupleVariable([key_tracker(None, k), d.items[k]]) for k in keys]
        return self.origin.items if self.origin is not None else self._items

    def python_type(self):
        return type(iter([])) if self.origin is not None else type(iter(()))

    def taken_lazily(self, tx, by: str) -> List[VariableTracker]:
        """Every item left, for a consumer that eager runs lazily (zip(), map(), any()...): the
        iterator is used up here where eager's would have yielded only as many as were asked
        for, so a later use of it cannot be modelled."""
        items = self.unpack(tx)
        self.drained_by = by
        return items

    def _check_not_drained(self):
        if self.drained_by is not None:
            raise Unsupported(f"an iterator that {self.drained_by} took in full here, used "
                              "again (eager's takes its items one by one)")

    def next_item(self):
        self._check_not_drained()
        self._check_unchanged()
        items = self.items
        if self.index >= len(items):
            return None
        item = items[self.index]
        note_mutation(self.serial)
        self.index += 1
        return item

    def items_one_by_one(self) -> list:
        """The items left, each taken through next_item (an iterator whose items are made or
        read as they are taken unpacks so)."""
        out = []
        item = self.next_item()
        while item is not None:
            out.append(item)
            item = self.next_item()
        return out

    def unpack(self, tx):
        self._check_not_drained()
        self._check_unchanged()
        rest = self.items[self.index:]
        if rest:
            note_mutation(self.serial)
        self.index += len(rest)
        return rest

    def identity(self, tx):
        return self

    def reconstruct(self, codegen) -> str:
        self._check_not_drained()
        self._check_unchanged()  # a copy of items the program changed since: not eager's
        # One object however often it is reached (a local and the argument of next(), say):
        # advancing one advances the other.
        if self.live_dict is not None:
            # Over the dict itself, at its position: eager's reads the values it has not yet
            # reached when it gets there (a resume function runs such a loop in Python).
            d, kind, _ = self.live_dict
            return codegen.temp(self, lambda: f"{codegen.constant(iterator_at)}("
                                              f"{codegen(d)}.{kind}(), {self.index})")
        if codegen.at_break:
            # A loop a graph break interrupts goes on in a resume function, which kiln captures
            # in turn: there the iterator is one it can read and guard (ResumeIterator).
            if self.origin is not None:
                return codegen.temp(self, lambda: f"{codegen.constant(ResumeIterator)}("
                                                  f"{codegen(self.origin)}, {self.index})")
            return codegen.temp(self, lambda: f"{codegen.constant(ResumeIterator)}((" + "".join(
                codegen(v) + ", " for v in self.items[self.index:]) + "), 0)")
        if self.origin is not None:
            return codegen.temp(self, lambda: f"{codegen.constant(iterator_at)}("
                                              f"{codegen(self.origin)}, {self.index})")
        return codegen.temp(self, lambda: "iter((" + "".join(
            codegen(v) + ", " for v in self.items[self.index:]) + "))")

    def __repr__(self):
        return f"ListIteratorVariable(at {self.index} of {len(self.items)})"


class ReversedListIterator(ListIteratorVariable):
    """reversed(lst) of a list: reads the list live from its end, as CPython's reverse list
    iterator does (an item replaced before the iterator gets there is seen, items appended are
    not, and once it stops it stays stopped), and is rebuilt after the graph as one over that
    very list at its position."""

    def __init__(self, lst: "ListVariable"):
        super().__init__([])
        self.lst = lst
        self.position = len(lst.items) - 1  # the index it reads next; -1 once stopped

    def python_type(self):
        return type(reversed([]))

    def reads(self) -> list:
        return [(self.lst, False)]

    @property
    def items(self) -> List[VariableTracker]:
        """What it has left to yield, while the list stays as it is."""
        items, i = self.lst.items, self.position
        return [items[j] for j in range(i, -1, -1)] if i < len(items) else []

    def next_item(self):
        self._check_not_drained()
        items, i = self.lst.items, self.position
        if not 0 <= i < len(items):
            self.position = -1
            return None
        note_mutation(self.serial)
        self.position = i - 1
        return items[i]

    def unpack(self, tx):
        return self.items_one_by_one()

    def reconstruct(self, codegen) -> str:
        self._check_not_drained()
        if self.position >= len(self.lst.items):
            # Eager's would yield again if the list grew back; one rebuilt starts at its end.
            raise Unsupported("a reverse list iterator past the end of its shrunk list, "
                              "outliving the graph")
        return codegen.temp(self, lambda: f"{codegen.constant(reversed_at)}({codegen(self.lst)}, "
                                          f"{self.position})")

    def __repr__(self):
        return f"ReversedListIterator(at {self.position})"


def reversed_at(items: list, index: int):
    """A reverse iterator over `items` that reads `items[index]` next (how the transformed code
    rebuilds one; -1: one that has stopped)."""
    it = reversed(items)
    it.__setstate__(index)
    return it


class ResumeIterator:
    """The iterator of a loop that a graph break interrupted, as the transformed code hands it
    to the resume function: `items` (a list, read live as a list iterator reads it, or a tuple
    of what is left) from position `index`. Plain attributes, so that the resume function's
    capture can read and guard them (ResumeIteratorVariable) and replay its progress."""

    def __init__(self, items, index: int):
        self.items = items
        self.index = index

    def __iter__(self):
        return self

    def __next__(self):
        i = self.index
        if i >= len(self.items):
            raise StopIteration
        self.index = i + 1
        return self.items[i]

    def __length_hint__(self):
        return max(len(self.items) - self.index, 0)


class ResumeIteratorVariable(ListIteratorVariable):
    """A ResumeIterator the frame received: its items are guarded as read, and how far the frame
    advanced it is an attribute store replayed after the graph."""

    def __init__(self, obj: ResumeIterator, source, items: "BaseListVariable", output):
        if type(items) is ListVariable:
            super().__init__([], origin=items)
        else:
            super().__init__(items.items)
        self.obj = obj
        self.source = source
        self.index = obj.index
        self._output = output

    def identity(self, tx):
        return self.obj

    def _advanced(self):
        from kiln.variables.side_effects import mutations_of

        note_mutation(-1)  # from outside the frame: every advance counts (note_container_...)
        mutations_of(self._output).store(self.obj, self.source, "index",
                                         ConstantVariable(self.index))

    def next_item(self):
        item = super().next_item()
        if item is not None:
            self._advanced()
        return item

    def unpack(self, tx):
        rest = super().unpack(tx)
        if rest:
            self._advanced()
        return rest

    def reconstruct(self, codegen) -> str:
        return codegen.source(self.source)  # the program's object, its index replayed

    def __repr__(self):
        return f"ResumeIteratorVariable(at {self.index} of {len(self.items)})"


def _containers_of(values) -> list:
    """(container, keys_only) for each container whose items iterating over `values` reads:
    themselves (a dict iterated over its keys, which eager reads live and refuses to go on over
    when they change), the dict a view copied, or the list a live list iterator reads."""
    out = []
    for v in values:
        view = getattr(v, "view_of", None)
        if view is not None:
            out.append(view)
        elif isinstance(v, ConstDictVariable):
            out.append((v, True))
        elif isinstance(v, ContainerVariable):
            out.append((v, False))
        elif isinstance(v, ListIteratorVariable):
            out.extend(v.reads())
    return out


def _state_of(container, keys_only: bool):
    """What an iterator over `container` depends on: its keys (a dict's keys, a keys view), or
    every mutation (its version)."""
    return tuple(container.items) if keys_only else container.version


def iterator_at(items: list, index: int):
    """A list iterator over `items` that has yielded its first `index` items (how the
    transformed code rebuilds one)."""
    it = iter(items)
    for _ in itertools.islice(it, index):
        pass
    return it
