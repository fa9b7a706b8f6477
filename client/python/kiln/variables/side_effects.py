"""Attribute assignments the frame makes to objects that outlive it (`self.flag = True` on a
global helper object, `self.steps += 1` on a module), and assignments to module globals
(`global n; n += 1`: a store into the module's globals dict, replayed with operator.setitem):
held as pending stores while tracing (later reads in the trace see them), and replayed by the
transformed code.

Contract with the executor: STORE_ATTR calls `tracker.store_attr(tx, name, value)` where the
tracker has one; when the root frame returns or breaks, `finish(tx.output)` must be called before
the transformed code is written. A store whose final value equals, as a constant, the value the
attribute held before the frame ran is a net no-op: it is dropped and a guard pins the entry
value. Every other store is kept in `output.attribute_stores`, in the order the frame first made
it, with its final value: the transformed code assigns each after the graph has run and before
anything else runs (the instruction a graph break leaves to Python, the return). Nothing between
the store and that point could observe the attribute: what the trace read, it read pending.
Trackers only keep a store pending when a plain assignment is exactly what eager does (the
object's class has object's or torch.nn.Module's __setattr__ for a plain attribute, and no data
descriptor of that name). Each store is replayed through what the program called: `setattr` for
an assignment (STORE_ATTR), `object.__setattr__` where the program called that (a frozen
dataclass's generated __init__, whose class __setattr__ refuses).
"""
from typing import Dict, List, Tuple

from kiln.exc import Unsupported
from kiln.guards.builder import is_guardable_constant
from kiln.guards.source import InstanceAttrSource, Source

_MISSING = object()


class AttributeMutations:
    """The pending stores of one capture, by (id(obj), attribute name)."""

    def __init__(self):
        # (id(obj), name) -> (obj, source of obj, tracker of the new value, setter)
        self._stores: Dict[Tuple[int, str], Tuple[object, Source, object, object]] = {}

    def store(self, obj, source: Source, name: str, value, setter=setattr):
        """Holds `obj.name = value` pending; `setter` is what the program called to store it
        (setattr or object.__setattr__), and what the transformed code will call."""
        if source is None:
            raise Unsupported(f"assignment to attribute {name!r} of an object with no source")
        key = (id(obj), name)
        held = self._stores.get(key)
        if held is not None and held[3] is not setter:
            # One replay cannot make both kinds of store of one attribute.
            raise Unsupported(f"attribute {name!r} assigned both through setattr and "
                              "object.__setattr__")
        self._stores[key] = (obj, source, value, setter)

    def load(self, obj, name: str):
        """The tracker a pending store left in `obj.name`, or None."""
        entry = self._stores.get((id(obj), name))
        return entry[2] if entry is not None else None

    def checkpoint(self):
        return dict(self._stores)

    def restore(self, ckpt):
        self._stores = dict(ckpt)

    def finish(self, guards) -> List[Tuple[Source, str, object]]:
        """Drops the net no-op stores, pinning the entry value each relies on; the others, as
        (source of the object, attribute name, tracker of the final value, setter), to
        replay."""
        replay = []
        for (_, name), (obj, source, value, setter) in self._stores.items():
            before = getattr(obj, "__dict__", {}).get(name, _MISSING)
            if (before is not _MISSING and is_guardable_constant(before)
                    and value.is_python_constant()):
                after = value.as_python_constant()
                if type(after) is type(before) and after == before:
                    guards.add(InstanceAttrSource(source, name), "CONSTANT_MATCH", before)
                    continue
            replay.append((source, name, value, setter))
        self._stores.clear()
        return replay


def mutations_of(output) -> AttributeMutations:
    """The capture's pending stores (kept on its OutputGraph)."""
    m = getattr(output, "attr_mutations", None)
    if m is None:
        m = AttributeMutations()
        output.attr_mutations = m
    return m


def finish(output):
    """Ends the capture's pending stores: output.attribute_stores and output.container_stores,
    what the transformed code replays (see the module's docstring)."""
    m = getattr(output, "attr_mutations", None)
    output.attribute_stores = m.finish(output.guards) if m is not None else []
    # Lists and dicts from outside the frame that it mutated (ContainerVariable._replay_outside):
    # their final items, assigned in place (the same object, as the program's).
    output.container_stores = [(t.source, t) for t in output.containers.replayed()]


def stores_named(output) -> List[str]:
    """What the transformed code assigns beside the graph, for people (export refuses these)."""
    return ([f"{source.name}.{attr}" for source, attr, _, _ in output.attribute_stores]
            + [f"{source.name}[...]" for source, _ in output.container_stores])


def assigned_ints(output) -> frozenset:
    """The sources of the int attributes output.attribute_stores assigns (an int the frame
    computed, or a symbol): STATE.self_assigned_ints."""
    out = set()
    for source, name, value, _ in output.attribute_stores:
        try:
            is_int = value.python_type() is int
        except (NotImplementedError, Unsupported, AttributeError):
            is_int = False
        if is_int:
            out.add(InstanceAttrSource(source, name))
    return frozenset(out)


def replay_statements(output, rebuild) -> List[str]:
    """The transformed code's assignments of output.attribute_stores: `rebuild` writes each
    object's and value's expression (values computed by the graph come from its outputs; what
    the frame read from a source, read before any store: rebuild.snapshot)."""
    out = []
    for source, name, value, setter in output.attribute_stores:
        out.append(f"{rebuild.constant(setter)}({rebuild.source(source)}, {name!r}, "
                   f"{rebuild(value)})")
    for source, tracker in output.container_stores:
        out.append(tracker.replay(rebuild, rebuild.source(source)))
    return out
