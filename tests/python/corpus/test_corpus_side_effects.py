"""Side effects a compiled frame must replay exactly as eager: mutation of Python containers
and objects passed in, attribute and global assignment, aliasing between arguments, and the
order of mutations around graph breaks."""
import logging

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.testing import CompileCounter

from .harness import Corpus, clone_tree, t

corpus = Corpus()


# Mutating a list from outside the frame: its final items are assigned into it after the graph.
@corpus((3,), lambda: [], frames=1, breaks=0)
def append_to_list_argument(x, acc):
    acc.append(x * 2)
    return x + 1


# Storing into and deleting from a dict from outside the frame: its final items, in their order,
# put back into it after the graph.
@corpus((3,), lambda: {"old": torch.zeros(3)}, frames=1, breaks=0)
def store_into_dict_argument(x, cache):
    cache["new"] = x.exp()
    del cache["old"]
    return len(cache)


@corpus((3,), lambda: [t(3), t(3)], frames=1, breaks=0)
def replace_list_argument_elements(x, xs):
    xs[0] = xs[0] + x
    xs.pop()
    xs.extend([x, x * 3])
    return xs[-1]


@corpus((3,), lambda: [1, 2], frames=1, breaks=0)
def int_list_argument_mutated(x, sizes):
    sizes.append(len(sizes) + 1)
    return x * sum(sizes)


@corpus((4,), frames=2, breaks=1)
def inplace_mutation_before_and_after_break(x):
    x.add_(1)
    print("corpus: between mutations")
    x.mul_(2)
    return x.sum()


# The first append is replayed before the print (its break), the second after the resume's graph.
@corpus((4,), lambda: [], frames=2, breaks=1)
def list_argument_appended_across_break(x, log):
    log.append(x + 1)
    print("corpus: break with a pending append")
    log.append(x * 2)
    return len(log)


# In the resume function `outs` comes from outside: its append is replayed into it.
@corpus((3,), frames=2, breaks=1)
def local_list_carried_across_break(x):
    outs = [x.sin()]
    print("corpus: local list")
    outs.append(x.cos())
    return torch.stack(outs)


# In the resume function `d` comes from outside: its store is put back into it after the graph.
@corpus((3,), frames=2, breaks=1)
def local_dict_carried_across_break(x):
    d = {"a": x + 1}
    d["b"] = x * 2
    print("corpus: local dict")
    d["c"] = d["a"] - d["b"]
    return d


@corpus((3, 3), frames=2, breaks=1)
def view_of_input_mutated_after_break(x):
    row = x[0]
    y = x.sum()
    print("corpus: view")
    row.zero_()
    return x, y


@corpus((4,), frames=2, breaks=1)
def mutated_input_then_item(x):
    x.mul_(-1)
    m = x.max().item()
    return x + m


class _State:
    def __init__(self):
        self.steps = 0
        self.last = None

    def __eq__(self, other):
        if self.steps != other.steps or (self.last is None) != (other.last is None):
            return False
        return self.last is None or torch.equal(self.last, other.last)


# Assignments to attributes of a user object: read back by the trace, replayed after the graph
# (state compared with eager's after each call).
@corpus((3,), lambda: _State(), frames=1, breaks=0)
def object_attribute_assignment(x, state):
    state.steps += 1
    state.last = x * 2
    return x + state.steps



@corpus((3,), lambda: _State(), frames=2, breaks=1)
def object_attribute_assignment_around_a_break(x, state):
    state.steps += 1
    state.last = x * 2
    print("corpus: a break after the stores")  # the break sees them made
    state.steps += 10
    return x + state.steps


def _swap_through(x, state):
    before = state.last  # read, then replaced: the return gives what was read
    state.last = x * 3
    state.steps = 7
    return before


@corpus((3,), lambda: _State(), frames=1, breaks=0)
def attribute_read_then_replaced_returns_what_was_read(x, state):
    state.last = x + 1
    return _swap_through(x, state), state.last


COUNTER = 0


def _bump_global(x):
    global COUNTER
    COUNTER += 1
    return x * 2


def test_global_assignment_is_replayed_every_call():
    global COUNTER
    COUNTER = 0
    cnt = CompileCounter()
    opt = kiln.compile(_bump_global, backend=cnt)
    x = torch.randn(3)
    for i in range(3):
        torch.testing.assert_close(opt(x), x * 2)
        assert COUNTER == i + 1  # (global assignment is not among the supported forms: the
        # frame may run eagerly, so the graph count is not asserted)


