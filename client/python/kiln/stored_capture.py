"""Stored captures: what a capture produced for a code object, kept as a record that names no
object by its address, and installed in another process without tracing (no symbolic execution,
no fake tensors, no torch._dynamo import).

A record holds the transformed code's source and the objects its constants tuple needs, the
guards with their sources as paths from the frame, the graph as the key of its kilnd artifact
and the paths of its parameters and inputs. Objects are named structurally: a class, function
or module by its module and qualified name (a function also by a digest of its code); an object
the capture pinned by identity (a model, a submodule) by its path and its class, bound at
installation to the live object found there; a tensor by its metadata, checked on the live one.

The key (capture_key) covers the code object's identity (its bytecode, constants, names, file,
qualified name and lines, nested code included), kiln's own build (its Python sources and its
extension), torch's and Python's versions and how the graph is compiled (the backend and its
CUDA graph setting). A record is installed only when every structural check holds on the live
frame and every guard passes on it: a changed model file is another key, a changed global it
read fails a guard, another torch version is another key. Anything that cannot be named this
way (another backend's callable, a constant object made in the frame) is not stored: that code
is captured in each process, as before. A graph break's resume function is named by how it was
made from the frame's code (kiln.transform.resume.ResumeRecipe); made again from the live code
at installation, it is the same code object, whose own capture is stored under its own key.
"""
import contextlib
import gc
import hashlib
import re
import reprlib
import json
import logging
import sys
import time
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from kiln import _C
from kiln.graph import stand_in
from kiln.stored_names import (NotInstallable, NotStorable, capture_key, code_digest,
                               decode, encode, key_parts, location_key, name_of,
                               nearest_difference, resolve_name)

log = logging.getLogger("kiln")

# An object's address in a guard's text ("<Linear at 0x7f2c1d0e5b10>").
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


