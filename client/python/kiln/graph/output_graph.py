"""The graph a capture builds: FX nodes, their fake (metadata-only) values, graph inputs and the
module attributes (parameters, buffers) the graph reads.

Tensor metadata comes from running each op on FakeTensors: shapes, dtypes, devices and strides
without touching real data or running real kernels.
"""
import contextlib
import functools
import operator
import threading
from typing import Any, Dict, List, Optional

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

try:  # a GraphModule that writes its Python code when something first reads or runs it
    from torch.fx._lazy_graph_module import _LazyGraphModule as _GraphModuleClass
except ImportError:  # torch < 2.3
    _GraphModuleClass = torch.fx.GraphModule

from kiln.exc import Unsupported
from kiln.graph import stand_in
from kiln.graph.meta_rules import (class_overrides_torch_function, fake_of, plain_tensor,
                                   shortcut)
from kiln.graph.size_one import forget_if_same_at_one
from kiln.graph.symbolic_ir import Mark
from kiln.graph.symbolic_shapes import (contains_symbol, drop_fresh_unbacked, fresh_unbacked,
                                        symbolic_ops)
from kiln.guards.builder import GuardSet
from kiln.guards.source import Source


class GraphInput:
    """`example`: the tensor the capture read at `source`. `plain`: its class overrides
    __torch_function__, so the graph takes a plain torch.Tensor over it (plain_alias): the
    capture recorded the override's effects, the graph's ops must not run it again."""
    __slots__ = ("node", "source", "example", "plain")

    def __init__(self, node, source, example, plain=False):
        self.node = node
        self.source = source
        self.example = example
        self.plain = plain


def plain_alias(t: torch.Tensor) -> torch.Tensor:
    """A torch.Tensor over the same data as `t`, in autograd as its alias (as_subclass, which
    no __torch_function__ intercepts)."""
    return torch.Tensor.as_subclass(t, torch.Tensor)


class ContainerMemo:
    """The trackers of the tuples, lists and dicts a capture read from outside the frame, by the
    object's identity and whether its reads were guarded (an unguarded read, through a module's
    attributes, does not stand for a guarded one). Holds the objects, so that no id is reused
    while the capture runs."""

    def __init__(self):
        self._trackers: Dict[tuple, Any] = {}
        self._objects: List[Any] = []

    def get(self, obj, guarded: bool):
        tracker = self._trackers.get((id(obj), guarded))
        if tracker is None and not guarded:
            # A container the frame mutated (replayed after the graph) is that tracker however
            # it is read again: a new one would hold the items it had before.
            other = self._trackers.get((id(obj), True))
            if other is not None and other.replayed:
                return other
        return tracker

    def remember(self, obj, guarded: bool, tracker):
        self._trackers[(id(obj), guarded)] = tracker
        self._objects.append(obj)
        tracker.outside_object = obj
        tracker.outside_guarded = guarded
        tracker.outside_memo = self

    def other_tracker(self, tracker):
        """The other tracker of `tracker`'s object (read guarded where it was not, or the
        reverse), or None."""
        return self._trackers.get((id(tracker.outside_object), not tracker.outside_guarded))

    def replayed(self) -> list:
        """The trackers of the outside containers the frame mutated (their `replayed` flag), in
        the order they were read."""
        return [t for t in self._trackers.values() if t.replayed]


class _Locations(threading.local):
    on = False


_locations = _Locations()


@contextlib.contextmanager
def recording_locations():
    """Captures in this thread give each node its stack_trace (kiln.export's graphs): a
    capture otherwise leaves it out, a string per node it would only spend time on."""
    prior, _locations.on = _locations.on, True
    try:
        yield
    finally:
        _locations.on = prior


def _takes_plain_bools(kind: str, target) -> bool:
    """Whether `target` (an op of the graph) takes its flags as Python bools: a tensor method or
    a torch function, not an operator or torch's own functions of symbolic numbers."""
    if kind == "call_method":
        return True
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", "") or ""
    return (module.startswith("torch") or isinstance(target, torch._ops.OpOverload)) and \
        not name.startswith("sym_") and target not in _TAKES_SCALARS


