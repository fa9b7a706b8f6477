"""Guards that a size is not 1 which an op's own meta kernel raises, kept only where the op's
result would differ at 1.

A batch dimension admits 1 (SymbolicInputs.fake): a server's request of one is served by the
graph of every other batch. Some of torch's meta kernels still ask `size == 1` of it where the
answer changes nothing the graph computes: F.linear of a (b, 1, h) slice of a longer sequence
folds it through a reshape whose view-or-copy choice asks whether b is 1 (an internal of the
decomposition: the op returns a new tensor of the same sizes and strides either way). Left in,
that guard sends every request of one to a capture of its own.

An op that learnt a guard `Ne(s, 1)` on such a symbol is run again with those symbols at 1
(everything else as it was, symbolic). That guard is forgotten (the op's others stay) when the
second run learns nothing new of the sizes and gives results of the same kind, dtype, device, sizes, strides and storage
offsets (the first run's with the symbols at 1) that alias the same inputs: the op then does the
same at 1 as at every other size the guards admit, and the graph needs no guard for it. Anything
else keeps the guard, and a call of one is another capture, as before."""
import sympy
import torch
from torch.utils._pytree import tree_flatten

from kiln.graph.symbolic_ir import Mark, shape_env_state
from kiln.graph.symbolic_shapes import _hints, symbolic_ops


def forget_if_same_at_one(env, mark: Mark, fake_mode, call, args, kwargs, result) -> bool:
    """After `result = call(args, kwargs)` ran on fakes in `fake_mode` from `mark`: forgets
    the op's guards that a size is not 1 where the op does the same at 1 (this module's
    docstring). True where it forgot them."""
    symbols = mark.learnt_at_least_two()
    if not symbols:
        return False
    after = Mark(env)
    try:
        same = _same_at_one(env, fake_mode, call, args, kwargs, result,
                            {s: sympy.Integer(1) for s in symbols})
    except Exception:  # noqa: BLE001 - the op refuses the inputs at 1: keep its guard
        same = False
    after.restore()  # whatever the second run taught it
    if same:
        mark.forget_at_least_two(symbols)
    return same


def _int_at(env, value, at: dict, hints: dict):
    """`value` (an int or SymInt) with the symbols `at` put in: an int, or a SymInt of the rest."""
    if not isinstance(value, torch.SymInt):
        return value
    expr = sympy.expand(value.node.expr.xreplace(at))
    if expr.is_number:
        return int(expr)
    return env.create_symintnode(expr, hint=int(expr.xreplace(hints)))


def _expr(value):
    return value.node.expr if isinstance(value, torch.SymInt) else sympy.Integer(value)


def _same_expr(first, second, at: dict) -> bool:
    return sympy.expand(_expr(first).xreplace(at) - _expr(second)) == 0


def _touches(t: torch.Tensor, at: dict) -> bool:
    values = list(t.shape) + list(t.stride()) + [t.storage_offset()]
    return any(isinstance(v, torch.SymInt) and v.node.expr.free_symbols & at.keys()
               for v in values)


def _made_at_one(env, fake_mode, a: torch.Tensor, at: dict, hints: dict):
    """A fake with `a`'s dtype, device, sizes, strides and storage offset at `at` (a view of a
    buffer of its own where `a` is a view); None where a size is 0 there."""
    sizes = [_int_at(env, v, at, hints) for v in a.shape]
    strides = [_int_at(env, v, at, hints) for v in a.stride()]
    offset = _int_at(env, a.storage_offset(), at, hints)
    if any(isinstance(v, int) and v == 0 for v in sizes):
        return None
    with fake_mode:
        if not a._is_view() and isinstance(offset, int) and offset == 0:
            t = torch.empty_strided(sizes, strides, dtype=a.dtype, device=a.device)
        else:
            needed = offset + 1
            for n, st in zip(sizes, strides):
                needed = needed + (n - 1) * st
            t = torch.empty(needed, dtype=a.dtype, device=a.device).as_strided(
                sizes, strides, offset)
        if a.requires_grad:
            t = t.detach().requires_grad_(True)
    return t


def _same_at_one(env, fake_mode, call, args, kwargs, result, at: dict) -> bool:
    hints = dict(_hints(env))
    hints.update(at)
    flat, spec = tree_flatten((args, kwargs))
    moved = []  # the inputs at 1: those the symbols touch made anew, the others as they are
    for a in flat:
        if isinstance(a, torch.Tensor):
            if not _touches(a, at):
                moved.append(a)
                continue
            t = _made_at_one(env, fake_mode, a, at, hints)
            if t is None:
                return False
            moved.append(t)
        else:
            moved.append(_int_at(env, a, at, hints))
    args1, kwargs1 = spec.unflatten(moved)
    before = shape_env_state(env)
    with fake_mode, symbolic_ops():
        result1 = call(args1, kwargs1)
    if shape_env_state(env) != before:
        return False
    out, out_spec = tree_flatten(result)
    out1, out1_spec = tree_flatten(result1)
    if out_spec != out1_spec:
        return False
    inputs = [a for a in flat if isinstance(a, torch.Tensor)]
    inputs1 = [a for a in moved if isinstance(a, torch.Tensor)]
    for o, o1 in zip(out, out1):
        if isinstance(o, torch.Tensor) != isinstance(o1, torch.Tensor):
            return False
        if not isinstance(o, torch.Tensor):
            if isinstance(o, (int, torch.SymInt)) and isinstance(o1, (int, torch.SymInt)):
                if not _same_expr(o, o1, at):
                    return False
            elif type(o) is not type(o1) or (not isinstance(o, torch.SymFloat) and o != o1):
                return False
            continue
        if (o.dtype, o.device, o.dim(), o.requires_grad) != \
                (o1.dtype, o1.device, o1.dim(), o1.requires_grad):
            return False
        if not all(_same_expr(x, y, at) for x, y in zip(
                list(o.shape) + list(o.stride()) + [o.storage_offset()],
                list(o1.shape) + list(o1.stride()) + [o1.storage_offset()])):
            return False
        if _aliased(o, inputs) != _aliased(o1, inputs1):
            return False
    return True


def _aliased(t: torch.Tensor, inputs: list) -> list:
    """Which of `inputs` share `t`'s storage."""
    mine = t.untyped_storage()._cdata
    return [i for i, a in enumerate(inputs) if a.untyped_storage()._cdata == mine]
