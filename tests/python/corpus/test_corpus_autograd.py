"""Gradients through compiled programs (with and without graph breaks) equal eager's, for
inputs and for module parameters."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.testing import CompileCounter


def _grads(fn, *inputs):
    inputs = [i.detach().clone().requires_grad_(True) for i in inputs]
    out = fn(*inputs)
    out.sum().backward()
    return out.detach(), [i.grad for i in inputs]


def _check_grads(fn, *inputs, frames):
    want, want_g = _grads(fn, *inputs)
    cnt = CompileCounter()
    got, got_g = _grads(kiln.compile(fn, backend=cnt), *inputs)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_g, want_g):
        torch.testing.assert_close(g, w)
    assert cnt.frame_count == frames


def _smooth(x, y):
    return (x.sin() * y).tanh() + x.pow(2)


def test_grad_of_straight_line_function():
    _check_grads(_smooth, torch.randn(4), torch.randn(4), frames=1)


def _with_break(x):
    y = x.exp()
    print("corpus: autograd break")
    return y * x


def test_grad_flows_across_a_graph_break():
    _check_grads(_with_break, torch.randn(4), frames=2)


def _tensor_branch(x):
    y = x * 3
    if y.sum() > 0:
        return y.relu()
    return y.sigmoid()


def test_grad_through_data_dependent_branch():
    _check_grads(_tensor_branch, torch.ones(4), frames=2)


def _inplace_on_intermediate(x):
    y = x * 2
    y.add_(1)
    y.mul_(3)
    return y


def test_grad_through_inplace_on_intermediate():
    _check_grads(_inplace_on_intermediate, torch.randn(4), frames=1)


def _detach_and_stop(x):
    return x * x.detach() + x.mean().detach()


def test_detach_stops_gradients_like_eager():
    _check_grads(_detach_and_stop, torch.randn(4), frames=1)


def _indexing_grad(x):
    return x[1:, ::2].sum() + x[0, [0, 2]].prod()


def test_grad_through_indexing():
    _check_grads(_indexing_grad, torch.randn(3, 4), frames=1)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_module_parameter_grads_equal_eager(mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    getattr(model, mode)()
    ref = copy.deepcopy(model)
    x = torch.randn(6, 4)
    ref(x).pow(2).mean().backward()
    opt = kiln.compile(model, backend=CompileCounter())
    opt(x).pow(2).mean().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    torch.testing.assert_close(model.state_dict(), ref.state_dict())


def test_training_step_with_optimizer_matches_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    ref = copy.deepcopy(model)

    def step(m, optim, x, y):
        optim.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        optim.step()
        return loss.detach()

    opt_model = kiln.compile(model, backend=CompileCounter())
    sgd, sgd_ref = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    for _ in range(3):
        x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
        torch.testing.assert_close(step(opt_model, sgd, x, y), step(ref, sgd_ref, x, y))
    torch.testing.assert_close(model.state_dict(), ref.state_dict())


def _no_grad_inside(x):
    with torch.no_grad():
        scale = x.abs().max()
    return x / scale


def test_no_grad_block_constant_in_backward():
    _check_grads(_no_grad_inside, torch.randn(5), frames=1)


def _custom_autograd_free(x, w):
    h = F.linear(x, w)
    return F.gelu(h).mean(0)


def test_weight_grad_through_functional_linear():
    _check_grads(_custom_autograd_free, torch.randn(3, 4), torch.randn(2, 4), frames=1)