class _DecidedFlag:
    """The argument an op receives for a symbolic bool decided at the call (see _decided)."""

    def __init__(self, value: bool):
        self.value = value

    def as_fx_arg(self):
        return self.value

    def as_fake_arg(self):
        return self.value


def _decided(trackers, fakes):
    """`trackers` and `fakes` (a tuple, or a dict, of an op's arguments) with each symbolic bool
    replaced by its value (bool() of a SymBool records the guard)."""
    keys = range(len(fakes)) if isinstance(fakes, tuple) else list(fakes)
    trackers = list(trackers) if isinstance(trackers, tuple) else dict(trackers)
    fakes = list(fakes) if isinstance(fakes, tuple) else dict(fakes)
    for k in keys:
        if type(fakes[k]) is torch.SymBool:
            fakes[k] = bool(fakes[k])
            trackers[k] = _DecidedFlag(fakes[k])
    if isinstance(trackers, list):
        return tuple(trackers), tuple(fakes)
    return trackers, fakes


class OutputGraph:
    """The graph of one capture. The graph knows trackers only through what it is given:
    `make_tensor(node, example, source)` makes the tracker of a graph input or attribute, and
    `wrap_result(output, node, result, same_as)` the tracker of an op's result (`same_as`: the
    argument's tracker when the op returned that argument itself); arguments of ops are
    trackers read through their protocol (as_fx_arg, as_fake_arg)."""

    def __init__(self, make_tensor, wrap_result, make_scalar=None):
        self._make_tensor = make_tensor
        self._wrap_result = wrap_result
        # The tracker class of a graph-computed number (kiln.variables.tensor.ScalarVariable).
        self._make_scalar = make_scalar
        self.graph = torch.fx.Graph()
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        # Symbolic sizes (kiln.graph.symbolic_shapes.SymbolicInputs), set by the capture: which
        # inputs' dimensions become symbols, and their guards.
        self.symbolic = None
        self.guards = GuardSet()
        self.inputs: List[GraphInput] = []
        self._input_by_source: Dict[Source, Any] = {}
        self._input_by_id: Dict[int, Any] = {}  # id(real tensor) -> its tracker
        self.attrs: Dict[str, torch.Tensor] = {}  # get_attr target -> real tensor
        self.attr_sources: Dict[str, Source] = {}  # get_attr target -> where the frame has it
        self._real_by_node: Dict[Any, torch.Tensor] = {}  # placeholder/get_attr node -> real
        self._attr_by_id: Dict[int, Any] = {}
        self._fakes: Dict[int, torch.Tensor] = {}  # id(real tensor) -> fake
        self._keepalive: List[Any] = []
        self.containers = ContainerMemo()
        self._names: Dict[str, int] = {}
        self.root_globals = None
        # Modules reached from the frame's arguments are guarded by their structure, not their
        # identity, with their parameters and buffers as graph inputs: one entry serves every
        # instance of a block class (kiln.variables.nn_module).
        self.unspecialized_modules = False
        # Whether an op taking a tensor whose class overrides __torch_function__ must go through
        # the override (kiln.variables.torch_function), so that call() refuses it; off while a
        # modelled torch.Tensor.__torch_function__ runs the op itself.
        self.torch_function_enabled = True
        # Whether the graph took a tensor whose class overrides __torch_function__ (the only way
        # one enters the capture): ops check their arguments for one only then.
        self.has_subclass_inputs = False
        # Where the program is, for the nodes recorded now: a callable returning the user's
        # stack as traceback text (outermost frame first, the line being captured last), or
        # None. The executor sets it; each node it creates carries the text as its
        # stack_trace, as TorchDynamo's nodes do (export, make_fx with preserved meta).
        self.where = None

    # -- values ------------------------------------------------------------------------------

    def fake(self, real: torch.Tensor, *, alone: bool = False) -> torch.Tensor:
        """`real`'s fake value, the same one each time. `alone`: `real` is known to share no
        storage with another tensor of the graph (a parameter or buffer that is no view), so
        its fake is built from its metadata directly: from_tensor's view-aware conversion costs
        about 0.25 ms a tensor, 70 ms for resnet50's 320 parameters and buffers on every
        start."""
        f = self._fakes.get(id(real))
        if f is None:
            if stand_in.target() is not None and real.device.type == "cpu":
                try:  # captured as the GPU's tensor (python -m kiln warm --cuda-arch)
                    f = stand_in.fake(self.fake_mode, real)
                except stand_in.CannotStandIn as e:
                    raise Unsupported(str(e)) from None
            elif isinstance(real, torch.nn.parameter.UninitializedTensorMixin):
                raise Unsupported("a parameter or buffer that is not initialized yet (a lazy "
                                  "module before its first call)")
            elif alone and plain_tensor(real):
                f = fake_of(self.fake_mode, real, real.device)
            else:
                try:
                    f = self.fake_mode.from_tensor(real)
                except Exception as e:  # a tensor no fake can stand for: not a kiln error
                    raise Unsupported(f"no fake tensor for a {type(real).__name__}: "
                                      f"{type(e).__name__}: {e}") from None
                # A plain FakeTensorMode remembers the value of a 0-d CPU integer tensor, and
                # an op that reads it as a number (torch.arange(t0, t1)) then bakes it into the
                # graph, which no guard checks: a value read is data-dependent, as for any
                # tensor the graph computes.
                f.item_memo = None
            self._fakes[id(real)] = f
            self._keepalive.append(real)
        return f

    def unique_name(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base).strip("_") or "v"
        if base[0].isdigit():
            base = "_" + base
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def add_input(self, real: torch.Tensor, source: Source):
        """A placeholder for a tensor the transformed code loads from `source` on every call."""
        vt = self._input_by_source.get(source)
        if vt is not None:
            return vt
        vt = self._input_by_id.get(id(real))
        if vt is not None:
            # The same tensor reached again (f(x, x)): one graph input, read from its first
            # source; the entry holds only while both sources give the same object.
            self.guards.add(source, "ALIAS", vt.source)
            self._input_by_source[source] = vt
            return vt
        name = self.unique_name(_source_var_name(source))
        node = self.graph.placeholder(name)
        plain = class_overrides_torch_function(type(real))
        self.has_subclass_inputs |= plain
        example = self._symbolic_fake(real, source) if not plain else None
        if example is None:
            example = self.fake(plain_alias(real) if plain else real)
        node.meta["example_value"] = example
        self.inputs.append(GraphInput(node, source, real, plain))
        vt = self._make_tensor(node, example, source)
        vt.python_class = type(real)  # pinned by the TENSOR_MATCH guard below
        self._input_by_source[source] = vt
        self._input_by_id[id(real)] = vt
        self._real_by_node[node] = real
        self.guards.add(source, "TENSOR_MATCH", real)
        return vt

    def _symbolic_fake(self, real: torch.Tensor, source: Source):
        """`real`'s fake with symbolic dimensions, when the capture makes any of its dimensions
        a symbol (kiln.graph.symbolic_shapes); else None."""
        if self.symbolic is None:
            return None
        from kiln.guards.source import ModuleMemberSource

        module_state = isinstance(real, torch.nn.Parameter) or isinstance(
            source, ModuleMemberSource)
        dims, marked, ranges = self.symbolic.dims_for(real, source, module_state)
        if not dims:
            return None
        try:
            fake = self.symbolic.fake(real, source, dims, marked, ranges)
        except Exception as e:
            raise Unsupported(f"no symbolic fake tensor for {source.name}: "
                              f"{type(e).__name__}: {e}") from None
        self._fakes[id(real)] = fake
        self._keepalive.append(real)
        return fake

    @property
    def is_dynamic(self) -> bool:
        """Whether some size in the graph is a symbol."""
        return self.symbolic is not None and self.symbolic.active

    def symbolic_guards(self) -> None:
        """Adds the guards of the graph's symbolic sizes: each dynamic input's TENSOR_MATCH
        leaves its symbolic dimensions out, and one SHAPE guard checks the relations the trace
        relied on (kiln.graph.symbolic_shapes). Called again, it writes them anew from what the
        ShapeEnv knows now."""
        if not self.is_dynamic:
            return
        per_tensor, shape = self.symbolic.guards()
        for source, (sizes, strides) in per_tensor.items():
            vt = self._input_by_source.get(source)
            real = self._real_by_node.get(vt.node) if vt is not None else None
            if real is None:  # rolled back: no TENSOR_MATCH of its own
                continue
            self.guards.replace(source, "TENSOR_MATCH", (real, sizes, strides))
        if shape is not None:
            self.guards.replace(None, "SHAPE", shape)

    def add_int_input(self, value: int, source: Source):
        """A placeholder for an int the transformed code loads from `source` on every call, a
        symbol of the graph's sizes (kiln.graph.symbolic_shapes): its tracker."""
        vt = self._input_by_source.get(source)
        if vt is not None:
            return vt
        node = self.graph.placeholder(self.unique_name(_source_var_name(source)))
        example = self.symbolic.int_symbol(value, source)
        node.meta["example_value"] = example
        self.inputs.append(GraphInput(node, source, value))
        vt = self._input_by_source[source] = self._wrap_result(self, node, example, None)
        vt.source = source  # read again from there where no graph computes it
        return vt

    def guard_distinct_inputs(self):
        """Tensors the graph takes as distinct inputs must stay distinct objects: the capture
        answered `a is b` and chose one input per object from what it saw."""
        tensors = [inp.source for inp in self.inputs if isinstance(inp.example, torch.Tensor)]
        if len(tensors) > 1:
            self.guards.add(None, "DISTINCT", tuple(tensors))

    def real_tensor(self, vt):
        """The real tensor behind a graph input or attribute's tracker, or None for a tensor the
        graph computes."""
        return self._real_by_node.get(vt.node)

    def add_attr(self, real: torch.Tensor, source: Source):
        """A get_attr node for a parameter or buffer: the graph module keeps the tensor itself."""
        vt = self._attr_by_id.get(id(real))
        if vt is not None:
            return vt
        if class_overrides_torch_function(type(real)):
            raise Unsupported(f"a {type(real).__qualname__} (its class overrides "
                              "__torch_function__) held by a module")
        node = self._get_attr(_source_var_name(source), real, source)
        example = self.fake(real, alone=True)
        node.meta["example_value"] = example
        vt = self._make_tensor(node, example, source)
        vt.python_class = type(real)  # the attribute is this very tensor (ID_MATCH on its module)
        self._attr_by_id[id(real)] = vt
        return vt

    def add_constant(self, value: torch.Tensor):
        """A get_attr node for a tensor the capture computed once and the graph holds as it is
        (what an assume_constant_result function returned): the graph module keeps it, and no
        frame has it, so its attr_sources entry is None."""
        if class_overrides_torch_function(type(value)):
            raise Unsupported(f"a {type(value).__qualname__} (its class overrides "
                              "__torch_function__) as a constant of the graph")
        node = self._get_attr("tensor_constant", value, None)
        example = self.fake(value)
        node.meta["example_value"] = example
        return self._make_tensor(node, example, None)

    def _get_attr(self, name: str, real: torch.Tensor, source):
        target = self.unique_name(name)
        self.attrs[target] = real
        self.attr_sources[target] = source
        node = self.graph.get_attr(target)
        self._located(node)
        self._real_by_node[node] = real
        return node

    def real_values(self, nodes: list) -> list:
        """The values `nodes` hold at this point of the program, for a capture that needs them
        in full (the arguments of an assume_constant_result function, as TorchDynamo's
        get_real_value): a graph input's or attribute's real tensor; otherwise what the graph
        built so far computes, run by torch.fx.Interpreter on copies of its inputs and
        attributes. The copies take the graph's in-place updates (a tensor read after
        `x.add_(1)` has its new value) and leave the program's own tensors untouched; the
        random state is restored after the run, and the grad mode too (the graph may set it).
        A whole graph is run once per call: meant for the rare value, not for every op."""
        if not call_nodes(self.graph) and all(n in self._real_by_node for n in nodes):
            return [self._real_by_node[n] for n in nodes]
        env, copies = {}, {}
        with torch.no_grad():
            for node, real in self._real_by_node.items():
                copy = copies.get(id(real))
                if copy is None:  # one copy per tensor object, however many nodes read it
                    copy = copies[id(real)] = (plain_alias(real) if class_overrides_torch_function(
                        type(real)) else real).clone()
                env[node] = copy
        cuda = sorted({t.device.index or 0 for t in copies.values() if t.device.type == "cuda"})
        interpreter = torch.fx.Interpreter(torch.nn.Module(), garbage_collect_values=False,
                                           graph=self.graph)
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=cuda):
                interpreter.run(initial_env=env, enable_io_processing=False)
        except Exception as e:  # the program would raise at this op too
            raise Unsupported(f"running the graph so far on the real inputs failed: "
                              f"{type(e).__name__}: {e}") from None
        finally:
            leave_autocast_blocks(self.graph, interpreter.env)
        return [interpreter.env[n] for n in nodes]

    # -- checkpoints (graph breaks roll back what a failed instruction recorded) ----------------

    def checkpoint(self):
        """What restore() rolls back to, and the grad mode the trace has there (a graph break
        inside `with torch.no_grad()` runs its instruction in that mode)."""
        return (next(iter(reversed(self.graph.nodes)), None), len(self.inputs),
                dict(self.attrs), torch.is_grad_enabled())

    def restore(self, ckpt):
        last, n_inputs, attrs, _ = ckpt
        nodes = list(self.graph.nodes)
        keep = nodes.index(last) + 1 if last is not None else 0
        for node in reversed(nodes[keep:]):
            self.graph.erase_node(node)
            self._real_by_node.pop(node, None)
        del self.inputs[n_inputs:]
        live = {inp.node for inp in self.inputs}
        self._input_by_source = {s: vt for s, vt in self._input_by_source.items()
                                 if vt.node in live}
        self._input_by_id = {k: vt for k, vt in self._input_by_id.items() if vt.node in live}
        for target in set(self.attrs) - set(attrs):
            real = self.attrs.pop(target)
            self.attr_sources.pop(target, None)
            self._attr_by_id.pop(id(real), None)

    # -- ops -----------------------------------------------------------------------------------

    def call(self, kind: str, target, args: tuple, kwargs: dict):
        """Records `target(*args, **kwargs)` (kind: call_function or call_method; arguments are
        trackers), computes its fake result and wraps it. Non-tensor results (sizes, dtypes)
        become constants and leave no node behind."""
        if self._make_scalar is not None and target not in _TAKES_SCALARS and any(
                isinstance(a, self._make_scalar) for a in (*args, *kwargs.values())):
            # A stand-in value would decide this op's sizes (torch.zeros(n)) or branches.
            raise Unsupported(f"{_target_name(target)} of a value Tensor.item() read")
        if self.has_subclass_inputs and self.torch_function_enabled and any(
                a.overrides_torch_function() for a in (*args, *kwargs.values())):
            # Every op of such a tensor goes through its class's override, which only
            # kiln.variables.torch_function models.
            raise Unsupported(f"{_target_name(target)} of a tensor whose class overrides "
                              "__torch_function__")
        fake_args = tuple(a.as_fake_arg() for a in args)
        fake_kwargs = {k: v.as_fake_arg() for k, v in kwargs.items()}
        if self.is_dynamic and _takes_plain_bools(kind, target) and any(
                type(f) is torch.SymBool for f in (*fake_args, *fake_kwargs.values())):
            # A flag computed from sizes (transformers' is_causal = q_len > 1) given to an op
            # that takes a bool: decided here, its answer guarded, as eager decides it.
            args, fake_args = _decided(args, fake_args)
            kwargs, fake_kwargs = _decided(kwargs, fake_kwargs)
        # The shortcuts compare sizes, which for symbols would add guards the op does not need.
        result = None if self.is_dynamic else shortcut(self.fake_mode, kind, target, fake_args,
                                                        fake_kwargs)
        if result is None:
            result = self._run_fake(kind, target, fake_args, fake_kwargs)
            if result is not None and not _contains_tensor(result) and not (
                    self.is_dynamic and contains_symbol(result)):
                # Sizes, dtypes, flags: constants, no node. (None comes from ops run for their
                # effect, such as setitem: those are nodes.)
                return self._wrap_result(self, None, result, None)
        node = self.graph.create_node(
            kind, target, tuple(a.as_fx_arg() for a in args),
            {k: v.as_fx_arg() for k, v in kwargs.items()},
            name=self.unique_name(_target_name(target)))
        node.meta["example_value"] = result
        self._located(node)
        # An in-place op (or out=) returns the very tensor it was given: its tracker says so.
        same_as = next((arg for arg, fake in zip((*args, *kwargs.values()),
                                                 (*fake_args, *fake_kwargs.values()))
                        if fake is result and isinstance(result, torch.Tensor)), None)
        return self._wrap_result(self, node, result, same_as)

    def end_in_grad_mode(self, enabled: bool) -> None:
        """Ends the graph with grad mode switched to `enabled` (where it began): a graph that
        stops inside a `with no_grad()` leaves the mode as it found it to whatever runs or
        traces it; the transformed code sets the program's mode after it."""
        node = self.graph.create_node("call_function", torch._C._set_grad_enabled, (enabled,),
                                      {}, name=self.unique_name("_set_grad_enabled"))
        node.meta["example_value"] = None

    def record_scalar(self, kind: str, target, args: tuple, python_type: type):
        """A node computing a Python number no fake can stand for (Tensor.item() under
        capture_scalar_outputs; arithmetic on such numbers): its tracker, a ScalarVariable."""
        if self._make_scalar is None:
            raise Unsupported(f"{_target_name(target)}: this graph takes no computed numbers")
        node = self.graph.create_node(kind, target, tuple(a.as_fx_arg() for a in args), {},
                                      name=self.unique_name(_target_name(target)))
        self._located(node)
        return self._make_scalar(node, python_type)

    @staticmethod
    def _call_fake(kind, target, fake_args, fake_kwargs):
        if kind == "call_method":
            return getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
        return target(*fake_args, **fake_kwargs)

    def _run_fake(self, kind, target, fake_args, fake_kwargs):
        try:
            # With symbolic sizes, ops run as torch.compile runs them: through the Python
            # dispatcher, which reaches the Python meta kernels registered for symbolic sizes
            # (constant_pad_nd's C++ one takes concrete amounts only: a mask padded to a
            # multiple of 8, SDPA's own padding on CUDA).
            if not self.is_dynamic:
                with self.fake_mode:
                    return self._call_fake(kind, target, fake_args, fake_kwargs)
            from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

            env = self.symbolic.shape_env
            before = fresh_unbacked(env)
            mark = Mark(env)
            try:
                with self.fake_mode, symbolic_ops():
                    result = self._call_fake(kind, target, fake_args, fake_kwargs)
            except GuardOnDataDependentSymNode:
                if fresh_unbacked(env) == before:
                    raise
                # The op's own view made that symbol, then asked of it (a setitem into a slice
                # to a symbolic end: torch 2.11): run again, as below.
                mark.restore()
            else:
                if fresh_unbacked(env) == before:
                    # A guard that a batch is not 1, raised inside the op's meta kernel where
                    # the op does the same at 1, is forgotten (kiln.graph.size_one).
                    forget_if_same_at_one(env, mark, self.fake_mode, functools.partial(
                        self._call_fake, kind, target), fake_args, fake_kwargs, result)
                    return result
            # Where size-oblivious reasoning leaves a size undecided, some torch versions
            # make it an unbacked symbol (a slice to a symbolic end: torch 2.11), which no
            # plan can bind: that op runs again as torch.compile runs it, guarding its sizes.
            drop_fresh_unbacked(env, before)
            with self.fake_mode, symbolic_ops(oblivious=False):
                return self._call_fake(kind, target, fake_args, fake_kwargs)
        except Unsupported:
            raise
        except (torch._subclasses.fake_tensor.DataDependentOutputException,
                torch._subclasses.fake_tensor.DynamicOutputShapeException) as e:
            raise Unsupported(f"data-dependent operation {_target_name(target)}: {e}") from None
        except Exception as e:  # the op itself rejects these inputs: eager would raise too
            raise Unsupported(f"{_target_name(target)} failed on fake inputs: "
                              f"{type(e).__name__}: {e}") from None

    def getitem_node(self, node, index: int, example):
        n = self.graph.call_function(operator.getitem, (node, index))
        n.meta["example_value"] = example
        self._located(n)
        return n

    def _located(self, node) -> None:
        """Gives `node` the user's stack where it was recorded (node.stack_trace, which is
        node.meta["stack_trace"]), where the executor says where that is (its translator's
        `where`), while recording_locations() is on."""
        if _locations.on and self.where is not None:
            text = self.where()
            if text:
                node.stack_trace = text

    def count_calls(self) -> int:
        return len(call_nodes(self.graph))

    def make_graph_module(self, outputs: list, name: str) -> torch.fx.GraphModule:
        self.graph.output(tuple(outputs))
        root = torch.nn.Module()
        for target, tensor in self.attrs.items():
            if isinstance(tensor, torch.nn.Parameter):
                root.register_parameter(target, tensor)
            else:
                root.register_buffer(target, tensor)
        # Lazy: the code is generated when a backend reads gm.code or runs the module. The
        # "kiln" backend on a warm start does neither (it fetches the artifact by a digest of
        # the graph), and writing resnet50's code and compiling it costs ~35 ms of a start.
        return _GraphModuleClass(root, self.graph, class_name=name)


