"""Tensor subclasses that override __torch_function__: their ops are captured through the
override (its Python inlined, torch.Tensor's own modelled) and return what eager returns, of the
class eager gives; the override runs as often, and with the functions, eager's dispatch gives
it. What kiln cannot send through the override breaks the graph. Every case is compared with
eager on random inputs."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.testing import CompileCounter

SEEN = []  # the functions the overrides below were called with, in order


class Logged(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        SEEN.append(func.__name__)
        return super().__torch_function__(func, types, args, kwargs)


class Inherited(torch.Tensor):
    """torch.Tensor's own __torch_function__: results of its ops are Inherited."""


class RefusesAdd(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.add:
            return NotImplemented
        return super().__torch_function__(func, types, args, kwargs)


def _of(cls, *shape):
    return torch.randn(*shape).as_subclass(cls)


def _assert_same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got.as_subclass(torch.Tensor), want.as_subclass(torch.Tensor))
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w)
    else:
        assert got == want


def _run_both(fn, make_args, **compile_kwargs):
    """fn eagerly and compiled (twice: the capturing call and the entry's), on the same inputs;
    checks the results and the overrides' calls match. Returns the compiled results, their
    arguments and the counter."""
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, **compile_kwargs)
    for _ in range(2):
        eager_args = make_args()
        args = tuple(a.detach().clone().as_subclass(type(a)) for a in eager_args)
        SEEN.clear()
        want = fn(*eager_args)
        want_seen = list(SEEN)
        SEEN.clear()
        got = compiled(*args)
        assert SEEN == want_seen
        _assert_same(got, want)
    return got, args, counter


def _sigmoids(x):
    x = F.sigmoid(x)  # Python: dispatches at its x.sigmoid()
    x = F.sigmoid(x)
    x = x.sigmoid()
    return x.sigmoid()


def test_a_subclass_s_override_is_traced_into_and_its_results_are_of_the_subclass():
    _, _, counter = _run_both(_sigmoids, lambda: (_of(Logged, 4),), fullgraph=True)
    assert counter.frame_count == 1 and counter.op_count == 4
    assert SEEN == ["sigmoid"] * 4


def _mixed(x, y):
    return (torch.add(x, y), torch.mul(y, x), F.relu(x), torch.cat([y, x]), x.split(2),
            torch.mm(x.view(2, 2), y.view(2, 2)))


@pytest.mark.parametrize("cls", [Logged, Inherited])
def test_ops_mixing_subclass_and_plain_tensors_are_of_the_subclass_as_in_eager(cls):
    _, _, counter = _run_both(_mixed, lambda: (_of(cls, 4), torch.randn(4)), fullgraph=True)
    assert counter.frame_count == 1


def _identities(x):
    y = x.sigmoid()
    z = x.add_(1)
    return x, y, y, z is x, z


def test_an_input_returned_an_in_place_result_and_a_result_returned_twice_keep_identity():
    got, (x,), _ = _run_both(_identities, lambda: (_of(Logged, 3),), fullgraph=True)
    assert got[0] is x and got[4] is x and got[1] is got[2]


def _operator_and_property(x, y):
    z = (x + y).sigmoid()
    return z * 2, z.shape, z.dtype


def test_an_operator_or_a_property_read_through_an_override_breaks_the_graph():
    _run_both(_operator_and_property, lambda: (_of(Logged, 3), torch.randn(3)))
    kiln.reset()
    with pytest.raises(kiln.exc.Unsupported):
        kiln.compile(_operator_and_property, backend="eager", fullgraph=True)(
            _of(Logged, 3), torch.randn(3))


def _add_of_classes(x, y):
    return torch.add(x, y)


@pytest.mark.parametrize("classes", [(RefusesAdd, RefusesAdd), (Logged, Inherited)])
def test_overrides_that_all_return_not_implemented_raise_type_error_as_in_eager(classes):
    make = lambda: (_of(classes[0], 3), _of(classes[1], 3))  # noqa: E731
    with pytest.raises(TypeError):
        _add_of_classes(*make())
    with pytest.raises(TypeError):
        kiln.compile(_add_of_classes, backend="eager")(*make())


def _loss(x, w):
    return torch.mm(x, w).sigmoid().sum(0)


def test_gradients_flow_to_a_subclass_input_as_in_eager():
    x = _of(Logged, 3, 4).requires_grad_()
    w = torch.randn(4, 2, requires_grad=True)
    want = _loss(x, w)
    want.sum().backward()
    x2 = x.detach().clone().as_subclass(Logged).requires_grad_()
    w2 = w.detach().clone().requires_grad_()
    got = kiln.compile(_loss, backend="eager", fullgraph=True)(x2, w2)
    got.sum().backward()
    _assert_same(got.detach(), want.detach())
    torch.testing.assert_close(x2.grad, x.grad)
    torch.testing.assert_close(w2.grad, w.grad)


def _from_the_class(x, y):
    return torch.Tensor.add(x, y), torch.Tensor.sigmoid(x)


@pytest.mark.parametrize("cls", [torch.Tensor, Logged])
def test_a_tensor_method_taken_from_the_class_is_called_on_its_first_argument(cls):
    _, _, counter = _run_both(_from_the_class, lambda: (_of(cls, 3), torch.randn(3)),
                              fullgraph=True)
    assert counter.frame_count == 1
