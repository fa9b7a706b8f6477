"""kiln._C.Plan with size symbols: one plan for every size in the symbols' ranges, its sizes read
from each call's inputs, SymInt arguments evaluated per call; results equal eager's at every size;
a call outside a range, or whose inputs disagree with the sizes the symbols imply, fails naming
why; kernels take sizes per call (their buffers sized per call, inputs laid out as the plan says);
plans the runtime cannot run over runtime sizes are refused when built."""
import pytest
import torch
from torch.testing import assert_close

from kiln import _C
from kiln.daemon import protocol

if not protocol.available():
    pytest.skip("the kiln.v1 modules are not available (grpcio-tools/protobuf missing)",
                allow_module_level=True)

from test_runtime import _build, kernel, library, plan_bytes, pos, value  # noqa: E402

pb = protocol.messages()


def expr(*terms):
    """A kiln.v1.SymExpr from (coefficient, [symbols]) terms, in canonical order."""
    e = pb.graph.SymExpr()
    for c, symbols in terms:
        e.terms.add(coefficient=c, symbols=list(symbols))
    return e


def sym_value(vid, sizes, dtype=torch.float32):
    """A contiguous value whose sizes are SymExprs (or ints): size -1 / stride 0 where symbolic."""
    v = value(vid, [1] * len(sizes), dtype)
    del v.meta.sizes[:], v.meta.strides[:]
    exprs = [s if isinstance(s, pb.graph.SymExpr) else expr((s, [])) for s in sizes]
    strides, stride = [], {(): 1}  # polynomials as {symbols: coefficient}
    for e in reversed(exprs):
        strides.append(stride)
        product = {}
        for syms, c in stride.items():
            for t in e.terms:
                key = tuple(sorted(syms + tuple(t.symbols)))
                product[key] = product.get(key, 0) + c * t.coefficient
        stride = product
    strides.reverse()
    for e, s in zip(exprs, strides):
        v.meta.size_exprs.append(e)
        v.meta.stride_exprs.append(expr(*sorted((c, list(k)) for k, c in s.items() if c)))
        constant = [t.coefficient for t in e.terms if not t.symbols]
        v.meta.sizes.append(constant[0] if len(e.terms) == 1 and constant else
                            (0 if not e.terms else -1))
        v.meta.strides.append(s[()] if list(s) == [()] else 0)
    return v


def sym_ints(*exprs):
    a = pb.graph.Argument()
    for e in exprs:
        a.sym_int_list.values.append(e)
    return a


def sym_int(e):
    a = pb.graph.Argument()
    a.sym_int_value.CopyFrom(e)
    return a


S0 = expr((1, [0]))


def symbolic_plan(steps, values, inputs, outputs, symbols, params=()):
    p = pb.artifact.ExecutionPlan()
    p.ParseFromString(plan_bytes(values, inputs, [], outputs))
    p.steps.extend(steps)
    p.size_symbols.extend(symbols)
    return _C.Plan(p.SerializeToString(), b"", list(params))


def relu_scale_flatten():
    """w [4] bound; x [s0, 4] (s0 >= 2) -> z = view(relu(x) * w, [4 * s0]), then narrow it to
    its first 4 * s0 - 3 elements."""
    steps = [library("aten::relu", [pos("value", 1)], [2]),
             library("aten::mul.Tensor", [pos("value", 2), pos("value", 0)], [3])]
    view = library("aten::view", [pos("value", 3)], [4])
    view.library.args.append(sym_ints(expr((4, [0]))))
    narrow = library("aten::narrow", [pos("value", 4), pos("int", 0), pos("int", 0)], [5])
    narrow.library.args.append(sym_int(expr((-3, []), (4, [0]))))
    values = [value(0, [4]), sym_value(1, [S0, 4]), sym_value(2, [S0, 4]),
              sym_value(3, [S0, 4]), sym_value(4, [expr((4, [0]))]),
              sym_value(5, [expr((-3, []), (4, [0]))])]
    symbol = pb.graph.SizeSymbol(id=0, input=1, dim=0, min=2, max=64)
    return steps + [view, narrow], values, symbol


def test_one_plan_runs_every_size_in_the_range_as_eager_does():
    steps, values, symbol = relu_scale_flatten()
    w = torch.randn(4)
    p = symbolic_plan(steps, values, [0, 1], [5], [symbol], params=[w])
    assert p.symbolic and p.num_inputs == 1
    for n in (2, 3, 17, 64, 5):
        x = torch.randn(n, 4)
        (out,) = p(x)
        assert_close(out, (torch.relu(x) * w).view(4 * n)[:4 * n - 3])


