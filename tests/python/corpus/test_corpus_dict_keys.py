"""Dicts keyed by objects that a dict compares by identity: tensors, nn.Parameters, modules. Python
finds such a key by which object it is (a tensor's hash is its id; its == is never asked), keeps
insertion order, and a defaultdict calls its default_factory for a missing key only. Dicts built
in the frame, passed in and mutated, and defaultdicts, compared with eager; a dict from outside
whose key objects change must recompile."""
import collections

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.testing import CompileCounter

from .harness import Corpus, assert_same, t

corpus = Corpus()

P1 = nn.Parameter(torch.randn(3))
P2 = nn.Parameter(torch.randn(3))
P3 = nn.Parameter(torch.randn(3))


@corpus((3,), frames=1)
def mixed_keys_built_in_the_frame(x):
    d = {"a": x, P1: 3, 1: x * 2}
    return d["a"] + d[P1] * P1 + d[1]


@corpus((3,), (3,), frames=1)
def input_tensors_as_keys(x, y):
    d = {x: 1.5, y: 2.5}
    d[x] = d[x] + 1
    return x * d[x] + y * d[y], len(d), list(d.values())


@corpus((3,), (3,), frames=1)
def iterating_a_dict_keyed_by_tensors(x, y):
    d = {y: 2.0, x: 3.0, P1: 4.0}
    out = torch.zeros(3)
    for k, v in d.items():
        out = out + k * v
    return out, [k * 1 for k in d]


@corpus((3,), frames=1)
def contains_get_pop_setdefault(x):
    d = {P1: x}
    found = (P1 in d, P2 in d, x in d)
    a = d.get(P2, 5)
    d.setdefault(P2, x + 1)
    b = d.pop(P1)
    return found, a, b, d[P2], len(d)


@corpus((3,), frames=1)
def comprehension_keyed_by_parameters(x):
    state = {p: p * x for p in (P1, P2)}
    return state[P2] - state[P1], [v for v in state.values()]


@corpus((3,), frames=1)
def computed_tensor_as_key(x):
    y = x + 1
    d = {y: "y", x: "x"}
    return y * len(d[y]), d[x]


@corpus((3,), frames=1)
def dict_merge_keyed_by_tensors(x):
    a = {P1: 1, "k": 2}
    b = {P1: 10, P2: 20}
    c = {**a, **b}
    return x * c[P1] + x * c[P2] + c["k"], list(c.values())


class _Keyed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x):
        scale = {self.a: 2.0, self.b: 3.0, self.a.weight: 4.0}
        out = x
        for m in (self.b, self.a):
            out = m(out) * scale[m]
        return out * scale[self.a.weight]


corpus((4, 3), frames=1)(_Keyed)


@corpus((3,), lambda: {P1: torch.randn(3), P2: torch.randn(3)}, frames=1)
def optimizer_state_passed_in_and_mutated(x, state):
    for p in (P1, P2):
        state[p] = state[p] * 0.9 + x * p
    state[P3] = x
    return state[P1] + state[P2]


@corpus((3,), lambda: {P2: torch.randn(3), "step": 1}, frames=1)
def reading_a_dict_from_outside_keyed_by_parameters(x, d):
    total = x * d["step"]
    for k, v in d.items():
        if isinstance(k, torch.Tensor):
            total = total + k * v
    return total, P1 in d, P2 in d


@corpus((3,), frames=1)
def defaultdict_built_in_the_frame(x):
    groups = collections.defaultdict(list)
    groups[P1].append(x)
    groups[P2].append(x + 1)
    groups[P1].append(x * 2)
    return sum(groups[P1]), len(groups[P2]), len(groups)


_DD = collections.defaultdict(dict)


@corpus((3,), frames=1)
def defaultdict_from_outside_missing_key(x):
    _DD.clear()
    _DD["a"] = x + 1
    _DD[P1] = 123
    return _DD["b"], _DD[P1] * x, list(_DD.values())[0]


@pytest.mark.parametrize("case", corpus.cases)
def test_corpus(case):
    case.run()


def test_changed_key_objects_recompile():
    def f(x, d):
        total = x
        for k, v in d.items():
            total = total + k * v
        return total

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = t(3)
    d1 = {P1: 1.0, P2: 2.0}
    d2 = {P1: 1.0, P3: 2.0}  # same length, one key another Parameter of the same shape
    for d in (d1, d2, d1, d2):
        assert_same(opt(x, dict(d)), f(x, dict(d)))
    assert cnt.frame_count == 2


def test_lookup_of_an_argument_guards_its_identity():
    def f(x, key, d):
        return x * d[key] if key in d else x - 1

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = t(3)
    d = {P1: 2.0, P2: 3.0}
    for key in (P1, P2, P3, P1):
        assert_same(opt(x, key, d), f(x, key, d))


def test_aliased_tensor_keys():
    def f(x, y):
        d = {x: 1.0, y: 2.0}
        return x * d[x] + y * d[y], len(d)

    opt = kiln.compile(f, backend=CompileCounter())
    a, b = t(3), t(3)
    for args in ((a, b), (a, a), (a, b)):
        assert_same(opt(*args), f(*args))


def test_outside_dict_mutation_keeps_key_objects():
    def f(x, d):
        d[P2] = x * 2
        d[P1] = d[P1] + x
        return len(d)

    opt = kiln.compile(f, backend=CompileCounter())
    x = t(3)
    want, got = {P1: t(3)}, None
    got = {P1: want[P1].clone()}
    assert opt(x, got) == f(x, want)
    assert list(got) == [P1, P2] and list(got)[0] is P1 and list(got)[1] is P2
    assert_same(got[P1], want[P1])
    assert_same(got[P2], want[P2])


def test_equal_valued_key_tensors_are_other_keys():
    # One-element tensors of equal values: == between them is True, but a dict holds them as
    # two keys, and the guard on the dict's keys must tell them apart too.
    def f(d):
        for k in d:
            k.mul_(2)
        return len(d)

    opt = kiln.compile(f, backend=CompileCounter())
    a = torch.ones(1)
    opt({a: 0})
    b = torch.full((1,), 2.0)  # == a now
    opt({b: 0})
    assert a.item() == 2.0 and b.item() == 4.0


def test_keys_across_a_graph_break_and_returned():
    def f(x):
        y = x + 1
        d = {y: 1, x: 2}
        print("break")
        d[y] = d[y] + d[x]
        return y, d

    opt = kiln.compile(f, backend=CompileCounter())
    x = t(3)
    y, d = opt(x)
    keys = list(d)
    assert keys[0] is y and keys[1] is x and list(d.values()) == [3, 2]
    assert_same(y, x + 1)


class _Token:
    """Hashed by identity; an argument of it is guarded by type only."""


_GLOBAL_TOKEN = _Token()


def _looks_up_the_global_token(x, token):
    d = {token: 1}
    return x + d.get(_GLOBAL_TOKEN, 0)


def test_a_lookup_by_a_pinned_key_in_a_dict_keyed_by_an_argument_is_guarded():
    """The global key is pinned by its own guard, the argument key is not: whether they are one
    object is guarded, so another argument misses the key as eager does."""
    x = torch.zeros(2)
    opt = kiln.compile(_looks_up_the_global_token, backend="eager")
    for token in (_GLOBAL_TOKEN, _Token(), _GLOBAL_TOKEN):
        torch.testing.assert_close(opt(x, token), _looks_up_the_global_token(x, token))
