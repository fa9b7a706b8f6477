"""Size symbols in the kiln.v1 IR (kiln.graph.ir.to_ir of an ATen graph traced over fakes whose
sizes are torch's SymInts): each size, stride, storage offset and SymInt argument becomes a
polynomial over the graph's size symbols (kiln.v1.SymExpr, in its canonical form), each symbol
bound to the first per-call input dimension whose size is exactly it, with the range the
capture's ShapeEnv gives it. What the IR cannot say exactly (a floor division, a min or max, a
symbol no input dimension gives) raises NotSymbolic: the graph then runs per signature, never a
plan that would compute something else."""
from typing import Dict, List, Optional, Tuple

import sympy
import torch

from kiln.graph.aten_nodes import LoweringError


class NotSymbolic(LoweringError):
    """A graph with symbolic sizes the kiln.v1 IR cannot carry exactly."""


def is_symbolic(value) -> bool:
    return isinstance(value, torch.SymInt) and not isinstance(_expr(value), sympy.Integer)


def _expr(value: torch.SymInt):
    return value.node.expr


class SizeSymbols:
    """The graph's size symbols: sympy symbol -> kiln.v1 id, each with its binding."""

    def __init__(self):
        self.ids: Dict[sympy.Symbol, int] = {}
        self.bindings: Dict[int, Tuple[int, int]] = {}  # id -> (input index, dim)
        self.env = None

    def bind(self, index: int, fake: torch.Tensor) -> None:
        """Numbers the symbols that are exactly a dimension of per-call input `index` (its
        position among the graph's inputs). Every input is bound before any value is written:
        an earlier input's size may be an expression of a later one's symbol (2 * s1 where the
        capture's guards replaced s0 by it)."""
        for d, size in enumerate(fake.shape):
            if not is_symbolic(size):
                continue
            e = _expr(size)
            self.env = size.node.shape_env
            if isinstance(e, sympy.Symbol) and e not in self.ids:
                self.ids[e] = len(self.ids)
                self.bindings[self.ids[e]] = (index, d)

    def expr(self, value, out, where: str) -> None:
        """Writes int or SymInt `value` into kiln.v1.SymExpr `out` (canonical form)."""
        if isinstance(value, torch.SymInt):
            e = sympy.expand(self._lifted(_expr(value)))
        else:
            e = sympy.Integer(int(value))
        terms = []
        for monomial, coefficient in e.as_coefficients_dict().items():
            if not (isinstance(coefficient, sympy.Integer) or coefficient.is_integer):
                raise NotSymbolic(f"{where}: {e} has a coefficient that is not an integer")
            terms.append((self._symbols(monomial, e, where), int(coefficient)))
        for symbols, coefficient in sorted(terms):
            if coefficient == 0:
                continue
            term = out.terms.add()
            term.coefficient = coefficient
            term.symbols.extend(symbols)

    def _lifted(self, e):
        """`e` with each Max(k, s) replaced by s where the ShapeEnv's range of s (which the
        guards hold it to) starts at k or above (a contiguous stride Max(1, s) is s), and each
        min or max whose answer the guards prove replaced by it."""
        if self.env is None:
            return e
        for _ in range(4):  # a min or max the capture's guards settled (nested: in turns)
            simpler = self.env.simplify(e)
            if simpler == e:
                break
            e = simpler

        def lift(m):
            symbols = [a for a in m.args if not a.is_number]
            if type(m).__name__ == "Max" and len(symbols) == 1 and \
                    isinstance(symbols[0], sympy.Symbol):
                vr = self.env.var_to_range.get(symbols[0])
                lower = _finite(vr.lower) if vr is not None else None
                if lower is not None and all(a <= lower for a in m.args if a.is_number):
                    return symbols[0]
            # The argument the guards prove the least (Min) or greatest (Max) of all: a min of
            # two sizes settled by a guard between them (s27 <= s98).
            rel = sympy.Le if type(m).__name__ == "Min" else sympy.Ge
            for a in m.args:
                if all(b is a or self._proved(rel(a, b)) for b in m.args):
                    return a
            return m

        return e.replace(lambda x: type(x).__name__ in ("Max", "Min"), lift)

    def _proved(self, relation) -> bool:
        """Whether the ShapeEnv proves `relation` from its ranges and guards."""
        try:
            return bool(self.env._maybe_evaluate_static(relation) == sympy.true)
        except Exception:  # an expression its evaluator does not take: not proved
            return False

    def _symbols(self, monomial, whole, where: str) -> Tuple[int, ...]:
        """The sorted symbol ids (repeated for powers) of one monomial of an expanded sum."""
        if monomial == 1:
            return ()
        factors = monomial.args if isinstance(monomial, sympy.Mul) else (monomial,)
        ids = []
        for f in factors:
            base, power = (f.args if isinstance(f, sympy.Pow) else (f, sympy.Integer(1)))
            if not isinstance(base, sympy.Symbol) or not isinstance(power, sympy.Integer) or \
                    power < 1:
                raise NotSymbolic(f"{where}: {whole} is not a polynomial of the sizes")
            if base not in self.ids:
                raise NotSymbolic(f"{where}: {whole} names {base}, which no input dimension "
                                  "gives")
            ids += [self.ids[base]] * int(power)
        return tuple(sorted(ids))

    def meta(self, t, out) -> None:
        """The size, stride and storage offset expressions of tensor (or _Meta) `t` into
        TensorMeta `out` (whose sizes, strides and offset meta_to_pb wrote: -1 / 0 / 0 where
        symbolic)."""
        sizes, strides, offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
        if not any(is_symbolic(v) for v in (*sizes, *strides, offset)):
            return
        for v in sizes:
            self.expr(v, out.size_exprs.add(), "a size")
        for v in strides:
            self.expr(v, out.stride_exprs.add(), "a stride")
        if is_symbolic(offset):  # a view at a position that depends on the sizes
            self.expr(offset, out.storage_offset_expr, "a storage offset")

    def write(self, graph, inputs: List[int]) -> None:
        """kiln.v1.Graph.size_symbols, with the ranges the ShapeEnv gives; `inputs`: the value
        id of each graph input, in order."""
        for sym, sid in sorted(self.ids.items(), key=lambda kv: kv[1]):
            s = graph.size_symbols.add()
            s.id = sid
            index, s.dim = self.bindings[sid]
            s.input = inputs[index]
            vr = self.env.var_to_range.get(sym) if self.env is not None else None
            lower = _finite(vr.lower) if vr is not None else None
            upper = _finite(vr.upper) if vr is not None else None
            s.min = max(lower or 0, 0)
            s.max = upper if upper is not None else 0  # 0: unbounded