@contextlib.contextmanager
def collector_held():
    """The cyclic garbage collector held off: describing, reading or installing a record
    allocates enough to start a full collection, which in a process holding a model (a
    transformer's hundreds of thousands of objects) costs far more than the work itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _PathTable:
    """The sources of a record, each once: entry i is [kind, parent index or None, argument],
    parents before their children, so that a path shared by a thousand guards (a model's
    submodule) is decoded and read once."""

    def __init__(self):
        self.rows: List[list] = []
        self._index: Dict[Any, int] = {}
        # Closure cells held by functions the record pins (id(cell) -> (the function's path
        # index, the cell's index)): a cell is named as that function's, bound at load.
        self.cells: Dict[int, Tuple[int, int]] = {}
        # Functions the record pins by identity (id -> their path index): wherever else the
        # record holds one (a source rooted at it, a constant), it is the live one at that path.
        self.pinned: Dict[int, int] = {}
        # id(path) -> (path, its index), once `pinned` and `cells` are complete (remember_paths):
        # a source's path is one tuple object (Source.guard_path), so the guards under a submodule
        # find its row at once instead of walking each path to its root again.
        self._known: Optional[Dict[int, Tuple[tuple, int]]] = None

    def remember_paths(self) -> None:
        """From now on `pinned` and `cells` do not change: the index of each path added is kept."""
        self._known = {}

    def add(self, path: tuple) -> int:
        known = self._known
        if known is not None and id(path) in known:
            return known[id(path)][1]
        i = self._add(path)
        if known is not None:
            known[id(path)] = (path, i)  # holding the path keeps its id from being reused
        return i

    def _add(self, path: tuple) -> int:
        kind = path[0]
        if kind in ("local", "closure", "global", "builtin"):
            row, key = [kind, None, path[1]], path
        elif kind == "object" and id(path[1]) in self.pinned:
            row = ["pinned", self.pinned[id(path[1])], None]
            key = tuple(row)
        elif kind == "object" and id(path[1]) in self.cells:
            function, index = self.cells[id(path[1])]
            row, key = ["cell", function, index], ("cell", function, index)
        elif kind == "object" and type(path[1]) is types.CellType:
            # A cell of a function the record does not pin: a method's __class__ cell (zero-
            # argument super()) read inside an inlined method reached through its class. Named
            # as a cell of an importable function holding it, bound at load (code checked).
            owner = _cell_owner(path[1])
            if owner is None:
                raise NotStorable(f"a closure cell of no importable function "
                                  f"({reprlib.repr(path[1])})")
            function = self.add(("object", owner[0]))
            row, key = ["cell", function, owner[1]], ("cell", function, owner[1])
        elif kind == "object":
            row = [kind, None, encode(path[1])]
            key = (kind, id(path[1]))
        elif kind in ("attr", "item"):
            parent = self.add(path[1])
            arg = path[2] if kind == "attr" else encode(path[2])
            row, key = [kind, parent, arg], (kind, parent, type(path[2]), path[2])
        elif kind in ("instance_dict", "type"):
            parent = self.add(path[1])
            row, key = [kind, parent, None], (kind, parent)
        else:
            raise NotStorable(f"a source of kind {kind!r}")
        try:
            i = self._index.get(key)
        except TypeError:  # an unhashable item key
            raise NotStorable("a source through an unhashable key") from None
        if i is None:
            i = self._index[key] = len(self.rows)
            self.rows.append(row)
        return i


def _cell_owner(cell) -> Optional[Tuple[types.FunctionType, int]]:
    """(function, index): a function with an importable name whose closure holds `cell` at
    index, or None. A method's __class__ cell holds its class: that class's functions are looked
    at first; the search of every referrer (gc.get_referrers walks the whole heap: 0.1 s and
    more in a process with a transformer model) is left for other cells."""
    def owner(function, closure):
        if not (isinstance(function, types.FunctionType) and closure is not None
                and function.__closure__ is closure and name_of(function) is not None):
            return None
        return next(((function, i) for i, c in enumerate(closure) if c is cell), None)

    try:
        contents = cell.cell_contents
    except ValueError:  # an empty cell
        contents = None
    if isinstance(contents, type):
        for attr in vars(contents).values():
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            functions = ([attr.fget, attr.fset, attr.fdel] if isinstance(attr, property)
                         else [attr])
            for function in functions:
                found = owner(function, getattr(function, "__closure__", None))
                if found is not None:
                    return found
    for closure in gc.get_referrers(cell):
        if type(closure) is not tuple:
            continue
        for function in gc.get_referrers(closure):
            found = owner(function, closure)
            if found is not None:
                return found
    return None


class _Frame:
    """Values at a record's sources in the live frame, each read once (Python's reading of what
    the C++ guard tree reads; where the two could differ, the tree's checks fail and nothing
    runs)."""

    def __init__(self, slots: tuple, func, rows: list):
        self.slots = slots
        self.func = func
        self.rows = rows
        self._values: Dict[int, Any] = {}
        self.paths: List[tuple] = []
        self._decode()

    def _decode(self) -> None:
        """The guard-tree paths of the record's table (see _PathTable), in order: a closure
        cell's row reads its function's (earlier) row on the live frame."""
        out = self.paths
        for row in self.rows:
            if not isinstance(row, list) or len(row) != 3:
                raise NotInstallable(f"malformed source {row!r}")
            kind, parent, arg = row
            if kind in ("attr", "item", "instance_dict", "type", "cell", "pinned"):
                if type(parent) is not int or not 0 <= parent < len(out):
                    raise NotInstallable(f"malformed source {row!r}")
                base = out[parent]
            if kind in ("local", "closure") and type(arg) is int:
                out.append((kind, arg))
            elif kind in ("global", "builtin") and type(arg) is str:
                out.append((kind, sys.intern(arg)))
            elif kind == "object":
                out.append((kind, decode(arg)))
            elif kind == "pinned":
                out.append(("object", self.value(parent)))
            elif kind == "cell" and type(arg) is int:
                function = self.value(parent)
                closure = getattr(function, "__closure__", None) or ()
                if not isinstance(function, types.FunctionType) or arg >= len(closure):
                    raise NotInstallable(f"{_source_name(base)} has no closure cell {arg}")
                out.append(("object", closure[arg]))
            elif kind == "attr" and type(arg) is str:
                out.append((kind, base, sys.intern(arg)))
            elif kind == "item":
                out.append((kind, base, decode(arg)))
            elif kind in ("instance_dict", "type"):
                out.append((kind, base))
            else:
                raise NotInstallable(f"malformed source {row!r}")

    def value(self, i: int):
        try:
            return self._values[i]
        except KeyError:
            pass
        kind, parent, arg = self.rows[i]
        path = self.paths[i]
        try:
            if kind == "local":
                v = self.slots[arg]
            elif kind == "closure":
                v = self.func.__closure__[arg].cell_contents
            elif kind == "global":
                v = self.func.__globals__[arg]
            elif kind == "builtin":
                b = self.func.__builtins__
                v = b[arg] if isinstance(b, dict) else getattr(b, arg)
            elif kind in ("object", "cell", "pinned"):
                v = path[1]
            elif kind == "attr":
                v = getattr(self.value(parent), arg)
            elif kind == "item":
                v = self.value(parent)[path[2]]
            elif kind == "instance_dict":
                v = object.__getattribute__(self.value(parent), "__dict__")
            else:  # type
                v = type(self.value(parent))
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as e:
            raise NotInstallable(f"no value at {path!r}: {type(e).__name__}") from None
        self._values[i] = v
        return v


def _source_name(path: tuple) -> str:
    """A source path as people read it: L[0].a.weight."""
    kind = path[0]
    if kind in ("local", "closure"):
        return f"{'L' if kind == 'local' else 'closure'}[{path[1]}]"
    if kind in ("global", "builtin"):
        return f"{'G' if kind == 'global' else 'builtins'}[{path[1]!r}]"
    if kind == "object":
        return f"<{type(path[1]).__name__}>"
    if kind == "attr":
        return f"{_source_name(path[1])}.{path[2]}"
    if kind == "item":
        return f"{_source_name(path[1])}[{path[2]!r}]"
    return f"{kind}({_source_name(path[1])})"


def _tensor_meta(t: torch.Tensor) -> dict:
    return {"type": name_of(type(t)), "dtype": str(t.dtype), "device": str(t.device),
            "size": list(t.shape), "stride": list(t.stride()),
            "requires_grad": t.requires_grad, "keys": str(torch._C._dispatch_keys(t))}


# ---- describing an entry ------------------------------------------------------------------------

def describe_entry(*, code, guards, global_state: str, src: str, consts: list, region,
                   graph: Optional[dict], input_size: Optional[List[bool]] = None) -> dict:
    """The record of one entry (see module docstring). `guards`: the capture's GuardSet;
    `consts`: the transformed code's constants tuple, in which `region` is the compiled graph's
    callable; `graph`: describe_graph's, or None when the entry runs no graph; `input_size`:
    per guard, whether its failing means an input's size changed (the entry's
    input_size_guards, which automatic dynamic shapes reads of an installed entry too). Raises
    NotStorable."""
    entry_guards = []
    groups: Dict[int, int] = {}
    table = _PathTable()
    for g in guards:  # the functions pinned by identity first: their cells are named by them
        if g.kind == "ID_MATCH" and isinstance(g.value, types.FunctionType) and \
                g.source is not None:
            at = table.add(g.source.guard_path())
            table.pinned.setdefault(id(g.value), at)
            for i, cell in enumerate(g.value.__closure__ or ()):
                table.cells.setdefault(id(cell), (at, i))
    table.remember_paths()
    for i, g in enumerate(guards):
        path = g.source.guard_path() if g.source is not None else ("local", 0)
        enc = {"path": table.add(path), "kind": g.kind, "text": g.describe()}
        if input_size is not None and input_size[i]:
            enc["size"] = True
        kind, value = g.kind, g.value
        if kind == "TENSOR_MATCH":
            # As the GPU's tensor where CPU tensors stand for one (kiln.graph.stand_in).
            if isinstance(value, tuple):  # a dynamic input: its symbolic dimensions None
                real, sizes, strides = value
                meta = dict(_tensor_meta(real), size=list(sizes), stride=list(strides))
            else:
                meta = _tensor_meta(value)
            enc["value"] = stand_in.stored_meta(meta)
            if enc["value"] is not meta:
                enc["text"] = enc["text"].replace(f" {meta['device']} size=",
                                                  f" {enc['value']['device']} size=", 1)
        elif kind == "ID_MATCH":
            name = name_of(value)
            if name is not None:
                enc["value"] = {"object": name}
            elif isinstance(value, types.CodeType):
                # A code object (a wrapped function's, read through its __code__): bound at load
                # to the one at its path whose digest is the captured code's.
                enc["value"] = {"code": code_digest(value),
                                "group": groups.setdefault(id(value), len(groups))}
            elif isinstance(value, types.FunctionType):
                # A function with no importable name (a decorator's inner function, a closure):
                # bound at load to the function at its path whose code is the one inlined; what
                # it read through its closure, defaults and globals has guards of its own.
                enc["value"] = {"function": code_digest(value.__code__),
                                "group": groups.setdefault(id(value), len(groups))}
            else:
                cls = name_of(type(value))
                if cls is None:
                    raise NotStorable(f"an instance of {type(value).__qualname__}, a class "
                                      "with no importable name")
                enc["value"] = {"instance": cls,
                                "group": groups.setdefault(id(value), len(groups))}
        elif kind == "TYPE_MATCH":
            enc["value"] = encode(value)
        elif kind in ("CONSTANT_MATCH", "LEN_MATCH", "HASATTR", "NO_HASATTR", "NO_ITEM"):
            enc["value"] = encode(value)
        elif kind == "DICT_KEYS":
            enc["value"] = encode(tuple(value))
        elif kind == "SHAPE":
            # The relations over the symbolic sizes (kiln.graph.symbolic_shapes): the sources
            # they read, how each slot is read from them, and the evaluator's trees.
            paths, bindings, constraints = value
            if graph is not None and (graph.get("int_inputs") or graph.get("size_floors")):
                floors = _carrier_floors(graph, value) + _size_floors(graph, value)
                constraints = tuple(constraints) + tuple(floors)
                enc["text"] += "".join(f"; {text}" for _, text in floors)
            enc["value"] = {"sources": [table.add(p) for p in paths],
                            "bindings": encode(tuple(bindings)),
                            "constraints": encode(tuple(constraints))}
        elif kind == "ALIAS":
            enc["value"] = table.add(value.guard_path())
        elif kind == "DISTINCT":
            enc["value"] = [table.add(s.guard_path()) for s in value]
        elif kind != "GLOBAL_STATE":
            raise NotStorable(f"a guard of kind {kind}")
        entry_guards.append(enc)
    if graph is not None and (graph.get("int_inputs") or graph.get("size_floors")) and \
            not any(g.kind == "SHAPE" for g in guards):
        raise NotStorable("the graph's plan takes sizes at least some number but no SHAPE "
                          "guard reads them")
    if graph is not None:
        graph = dict(graph, params=[table.add(p) for p in graph["params"]],
                     inputs=[table.add(p) for p in graph["inputs"]])
    entry_consts = []
    for obj in consts:
        if obj is region:
            entry_consts.append({"graph": True})
        elif id(obj) in table.pinned:
            entry_consts.append({"pinned": table.pinned[id(obj)]})
        elif isinstance(obj, types.FunctionType) and \
                getattr(obj, "__kiln_resume__", None) is not None:
            # A graph break's resume function: made again from the live code by its recipe.
            entry_consts.append({"resume": list(obj.__kiln_resume__)})
        else:
            entry_consts.append(encode(obj))
    record = {"code": code_digest(code), "global_state": global_state, "source": src,
              "consts": entry_consts, "paths": table.rows, "guards": entry_guards,
              "graph": graph}
    record["id"] = record_id(record)
    record["made"] = time.time()
    return record


def record_id(record: dict) -> str:
    """The id of a record (before "id" and "made" are added). The same capture made by another
    process is the same record: guard texts name objects by their addresses, which the id leaves
    out (a fleet's processes would otherwise each add one, and push other captures of the code
    past CaptureStore's MAX_ENTRIES)."""
    same = dict(record, guards=[dict(g, text=_ADDRESS.sub("", g["text"]))
                                for g in record["guards"]])
    # Of its JSON form, which the store keeps: a record read back has the same id.
    return hashlib.sha256(json.dumps(same, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def describe_graph(artifact, param_sources: list, input_sources: list, device: torch.device,
                   cuda_graphs: bool, shared_modules: bool = False,
                   size_outputs=None, int_inputs=None, cpu_scalars=None,
                   size_floors=()) -> dict:
    """The graph of an entry: the kilnd artifact `artifact` (a kiln_backend.CompiledArtifact)
    with its parameters and inputs at these sources. `shared_modules`: the entry serves many
    instances of its modules' classes, whose parameters are inputs of each call.
    `size_outputs`: for a plan with size symbols (whole_plan_parts), where the outputs that
    are no tensor come from (kiln.graph.size_outputs), or None; `int_inputs`: its ints passed
    as carriers (kiln.graph.int_inputs), or None; `cpu_scalars`: its 0-dim CPU inputs copied
    to the GPU at each call (kiln.graph.cpu_scalars), or None; `size_floors`: where its plan
    takes sizes as 2 or more (kiln.graph.size_floors)."""
    graph = {"artifact": artifact.key, "device": str(device), "cuda_graphs": bool(cuda_graphs),
             "params": [s.guard_path() for s in param_sources],
             "inputs": [s.guard_path() for s in input_sources],
             "shared_modules": bool(shared_modules)}
    if getattr(artifact.plan, "symbolic", False):
        graph["symbolic"] = True
    if size_outputs is not None:
        graph["size_outputs"] = [[kind, encode(where)] for kind, where in size_outputs.outputs]
    if int_inputs is not None:
        graph["int_inputs"] = [[int(p), int(least)] for p, least in
                               zip(int_inputs.positions, int_inputs.least)]
    if cpu_scalars is not None:
        graph["cpu_scalars"] = [int(p) for p in cpu_scalars.positions]
    if size_floors:
        graph["size_floors"] = [[int(p), None if d is None else int(d), int(least)]
                                for p, d, least in size_floors]
    return graph


def whole_plan_parts(whole):
    """(plan, SizeOutputs or None, IntInputs or None, size floors) of a graph's plan for every
    size (kiln_backend.compile_symbolic's callable; its CpuScalars: cpu_scalars_of; the floors:
    kiln.graph.size_floors, [] where none)."""
    floors = []
    if hasattr(whole, "admits"):
        floors, whole = whole.floors, whole.plan
    sizes = getattr(whole, "size_outputs", None)
    if sizes is not None:
        whole = whole.plan
    ints = getattr(whole, "int_inputs", None)
    if ints is not None:
        whole = whole.plan
    return whole, sizes, ints, floors


def cpu_scalars_of(compiled):
    """(plan, CpuScalars or None) of a graph's compiled callable (kiln.graph.cpu_scalars)."""
    scalars = getattr(compiled, "cpu_scalars", None)
    return (compiled, None) if scalars is None else (compiled.plan, scalars)


def _carrier_floors(graph: dict, shape_value) -> list:
    """The SHAPE guard's constraints that a record whose graph takes ints as carriers adds: each
    such int at least the least number the compiled graph takes (kiln.graph.int_inputs: a call
    below it runs the program's graph, which a record does not hold, so the record's entry is
    not for it). Raises NotStorable when an int input has no symbol in the guard."""
    return [f for position, least in graph.get("int_inputs") or ()
            for f in _floor(graph, shape_value, position, None, least)]


def _size_floors(graph: dict, shape_value) -> list:
    """The SHAPE guard's constraints that a record whose plan takes some sizes as 2 or more
    adds (kiln.graph.size_floors: a call with less runs without the plan in the capturing
    process, which a record does not hold)."""
    return [f for position, dim, least in graph.get("size_floors") or ()
            for f in _floor(graph, shape_value, position, dim, least)]


def _floor(graph: dict, shape_value, position: int, dim, least: int) -> list:
    """[(tree, text)]: the constraint that the graph's input `position` (its size `dim`; the int
    itself where dim is None) is at least `least`, or [] where the guard says so already."""
    paths, bindings, constraints = shape_value
    path = graph["inputs"][position]
    want = "int" if dim is None else "size"
    slot = next((i for i, (src, kind, d, _name) in enumerate(bindings)
                 if kind == want and paths[src] == path and (dim is None or d == dim)), None)
    if slot is None:
        raise NotStorable(f"the graph's input {position} has no symbol of its guards there")
    text = f"{bindings[slot][3]} >= {least}"
    if text in {t for _tree, t in constraints}:  # the capture's own guard, its range narrowed
        return []
    return [(("ge", ("sym", slot), int(least)), text)]


# ---- installing an entry ------------------------------------------------------------------------

def _check_tuple(frame: _Frame, kind: str, value, groups: Dict[int, Any], at: int) -> tuple:
    path = frame.paths[at]
    if kind == "TENSOR_MATCH":
        live = frame.value(at)
        if not isinstance(live, torch.Tensor):
            raise NotInstallable(f"{_source_name(path)} is a {type(live).__name__}, not a tensor")
        meta = _tensor_meta(live)
        symbolic = isinstance(value, dict) and any(
            d is None for k in ("size", "stride") for d in value.get(k) or ())
        if symbolic:  # the SHAPE guard checks its symbolic dimensions
            for k in ("size", "stride"):
                dims = value.get(k)
                if isinstance(dims, list) and len(dims) == len(meta[k]):
                    meta[k] = [d if want is not None else None
                               for d, want in zip(meta[k], dims)]
        if meta != value:
            diff = ", ".join(f"{k} {value.get(k)} captured, {meta[k]} now" for k in meta
                             if meta[k] != value.get(k))
            raise NotInstallable(f"the tensor {_source_name(path)} differs: {diff}")
        if symbolic:
            return ("tensor", live, tuple(value["size"]), tuple(value["stride"]))
        return ("tensor", live)
    if kind == "ID_MATCH":
        if "function" not in value and "instance" not in value and "code" not in value:
            return ("id", decode(value))
        # An object named by its path: the live one there, if it is what was captured and
        # keeps the identities the capture saw.
        live = frame.value(at)
        if "code" in value:
            if not isinstance(live, types.CodeType) or code_digest(live) != value["code"]:
                raise NotInstallable(f"{_source_name(path)} is not the code captured")
        elif "function" in value:
            if not isinstance(live, types.FunctionType) or \
                    code_digest(live.__code__) != value["function"]:
                raise NotInstallable(f"{_source_name(path)} is not the function captured")
        elif type(live) is not resolve_name(value["instance"]):
            raise NotInstallable(f"{_source_name(path)} is a {type(live).__qualname__}, "
                                 f"not the {value['instance'][2]} captured")
        if groups.setdefault(value["group"], live) is not live:
            raise NotInstallable("objects that were one are now two")
        return ("id", live)
    if kind == "TYPE_MATCH":
        return ("type", decode(value))
    if kind == "CONSTANT_MATCH":
        return ("constant", decode(value))
    if kind == "LEN_MATCH":
        return ("len", decode(value))
    if kind == "DICT_KEYS":
        return ("dict_keys", decode(value))
    if kind == "HASATTR":
        return ("has_attr", decode(value))
    if kind == "NO_HASATTR":
        return ("no_attr", decode(value))
    if kind == "NO_ITEM":
        return ("no_item", decode(value))
    if kind == "SHAPE":
        return ("shape", tuple(frame.paths[i] for i in value["sources"]),
                decode(value["bindings"]), decode(value["constraints"]))
    if kind == "ALIAS":
        return ("is", frame.paths[value])
    if kind == "DISTINCT":
        return ("distinct", tuple(frame.paths[i] for i in value))
    if kind == "GLOBAL_STATE":
        return ("global_state",)
    raise NotInstallable(f"unknown guard kind {kind!r}")


def _guard_tree(record: dict, frame: _Frame, code):
    import torch

    from kiln.guards.builder import entry_dropper

    groups: Dict[int, Any] = {}
    checks = [(frame.paths[g["path"]], _check_tuple(frame, g["kind"], g.get("value"), groups,
                                                      g["path"]), g["text"])
              for g in record["guards"]]
    if len({id(v) for v in groups.values()}) != len(groups):
        raise NotInstallable("objects that were two are now one")
    # The modules whose identity the entry checks, watched as a traced entry's are: when one
    # dies, the code's later captures guard modules by structure, whichever way the entry came.
    modules = [c[1] for _, c, _ in checks
               if c[0] == "id" and isinstance(c[1], torch.nn.Module)]
    on_dead, manager_ref = entry_dropper(code, modules)
    manager = _C.GuardManager(on_dead=on_dead)
    manager_ref.append(__import__("weakref").ref(manager))
    for path, check, text in checks:
        try:
            manager.add(path, check, text)
        except ValueError as e:
            raise NotInstallable(f"guard {text!r}: {e}") from None
    return manager, [text for _, _, text in checks]


def _graph_callable(graph: dict, frame: _Frame, prepared: Sequence["_PreparedPlan"] = ()):
    """(plan, the prepared plan used or None) of the record's graph: loaded from kilnd by its
    artifact key, or one of `prepared` (StoredCaptures.prepare) that is this graph's plan,
    prepared for the very parameters this frame holds."""
    from kiln.backends.kiln_backend import CompiledArtifact, load_artifact_by_key
    from kiln.daemon import artifact as art
    from kiln.daemon.client import DaemonUnavailable
    from kiln.daemon.protocol import ProtocolUnavailable
    from kiln.state import STATE

    params = [frame.value(i) for i in graph["params"]]
    inputs = [frame.value(i) for i in graph["inputs"]]
    device = torch.device(graph["device"])
    for position, _least in graph.get("int_inputs", ()):
        n = inputs[position]
        if type(n) is not int or n < 0:
            raise NotInstallable(f"the graph's int input {position} is {n!r} here")
        inputs[position] = torch.empty((n, 0), device=device)  # its carrier, as the call's
    for position in graph.get("cpu_scalars", ()):
        t = inputs[position]
        if not (isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() == 0):
            raise NotInstallable(f"the graph's input {position} is no 0-dim CPU tensor here")
        inputs[position] = t.to(device)  # as each call passes it
    if not all(isinstance(t, torch.Tensor) for t in params + inputs):
        raise NotInstallable("a parameter or input of the graph is no longer a tensor")
    start = time.perf_counter()
    ready = next((p for p in prepared if p.fits(graph, params, device)), None)
    try:
        if ready is not None:
            art.check_inputs(ready.body, params + inputs)
            body, plan = ready.body, ready.plan
        else:
            body, plan = load_artifact_by_key(graph["artifact"], params, inputs, device,
                                              graph["cuda_graphs"])
    except (art.ArtifactRejected, DaemonUnavailable, ProtocolUnavailable, RuntimeError,
            ValueError) as e:
        raise NotInstallable(f"artifact {graph['artifact'][:16]}… not loaded: {e}") from None
    STATE.artifacts.append(CompiledArtifact(graph["artifact"], True, True, 0.0,
                                            time.perf_counter() - start, body, plan))
    return plan, ready


# How many of a code's stored plans kiln.compile prepares (a generate() has four: its prefill
# and decode step, static and for every size).
_PREPARED_PER_CODE = 4


class _PreparedPlan:
    """A record's graph (its artifact key, device and CUDA graph setting) loaded as `plan` and
    run once before the first call, for `params`."""

    def __init__(self, graph: dict, params: list, body, plan, seconds: dict):
        self.graph, self.params, self.body, self.plan = graph, params, body, plan
        self.seconds = seconds  # where preparation went: records, artifact, plan, warm

    def fits(self, graph: dict, params: list, device: torch.device) -> bool:
        # The same tensor objects: the plan binds them, and its prologue runs again when one
        # has been written since (Plan's version stamps), so their values may have changed.
        return (graph["artifact"] == self.graph["artifact"] and
                device == torch.device(self.graph["device"]) and
                graph["cuda_graphs"] == self.graph["cuda_graphs"] and
                len(params) == len(self.params) and
                all(a is b for a, b in zip(params, self.params)))


# A frame slot that preparation has no value for: an argument of a call not yet made. It has no
# attributes or items, so no path through it reaches a tensor.
_UNBOUND = object()


def _resume(code, func, recipe: list):
    """The resume function a record's recipe names, made again from the live code: the same
    code object as the capturing process made, so its own stored capture is found by its key."""
    from kiln.transform.resume import resume_origin, shared_resume

    code = resume_origin(code)[0]  # a resume function's breaks continue its origin's code
    offset, is_null, unbound, name = recipe
    if not (type(offset) is int and type(name) is str and name.startswith("__resume_at_") and
            all(type(b) is bool for b in is_null) and all(type(u) is str for u in unbound)):
        raise NotInstallable(f"malformed resume function {recipe!r}")
    try:
        return shared_resume(code, func.__globals__, offset, tuple(is_null), tuple(unbound),
                             name)
    except (ValueError, IndexError, KeyError) as e:
        raise NotInstallable(f"resume function {name} not made: {e}") from None


def _const(c, region, frame: _Frame, code, func):
    """The object one of a record's constants names on this frame (see describe_entry)."""
    if c == {"graph": True}:
        return region
    if isinstance(c, dict) and "pinned" in c:
        return frame.value(c["pinned"])
    if isinstance(c, dict) and "resume" in c:
        return _resume(code, func, c["resume"])
    return decode(c)


def install(record: dict, code, slots: tuple, func, prepared: Sequence[_PreparedPlan] = ()):
    """(guard tree, transformed code, EntryInfo) for `record` on this frame, when its structural
    checks and every guard hold here. Raises NotInstallable. `prepared`: the plans prepared
    before the call for this code, one used where it fits (see _graph_callable): then the
    entry's compiled_fn."""
    from kiln.entry import EntryInfo, next_compile_id
    from kiln.graph.lowering import _global_state
    from kiln.transform.codegen import code_from_source

    start = time.perf_counter()
    try:
        if record.get("code") != code_digest(code):
            raise NotInstallable("the record is another code's")
        if record["global_state"] != _global_state():
            raise NotInstallable("captured under another grad/autocast/default dtype state")
        frame = _Frame(slots, func, record["paths"])
        manager, descriptions = _guard_tree(record, frame, code)
        why = manager.failure_reason(slots, func)
        if why is not None:
            raise NotInstallable(f"a guard fails: {why}")
        region = plan = used = None
        if record["graph"] is not None:
            from kiln import config

            if record["graph"].get("symbolic") and not config.symbolic_plans:
                raise NotInstallable("a plan for every size, and symbolic_plans is off")
            plan, used = _graph_callable(record["graph"], frame, prepared)
            runs = plan
            if record["graph"].get("cpu_scalars"):
                from kiln.graph.cpu_scalars import CpuScalars

                runs = CpuScalars(list(record["graph"]["cpu_scalars"]),
                                  torch.device(record["graph"]["device"])).adapt(runs)
            if record["graph"].get("int_inputs"):
                from kiln.graph.int_inputs import IntInputs

                pairs = record["graph"]["int_inputs"]
                runs = IntInputs([p for p, _ in pairs], [least for _, least in pairs],
                                 torch.device(record["graph"]["device"]), None).adapt(runs)
            if "size_outputs" in record["graph"]:
                from kiln.graph.size_outputs import SizeOutputs

                runs = SizeOutputs([(kind, decode(where)) for kind, where in
                                    record["graph"]["size_outputs"]]).adapt(runs)
            region = _C.FrameRegion(runs, None)  # what the graph runs is never captured
        objects = [_const(c, region, frame, code, func) for c in record["consts"]]
        new_code = code_from_source(code, record["source"], objects)
    except NotInstallable:
        raise
    except (KeyError, TypeError, ValueError, SyntaxError, AttributeError, IndexError) as e:
        raise NotInstallable(f"malformed record: {type(e).__name__}: {e}") from None
    compile_id = next_compile_id()
    info = EntryInfo(compile_id=compile_id, name=f"__compiled_fn_{compile_id}",
                     graph_module=None, compiled_fn=plan, guards=descriptions,
                     original_code=code, transformed_code=new_code,
                     transformed_source=record["source"], op_count=-1, capture_seconds=0.0,
                     backend_seconds=time.perf_counter() - start)
    info.extra["stored_capture"] = record["id"]
    info.extra["input_size_guards"] = frozenset(g["text"] for g in record["guards"]
                                                if g.get("size") is True)
    info.extra["prepared_plan"] = used is not None
    if used is not None:
        info.extra["prepare_seconds"] = used.seconds
    return manager, new_code, info


# ---- the process's stored captures ----------------------------------------------------------------

class StoredCaptures:
    """Stored captures for one compile setting (the "kiln" backend with or without CUDA
    graphs): find and install a record for a frame the hook missed, and store what a capture
    made. Every failure is a miss, said at debug level (KILN_LOG=cache: at warning level)."""

    def __init__(self, setting: str, cuda_graphs: bool):
        self.setting = setting
        self.cuda_graphs = cuda_graphs
        self._store = None
        self._store_settings = None
        # What prepare read ahead of the first call, by capture key: the records, which the
        # first install of the code takes, and the plans of those it could prepare, each taken
        # by the install that uses it (a generate() installs its prefill and its decode step
        # from one code's records).
        self._prepared: Dict[str, List[dict]] = {}
        self._plans: Dict[str, List[_PreparedPlan]] = {}

    def store(self):
        from kiln.daemon.capture_store import CaptureStore
        from kiln.daemon.client import DaemonUnavailable, read_mac_key
        from kiln.state import STATE

        settings = STATE.daemon.settings
        if self._store is None or self._store_settings is not settings:
            try:
                mac_key = read_mac_key(settings.mac_key_file)
            except DaemonUnavailable:
                return None  # no kilnd has run with this cache yet: nothing stored either
            self._store = CaptureStore(settings.cache_dir / "captures", mac_key,
                                       daemon=STATE.daemon.client)
            self._store_settings = settings
        return self._store

    def key(self, code) -> str:
        from kiln.state import STATE

        return capture_key(code, self.setting, STATE.daemon.settings.cache_dir)

    def install(self, func, code, slots):
        """The hook's entry from a stored record that holds on this frame, or None."""
        from kiln.state import STATE

        from kiln import config

        if config.compile_only:
            return None  # its artifacts may be for a target this machine cannot run
        with collector_held():
            return self._install(func, code, slots)

    def prepare(self, func, bound_self=None) -> bool:
        """The work of a stored capture's installation that needs no call, done before the
        first call (kiln.compile): the records for `func`'s code read, and the newest one's
        graph loaded and its plan run once over zeroed inputs (the prologue and the kernels'
        first-run setup), for the parameters it reaches from `bound_self` (a module whose
        forward `func` is), globals or closures. The first call then checks the guards on its
        frame and installs without waiting on kilnd, the artifact or the plan's first run; the
        plan is used only for the very tensors it was prepared with. True when a plan was
        prepared; any failure leaves the first call to do it all."""
        from kiln import config

        code = getattr(func, "__code__", None)
        if config.compile_only or not isinstance(code, types.CodeType):
            return False
        try:
            with collector_held():
                return self._prepare(func, code, bound_self)
        except Exception as e:  # preparation is an optimisation: never the user's error
            say("kiln: %s: nothing prepared (%s: %s)", code.co_qualname, type(e).__name__, e)
            return False

    def _prepare(self, func, code, bound_self) -> bool:
        from kiln.backends.kiln_backend import build_plan_for

        start = time.perf_counter()
        store = self.store()
        if store is None:
            return False
        key = self.key(code)
        records = store.get(key)
        if not records:
            return False
        read = time.perf_counter() - start
        self._prepared[key] = records
        # Each record's plan whose parameters are this module's (captures of other modules
        # whose forward is this code, two nn.Sequential models, share the key), once per
        # artifact: a generate()'s prefill and decode step, static and for every size. The
        # newest few only: each one holds its prologue's outputs until an install takes it.
        plans, done = [], set()
        for record in records:
            if len(plans) == _PREPARED_PER_CODE:
                break
            start = time.perf_counter()
            fit = self._fit(record, func, code, bound_self)
            if fit is None or record["graph"]["artifact"] in done:
                continue
            graph, mode, params, device, body = fit
            seconds = {"records": read, "artifact": time.perf_counter() - start}
            start = time.perf_counter()
            plan = build_plan_for(body, params, len(graph["inputs"]), device,
                                  graph["cuda_graphs"])
            seconds["plan"] = time.perf_counter() - start
            warm = getattr(plan, "warm", None)
            if warm is not None:
                start = time.perf_counter()
                try:
                    with mode():
                        warm()
                except Exception as e:  # noqa: BLE001 - its example sizes are no call's
                    # (a plan for every size runs over example sizes that its ops may refuse):
                    # a plan built afresh, its first run left to the first call that needs it.
                    say("kiln: %s: artifact %s… not warmed (%s: %s)", code.co_qualname,
                        graph["artifact"][:16], type(e).__name__, e)
                    plan = build_plan_for(body, params, len(graph["inputs"]), device,
                                          graph["cuda_graphs"])
                seconds["warm"] = time.perf_counter() - start  # prologue, first run
            plans.append(_PreparedPlan(graph, params, body, plan, seconds))
            done.add(graph["artifact"])
        if not plans:
            return False
        self._plans[key] = plans
        say("kiln: %s: prepared %d plan%s of stored capture %s…", code.co_qualname, len(plans),
            "" if len(plans) == 1 else "s", key[:16])
        return True

    @staticmethod
    def _fit(record: dict, func, code, bound_self):
        """(graph, grad mode, parameters, device, artifact body) of `record` when its plan can be
        prepared for `func` bound to `bound_self` now, else None."""
        from kiln.backends.kiln_backend import artifact_body_by_key
        from kiln.daemon import artifact as art
        from kiln.graph.lowering import _global_state

        graph = record.get("graph")
        if graph is None or record.get("code") != code_digest(code) or \
                graph.get("shared_modules"):
            return None  # (a shared entry's module tensors are inputs of the call: none bound)
        # The plan runs now as the first call would: in the global state the first call's
        # guards require (its prologue's outputs are made in it and kept). Only a graph run
        # without autograd is prepared, and only when the rest of that state (default dtype,
        # autocast) is this thread's now.
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                if _global_state() == record["global_state"]:
                    break
        else:
            return None
        # Slot 0 is `bound_self` where the code takes it as its first argument (not *args).
        nslots = code.co_nlocals + len(code.co_cellvars) + len(code.co_freevars)
        first = bound_self if bound_self is not None and code.co_argcount > 0 else _UNBOUND
        try:
            frame = _Frame((first,) + (_UNBOUND,) * (nslots - 1), func, record["paths"])
            params = [frame.value(i) for i in graph["params"]]
        except NotInstallable:
            return None  # a path this module does not have
        if not all(isinstance(t, torch.Tensor) for t in params):
            return None  # a parameter reached from an argument of the call
        device = torch.device(graph["device"])
        if device.type == "cuda" and not torch.cuda.is_available():
            return None  # a record for a GPU this machine lacks (python -m kiln warm --cuda-arch)
        body = artifact_body_by_key(graph["artifact"], device)
        try:
            art.check_inputs(body, params, leading=True)
        except art.ArtifactRejected:
            return None  # another module's parameters
        return graph, mode, params, device, body

    def _install(self, func, code, slots):
        from kiln.state import STATE

        store = self.store()
        if store is None:
            return None
        key = self.key(code)
        records = self._prepared.pop(key, None)
        if records is None:
            records = store.get(key)
        prepared = self._plans.get(key, [])
        reasons = []
        for record in records:
            try:
                entry = install(record, code, slots, func, prepared)
            except NotInstallable as e:
                reasons.append(str(e))
                continue
            # A prepared plan serves the one entry that took it.
            prepared[:] = [p for p in prepared if p.plan is not entry[2].compiled_fn]
            if not prepared:
                self._plans.pop(key, None)
            say("kiln: %s: installed stored capture %s…", code.co_qualname, key[:16])
            STATE.capture_misses.pop(code, None)
            return entry
        if reasons:
            why = "; ".join(reasons)
        else:
            parts = key_parts(code, self.setting, STATE.daemon.settings.cache_dir)
            why = ("no capture stored under this code, kiln, torch and Python version and "
                   "compile setting: " + nearest_difference(parts, store.locate(
                       location_key(code))))
        STATE.capture_misses[code] = why
        say("kiln: %s: no stored capture used (%s)", code.co_qualname, why)
        return None

    def put(self, code, record: dict) -> None:
        from kiln.state import STATE

        store = self.store()
        if store is not None:
            store.put(self.key(code), record)
            store.note_location(location_key(code), key_parts(
                code, self.setting, STATE.daemon.settings.cache_dir))


def say(fmt, *args):
    """A stored capture's news: at warning level under KILN_LOG=cache, else debug."""
    from kiln import config

    config.say("cache", fmt, *args)