def test_a_size_outside_the_range_fails_naming_the_symbol():
    steps, values, symbol = relu_scale_flatten()
    p = symbolic_plan(steps, values, [0, 1], [5], [symbol], params=[torch.randn(4)])
    with pytest.raises(RuntimeError, match=r"size symbol 0 is 65, outside \[2, 64\]"):
        p(torch.randn(65, 4))
    with pytest.raises(RuntimeError, match="has no dimension 0"):
        p(torch.randn(()))


def test_inputs_that_disagree_with_the_symbols_sizes_fail_before_any_step():
    steps, values, symbol = relu_scale_flatten()
    p = symbolic_plan(steps, values, [0, 1], [5], [symbol], params=[torch.randn(4)])
    with pytest.raises(RuntimeError, match="the plan's size symbols make them"):
        p(torch.randn(6, 5))  # s0 = 6 says [6, 4]


def test_two_inputs_share_a_symbol():
    # x [s0, 3], y [s0, 3] -> x + y; the symbol is read from x, y checked against it.
    steps = [library("aten::add.Tensor", [pos("value", 0), pos("value", 1)], [2])]
    values = [sym_value(i, [S0, 3]) for i in range(3)]
    p = symbolic_plan(steps, values, [0, 1], [2],
                      [pb.graph.SizeSymbol(id=0, input=0, dim=0, min=2)])
    for n in (2, 9):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        assert_close(p(x, y)[0], x + y)
    with pytest.raises(RuntimeError, match="input 1 has sizes"):
        p(torch.randn(4, 3), torch.randn(5, 3))


SCALE_ROWS = r"""
#include <stdint.h>
// y = 2x over a contiguous float[n, 4], n (a size argument) after the pointers.
extern "C" void scale_rows(void* const* a, void*) {
  const float* x = (const float*)a[0]; float* y = (float*)a[1];
  const int64_t n = *(const int64_t*)a[2];
  for (int64_t i = 0; i < n * 4; i++) y[i] = x[i] * 2;
}
"""


def scale_rows_plan(binary, in_arena=False, size_args=(S0,)):
    """x [s0, 4] per call -> kernel scale_rows writes buffer y [s0, 4] -> y + x (a library call
    reading the buffer)."""
    k = kernel("scale_rows", [0, 1], [1])
    k.kernel.size_args.extend(size_args)
    add = library("aten::add.Tensor", [pos("value", 1), pos("value", 0)], [2])
    p = pb.artifact.ExecutionPlan()
    p.ParseFromString(plan_bytes([sym_value(i, [S0, 4]) for i in range(3)], [0], [k, add], [2],
                                 buffers=[(1, in_arena, 0)], arena=256 if in_arena else 0))
    p.size_symbols.append(pb.graph.SizeSymbol(id=0, input=0, dim=0, min=1))
    return _C.Plan(p.SerializeToString(), binary, [])


def test_a_kernel_takes_its_rows_per_call_into_a_buffer_sized_per_call(tmp_path_factory):
    p = scale_rows_plan(_build(tmp_path_factory, "scale_rows", SCALE_ROWS))
    assert p.symbolic and p.num_kernels == 1
    for n in (1, 3, 50, 7):
        x = torch.randn(n, 4)
        assert_close(p(x)[0], 3 * x)
    # An input laid out otherwise than the plan says is copied into its layout for the kernel.
    x = torch.randn(4, 6).t()
    assert_close(p(x)[0], 3 * x)


def test_plans_the_runtime_cannot_run_over_runtime_sizes_are_refused(tmp_path_factory):
    binary = _build(tmp_path_factory, "scale_rows", SCALE_ROWS)
    with pytest.raises(ValueError, match="symbolic sizes and is in the arena"):
        scale_rows_plan(binary, in_arena=True)
    with pytest.raises(ValueError, match="symbol 3 is not declared"):
        scale_rows_plan(binary, size_args=[expr((1, [3]))])
    static = pb.artifact.ExecutionPlan()
    static.ParseFromString(plan_bytes([value(0, [2, 4]), value(1, [2, 4])], [0],
                                      [kernel("scale_rows", [0, 1], [1])], [1],
                                      buffers=[(1, False, 0)]))
    static.steps[0].kernel.size_args.append(S0)
    with pytest.raises(ValueError, match="sizes per call in a plan without size symbols"):
        _C.Plan(static.SerializeToString(), binary, [])
    steps, values, symbol = relu_scale_flatten()
    with pytest.raises(ValueError, match="the plan no symbols"):
        symbolic_plan(steps, values, [0, 1], [5], [], params=[torch.randn(4)])
    bound = pb.graph.SizeSymbol(id=0, input=0, dim=0, min=2)  # the parameter is bound once
    with pytest.raises(ValueError, match="not a per-call input"):
        symbolic_plan(steps, values, [0, 1], [5], [bound], params=[torch.randn(4)])
    undeclared = pb.graph.SizeSymbol(id=1, input=1, dim=0, min=2)
    with pytest.raises(ValueError, match="symbol 0 is not declared"):
        symbolic_plan(steps, values, [0, 1], [5], [undeclared], params=[torch.randn(4)])


