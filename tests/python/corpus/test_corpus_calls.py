"""Calls of user functions and methods, inlined into the caller's graph: defaults, *args,
**kwargs, keyword-only arguments, methods, static and class methods, recursion on constants."""
import functools

import pytest
import torch
import torch.nn.functional as F

from .harness import Corpus, t

corpus = Corpus()


def _affine(x, w=2.0, b=1.0):
    return x * w + b


@corpus((4,), frames=1)
def call_with_defaults(x):
    return _affine(x) + _affine(x, 3.0) + _affine(x, b=-1.0)


def _total(*xs):
    out = xs[0]
    for v in xs[1:]:
        out = out + v
    return out


@corpus((3,), frames=1)
def call_varargs(x):
    return _total(x, x * 2, x * 3)


def _opts(x, **kw):
    if kw.get("square"):
        x = x * x
    return x + kw.get("shift", 0)


@corpus((3,), frames=1)
def call_var_kwargs(x):
    return _opts(x, square=True, shift=2)


def _kwonly(x, *, scale, offset=0.0):
    return x * scale + offset


@corpus((3,), frames=1)
def call_keyword_only(x):
    return _kwonly(x, scale=3.0) - _kwonly(x, offset=1.0, scale=0.5)


def _apply_all(x, *fns, reduce=torch.stack):
    return reduce([f(x) for f in fns])


@corpus((3,), frames=1)
def varargs_of_functions_and_kwonly_default(x):
    return _apply_all(x, torch.sin, torch.cos, reduce=torch.cat)


class _Scaler:
    def __init__(self, s):
        self.s = s

    def __call__(self, x):
        return x * self.s

    def apply(self, x):
        return self(x) + self.s

    @staticmethod
    def static_shift(x):
        return x - 1

    @classmethod
    def make_double(cls):
        return cls(2.0)


_SCALER = _Scaler(3.0)


@corpus((3,), frames=1)
def method_call_on_global_object(x):
    return _SCALER.apply(x)


@corpus((3,), frames=1)
def callable_object_call(x):
    return _SCALER(x)


@corpus((3,), frames=1)
def staticmethod_call(x):
    return _Scaler.static_shift(x) * 2


@corpus((3,), lambda: _Scaler(4.0), frames=1)
def method_of_object_argument(x, scaler):
    return scaler.apply(x)


def _depth(x, n):
    if n == 0:
        return x
    return _depth(x.sin(), n - 1)


@corpus((3,), frames=1)
def recursion_on_constant_depth(x):
    return _depth(x, 3)


def _returns_multiple(x):
    return x.max(dim=0), x.min(dim=0).values


@corpus((4, 3), frames=1)
def function_returning_named_tuple(x):
    (values, indices), mins = _returns_multiple(x)
    return values - mins, indices


@corpus((3,), frames=1)
def lambda_assigned_and_called(x):
    sq = lambda v: v * v  # noqa: E731
    return sq(x) + sq(x + 1)


def _outer(x):
    return _middle(x) * 2


def _middle(x):
    return _inner(x) + 1


def _inner(x):
    return x.exp()


@corpus((3,), frames=1)
def three_levels_of_calls(x):
    return _outer(x)


def _maybe(x, fn=None):
    return fn(x) if fn is not None else x


@corpus((3,), frames=1)
def function_passed_as_argument(x):
    return _maybe(x, torch.tanh) + _maybe(x)


@corpus((3,), lambda: F.gelu, frames=1)
def activation_passed_in(x, act):
    return act(x) * 2


def _unpack_kwargs(x, alpha, beta):
    return x * alpha + beta


@corpus((3,), frames=1)
def call_mixing_positional_and_keywords(x):
    return _unpack_kwargs(x, beta=1.0, alpha=2.0) + _unpack_kwargs(x, 3.0, beta=0.5)


@corpus((4, 4), frames=1)
def torch_function_keyword_arguments(x):
    return torch.sum(x, dim=1, keepdim=True) + torch.mean(input=x, dim=0)


@corpus((3,), frames=1)
def tensor_method_chain(x):
    return x.abs().add(1).log().mul(2).neg().exp()


def _side(x, acc):
    acc.append(x * 2)
    return x + 1


@corpus((3,), frames=1)
def callee_appends_to_local_list(x):
    acc = []
    y = _side(x, acc)
    z = _side(y, acc)
    return z, acc


def _with_default_list(x, dims=(0,)):
    return x.sum(dims)


@corpus((2, 3), frames=1)
def tuple_default_argument(x):
    return _with_default_list(x), _with_default_list(x, dims=(0, 1))


@corpus((3,), frames=1)
def classmethod_factory(x):
    return _Scaler.make_double()(x)


def _generic(x, *args, **kwargs):
    return _affine(x, *args, **kwargs)


@corpus((3,), frames=1)
def forwarding_star_args_and_kwargs(x):
    return _generic(x, 4.0, b=2.0)


def _early(x, flag):
    if not flag:
        return x
    y = x * 2
    return y + 1


@corpus((3,), frames=1)
def callee_with_early_returns(x):
    return _early(x, True) + _early(x, False)


class _Chain:
    def __init__(self):
        self.ops = []

    def add(self, fn):
        self.ops.append(fn)
        return self

    def run(self, x):
        for op in self.ops:
            x = op(x)
        return x


_CHAIN = _Chain().add(torch.relu).add(torch.sqrt)


@corpus((3,), frames=1)
def builder_object_holding_functions(x):
    return _CHAIN.run(x)


def _bound_method_user(fn, x):
    return fn(x)


@corpus((3,), frames=1)
def bound_method_passed_around(x):
    return _bound_method_user(_SCALER.apply, x)


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
