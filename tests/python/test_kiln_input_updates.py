"""Graphs that update their inputs in place, through the "kiln" backend: the plan writes each
updated input (the caller's own tensor, or a module's buffer) after its last step, as eager's
in-place ops left it, where the whole graph ran eagerly before. Results, the inputs afterwards
and what aliases what, against eager on the same inputs."""
import logging

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def fresh(kilnd_cache):
    kiln.reset()
    yield
    kiln.reset()


def compiled_like_eager(caplog, fn, *inputs):
    """fn on clones of `inputs` eagerly and through kiln (no_grad): returns (kiln's result, the
    inputs kiln updated, eager's result, the inputs eager updated), after checking that kilnd
    compiled the graph with its input updates and nothing ran eagerly."""
    eager_inputs = [t.clone() for t in inputs]
    kiln_inputs = [t.clone() for t in inputs]
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln"):
        expected = fn(*eager_inputs)
        out = kiln.compile(fn, backend="kiln")(*kiln_inputs)
    assert not [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    (art,) = kiln.debug.artifacts()
    assert len(art.body.plan.input_updates) >= 1
    torch.testing.assert_close(out, expected)
    for k, e in zip(kiln_inputs, eager_inputs):
        assert k.shape == e.shape and k.stride() == e.stride()
        torch.testing.assert_close(k, e)
    return out, kiln_inputs, expected, eager_inputs


def test_in_place_ops_on_an_input_and_on_a_view_of_it_write_the_input(caplog):
    def f(x, y):
        x[:, 0].copy_(y)
        x.add_(1)
        x[1:, 2:] *= 2
        return x * y.unsqueeze(1)

    compiled_like_eager(caplog, f, torch.randn(3, 4), torch.randn(3))


def test_the_input_read_before_its_update_is_its_old_value(caplog):
    def f(x):
        before = x * 2
        x.sub_(x.mean())
        return before + x

    compiled_like_eager(caplog, f, torch.randn(5, 6))


def test_an_updated_input_returned_is_the_callers_tensor(caplog):
    def f(x):
        x.mul_(3).add_(1)
        return x

    out, (x,), _, _ = compiled_like_eager(caplog, f, torch.randn(7))
    assert out is x


def test_a_view_of_an_updated_input_returned_aliases_the_input(caplog):
    def f(x):
        x.add_(1)
        return x[1], x.sum()

    (row, _), (x,), _, _ = compiled_like_eager(caplog, f, torch.randn(3, 4))
    row.zero_()  # as eager's row, a view of x
    assert (x[1] == 0).all()


@pytest.mark.parametrize("update", ["unsqueeze_", "t_", "transpose_"])
def test_an_input_whose_layout_changes_in_place_gets_the_new_layout(caplog, update):
    def f(x):
        if update == "unsqueeze_":
            x.unsqueeze_(0)
        elif update == "t_":
            x.t_()
        else:
            x.transpose_(0, 1)
        return x + 1, x

    (_, same), (x,), _, _ = compiled_like_eager(caplog, f, torch.randn(3, 4))
    assert same is x


def test_an_in_place_activation_of_a_non_contiguous_input(caplog):
    def f(x):
        torch.relu_(x)
        return x.sum(0)

    compiled_like_eager(caplog, f, torch.randn(6, 5).t())


def test_a_graph_break_makes_an_intermediate_an_input_updated_in_place(caplog):
    def f(x):
        y = torch.tanh(x) * 3
        kiln.graph_break()
        y.relu_()
        return y + 1

    x = torch.randn(4, 4)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln"):
        expected = f(x)
        out = kiln.compile(f, backend="kiln")(x)
    torch.testing.assert_close(out, expected)
    assert not [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    arts = kiln.debug.artifacts()
    assert len(arts) == 2 and any(a.body.plan.input_updates for a in arts)


def test_batch_norm_in_training_mode_updates_its_running_statistics_like_eager(caplog):
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))
    model.load_state_dict(eager.state_dict())
    compiled = kiln.compile(model, backend="kiln")
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(3):  # the buffers the plan wrote are read back by the next call
            x = torch.randn(8, 6)
            torch.testing.assert_close(compiled(x), eager(x))
    assert not [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    for be, bk in zip(eager.buffers(), model.buffers()):  # mean, var, num_batches_tracked
        torch.testing.assert_close(bk, be)
    (art,) = kiln.debug.artifacts()
    assert len(art.body.plan.input_updates) == 3


def test_dropout_of_a_model_in_training_mode_draws_eagers_numbers(caplog):
    drop = torch.nn.Dropout(0.4)

    def f(x):
        return drop(x) * 2

    x = torch.randn(64, 64)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln"):
        torch.manual_seed(5)
        expected = f(x)
        compiled = kiln.compile(f, backend="kiln")
        torch.manual_seed(5)
        out = compiled(x)
    torch.testing.assert_close(out, expected)
    # The plan drew them (an eager fallback under the same seed would match too).
    assert not [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    art = kiln.debug.artifact(f)
    assert art is not None and "bernoulli" in kiln.debug.format_artifact(art)


@pytest.mark.parametrize("pooling", ["adaptive_avg_pool2d", "AdaptiveAvgPool2d"])
def test_a_value_the_graph_restrides_in_place_is_compiled_as_a_view(caplog, pooling):
    """ATen's adaptive_avg_pool2d to 1x1 of a channels-last input restrides its mean in place
    (as_strided_, below functionalization): no write into anything the caller holds, so the graph
    is compiled, with eager's values and layouts (convnext's and swin's heads)."""
    pool = torch.nn.AdaptiveAvgPool2d(1)

    def f(x, w):
        x = torch.nn.functional.gelu(x * 2)
        pooled = torch.nn.functional.adaptive_avg_pool2d(x, 1) if pooling[0] == "a" \
            else pool(x)
        return pooled.flatten(1) @ w, pooled

    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    w = torch.randn(8, 3)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln"):
        expected = f(x, w)
        out = kiln.compile(f, backend="kiln")(x, w)
    assert not [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    assert len(kiln.debug.artifacts()) == 1
    torch.testing.assert_close(out, expected)
    assert out[1].stride() == expected[1].stride()