def test_a_size_passed_where_a_tensor_or_scalar_is_taken():
    # x [s0, 2] -> arange(2 * s0) + s0 (end: a Scalar; other: a Tensor, as a wrapped number)
    arange = library("aten::arange", [], [1])
    arange.library.args.append(sym_int(expr((2, [0]))))
    add = library("aten::add.Tensor", [pos("value", 1)], [2])
    add.library.args.append(sym_int(S0))
    values = [sym_value(0, [S0, 2]), sym_value(1, [expr((2, [0]))], torch.int64),
              sym_value(2, [expr((2, [0]))], torch.int64)]
    p = symbolic_plan([arange, add], values, [0], [2],
                      [pb.graph.SizeSymbol(id=0, input=0, dim=0, min=2)])
    for n in (2, 5):
        (out,) = p(torch.randn(n, 2))
        assert out.dtype == torch.int64
        assert torch.equal(out, torch.arange(2 * n) + n)


def _ops_called(p, *args):
    """The ATen ops the dispatcher ran for one call of plan `p`, and its outputs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = p(*args)
    return {e.name for e in prof.events()}, out


def test_views_inside_the_plan_are_made_without_the_dispatcher_where_the_layout_allows():
    # x [s0, 4] -> transpose -> a contiguous copy -> a view [4 * s0] of it -> relu: the transpose
    # and the view are made from the plan's metadata; only the copy and the relu are dispatched.
    t = library("aten::transpose.int", [pos("value", 0), pos("int", 0), pos("int", 1)], [1])
    contiguous = library("aten::clone", [pos("value", 1)], [2])
    contiguous.library.args.append(pb.graph.Argument(
        name="memory_format", memory_format_value=pb.graph.MEMORY_FORMAT_CONTIGUOUS))
    view = library("aten::view", [pos("value", 2)], [3])
    view.library.args.append(sym_ints(expr((4, [0]))))
    relu = library("aten::relu", [pos("value", 3)], [4])
    transposed = sym_value(1, [4, S0])
    transposed.meta.stride_exprs[0].CopyFrom(expr((1, [])))
    transposed.meta.stride_exprs[1].CopyFrom(expr((4, [])))
    transposed.meta.strides[:] = [1, 4]
    values = [sym_value(0, [S0, 4]), transposed, sym_value(2, [4, S0]),
              sym_value(3, [expr((4, [0]))]), sym_value(4, [expr((4, [0]))])]
    p = symbolic_plan([t, contiguous, view, relu], values, [0], [4],
                      [pb.graph.SizeSymbol(id=0, input=0, dim=0, min=2)])
    for n in (2, 7, 30):
        x = torch.randn(n, 4)
        called, (out,) = _ops_called(p, x)
        assert_close(out, torch.relu(x.t().contiguous().view(4 * n)))
        assert "aten::relu" in called and "aten::clone" in called
        assert "aten::view" not in called and "aten::transpose" not in called
    # An input laid out otherwise than the plan's metadata says: the dispatcher makes the view.
    x = torch.randn(4, 9).t()
    called, (out,) = _ops_called(p, x)
    assert_close(out, torch.relu(x.t().contiguous().view(36)))
    assert "aten::transpose" in called


def test_a_returned_view_keeps_the_programs_base():
    # z = view(y), then narrow(z) returned: eager's result is a view whose base is y's root.
    steps, values, symbol = relu_scale_flatten()
    p = symbolic_plan(steps, values, [0, 1], [5], [symbol], params=[torch.randn(4)])
    (out,) = p(torch.randn(6, 4))
    assert out._base is not None and out._base.shape == (6, 4)
