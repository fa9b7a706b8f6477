"""Exceptions that the trace knows are raised, caught inside the traced code: a missing key of a
guarded dict (os.environ.get of an unset variable), a missing attribute, `raise ValueError` in an
inlined call caught by its caller. Each is one graph with no break where the frame broke or ran
eagerly before; what the trace cannot model exactly (a `with` block's __exit__, a generator)
still runs eagerly, and an exception no traced frame catches reaches the caller as eager's.
Last, opcodes the same library code reaches: a set comprehension, `yield from`, `del` of a cell."""
import os

import pytest
import torch

import kiln
from kiln.testing import CompileCounter

_VAR = "KILN_TEST_EXCEPTIONS_IN_CAPTURE"


@pytest.fixture
def unset_var():
    saved = os.environ.pop(_VAR, None)
    yield _VAR
    os.environ.pop(_VAR, None)
    if saved is not None:
        os.environ[_VAR] = saved


def compiled(fn):
    cnt = CompileCounter()
    return kiln.optimize(cnt)(fn), cnt


def assert_one_graph_no_break(fn, *args):
    out = kiln.explain(fn)(*args)
    assert out.graph_break_count == 0, [str(r) for r in out.break_reasons]
    assert out.graph_count == 1


def sdpa_scale(x):
    # transformers reads its switches this way inside the functions kiln inlines.
    if os.environ.get(_VAR) is None:
        return x * 2
    return x * int(os.environ.get(_VAR))


def test_environ_get_of_an_unset_variable_is_one_graph(unset_var):
    x = torch.randn(4)
    fn, cnt = compiled(sdpa_scale)
    torch.testing.assert_close(fn(x), sdpa_scale(x))
    assert cnt.frame_count == 1
    assert_one_graph_no_break(sdpa_scale, x)


def test_environ_get_recompiles_when_the_variable_is_set_and_unset_again(unset_var):
    x = torch.randn(4)
    fn, cnt = compiled(sdpa_scale)
    torch.testing.assert_close(fn(x), sdpa_scale(x))
    os.environ[unset_var] = "5"
    torch.testing.assert_close(fn(x), sdpa_scale(x))  # the environment's keys are guarded
    assert cnt.frame_count == 2
    del os.environ[unset_var]
    torch.testing.assert_close(fn(x), sdpa_scale(x))
    assert cnt.frame_count == 2  # the first entry serves again
    assert_one_graph_no_break(sdpa_scale, x)
    os.environ[unset_var] = "5"
    assert_one_graph_no_break(sdpa_scale, x)


def env_switches(x):
    # The other ways a library reads its switches: `in`, [] (KeyError caught), os.getenv.
    y = x * (3 if _VAR in os.environ else 4)
    try:
        y = y + int(os.environ[_VAR])
    except KeyError:
        y = y - 1
    return y + (1 if os.getenv(_VAR + "_OTHER") is None else 2)


def test_environ_lookups_are_guarded_on_the_variables_read_alone(unset_var):
    x = torch.randn(4)
    fn, cnt = compiled(env_switches)
    torch.testing.assert_close(fn(x), env_switches(x))
    os.environ[_VAR + "_UNRELATED"] = "1"  # a variable the function never reads
    try:
        torch.testing.assert_close(fn(x), env_switches(x))
        assert cnt.frame_count == 1
    finally:
        del os.environ[_VAR + "_UNRELATED"]
    os.environ[unset_var] = "7"
    torch.testing.assert_close(fn(x), env_switches(x))
    assert cnt.frame_count == 2
    os.environ[unset_var] = "8"  # its value is guarded, not only its presence
    torch.testing.assert_close(fn(x), env_switches(x))
    assert cnt.frame_count == 3
    os.environ[_VAR + "_OTHER"] = "x"
    try:
        torch.testing.assert_close(fn(x), env_switches(x))
        assert cnt.frame_count == 4
    finally:
        del os.environ[_VAR + "_OTHER"]
    assert_one_graph_no_break(env_switches, x)


def lookup_or_default(x, d):
    try:
        scale = d["scale"]
    except KeyError:
        scale = 3
    return x * scale


