"""Symbolic sizes in a capture: which dimensions of a graph input are symbols, the fake tensors
that carry them (torch's ShapeEnv and SymInts), and the guards that say for which sizes the
graph holds.

A capture is static until a size is known to change: kiln.compile(dynamic=True) makes every
dimension of every graph input a symbol; with dynamic=None (the default) a frame captured again
because an input's size changed (kiln.eval_frame) is captured with every dimension of its
inputs a symbol (automatic dynamic shapes, as torch.compile's, but for every input at once: a
server's request that changed its sequence length changes its batch size next, and a decoder's
cache grows with the input that changed first). kiln.mark_dynamic / torch._dynamo.mark_dynamic
(and maybe_mark_dynamic, mark_unbacked) mark dimensions of a tensor, mark_static keeps one
static. A symbolic batch (the leading dimension of a tensor of two or more dimensions) ranges
from 1 up: size 1 is specialised only where the trace asks (broadcasting asks `s == 1`, and the
answer is a guard; an op's meta kernel that asks it where the op's result is the same at 1 is
no guard: kiln.graph.size_one), so a server's batch of 1 is served by the graph of every other
batch; other symbolic sizes start at 2, as torch's do (a length of 1 is another graph), and size
0 is specialised (an empty tensor traces otherwise). Parameters and buffers of modules stay
static unless marked.

Guards: the inputs' TENSOR_MATCH checks leave their symbolic dimensions out; one SHAPE guard
binds each symbol to where its value is read (a size, stride or storage offset of an input) and
checks every relation the trace relied on: each symbol's range, equalities between sizes, and
the ShapeEnv's guards (what fake ops and branches on sizes decided). It is evaluated in C++
(client/guards/guard_shape.cpp) with the other guards.
"""
import contextlib
import threading
from typing import Dict, List, Optional, Tuple

import torch

from kiln.exc import KilnError

# What a tensor's marks say of its dimensions (torch._dynamo's attributes, which kiln's own
# mark_dynamic & co. set too, so that programs written for torch.compile keep theirs).
_DYNAMIC_ATTR = "_dynamo_dynamic_indices"
_WEAK_DYNAMIC_ATTR = "_dynamo_weak_dynamic_indices"
_STATIC_ATTR = "_dynamo_static_indices"
_UNBACKED_ATTR = "_dynamo_unbacked_indices"
_RANGE_ATTR = "_dynamo_dynamic_range"


# Symbolic numbers, and the Python type each stands for.
SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
SYM_PYTHON_TYPE = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def contains_symbol(value) -> bool:
    """Whether `value` is, or a torch.Size, tuple or list of it holds, a symbolic number that
    is not a known constant."""
    t = type(value)
    if t in SYM_TYPES:
        return not value.node.is_constant()
    if t is torch.Size or t is tuple or t is list:
        return any(contains_symbol(v) for v in value)
    return False


@contextlib.contextmanager
def symbolic_ops(oblivious: bool = True):
    """The context ops on symbolic sizes run in: torch's Python dispatcher on (as torch.compile
    traces), so that the Python meta kernels written for symbolic sizes are the ones run, and
    (`oblivious`) size-oblivious reasoning (size_oblivious)."""
    from torch._dispatch.python import enable_python_dispatcher

    with (size_oblivious() if oblivious else contextlib.nullcontext()), \
            enable_python_dispatcher():
        yield


def fresh_unbacked(env) -> int:
    """How many unbacked symbols `env` made that no op result has claimed yet (a count to
    compare before and after an op)."""
    return len(getattr(env, "pending_fresh_unbacked_symbols", ()))


def drop_fresh_unbacked(env, keep: int) -> None:
    """Forgets the unbacked symbols `env` made after fresh_unbacked(env) was `keep`: an op whose
    result is thrown away made them (see OutputGraph._run_fake)."""
    pending = getattr(env, "pending_fresh_unbacked_symbols", None)
    if pending is not None:
        del pending[keep:]