class _Cache(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.cached = None

    def forward(self, x):
        y = self.lin(x)
        self.cached = y.detach()
        return y


def test_module_attribute_assigned_in_forward():
    model = _Cache()
    opt = kiln.compile(model, backend=CompileCounter())
    x = torch.randn(2, 3)
    y = opt(x)
    assert model.cached is not None
    torch.testing.assert_close(model.cached, y.detach())
    torch.testing.assert_close(y, model.lin(x))


def _two_mutations(a, b):
    a.add_(1)
    b.mul_(2)
    return a + b


def test_aliased_arguments_mutated_in_place():
    x = torch.randn(4)
    want_x = x.clone()
    want = _two_mutations(want_x, want_x)
    cnt = CompileCounter()
    opt = kiln.compile(_two_mutations, backend=cnt)
    got_x = x.clone()
    got = opt(got_x, got_x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_x, want_x)


def test_aliased_arguments_after_unaliased_call_are_right():
    cnt = CompileCounter()
    opt = kiln.compile(_two_mutations, backend=cnt)
    a, b = torch.randn(4), torch.randn(4)
    ea, eb = a.clone(), b.clone()
    torch.testing.assert_close(opt(a, b), _two_mutations(ea, eb))
    x = torch.randn(4)
    ex = x.clone()
    torch.testing.assert_close(opt(x, x), _two_mutations(ex, ex))
    torch.testing.assert_close(x, ex)


def _view_and_base(base, view):
    view.add_(10)
    return base.sum()


def test_argument_that_is_a_view_of_another_argument():
    x = torch.randn(3, 3)
    ex = x.clone()
    want = _view_and_base(ex, ex[1])
    opt = kiln.compile(_view_and_base, backend=CompileCounter())
    got = opt(x, x[1])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x, ex)


def _set_grad_off(x):
    torch.set_grad_enabled(False)
    return x * 2


def test_set_grad_enabled_inside_frame_persists_like_eager():
    x = torch.randn(3, requires_grad=True)
    try:
        want = _set_grad_off(x)
        eager_state = torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)
    opt = kiln.compile(_set_grad_off, backend=CompileCounter())
    try:
        got = opt(x)
        kiln_state = torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)
    assert kiln_state == eager_state
    assert got.requires_grad == want.requires_grad
    torch.testing.assert_close(got, want)


def _random_ops(x):
    noise = torch.randn_like(x)
    mask = torch.rand(x.shape) > 0.5
    return torch.nn.functional.dropout(x + noise, p=0.3, training=True) * mask


def test_random_ops_follow_the_global_generator_like_eager():
    x = torch.randn(5, 5)
    torch.manual_seed(123)
    want = _random_ops(x)
    want_next = torch.rand(3)
    opt = kiln.compile(_random_ops, backend=CompileCounter())
    torch.manual_seed(123)
    got = opt(x)
    got_next = torch.rand(3)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_next, want_next)


def _generator_state_calls(x):
    state = torch.get_rng_state()
    before = torch.rand(10) + x
    torch.set_rng_state(state)
    after = torch.rand(10) + x
    torch.manual_seed(9000)
    return before, after, torch.randn(3) * x


def test_generator_state_set_inside_the_frame_draws_and_leaves_numbers_as_eager():
    # get_rng_state, set_rng_state and manual_seed between random ops: the graphs draw the
    # numbers eager draws, and the generator is left where eager leaves it.
    x = torch.randn(1)
    opt = kiln.compile(_generator_state_calls, backend=CompileCounter())
    for seed in range(3):
        torch.manual_seed(seed)
        want, want_next = _generator_state_calls(x), torch.rand(4)
        torch.manual_seed(seed)
        got, got_next = opt(x), torch.rand(4)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
        assert torch.equal(got_next, want_next)


def _mutate_returns_input(x):
    x.sub_(1)
    return x


def test_returned_input_is_the_same_object():
    x = torch.randn(3)
    opt = kiln.compile(_mutate_returns_input, backend=CompileCounter())
    assert opt(x) is x


def _returns_same_tensor_twice(x):
    y = x + 1
    return y, y


def test_returned_tensor_identity_is_kept():
    opt = kiln.compile(_returns_same_tensor_twice, backend=CompileCounter())
    a, b = opt(torch.randn(3))
    assert a is b


def _catches_index_error(x):
    try:
        v = [1, 2][5]
    except IndexError:
        v = 3
    return x * v


