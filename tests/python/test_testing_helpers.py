"""kiln.testing's helpers and the tracker classes reachable by name from kiln.variables, as
programs written against torch._dynamo's test helpers use them."""
import collections

import pytest
import torch

import kiln
import kiln.variables
from kiln.testing import CompileCounter, unsupported


def test_unsupported_returns_its_second_argument_through_a_graph_break():
    def fn(a, b):
        c = unsupported(a * 2, b + 1)
        return a + b * 10 + c

    a, b = torch.randn(4), torch.randn(4)
    cnt = CompileCounter()
    out = kiln.optimize(cnt)(fn)(a, b)
    torch.testing.assert_close(out, a + b * 10 + (b + 1))
    assert cnt.frame_count == 2  # before the call, and after it in the resume function
    assert cnt.op_count == 5     # mul, add | mul, add, add (the call itself is in neither)


def test_unsupported_is_refused_under_fullgraph():
    with pytest.raises(kiln.exc.Unsupported):
        kiln.optimize(CompileCounter(), nopython=True)(lambda a, b: unsupported(a, b) + 1)(
            torch.ones(2), torch.ones(2))


def test_tracker_classes_by_name():
    d = kiln.variables.ConstDictVariable({"a": 1}, dict)
    assert d.python_type() is dict
    o = kiln.variables.ConstDictVariable({}, collections.OrderedDict)
    assert o.python_type() is collections.OrderedDict
    assert kiln.variables.TensorVariable.__module__ == "kiln.variables.tensor"
    with pytest.raises(AttributeError, match="NoSuchVariable"):
        kiln.variables.NoSuchVariable
