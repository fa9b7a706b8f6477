"""kiln.export's graph module as TorchDynamo's export and torch.export make it: it takes the
function's pytree-flattened inputs (numbers and tensors it never reads included), returns the
function's structure (an input returned as the input), holds tensors read from elsewhere, and
its nodes carry the user's stack where the capture gives it. Every exported graph is compared
with eager on random inputs. (export's refusals and the seed's examples are in
test_graph_breaks.py.)"""
import pytest
import torch
import torch.utils._pytree as pytree

import kiln


def _assert_same(got, want):
    flat_got, spec_got = pytree.tree_flatten(got)
    flat_want, spec_want = pytree.tree_flatten(want)
    assert spec_got == spec_want
    for g, w in zip(flat_got, flat_want):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w


def _placeholders(gm):
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def _dupes(x):
    y = x + 1
    return y, y


def _structured(x, k: int):
    y = x * k
    return {"y": y, "k": k, "pair": (y.sin(), None), "x": x}


@pytest.mark.parametrize("aten_graph", [False, True])
@pytest.mark.parametrize("fn,args", [(_dupes, (torch.randn(3),)),
                                     (_structured, (torch.randn(3), 2))],
                         ids=["a_tensor_returned_twice", "dict_with_constants_and_an_input"])
def test_an_exported_graph_returns_what_the_function_returns(fn, args, aten_graph):
    gm, _ = kiln.export(fn, *args, aten_graph=aten_graph)
    other = tuple(torch.randn(3) if isinstance(a, torch.Tensor) else a for a in args)
    got = gm(*other)
    _assert_same(got, fn(*other))
    if fn is _dupes:
        assert got[0] is got[1]  # one tensor returned twice, as the function does
    else:
        assert got["x"] is other[0]  # an input returned as the input


def _items(a, b):
    # A graph-computed 0.0 / 0 and constant 0s of the same value side by side: the exported
    # graph must return the computed ones from its inputs and the constants as constants.
    return a, b[0].item() + a[0].item(), 0.0, b.long()[1].item(), 0, a


@pytest.mark.parametrize("aten_graph", [False, True])
def test_an_exported_graph_returns_the_numbers_it_computes_not_their_values_at_export(
        monkeypatch, aten_graph):
    monkeypatch.setattr(kiln.config, "capture_scalar_outputs", True)
    # Captured on zeros: every item() is 0 there.
    gm, _ = kiln.export(_items, torch.zeros(4), torch.zeros(4), aten_graph=aten_graph)
    a, b = torch.randn(4), torch.randn(4) * 10
    got = gm(a, b)
    _assert_same(got, _items(a, b))
    assert got[0] is a and got[5] is a


def _scaled(x, unread, k, pair, *, bias):
    return x * k + pair[1] + bias


@pytest.mark.parametrize("aten_graph", [False, True])
def test_an_exported_graph_takes_every_flattened_input_numbers_and_unread_tensors_included(
        aten_graph):
    args = (torch.randn(3), torch.randn(3), 4, [torch.randn(3), torch.randn(3)])
    kwargs = {"bias": torch.randn(3)}
    gm, _ = kiln.export(_scaled, *args, aten_graph=aten_graph, **kwargs)
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    assert _placeholders(gm) == ["x", "unread", "k", "pair_0", "pair_1", "bias"]
    assert gm._in_spec == in_spec
    _assert_same(gm(*leaves), _scaled(*args, **kwargs))
    # Other tensors of the same shapes: the graph computes; the number was specialised on.
    args2 = (torch.randn(3), torch.randn(3), 4, [torch.randn(3), torch.randn(3)])
    kwargs2 = {"bias": torch.randn(3)}
    _assert_same(gm(*pytree.tree_flatten((args2, kwargs2))[0]), _scaled(*args2, **kwargs2))


def _first_squared_and_the_list(x):
    first = x[2]
    return first * first, x


@pytest.mark.parametrize("aten_graph", [False, True])
def test_an_exported_graph_returns_an_input_list_as_the_inputs_it_was_given(aten_graph):
    inp = [torch.randn(2) for _ in range(4)]
    gm, _ = kiln.export(_first_squared_and_the_list, inp, aten_graph=aten_graph)
    other = [torch.randn(2) for _ in range(4)]
    got = gm(*other)
    _assert_same(got, _first_squared_and_the_list(other))
    assert all(g is o for g, o in zip(got[1], other))  # the very tensors, as eager returns them


_OFFSET = torch.randn(3)


def _plus_global(x):
    return x + _OFFSET, _OFFSET


def test_a_tensor_read_from_a_global_is_held_by_the_exported_graph():
    gm, _ = kiln.export(_plus_global, torch.randn(3))
    assert _placeholders(gm) == ["x"]
    x = torch.randn(3)
    got = gm(x)
    _assert_same(got, _plus_global(x))
    assert got[1] is _OFFSET or torch.equal(got[1], _OFFSET)


def _linear_relu(x, linear):
    x = x + 1
    return linear(x.t().relu())


def test_exported_nodes_carry_the_stack_the_capture_gives_them_through_aten_graphs_too():
    # Each node's stack_trace is where the traced code was when it recorded the node: the line
    # of the function, or of Linear.forward inlined into it; an ATen node keeps its source's.
    x, linear = torch.randn(2, 2), torch.nn.Linear(2, 2)
    gm, _ = kiln.export(_linear_relu, x, linear)
    aten, _ = kiln.export(_linear_relu, x, linear, aten_graph=True)
    for g in (gm, aten):
        nodes = [n for n in g.graph.nodes if n.op not in ("placeholder", "output")]
        assert nodes and all(n.stack_trace for n in nodes)
        added = [n for n in nodes if n.name == "add"]
        assert added and all("in _linear_relu" in n.stack_trace and "x = x + 1" in n.stack_trace
                             for n in added)
        linear_nodes = [n for n in nodes if n.op == "get_attr" or "linear" in str(n.target)
                        or "addmm" in str(n.target)]
        assert linear_nodes and all("in forward" in n.stack_trace and "F.linear" in n.stack_trace
                                    for n in linear_nodes)
    x2 = torch.randn(2, 2)
    for g in (gm, aten):
        torch.testing.assert_close(g(x2, linear), _linear_relu(x2, linear))


def test_export_options_that_do_not_go_together_are_also_torch_s_assertion_errors():
    with pytest.raises(AssertionError, match="aten_graph=True"):
        kiln.export(_plus_global, torch.randn(2), decomposition_table={})
    with pytest.raises(ValueError, match="static"):
        kiln.export(_plus_global, torch.randn(2), aten_graph=True, tracing_mode="symbolic")