def realized(compiled, gm: torch.fx.GraphModule):
    """What a backend returned, made ready to run at full speed: `gm.forward` read from a lazy
    module before its code existed recompiles and calls the module on every call; generate the
    code now and hand out the real forward."""
    lazy_forward = getattr(_GraphModuleClass, "_lazy_forward", None)
    if lazy_forward is None:
        return compiled
    if compiled is gm or (getattr(compiled, "__self__", None) is gm
                          and getattr(compiled, "__func__", None) is lazy_forward):
        gm.real_recompile()
        return compiled if compiled is gm else gm.forward
    return compiled


_CALL_OPS = ("call_function", "call_method", "call_module")


def call_nodes(graph: torch.fx.Graph) -> list:
    """The nodes of `graph` that are operations (what op counts count)."""
    return [n for n in graph.nodes if n.op in _CALL_OPS]


def _contains_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_contains_tensor(v) for v in value)
    return False


# Elementwise arithmetic whose result's metadata does not depend on a number operand's value
# (only on its Python type): what a graph-computed number may be an operand of.
_TAKES_SCALARS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.neg, operator.lt, operator.le, operator.gt,
    operator.ge, operator.eq, operator.ne,
    torch.add, torch.sub, torch.mul, torch.div, torch.true_divide, torch.pow, torch.rsub,
    "add", "sub", "mul", "div", "true_divide", "pow", "rsub", "__add__", "__radd__",
    "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__pow__",
}


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", None) or type(target).__name__
    return name


def _source_var_name(source: Optional[Source]) -> str:
    if source is None:
        return "v"
    name = source.name
    for ch in "[]'\".@:":
        name = name.replace(ch, "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name.strip("_")


def leave_autocast_blocks(graph, env) -> None:
    """Exits, innermost first, the autocast blocks a run of `graph` entered and did not leave
    (the graph so far ends inside a `with torch.autocast()`): the run must not leave torch's
    autocast state, its nesting count included, other than it found it."""
    exited = {n.args[0] for n in graph.nodes
              if n.op == "call_function" and n.target is torch.amp._exit_autocast and n in env}
    entered = [n for n in graph.nodes
               if n.op == "call_function" and n.target is torch.amp._enter_autocast and n in env
               and n not in exited]
    for node in reversed(entered):
        torch.amp._exit_autocast(env[node])