def is_input_size_guard(guard, object_ints=frozenset()) -> bool:
    """Whether `guard` (kiln.guards.builder.Guard) checks what automatic dynamic shapes makes a
    symbol when it fails: a tensor input's sizes (not a parameter's or buffer's: a block class
    whose instances differ in width recompiles per width, static), the SHAPE guard, an int
    argument's value, or the value of an int attribute of an object reached from the
    arguments (`object_ints`, SymbolicInputs.object_ints: a cache's length counter; a module's
    attributes are not among them)."""
    from kiln.guards.source import ModuleMemberSource

    if guard.kind == "SHAPE":
        return True
    if guard.kind == "TENSOR_MATCH":
        real = guard.tensor_spec()[0]
        return not isinstance(real, torch.nn.Parameter) and \
            not isinstance(guard.source, ModuleMemberSource)
    if guard.kind == "CONSTANT_MATCH" and type(guard.value) is int:
        return SymbolicInputs.passed_in(guard.source) or guard.source in object_ints
    return False


class _SizeOblivious:
    """torch's size-oblivious reasoning about its sizes' symbols, on while kiln traces or lowers
    a graph with symbolic sizes (torch.fx.experimental._config.backed_size_oblivious, which
    torch's export uses for the same end). A question that holds for every size but 0 and 1
    once either is set aside (is this view contiguous, is this operand broadcast) is answered
    for the general case without a guard, torch's decompositions and meta kernels being written
    so that the answer is right for 1 too; a branch the program takes on a size, and every
    relation an op needs (two sizes equal), stays a guard. So a batch that admits 1 keeps
    admitting it, and the server's batch of 1 runs the graph of every other batch.

    The switch is torch's and global to the process; kiln turns it on for its own thread only:
    the config module answers the switch's name from a thread-local value where this thread set
    one (its class gains a property for that name), so a torch.compile trace in another thread
    while kiln compiles in the background reads the process's own setting."""

    _NAME = "backed_size_oblivious"

    def __init__(self):
        self._local = threading.local()
        self._lock = threading.Lock()
        self._installed = False

    def _install(self, config) -> bool:
        """Gives the config module's class the thread-local property (once); False where the
        module cannot take it (then kiln leaves the switch off)."""
        with self._lock:
            if self._installed:
                return True
            local, name = self._local, self._NAME
            base = type(config)

            def read(module):
                value = getattr(local, "value", None)
                return base.__getattr__(module, name) if value is None else value

            def write(module, value):
                base.__setattr__(module, name, value)

            try:  # below the module's own __setattr__, which takes config names only
                object.__setattr__(config, "__class__",
                                   type(base.__name__, (base,), {name: property(read, write)}))
            except (TypeError, AttributeError):
                return False
            self._installed = True
            return True

    def __enter__(self):
        config = _torch_config()
        depth = getattr(self._local, "depth", 0)
        if config is not None and self._install(config):
            self._local.depth = depth + 1
            self._local.value = True
        return self

    def __exit__(self, *exc):
        depth = getattr(self._local, "depth", 0)
        if depth:
            self._local.depth = depth - 1
            if depth == 1:
                self._local.value = None
        return False


def _torch_config():
    """torch.fx.experimental._config where it has the switch (torch >= 2.7), else None."""
    try:
        from torch.fx.experimental import _config
    except ImportError:
        return None
    return _config if hasattr(_config, "backed_size_oblivious") else None


_SIZE_OBLIVIOUS = _SizeOblivious()


def size_oblivious() -> _SizeOblivious:
    """The context in which kiln traces and lowers graphs with symbolic sizes (_SizeOblivious)."""
    return _SIZE_OBLIVIOUS


def settle_min_max(env, values) -> None:
    """Guards which argument of each min or max of the sizes in `values` (the graph's example
    values: tensors and SymInts) is the one the trace saw, narrowing the symbols' ranges so that
    the ShapeEnv simplifies the min or max away. Size-oblivious reasoning leaves a slice's end
    as Min(512, s) where torch would have guarded s <= 512; kiln's IR carries polynomials of the
    sizes, and the graph is compiled for the side of the min the calls take (another size is
    another capture, as torch's guard would have made it)."""
    import sympy

    hints = _hints(env)
    for _ in range(8):  # nested ones settle from the inside out
        pending = set()
        for v in values:
            for e in _size_exprs(v):
                e = env.simplify(e)
                pending.update(a for a in sympy.preorder_traversal(e)
                               if type(a).__name__ in ("Min", "Max"))
        if not pending:
            return
        for m in pending:
            args = list(m.args)
            try:
                at = [int(a.xreplace(hints)) for a in args]
            except (TypeError, ValueError):
                continue  # a symbol with no hint: left to the lowering, which refuses it
            pick = (min if type(m).__name__ == "Min" else max)(range(len(args)),
                                                                   key=at.__getitem__)
            for i, a in enumerate(args):
                if i != pick:
                    rel = sympy.Le(args[pick], a) if type(m).__name__ == "Min" else \
                        sympy.Ge(args[pick], a)
                    env.evaluate_expr(rel)
        _forget_answers(env)


