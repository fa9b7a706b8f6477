"""The corpus's one check: run a program eagerly and under kiln, compare everything it returns
and mutates, and count the graphs (and, through kiln.explain, the graph breaks)."""
import copy
import math
import types

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.testing import CompileCounter


_SHARED = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.ModuleType, nn.Module)


def clone_tree(value):
    """A deep copy of the tensors in nested tuples/lists/dicts, and of plain objects (so
    eager and kiln mutate their own); functions, classes and modules are shared."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, tuple):
        return tuple(clone_tree(v) for v in value)
    if isinstance(value, list):
        return [clone_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: clone_tree(v) for k, v in value.items()}
    if hasattr(value, "__dict__") and not isinstance(value, _SHARED) and not callable(value):
        return copy.deepcopy(value)
    return value


def assert_same(got, want, path="result", **tol):
    """Equal structure, types and values; tensors through torch.testing.assert_close (dtype,
    device and shape included)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got).__name__} is not a Tensor"
        torch.testing.assert_close(got, want, msg=lambda m: f"{path}: {m}", **tol)
        return
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]", **tol)
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]", **tol)
    elif (hasattr(want, "__dict__") and not isinstance(want, _SHARED)
          and type(want).__eq__ is object.__eq__):
        assert_same(vars(got), vars(want), f"{path}.__dict__", **tol)
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), f"{path}: {got} is not nan"
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), f"{path}: {got} != {want}"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def check(program, *args, frames, breaks=None, calls=2, arg_sets=None, ops=None, **tol):
    """Runs `program` (a function or an nn.Module) eagerly and compiled with a CompileCounter.

    Each call gets fresh copies of its arguments; the result and the arguments afterwards
    (in-place mutation) must equal eager, and an nn.Module's state must equal that of an eager
    deep copy. `arg_sets` (a list of argument tuples) replaces `args` and is called in order;
    otherwise `args` is called `calls` times, and a repeated call must hit the cache.
    `frames`: graphs compiled over all the calls. `breaks`: the graph breaks kiln.explain
    reports for one call on the first argument set (its graph count must then be `frames`
    when there is one call's worth of graphs). Returns the CompileCounter."""
    arg_sets = list(arg_sets) if arg_sets is not None else [args] * calls
    eager_program = copy.deepcopy(program) if isinstance(program, nn.Module) else program
    explain_program = copy.deepcopy(program) if isinstance(program, nn.Module) else program
    cnt = CompileCounter()
    opt = kiln.compile(program, backend=cnt)
    for i, call_args in enumerate(arg_sets):
        eager_args, kiln_args = clone_tree(call_args), clone_tree(call_args)
        want = eager_program(*eager_args)
        got = opt(*kiln_args)
        assert_same(got, want, f"call {i}: result", **tol)
        assert_same(kiln_args, eager_args, f"call {i}: arguments after the call", **tol)
    if isinstance(program, nn.Module):
        assert_same(program.state_dict(), eager_program.state_dict(), "module state", **tol)
        assert program.training == eager_program.training
    assert cnt.frame_count == frames, f"{cnt.frame_count} graphs compiled, expected {frames}"
    if ops is not None:
        assert cnt.op_count == ops, f"{cnt.op_count} ops captured, expected {ops}"
    if breaks is not None:
        out = kiln.explain(explain_program)(*clone_tree(arg_sets[0]))
        reasons = "\n".join(str(r) for r in out.break_reasons)
        assert out.graph_break_count == breaks, (
            f"explain: {out.graph_break_count} breaks, expected {breaks}:\n{reasons}")
        if all(a is arg_sets[0] for a in arg_sets):
            assert out.graph_count == frames, f"explain: {out.graph_count} graphs, expected {frames}"
    return cnt


def check_fullgraph_raises(program, *args):
    """fullgraph=True must raise kiln.exc.Unsupported at the first graph break."""
    if isinstance(program, nn.Module):
        program = copy.deepcopy(program)
    opt = kiln.compile(program, backend=CompileCounter(), fullgraph=True)
    with pytest.raises(kiln.exc.Unsupported):
        opt(*clone_tree(args))


def t(*shape, dtype=torch.float32):
    """A random tensor: normal floats, or integers in [0, 10) for an integer dtype."""
    if dtype.is_floating_point:
        return torch.randn(*shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    return torch.randint(0, 10, shape, dtype=dtype)


def make_args(specs):
    """One call's arguments from specs: a tuple of ints is a random float tensor of that shape,
    a callable is called, anything else is passed as it is."""
    out = []
    for s in specs:
        if isinstance(s, tuple) and all(isinstance(d, int) for d in s):
            out.append(t(*s))
        elif callable(s) and not isinstance(s, (torch.Tensor, nn.Module, type)):
            out.append(s())
        else:
            out.append(s)
    return tuple(out)


class Corpus:
    """Collects a file's programs. Decorate a function (or an nn.Module class, built with no
    arguments) with `@corpus(*arg_specs, frames=N, breaks=B, ...)` and parametrize one test
    over `corpus.cases`. `sets=[specs, specs, ...]` calls it once per argument set;
    `fullgraph_raises=True` also checks fullgraph=True raises; `xfail="kiln: ..."` marks a
    known kiln bug (strict)."""

    def __init__(self):
        self.cases = []

    def __call__(self, *specs, frames, sets=None, xfail=None, fullgraph_raises=False, **kw):
        def register(program):
            case = _Case(program, specs, sets, frames, fullgraph_raises, kw)
            marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
            self.cases.append(pytest.param(case, id=program.__name__, marks=marks))
            return program

        return register


class _Case:
    def __init__(self, program, specs, sets, frames, fullgraph_raises, kw):
        self.program, self.specs, self.sets = program, specs, sets
        self.frames, self.fullgraph_raises, self.kw = frames, fullgraph_raises, kw

    def run(self):
        program = self.program
        if isinstance(program, type) and issubclass(program, nn.Module):
            program = program()
        if self.sets is not None:
            arg_sets = [make_args(s) for s in self.sets]
            check(program, arg_sets=arg_sets, frames=self.frames, **self.kw)
            first = arg_sets[0]
        else:
            first = make_args(self.specs)
            check(program, *first, frames=self.frames, **self.kw)
        if self.fullgraph_raises:
            check_fullgraph_raises(program, *first)
