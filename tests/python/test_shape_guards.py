"""The C++ SHAPE guard (client/guards/guard_shape.cpp) and TENSOR_MATCH's symbolic dimensions:
relations over sizes, strides and ints read from the frame, evaluated as Python evaluates them,
failing (never raising) on what they cannot compute."""
import pytest
import torch

from kiln import _C

L0 = ("local", 0)
L1 = ("local", 1)


def shape_guard(bindings, *constraints, sources=(L0, L1)):
    g = _C.GuardManager()
    g.add(None, ("shape", sources, bindings, constraints), "SHAPE")
    return g


def frame_func(a=None, b=None):
    return a, b


X0 = (0, "size", 0, "L['x'].size()[0]")
X1 = (0, "size", 1, "L['x'].size()[1]")
Y0 = (1, "size", 0, "L['y'].size()[0]")


def test_range_and_equality_between_two_tensors():
    g = shape_guard((X0, Y0), (("ge", ("sym", 0), 2), "x0 >= 2"),
                    (("le", ("sym", 0), 512), "x0 <= 512"),
                    (("eq", ("sym", 0), ("sym", 1)), "x0 == y0"))
    assert g.check((torch.zeros(5, 3), torch.zeros(5)), frame_func)
    assert g.check((torch.zeros(512, 1), torch.zeros(512)), frame_func)
    assert not g.check((torch.zeros(1, 3), torch.zeros(1)), frame_func)
    assert not g.check((torch.zeros(513, 3), torch.zeros(513)), frame_func)
    assert not g.check((torch.zeros(5, 3), torch.zeros(6)), frame_func)
    reason = g.failure_reason((torch.zeros(5, 3), torch.zeros(6)), frame_func)
    assert "x0 == y0 does not hold" in reason and "L['y'].size()[0] = 6" in reason


def test_arithmetic_is_pythons():
    # floor division and modulo round towards negative infinity, as Python's do
    for a in range(-7, 8):
        for b in (-3, -2, 2, 3):
            g = shape_guard(((0, "int", 0, "a"), (1, "int", 0, "b")),
                            (("eq", ("floordiv", ("sym", 0), ("sym", 1)), a // b), "fd"),
                            (("eq", ("mod", ("sym", 0), ("sym", 1)), a % b), "mod"),
                            (("eq", ("ceildiv", ("sym", 0), ("sym", 1)), -(-a // b)), "cd"))
            assert g.check((a, b), frame_func), (a, b)


def test_n_ary_operations_and_logic():
    g = shape_guard((X0, X1),
                    (("eq", ("add", ("sym", 0), ("mul", 2, ("sym", 1)), 1), 12), "x0 + 2*x1 + 1"),
                    (("eq", ("pow", ("sym", 1), 3), 27), "x1**3"),
                    (("eq", ("max", ("sym", 0), ("sym", 1), 4), 5), "max"),
                    (("eq", ("min", ("sym", 0), ("sym", 1)), 3), "min"),
                    (("or", ("lt", ("sym", 0), 0), ("and", ("gt", ("sym", 1), 2),
                                                     ("not", ("ne", ("sym", 1), 3)))), "logic"),
                    sources=(L0,))
    assert g.check((torch.zeros(5, 3),), frame_func)
    assert not g.check((torch.zeros(7, 2),), frame_func)


def test_overflow_and_division_by_zero_fail():
    big = shape_guard(((0, "int", 0, "n"),), (("gt", ("mul", ("sym", 0), ("sym", 0)), 0), "n*n > 0"),
                      sources=(L0,))
    assert big.check((3,), frame_func)
    assert not big.check((2 ** 40,), frame_func)  # 2**80 does not fit: fails, never wraps
    div = shape_guard(((0, "int", 0, "n"),), (("eq", ("floordiv", 6, ("sym", 0)), 3), "6 // n"),
                      sources=(L0,))
    assert div.check((2,), frame_func)
    assert not div.check((0,), frame_func)


def test_strides_and_storage_offset():
    g = shape_guard(((0, "stride", 0, "s0"), (0, "storage_offset", 0, "off")),
                    (("eq", ("sym", 0), 3), "s0 == 3"), (("eq", ("sym", 1), 0), "off == 0"),
                    sources=(L0,))
    t = torch.zeros(4, 3)
    assert g.check((t,), frame_func)
    assert not g.check((t.t(),), frame_func)
    assert not g.check((torch.zeros(5, 3)[1:],), frame_func)


@pytest.mark.parametrize("value", ["abc", 3.5, None, [1]])
def test_a_value_that_is_not_what_its_binding_says_fails(value):
    g = shape_guard((X0,), (("ge", ("sym", 0), 0), "x0 >= 0"), sources=(L0,))
    assert not g.check((value,), frame_func)
    assert g.failure_reason((value,), frame_func)
    n = shape_guard(((0, "int", 0, "n"),), (("ge", ("sym", 0), 0), "n >= 0"), sources=(L0,))
    assert not n.check((value,), frame_func)


def test_a_dimension_past_the_rank_fails():
    g = shape_guard(((0, "size", 3, "L['x'].size()[3]"),), (("ge", ("sym", 0), 0), "x3"),
                    sources=(L0,))
    assert not g.check((torch.zeros(2, 2),), frame_func)


@pytest.mark.parametrize("check, message", [
    (("shape", (L0,), ((0, "size", 0, "n"),), ((("sym", 1), "t"),)), "bound symbol's index"),
    (("shape", (L0,), ((0, "size", 0, "n"),), ((("bogus", 1, 2), "t"),)),
     "unknown shape operation"),
    (("shape", (L0,), ((0, "size", 0, "n"),), ((("pow", 2, ("sym", 0)), "t"),)),
     "int exponent"),
    (("shape", (L0,), ((0, "size", 0, "n"),), ((("eq", 1), "t"),)), "wrong number of operands"),
    (("shape", (L0,), ((1, "size", 0, "n"),), ()), "out of range"),
    (("shape", (L0,), ((0, "height", 0, "n"),), ()), "kind is size, stride"),
    (("shape", (L0,), ((0, "size", 0, "n"),), ((2 ** 70, "t"),)), "does not fit 64 bits"),
    (("shape", (L0,), ((0, "size", 0, "n"),), (("x", "t"),)), "an int or (op, arg...)"),
    (("shape", [L0], (), ()), "needs three tuples"),
])
def test_malformed_shape_guards_are_value_errors(check, message):
    g = _C.GuardManager()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        g.add(None, check, "SHAPE")


def test_tensor_match_leaves_symbolic_dimensions_to_the_shape_guard():
    g = _C.GuardManager()
    g.add(L0, ("tensor", torch.zeros(4, 3), (None, 3), (3, 1)), "TENSOR_MATCH")
    assert g.check((torch.zeros(7, 3),), frame_func)
    assert not g.check((torch.zeros(7, 4),), frame_func)  # a static dimension still checked
    assert not g.check((torch.zeros(7, 3, 1),), frame_func)  # and the rank
    assert not g.check((torch.zeros(3, 7).t(),), frame_func)  # and the static strides