def _size_exprs(value):
    """The sympy expressions of a tensor's sizes, strides and storage offset, or of a SymInt."""
    if isinstance(value, torch.Tensor):
        parts = (*value.shape, *value.stride(), value.storage_offset())
    elif isinstance(value, torch.SymInt):
        parts = (value,)
    else:
        return ()
    return [p.node.expr for p in parts if isinstance(p, torch.SymInt)]


def at_least(env, value, least: int) -> None:
    """Narrows the ShapeEnv's range of the symbol `value` (a SymInt) to start at `least` when it
    starts below: a size the graph is traced for, and guarded to be, at least that."""
    from torch.utils._sympy.value_ranges import ValueRanges

    if not isinstance(value, torch.SymInt):
        return
    expr = value.node.expr
    vr = env.var_to_range.get(expr)
    if vr is None or vr.lower >= least:
        return
    env._update_var_to_range(expr, ValueRanges(least, vr.upper))
    _forget_answers(env)


def _forget_answers(env) -> None:
    """Makes `env` answer anew after kiln narrowed what it knows (its simplify and static
    evaluation cache their answers by this version)."""
    if hasattr(env, "_version_counter"):
        env._version_counter += 1


class ConstraintViolation(KilnError):
    """A dimension marked dynamic (mark_dynamic) that the trace had to specialise, or whose
    declared range the trace narrowed: the program asked for a graph that holds for every size
    in that range, and this one does not."""


def _marked(t: torch.Tensor, attr: str) -> frozenset:
    try:
        marks = t.__dict__.get(attr)
    except AttributeError:
        return frozenset()
    return frozenset(marks) if marks else frozenset()


def marked_ranges(t: torch.Tensor) -> Dict[int, Tuple[Optional[int], Optional[int]]]:
    """dim -> (min, max) for the dimensions mark_dynamic gave a range."""
    out = {}
    try:
        ranges = t.__dict__.get(_RANGE_ATTR)
    except AttributeError:
        return out
    for r in ranges or ():
        out[r.dim] = (r.min, r.max)
    return out


class _CallableName(str):
    """A source's name, read as an attribute or called as a method."""

    def __call__(self) -> str:
        return str(self)


class _ShapeSource:
    """Stands for a kiln source where torch's ShapeEnv wants one of its own (torch._guards.
    Source): the ShapeEnv names symbols by it and records, per symbol, where its value came
    from (TensorPropertySource over this)."""

    @staticmethod
    def make(source):
        import torch._guards

        cls = _ShapeSource._class
        if cls is None:
            class KilnShapeSource(torch._guards.Source):
                __slots__ = ("kiln_source",)

                def __init__(self, kiln_source):
                    self.kiln_source = kiln_source

                # torch >= 2.12 reads `source.name`, older torch calls `source.name()`.
                @property
                def name(self) -> "_CallableName":
                    return _CallableName(self.kiln_source.name)

                def guard_source(self):
                    return torch._guards.GuardSource.LOCAL

                def __hash__(self):
                    return hash(self.kiln_source)

                def __eq__(self, other):
                    return isinstance(other, KilnShapeSource) and \
                        other.kiln_source == self.kiln_source

                def __repr__(self):
                    return f"KilnShapeSource({self.kiln_source.name})"

            cls = _ShapeSource._class = KilnShapeSource
        return cls(source)

    _class = None