def test_try_except_keyerror_over_a_dict_from_outside():
    x = torch.randn(4)
    fn, cnt = compiled(lookup_or_default)
    torch.testing.assert_close(fn(x, {"other": 1}), lookup_or_default(x, {"other": 1}))
    torch.testing.assert_close(fn(x, {"scale": 5}), lookup_or_default(x, {"scale": 5}))
    assert cnt.frame_count == 2  # the key's presence is guarded
    assert_one_graph_no_break(lookup_or_default, x, {"other": 1})


def pop_and_index(x, n):
    d = {"a": x}
    items = [x, x * 2]
    try:
        d.pop("b")
    except KeyError as e:
        x = x + len(e.args)
    try:
        x = x + items[n]
    except IndexError:
        x = x - 1
    return x


def test_keyerror_and_indexerror_of_containers_the_frame_made():
    x = torch.randn(4)
    fn, cnt = compiled(pop_and_index)
    for n in (1, 5):
        torch.testing.assert_close(fn(x, n), pop_and_index(x, n))
    assert cnt.frame_count == 2
    assert_one_graph_no_break(pop_and_index, x, 5)


class Config:
    def __init__(self):
        self.hidden = 4


def attribute_or_default(x, config):
    try:
        eps = config.layer_norm_eps
    except AttributeError:
        eps = 0.5
    return x + eps


def test_getattr_fallback_through_except_attributeerror():
    x = torch.randn(4)
    config = Config()
    fn, cnt = compiled(attribute_or_default)
    torch.testing.assert_close(fn(x, config), attribute_or_default(x, config))
    config.layer_norm_eps = 0.25  # the attribute's absence is guarded
    torch.testing.assert_close(fn(x, config), attribute_or_default(x, config))
    assert cnt.frame_count == 2
    assert_one_graph_no_break(attribute_or_default, x, Config())


def check_rank(x):
    if x.dim() != 2:
        raise ValueError(f"expected a matrix, got {x.dim()} dimensions")
    return x


def as_matrix(x):
    try:
        x = check_rank(x)
    except ValueError as e:
        x = x.reshape(2, -1) * len(e.args)
    return x.sum(0)


def test_value_error_raised_in_an_inlined_call_is_caught_by_its_caller():
    fn, cnt = compiled(as_matrix)
    for x in (torch.randn(2, 3), torch.randn(6)):
        torch.testing.assert_close(fn(x), as_matrix(x))
    assert cnt.frame_count == 2  # one per rank: the raise is guarded by the shape
    assert_one_graph_no_break(as_matrix, torch.randn(6))


def read_through(d):
    try:
        return d["k"]
    finally:
        d_seen.append(len(d))


d_seen = []


def reraised(x, d):
    try:
        return x * read_through(d)
    except LookupError:  # a KeyError, re-raised by read_through's `finally`
        pass
    try:
        try:
            {}["a"]
        except KeyError:
            raise  # the exception being handled
    except (TypeError, KeyError) as e:
        x = x + len(e.args)
    try:
        try:
            {}["a"]
        except KeyError:
            raise RuntimeError("wrapped") from None
    except RuntimeError as e:
        x = x + (e.__cause__ is None) + e.__suppress_context__
    return x


def test_reraise_bare_raise_and_raise_from_inside_the_trace():
    x = torch.randn(4)
    d_seen.clear()
    want = reraised(x, {})
    fn, cnt = compiled(reraised)
    torch.testing.assert_close(fn(x, {}), want)
    assert d_seen == [0, 0]  # the `finally` ran once each time
    assert cnt.frame_count == 1
    assert_one_graph_no_break(reraised, x, {})


def raises_value_error(y):
    raise ValueError("never caught")


def caught_then_uncaught(x, d):
    try:
        scale = d["scale"]
    except KeyError:
        scale = 2
    return raises_value_error(x * scale)


def test_an_exception_no_traced_frame_catches_reaches_the_caller_as_eagers():
    x = torch.randn(4)
    with pytest.raises(ValueError, match="never caught"):
        caught_then_uncaught(x, {})
    fn, cnt = compiled(caught_then_uncaught)
    with pytest.raises(ValueError, match="never caught"):
        fn(x, {})
    assert cnt.frame_count == 1  # the graph up to the call; the call raises in Python


