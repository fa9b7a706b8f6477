"""Attribute assignments the frame makes to objects that outlive it (`self.flag = True` on a
global helper object): held as pending stores while tracing, and checked when the trace ends.

Contract with the executor: STORE_ATTR calls `tracker.store_attr(tx, name, value)` where the
tracker has one; when the root frame returns, `finish(tx.output)` must be called before the
transformed code is written. A store whose final value equals, as a constant, the value the
attribute held before the frame ran is a net no-op: it is dropped and a guard pins the entry
value. Any other store would have to be replayed after the graph, which kiln cannot do yet, so
`finish` raises Unsupported: the compiled code never silently loses a mutation.
"""
from typing import Dict, Tuple

from kiln.exc import Unsupported
from kiln.guards.builder import is_guardable_constant
from kiln.guards.source import InstanceAttrSource, Source

_MISSING = object()


class AttributeMutations:
    """The pending stores of one capture, by (id(obj), attribute name)."""

    def __init__(self):
        # (id(obj), name) -> (obj, source of obj, tracker of the new value)
        self._stores: Dict[Tuple[int, str], Tuple[object, Source, object]] = {}

    def store(self, obj, source: Source, name: str, value):
        if source is None:
            raise Unsupported(f"assignment to attribute {name!r} of an object with no source")
        self._stores[(id(obj), name)] = (obj, source, value)

    def load(self, obj, name: str):
        """The tracker a pending store left in `obj.name`, or None."""
        entry = self._stores.get((id(obj), name))
        return entry[2] if entry is not None else None

    def checkpoint(self):
        return dict(self._stores)

    def restore(self, ckpt):
        self._stores = dict(ckpt)

    def finish(self, guards):
        """Drops the net no-op stores, pinning the entry value each relies on; raises
        Unsupported for the first store that would have to be replayed."""
        for (_, name), (obj, source, value) in self._stores.items():
            before = getattr(obj, "__dict__", {}).get(name, _MISSING)
            if (before is not _MISSING and is_guardable_constant(before)
                    and value.is_python_constant()):
                after = value.as_python_constant()
                if type(after) is type(before) and after == before:
                    guards.add(InstanceAttrSource(source, name), "CONSTANT_MATCH", before)
                    continue
            raise Unsupported(f"assignment to {source.name}.{name} outlives the frame "
                              "(replaying it after the graph is not supported)")
        self._stores.clear()


def mutations_of(output) -> AttributeMutations:
    """The capture's pending stores (kept on its OutputGraph)."""
    m = getattr(output, "attr_mutations", None)
    if m is None:
        m = AttributeMutations()
        output.attr_mutations = m
    return m


def finish(output):
    m = getattr(output, "attr_mutations", None)
    if m is not None:
        m.finish(output.guards)