class SymbolicInputs:
    """The symbolic side of one capture: its ShapeEnv (given to the capture's fake mode on the
    first dynamic input) and the tensors whose fakes have symbolic sizes."""

    def __init__(self, fake_mode, dynamic: Optional[bool], object_int_values=None,
                 shapes_seen=None, self_assigned=frozenset()):
        self.fake_mode = fake_mode
        # sources of the int attributes earlier captures of the frame assigned
        # (kiln.state.STATE.self_assigned_ints)
        self.self_assigned = self_assigned
        # source -> values earlier entries of the frame guarded an int attribute of an object
        # it was passed to have (kiln.state.STATE.object_int_values)
        self.object_int_values = object_int_values or {}
        # source -> the shapes earlier captures of the frame saw the tensor input there have
        # (kiln.state.STATE.input_shapes); and the ones this capture saw
        self.shapes_seen = shapes_seen or {}
        self._sizes_seen: Optional[frozenset] = None  # every size in shapes_seen (_a_size_seen)
        self.shapes: Dict = {}
        # True: every dimension of a graph input is a symbol; None: the marked ones; False: none
        self.dynamic = dynamic
        self.shape_env = None
        # (source, real, fake, marked-dynamic dims, ranges) of each tensor made symbolic
        self.tensors: List[tuple] = []
        self.ints: List[tuple] = []  # (source, SymInt) of each int input made a symbol
        # source -> value of each int read from an object's attribute (not a module's) and
        # guarded as a constant: which a later capture makes a symbol when it changed.
        self.object_ints: Dict = {}

    @property
    def active(self) -> bool:
        return self.shape_env is not None

    def dims_for(self, real: torch.Tensor, source, module_state: bool) -> Tuple[list, set, dict]:
        """(dims to make symbols, dims the program marked dynamic, their ranges) of the graph
        input `real` read at `source`. `module_state`: a parameter or buffer (static unless
        marked)."""
        shape = tuple(real.shape)
        if not module_state:
            self.shapes[source] = shape
        if self.dynamic is False or real.layout is not torch.strided:
            return [], set(), {}
        # mark_dynamic is a promise the trace must keep (an error if it specialises the dim);
        # maybe_mark_dynamic and mark_unbacked are wishes.
        marked = set(_marked(real, _DYNAMIC_ATTR))
        wanted = marked | set(_marked(real, _WEAK_DYNAMIC_ATTR)) | set(
            _marked(real, _UNBACKED_ATTR))
        if self.dynamic is True and not module_state:
            wanted |= set(range(real.dim()))
        wanted -= set(_marked(real, _STATIC_ATTR))
        wanted = {d for d in wanted if 0 <= d < real.dim()}
        for d in marked:
            if d < real.dim() and shape[d] == 0:
                raise ConstraintViolation(
                    f"{source.name}: dimension {d} is marked dynamic but has size 0; size 0 is "
                    "specialised (mark it only for sizes >= 1)")
        # A dimension of size 1 is a symbol where it was marked, or where it leads a tensor of
        # two or more dimensions and an earlier capture of the frame saw it with another size:
        # a batch (a server's batch of 1 after others, traced with 1, the graph serves every
        # batch). Another dimension seen as 1 stays 1: a decoder's step of one token is traced
        # for one token, not as the prompt's length that happens to be 1.
        seen = [s for s in self.shapes_seen.get(source, ()) if len(s) == len(shape)]
        batch = len(shape) >= 2 and shape[0] == 1 and any(s[0] != 1 for s in seen)
        dims = [d for d in sorted(wanted)
                if shape[d] >= 2 or (shape[d] == 1 and (d in marked or (d == 0 and batch)))]
        return dims, marked & set(dims), marked_ranges(real) if marked else {}

    def assigned_int_is_symbol(self, value: int, source) -> bool:
        """Whether the int `value` read at `source` is a symbol because an earlier capture of
        the frame assigned it (a module's `self.calls += 1`, different on every call): but 0 and
        1, and never under dynamic=False."""
        return self.dynamic is not False and value not in (0, 1) and source in self.self_assigned

    def int_is_symbol(self, value: int, source) -> bool:
        """Whether the int `value`, read at `source` (by kiln.variables.builder), is a symbol:
        one an earlier capture assigned (assigned_int_is_symbol); under dynamic=True, but 0 and
        1, an argument or an item of one, or an attribute of an object (not a module) reached
        from one that an earlier entry saw with another value (a cache's length; a window size
        that never changed stays a constant)."""
        if self.assigned_int_is_symbol(value, source):
            return True
        if self.dynamic is not True or value in (0, 1):
            return False
        if self.passed_in(source):
            return True
        return self.passed_in(source, True) and (
            bool(self.object_int_values.get(source, set()) - {value})
            or self._a_size_seen(value))

    def _a_size_seen(self, value: int) -> bool:
        """Whether a tensor input of the frame had a dimension of size `value` in an earlier
        capture: an object's int equal to one (a static cache's capacity, the length of its
        tensors, which a longer request makes anew) is a symbol of its own, related to the
        sizes by the guards the trace needs, not a constant that pins the sizes it meets."""
        if self._sizes_seen is None:  # the frame's earlier captures: fixed during this one
            self._sizes_seen = frozenset(size for shapes in self.shapes_seen.values()
                                         for shape in shapes for size in shape)
        return value in self._sizes_seen

    @staticmethod
    def passed_in(source, through_objects: bool = False) -> bool:
        """Whether `source` is an argument of the frame, or an item of one; `through_objects`:
        or an attribute (in its instance dict) of an object reached that way."""
        from kiln.guards.source import DictItemSource, InstanceAttrSource, ItemSource, LocalSource

        hops = (ItemSource, DictItemSource) + ((InstanceAttrSource,) if through_objects else ())
        while isinstance(source, hops):
            source = source.base
        return isinstance(source, LocalSource)

    def int_symbol(self, value: int, source):
        """A SymInt for the int input `value` read at `source`."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic

        env = self._env()
        shape_source = _ShapeSource.make(source)
        sym = env.create_unspecified_symbol(value, source=shape_source,
                                            dynamic_dim=DimDynamic.DYNAMIC)
        symint = env.create_symintnode(sym, hint=value, source=shape_source)
        self.ints.append((source, symint))
        return symint

    def _env(self):
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        if self.shape_env is None:
            # No dynamic output shapes, no scalar outputs: data-dependent ops stay graph
            # breaks, as in a static capture.
            self.shape_env = ShapeEnv(allow_scalar_outputs=False,
                                      allow_dynamic_output_shape_ops=False)
            self.fake_mode.shape_env = self.shape_env
        return self.shape_env

    def fake(self, real: torch.Tensor, source, dims: list, marked: set, ranges: dict):
        """A fake of `real` whose dimensions `dims` are symbols."""
        from torch.fx.experimental.symbolic_shapes import (DimDynamic, StatelessSymbolicContext,
                                                           StrictMinMaxConstraint)
        from torch.utils._sympy.value_ranges import ValueRanges

        self._env()
        sizes, constraints = [], []
        for d in range(real.dim()):
            sizes.append(DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC)
            lo, hi = ranges.get(d, (None, None))
            if d in dims and (lo is not None or hi is not None):
                constraints.append(StrictMinMaxConstraint(
                    vr=ValueRanges(lower=max(lo if lo is not None else 1, 1),
                                   upper=hi if hi is not None else _unbounded()),
                    warn_only=False))
            else:
                constraints.append(None)
        context = StatelessSymbolicContext(dynamic_sizes=sizes, constraint_sizes=constraints)
        with size_oblivious():  # a size of 1 is a symbol too, its stride and offset not
            fake = self.fake_mode.from_tensor(real, static_shapes=False,
                                              source=_ShapeSource.make(source),
                                              symbolic_context=context)
        for d in dims:
            # A batch admits 1 (the graph is traced size-obliviously); any other symbolic size
            # is 2 or more, as torch's are: a length of 1 (a cache of one token) is another
            # graph, so that no lowering has to ask of it what the capture did not.
            batch = d == 0 and real.dim() >= 2
            at_least(self.shape_env, fake.shape[d], 1 if batch or d in marked else 2)
        self.tensors.append((source, real, fake, marked, ranges))
        return fake

    # -- guards ------------------------------------------------------------------------------

    def guards(self):
        """(per dynamic tensor source: (sizes, strides) with None where the SHAPE guard checks
        the value, the SHAPE guard's (bindings, constraints) or None). Raises ConstraintViolation
        when a dimension the program marked dynamic was specialised."""
        return _GuardWriter(self).write()


# Binding kinds: what of the value at a source a symbol is.
SIZE, STRIDE, OFFSET, INT = "size", "stride", "storage_offset", "int"


class _Untranslatable(Exception):
    """An expression the C++ evaluator has no operation for."""


def _hints(env) -> dict:
    """symbol -> the value it had when traced (torch >= 2.12 names the map backed_var_to_val)."""
    hints = getattr(env, "backed_var_to_val", None)
    return hints if hints is not None else env.var_to_val


def _unbounded():
    try:
        from torch.utils._sympy.numbers import int_oo
        return int_oo
    except ImportError:  # older torch
        import sympy
        return sympy.oo


class _GuardWriter:
    def __init__(self, inputs: SymbolicInputs):
        self.inputs = inputs
        self.env = inputs.shape_env
        self.bindings: List[tuple] = []  # (source, kind, dim)
        self._slot_of: Dict[tuple, int] = {}
        self._slot_of_symbol: Dict[object, int] = {}
        self.constraints: List[tuple] = []  # (tree, text)

    def _slot(self, source, kind: str, dim: int) -> int:
        key = (source, kind, dim)
        slot = self._slot_of.get(key)
        if slot is None:
            slot = self._slot_of[key] = len(self.bindings)
            self.bindings.append(key)
        return slot

    def _expr(self, value):
        import sympy

        if isinstance(value, int):
            return sympy.Integer(value)
        return self.env.simplify(value.node.expr)

    def write(self):
        import sympy

        per_tensor = {}
        pending = []  # (slot, expr): the value at slot must equal expr
        for source, real, fake, marked, ranges in self.inputs.tensors:
            sizes, strides = [], []
            for kind, values, out in ((SIZE, fake.shape, sizes), (STRIDE, fake.stride(), strides)):
                for d, v in enumerate(values):
                    e = self._expr(v)
                    if e.is_Integer:
                        out.append(int(e))
                        continue
                    out.append(None)
                    slot = self._slot(source, kind, d)
                    if isinstance(e, sympy.Symbol) and e not in self._slot_of_symbol:
                        self._slot_of_symbol[e] = slot
                    else:
                        pending.append((slot, e))
            for d in marked:
                if sizes[d] is not None:
                    raise ConstraintViolation(
                        f"{source.name}: dimension {d} is marked dynamic, but the program "
                        f"needs it to be {sizes[d]} (the trace specialised it)")
            offset = self._expr(fake.storage_offset())
            if not offset.is_Integer:
                slot = self._slot(source, OFFSET, 0)
                if isinstance(offset, sympy.Symbol) and offset not in self._slot_of_symbol:
                    self._slot_of_symbol[offset] = slot
                else:
                    pending.append((slot, offset))
            per_tensor[source] = (tuple(sizes), tuple(strides))
        for source, symint in self.inputs.ints:
            # What the trace assumed of an int input: nothing (a symbol of its own), its value
            # (the ShapeEnv replaced its symbol by a constant), or an expression of others.
            slot = self._slot(source, INT, 0)
            e = self._expr(symint)
            if isinstance(e, sympy.Symbol) and e not in self._slot_of_symbol:
                self._slot_of_symbol[e] = slot
            else:
                pending.append((slot, e))
        try:
            for slot, e in pending:
                self._add(("eq", ("sym", slot), self._tree(e)), self._eq_text(slot, e))
            for sym, slot in list(self._slot_of_symbol.items()):
                vr = self.env.var_to_range.get(sym)
                if vr is None:
                    continue
                lo, hi = vr.lower, vr.upper
                if lo.is_finite and lo > -(2 ** 62):
                    self._add(("ge", ("sym", slot), int(lo)), f"{self._name(slot)} >= {int(lo)}")
                if hi.is_finite and hi < 2 ** 62:
                    self._add(("le", ("sym", slot), int(hi)), f"{self._name(slot)} <= {int(hi)}")
            seen = set()
            for g in self.env.guards:
                e = self.env.simplify(g.expr)
                if e is sympy.true or e in seen:
                    continue
                seen.add(e)
                self._add(self._tree(e), self._text(e))
        except _Untranslatable:
            # A relation the evaluator cannot compute: the graph holds for the sizes it was
            # traced with, checked as they are.
            self.constraints = []
            hints = _hints(self.env)
            for sym, slot in self._slot_of_symbol.items():
                hint = int(hints[sym])
                self._add(("eq", ("sym", slot), hint), f"{self._name(slot)} == {hint}")
            for slot, e in pending:
                hint = int(e.xreplace(hints))
                self._add(("eq", ("sym", slot), hint), f"{self._name(slot)} == {hint}")
        if not self.bindings:
            return per_tensor, None
        sources = list(dict.fromkeys(s for s, _kind, _d in self.bindings))
        index = {s: i for i, s in enumerate(sources)}
        bindings = tuple((index[s], kind, d, self._name(slot))
                         for slot, (s, kind, d) in enumerate(self.bindings))
        return per_tensor, (tuple(s.guard_path() for s in sources), bindings,
                            tuple(self.constraints))

    def _add(self, tree, text: str) -> None:
        self.constraints.append((tree, text))

    def _name(self, slot: int) -> str:
        source, kind, d = self.bindings[slot]
        if kind == INT:
            return source.name
        return f"{source.name}.{kind}()" if kind == OFFSET else f"{source.name}.{kind}()[{d}]"

    def _symbol_slot(self, sym) -> int:
        slot = self._slot_of_symbol.get(sym)
        if slot is not None:
            return slot
        # A symbol of a tensor whose sizes no input of the graph carries now (its capture was
        # rolled back): read where the ShapeEnv says it came from.
        for src in self.env.var_to_sources.get(sym, ()):
            if getattr(src, "kiln_source", None) is not None:  # an int input
                slot = self._slot_of_symbol[sym] = self._slot(src.kiln_source, INT, 0)
                return slot
            base = getattr(src, "base", None)
            kiln_source = getattr(base, "kiln_source", None)
            if kiln_source is None:
                continue
            kind = {0: SIZE, 1: STRIDE, 2: OFFSET}.get(int(src.prop.value))
            if kind is None:
                continue
            slot = self._slot_of_symbol[sym] = self._slot(kiln_source, kind, src.idx or 0)
            return slot
        raise _Untranslatable(f"no source for {sym}")

    def _text(self, e) -> str:
        import sympy

        names = {s: sympy.Symbol(self._name(self._symbol_slot(s))) for s in e.free_symbols}
        return str(e.xreplace(names))

    def _eq_text(self, slot: int, e) -> str:
        return f"{self._name(slot)} == {self._text(e)}"

    def _tree(self, e):
        """`e` (a sympy expression over the capture's symbols) as the evaluator's tree."""
        import sympy
        from torch.utils._sympy import functions as F

        if e is sympy.true:
            return ("eq", 0, 0)
        if e is sympy.false:
            return ("ne", 0, 0)
        if isinstance(e, sympy.Integer) or (getattr(e, "is_Integer", False)):
            return int(e)
        if isinstance(e, sympy.Symbol):
            return ("sym", self._symbol_slot(e))
        if isinstance(e, sympy.Add):
            return ("add", *(self._tree(a) for a in e.args))
        if isinstance(e, sympy.Mul):
            if any(a.is_Rational and not a.is_Integer for a in e.args):
                raise _Untranslatable(str(e))
            return ("mul", *(self._tree(a) for a in e.args))
        if isinstance(e, (sympy.Pow, F.PowByNatural)):
            base, exp = e.args
            if not exp.is_Integer or exp < 0:
                raise _Untranslatable(str(e))
            return ("pow", self._tree(base), int(exp))
        if isinstance(e, F.CeilDiv):
            return ("ceildiv", self._tree(e.args[0]), self._tree(e.args[1]))
        if isinstance(e, F.FloorDiv):  # CleanDiv too: exact, so floor is the same
            return ("floordiv", self._tree(e.args[0]), self._tree(e.args[1]))
        if isinstance(e, (F.Mod, F.PythonMod, sympy.Mod)):
            return ("mod", self._tree(e.args[0]), self._tree(e.args[1]))
        if isinstance(e, F.ModularIndexing):
            base, div, mod = e.args
            return ("mod", ("floordiv", self._tree(base), self._tree(div)), self._tree(mod))
        if isinstance(e, (F.Max, sympy.Max)):
            return ("max", *(self._tree(a) for a in e.args))
        if isinstance(e, (F.Min, sympy.Min)):
            return ("min", *(self._tree(a) for a in e.args))
        if isinstance(e, F.Identity):
            return self._tree(e.args[0])
        rel = {sympy.Eq: "eq", sympy.Ne: "ne", sympy.StrictLessThan: "lt",
               sympy.LessThan: "le", sympy.StrictGreaterThan: "gt", sympy.GreaterThan: "ge"}
        for cls, name in rel.items():
            if type(e) is cls:
                return (name, self._tree(e.lhs), self._tree(e.rhs))
        if isinstance(e, sympy.And):
            return ("and", *(self._tree(a) for a in e.args))
        if isinstance(e, sympy.Or):
            return ("or", *(self._tree(a) for a in e.args))
        if isinstance(e, sympy.Not):
            return ("not", self._tree(e.args[0]))
        raise _Untranslatable(f"{type(e).__name__}: {e}")