def test_exception_raised_and_caught_inside_frame():
    x = torch.randn(3)
    opt = kiln.compile(_catches_index_error, backend=CompileCounter())
    torch.testing.assert_close(opt(x), x * 3)


def _raises(x):
    y = x + 1
    if y.dim() == 1:
        raise ValueError("corpus: expected")
    return y


def test_exception_raised_out_of_compiled_frame_propagates():
    opt = kiln.compile(_raises, backend=CompileCounter())
    with pytest.raises(ValueError, match="corpus: expected"):
        opt(torch.randn(3))


@torch.no_grad()
def _no_grad_helper(x):
    return x * 2


def _calls_no_grad_helper(x):
    return _no_grad_helper(x) + x


def test_no_grad_decorated_helper():
    x = torch.randn(3, requires_grad=True)
    want = _calls_no_grad_helper(x)
    got = kiln.compile(_calls_no_grad_helper, backend=CompileCounter())(x)
    torch.testing.assert_close(got, want)
    assert got.requires_grad == want.requires_grad
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _logs_between_ops(x):
    y = x * 2
    _ENABLED_LOG.info("corpus: value %d", 3)
    return y + 1


_ENABLED_LOG = logging.getLogger("kiln_corpus.enabled")


def test_enabled_logger_delivers_every_record():
    handler = _ListHandler()
    _ENABLED_LOG.addHandler(handler)
    _ENABLED_LOG.setLevel(logging.INFO)
    _ENABLED_LOG.propagate = False
    try:
        cnt = CompileCounter()
        opt = kiln.compile(_logs_between_ops, backend=cnt)
        x = torch.randn(3)
        for _ in range(2):
            torch.testing.assert_close(opt(x), x * 2 + 1)
        assert handler.messages == ["corpus: value 3"] * 2
        assert cnt.frame_count == 2  # logging is a break: x * 2 | log call | y + 1
    finally:
        _ENABLED_LOG.removeHandler(handler)


# -- assignments to module globals (STORE_GLOBAL) ------------------------------------------------

_COUNTER = 0
_SEEN = []


def _next_id():
    global _COUNTER
    _COUNTER += 1
    return _COUNTER


def _numbers_then_scales(x):
    global _COUNTER
    n = _next_id()  # a store in an inlined function, read back by the frame below
    y = x * n
    _COUNTER = _COUNTER + 10
    return y + _COUNTER


def _store_then_break(x):
    global _COUNTER
    _COUNTER = 7
    _SEEN.append(_read_counter())  # a graph break: it must see the store
    return x + _COUNTER


def _read_counter():
    print("corpus: reads the global")
    return _COUNTER


@pytest.mark.parametrize("start", [0, 5])
def test_a_global_assigned_in_the_frame_is_read_back_and_left_as_eager_leaves_it(start):
    global _COUNTER
    x = torch.randn(3)
    _COUNTER = start
    want = _numbers_then_scales(x)
    want_counter = _COUNTER
    cnt = CompileCounter()
    opt = kiln.compile(_numbers_then_scales, backend=cnt)
    for _ in range(2):
        _COUNTER = start
        torch.testing.assert_close(opt(x), want)
        assert _COUNTER == want_counter
    assert cnt.frame_count == 1


def test_a_global_assigned_before_a_graph_break_is_assigned_when_the_break_runs():
    global _COUNTER
    _SEEN.clear()
    _COUNTER = 0
    x = torch.randn(3)
    cnt = CompileCounter()
    got = kiln.compile(_store_then_break, backend=cnt)(x)
    torch.testing.assert_close(got, x + 7)
    assert _SEEN == [7] and _COUNTER == 7
    assert cnt.frame_count == 1  # x + _COUNTER, after the break


def test_a_global_assigned_by_a_function_of_another_module():
    import types

    module = types.ModuleType("kiln_corpus_other_module")
    exec("calls = 0\n"
         "def tick(t):\n"
         "    global calls\n"
         "    calls = calls + 1\n"
         "    return t * calls\n", module.__dict__)

    def f(x):
        return module.tick(x) + module.tick(x)

    x = torch.randn(2)
    module.calls = 0
    want = f(x)
    module.calls = 0
    cnt = CompileCounter()
    got = kiln.compile(f, backend=cnt)(x)
    torch.testing.assert_close(got, want)
    assert module.calls == 2 and cnt.frame_count == 1
    assert kiln.explain(f)(x).graph_break_count == 0
