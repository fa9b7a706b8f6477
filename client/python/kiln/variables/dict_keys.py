"""The keys of the dicts the frame holds (ConstDictVariable.items): a constant's own value, or an
IdentityKey for an object that a dict compares by identity (a tensor, an nn.Module, an instance
of a class that keeps object's __hash__).

CPython finds a key by its hash and then by `is` or `==`; such an object's hash is its id, so two
of them are one key exactly when they are one object. Whether two values are one object can
depend on the call (two tensor arguments may be one tensor next time), so a lookup that compares
objects from outside the frame guards the answer it found (find_key)."""
import torch

from kiln.exc import Unsupported
from kiln.guards.builder import is_guardable_constant
from kiln.guards.source import IDENTITY_HASHES, ObjectSource, key_repr
from kiln.graph.meta_rules import class_overrides_torch_function
from kiln.variables.base import VariableTracker, same_object
from kiln.variables.constant import ConstantVariable


def hashed_by_identity(cls) -> bool:
    """Whether a dict keys instances of `cls` by which object they are. A tensor class that
    overrides __torch_function__ does not qualify: its __hash__ runs the override."""
    if getattr(cls, "__hash__", None) not in IDENTITY_HASHES:
        return False
    return not class_overrides_torch_function(cls)


class IdentityKey:
    """A key that is one object: `obj` is the object, the real one for a value from outside the
    frame or the tracker for one the frame made (no outside object is it). `vt` is its tracker;
    a key read with a dict from outside has none until one is needed (`tracker`), and its
    identity is pinned by that dict's DICT_KEYS guard."""

    __slots__ = ("obj", "vt", "label")

    def __init__(self, obj, vt=None, label: str = None):
        self.obj = obj
        self.vt = vt
        self.label = label

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return type(other) is IdentityKey and other.obj is self.obj

    def tracker(self, tx):
        if self.vt is None:
            # The dict's DICT_KEYS guard holds this very object: it is read from there.
            self.vt = tx.wrap(self.obj, ObjectSource(self.obj, self.label))
        return self.vt

    def __repr__(self):
        return key_repr(self.obj)


def tracker_key(tx, vt):
    """The key of ConstDictVariable.items that the value of tracker `vt` is: a constant's own
    value, or an IdentityKey for an object a dict compares by identity (a tensor, a module, an
    instance of a class that keeps object's __hash__)."""
    try:
        value = vt.as_python_constant()
    except Unsupported:
        value = _NOT_CONSTANT
    if value is not _NOT_CONSTANT and (is_guardable_constant(value) or
                                       not hashed_by_identity(type(value))):
        try:
            hash(value)
        except TypeError:
            raise Unsupported(f"an unhashable {type(value).__name__} as a dict key") from None
        return value
    if not hashed_by_identity(vt.python_type()):
        raise Unsupported(f"a {vt.python_type().__name__} as a dict key (its class hashes "
                          "it in Python)")
    try:
        obj = vt.identity(tx)
    except Unsupported:
        if value is _NOT_CONSTANT:
            raise
        obj = value
    return IdentityKey(obj, vt)


_NOT_CONSTANT = object()


def key_tracker(tx, key):
    """The tracker of a key of ConstDictVariable.items (`tx` may be None where the key has
    one already)."""
    if type(key) is IdentityKey:
        return key.tracker(tx)
    return ConstantVariable(key)


def outside_key(key, label: str):
    """The key of ConstDictVariable.items for `key`, a key of a dict read from outside the
    frame; None where kiln cannot key it (neither a guardable constant nor an object hashed by
    identity)."""
    if is_guardable_constant(key):
        return key
    if hashed_by_identity(type(key)):
        return IdentityKey(key, None, label)
    return None


def find_key(tx, keys, probe: IdentityKey):
    """The key among `keys` that is `probe`'s object, or None; the answer guarded where the
    objects compared come from outside the frame and no other guard pins which they are."""
    found = None
    for k in keys:
        if type(k) is IdentityKey and k.obj is probe.obj:
            found = k
            break
    if found is not None:
        _guard_same(tx, found, probe, True)
        return found
    for k in keys:
        if type(k) is IdentityKey:
            _guard_same(tx, k, probe, False)
    return None


def _guard_same(tx, stored: IdentityKey, probe: IdentityKey, same: bool):
    b = probe.vt
    if stored.vt is b or _made_here(stored) or _made_here(probe):
        return
    if stored.vt is None and same and b.source is not None and not b.identity_pinned:
        # The stored key's identity is pinned by its dict's DICT_KEYS guard.
        tx.output.guards.add(b.source, "ID_MATCH", stored.obj)
        return
    a = stored.tracker(tx)
    if _graph_input(a) and _graph_input(b):
        return  # the graph's inputs are guarded as aliases, or all distinct
    if _is_tensor(a) != _is_tensor(b):
        return  # a tensor is never a module
    same_object(tx, a, b)


def _made_here(key: IdentityKey) -> bool:
    return isinstance(key.obj, VariableTracker)


def _is_tensor(vt) -> bool:
    try:
        return issubclass(vt.python_type(), torch.Tensor)
    except Unsupported:
        return False


def _graph_input(vt) -> bool:
    """A tensor the graph takes as an input (a TensorVariable's node is its placeholder)."""
    node = getattr(vt, "node", None)
    return _is_tensor(vt) and node is not None and \
        vt.same_object().node.op == "placeholder"