def _finite(bound) -> Optional[int]:
    """A range bound as an int; None for an infinite one (sympy's oo, torch's int_oo)."""
    if bound in (sympy.oo, -sympy.oo) or type(bound).__name__ in ("IntInfinity",
                                                                     "NegativeIntInfinity"):
        return None
    try:
        return int(bound)
    except (TypeError, ValueError, OverflowError):
        return None


def at_least_two(expr):
    """s where `expr` says only that the symbol s is 2 or more (s != 1 of a size, s >= 2,
    s > 1, 2 <= s, 1 < s), else None."""
    if not isinstance(expr, sympy.Basic) or len(expr.args) != 2:
        return None
    a, b = expr.args
    forms = {sympy.Ne: ((a, b, 1), (b, a, 1)), sympy.Ge: ((a, b, 2),), sympy.Gt: ((a, b, 1),),
             sympy.Le: ((b, a, 2),), sympy.Lt: ((b, a, 1),)}
    for sym, bound, want in forms.get(type(expr), ()):
        if isinstance(sym, sympy.Symbol) and bound == want:
            return sym
    return None


def static_value(value) -> Optional[int]:
    """`value` as a plain int when it is one (an int, or a SymInt with a constant expression)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt) and not is_symbolic(value):
        return int(_expr(value))
    return None


def shape_env_state(env) -> tuple:
    """What a ShapeEnv knows of its symbols, to compare before and after a trace: its guards,
    replacements, ranges and runtime assertions."""
    return (len(env.guards), dict(env.replacements), dict(env.var_to_range),
            sum(len(v) for v in getattr(env, "deferred_runtime_asserts", {}).values()))


class Mark:
    """What a ShapeEnv knew at a point (shape_env_state and its axioms), to compare with later
    and to go back to."""

    def __init__(self, env):
        self.env = env
        self.state = shape_env_state(env)
        self.axioms = dict(getattr(env, "axioms", {}))

    def changed(self) -> bool:
        return shape_env_state(self.env) != self.state

    def learnt_at_least_two(self) -> list:
        """The symbols s of the guards learnt since the mark that say only s >= 2 (at_least_two)
        on symbols whose range began at 1 there ([] where none, or where runtime assertions
        were learnt)."""
        env = self.env
        guards, _, ranges, asserts = self.state
        if shape_env_state(env)[3] != asserts:
            return []
        found = []
        for g in env.guards[guards:]:
            s = at_least_two(g.expr)
            if s is not None and ranges.get(s) is not None and ranges[s].lower == 1 \
                    and s not in found:
                found.append(s)
        return found

    def only_learnt_at_least_two(self) -> list:
        """learnt_at_least_two() where those guards and the ranges they narrowed are all that
        was learnt since the mark; [] otherwise."""
        guards, replacements, ranges, _ = self.state
        env = self.env
        symbols = self.learnt_at_least_two()
        if not symbols or dict(env.replacements) != replacements or \
                len(env.guards) - guards != sum(at_least_two(g.expr) in symbols
                                                for g in env.guards[guards:]):
            return []
        for k, vr in env.var_to_range.items():
            old = ranges.get(k)
            if old != vr and not (k in symbols and vr.lower == 2 and old.upper == vr.upper):
                return []
        return symbols

    def forget_at_least_two(self, symbols) -> None:
        """Forgets the guards learnt since the mark that say s >= 2 of `symbols`, and the range
        and axioms they taught; what else was learnt stays."""
        env = self.env
        guards, _, ranges, _ = self.state
        symbols = set(symbols)
        env.guards[guards:] = [g for g in env.guards[guards:]
                               if at_least_two(g.expr) not in symbols]
        for s in symbols:
            env.var_to_range[s] = ranges[s]
        if hasattr(env, "axioms"):
            kept = {k: v for k, v in env.axioms.items()
                    if k in self.axioms or not (k.free_symbols & symbols)}
            env.axioms.clear()
            env.axioms.update(kept)
        _changed(env)

    def restore(self) -> None:
        """Forgets everything the ShapeEnv learnt since the mark."""
        env = self.env
        guards, replacements, ranges, _ = self.state
        del env.guards[guards:]
        if env.replacements != replacements:
            env.replacements.clear()
            env.replacements.update(replacements)
        for k in list(env.var_to_range):
            if k in ranges and env.var_to_range[k] != ranges[k]:
                env.var_to_range[k] = ranges[k]
        if hasattr(env, "axioms"):
            env.axioms.clear()
            env.axioms.update(self.axioms)
        _changed(env)


def _changed(env) -> None:
    if hasattr(env, "_version_counter"):  # its answers are cached by this version
        env._version_counter += 1


class ShapeEnvUnchanged:
    """Fails a lowering that taught the capture's ShapeEnv anything (a guard, a replacement, a
    narrowed range): the capture's guards, installed already, would not check it, and a plan
    that relied on it could compute something else for sizes they admit.

    With `floors` (a dict), a lowering that learnt only that symbols whose range began at 1 are
    2 or more (a kernel's choice that asks whether a batch is 1: SDPA's on a GPU) is not failed:
    those symbols go into `floors` (symbol -> 2), the ShapeEnv is put back as it was, and the
    plan is for calls where they are (kiln.graph.size_floors)."""

    def __init__(self, env, floors: Optional[dict] = None):
        self.env = env
        self.floors = floors

    def __enter__(self):
        self.mark = Mark(self.env) if self.env is not None else None
        return self

    def __exit__(self, kind, value, tb):
        if kind is None and self.mark is not None and self.mark.changed():
            if self.floors is not None:
                learnt = self.mark.only_learnt_at_least_two()
                if learnt:
                    self.floors.update({s: 2 for s in learnt})
                    self.mark.restore()
                    return False
            guards, replacements, ranges, _ = self.mark.state
            env = self.env
            learnt = [str(g.expr) for g in env.guards[guards:]]
            learnt += [f"{k} = {v}" for k, v in env.replacements.items()
                       if replacements.get(k) != v]
            learnt += [f"{k} in [{v.lower}, {v.upper}]" for k, v in env.var_to_range.items()
                       if ranges.get(k) != v]
            raise NotSymbolic("lowering the graph relied on sizes its capture did not guard: " +
                              ", ".join(learnt[:4] or ["a runtime assertion"]))
        return False