def in_a_with_block(x, d):
    try:
        with torch.no_grad():
            y = x * d["k"]
    except KeyError:
        y = x + 1
    return y


def items_of(d):
    yield 1
    yield d["k"]


def from_a_generator(x, d):
    try:
        return x * sum(items_of(d))
    except KeyError:
        return x - 1


class Lazy:
    @property
    def value(self):
        raise AttributeError("not yet")

    def __getattr__(self, name):
        return 7


def property_then_getattr(x, obj):
    try:
        v = obj.value  # eager calls __getattr__ after the property's AttributeError
    except AttributeError:
        v = 0
    return x + v


# Guards of what stays as it was: these ran eagerly before and still do, with eager's answer.
@pytest.mark.parametrize("fn, args", [
    (in_a_with_block, ({},)),  # __exit__ would see the exception
    (from_a_generator, ({},)),  # eager's consumer meets it only where it iterates to it
    (property_then_getattr, (Lazy(),)),
], ids=["with", "generator", "getattr_after_property"])
def test_what_the_trace_does_not_model_exactly_runs_as_eager(fn, args):
    x = torch.randn(4)
    c, _ = compiled(fn)
    torch.testing.assert_close(c(x, *args), fn(x, *args))
    assert torch.is_grad_enabled()


# -- opcodes the same library code reaches: SET_ADD, yield from, DELETE_DEREF ------------------


def set_comprehension(x, names):
    # transformers' ModelOutput.__setattr__ checks names against a set comprehension.
    upper = {n.upper() for n in names if n}
    return x * len(upper) + ("A" in upper)


def test_set_comprehension_is_one_graph():
    x = torch.randn(4)
    names = ["a", "b", "a", ""]
    fn, cnt = compiled(set_comprehension)
    torch.testing.assert_close(fn(x, names), set_comprehension(x, names))
    assert cnt.frame_count == 1
    assert_one_graph_no_break(set_comprehension, x, names)


class Bag:
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        yield 0
        done = yield from self.items  # an iterator's `yield from` is None
        yield from (done is None,)


def delegating_iter(x):
    return x + sum(Bag([1, 2])), list(Bag((3,)))


def test_yield_from_in_an_inlined_iter_is_one_graph():
    x = torch.randn(4)
    fn, cnt = compiled(delegating_iter)
    got, want = fn(x), delegating_iter(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1] == [0, 3, True]
    assert cnt.frame_count == 1
    assert_one_graph_no_break(delegating_iter, x)


def deleted_cell(x):
    y = x + 1
    get = lambda: y * 2  # noqa: E731
    z = get()
    del y  # DELETE_DEREF: `y` is a cell the lambda closes over
    return z, get


def test_del_of_a_cell_variable_is_one_graph_and_empties_the_cell():
    x = torch.randn(4)
    fn, cnt = compiled(deleted_cell)
    z, get = fn(x)
    torch.testing.assert_close(z, deleted_cell(x)[0])
    with pytest.raises(NameError):  # as eager's: the rebuilt function's cell is empty
        get()
    assert cnt.frame_count == 1
    assert_one_graph_no_break(deleted_cell, x)


class _FallsBack:
    @property
    def p(self):
        raise AttributeError("p")

    def __getattr__(self, name):  # what CPython calls after the property's AttributeError
        return 5.0


class _NoFallback:
    @property
    def p(self):
        raise AttributeError("p")


def _getattr_builtin(x, obj):
    try:
        v = getattr(obj, "p")
    except AttributeError:
        v = -1.0
    return x * v, getattr(obj, "p", 2.0)


@pytest.mark.parametrize("cls", [_FallsBack, _NoFallback])
def test_the_getattr_builtin_meets_an_attribute_error_as_load_attr_does(cls):
    # getattr() skipped LOAD_ATTR's check: the property's AttributeError went to the program's
    # except, where eager calls the class's __getattr__.
    x = torch.randn(2)
    got, want = kiln.compile(_getattr_builtin, backend="eager")(x, cls()), \
        _getattr_builtin(x, cls())
    torch.testing.assert_close(got, want)
