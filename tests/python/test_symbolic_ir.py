"""kiln.graph.symbolic_ir through lower_symbolic: a graph captured with symbolic sizes becomes a
kiln.v1 graph whose sizes, strides and SymInt arguments are canonical polynomials over size
symbols bound to per-call input dimensions with the capture's ranges; what the IR cannot carry
exactly (a floor division, a symbol no input gives, an in-place op, a lowering that would need
a guard the capture did not make) is refused with NotSymbolic or LoweringError, never lowered
to another computation."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from kiln.daemon import protocol

if not protocol.available():
    pytest.skip("the kiln.v1 modules are not available", allow_module_level=True)

from kiln.graph.aten_nodes import LoweringError  # noqa: E402
from kiln.graph.lowering import attr_tensors, lower_symbolic  # noqa: E402
from kiln.graph.symbolic_ir import NotSymbolic  # noqa: E402


def symbolic_graph(fn, *shapes, dynamic=None, module=None):
    """`fn` traced by FX over fakes of `shapes` whose dims in `dynamic[i]` (default: all but the
    last) are symbols of one ShapeEnv, as kiln's capture makes them: the placeholders carry the
    fakes as their example values."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    fakes = []
    for i, shape in enumerate(shapes):
        dims = dynamic[i] if dynamic is not None else range(len(shape) - 1)
        context = StatelessSymbolicContext(dynamic_sizes=[
            DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(len(shape))])
        fakes.append(mode.from_tensor(torch.randn(shape), symbolic_context=context))
    gm = torch.fx.symbolic_trace(module if module is not None else fn)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, f in zip(placeholders, fakes):
        n.meta["example_value"] = f
    return gm, env


class _Mlp(torch.nn.Module):
    """Linear, GELU, layer norm over (..., 8) -> (..., 16), its parameters read as attributes
    (get_attr nodes, as kiln's capture makes them)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w, self.b = torch.nn.Parameter(torch.randn(16, 8)), torch.nn.Parameter(torch.randn(16))
        self.g, self.h = torch.nn.Parameter(torch.ones(16)), torch.nn.Parameter(torch.zeros(16))

    def forward(self, x):
        y = torch.nn.functional.gelu(torch.nn.functional.linear(x, self.w, self.b))
        return torch.nn.functional.layer_norm(y, (16,), self.g, self.h)


def terms(e):
    return [(t.coefficient, list(t.symbols)) for t in e.terms]


def node(graph, op):
    return next(n for n in graph.nodes if n.op == op)


def test_sizes_and_strides_are_polynomials_over_the_inputs_dims():
    gm, env = symbolic_graph(None, (4, 6, 8), module=_Mlp())
    graph = lower_symbolic(gm, list(attr_tensors(gm).values())).graph
    assert graph.num_bound_inputs == 4
    x = graph.inputs[4]
    assert list(x.meta.sizes) == [-1, -1, 8] and list(x.meta.strides) == [0, 8, 1]
    assert [terms(e) for e in x.meta.size_exprs] == [[(1, [0])], [(1, [1])], [(8, [])]]
    assert [terms(e) for e in x.meta.stride_exprs] == [[(8, [1])], [(8, [])], [(1, [])]]
    symbols = [(s.id, s.input, s.dim, s.min, s.max) for s in graph.size_symbols]
    assert symbols == [(0, x.id, 0, 2, 0), (1, x.id, 1, 2, 0)]
    # the linear's flattening view: [s0 * s1, 8]
    view = next(n for n in graph.nodes if n.op == "aten::view" and n.args[1].HasField(
        "sym_int_list"))
    assert [terms(e) for e in view.args[1].sym_int_list.values] == [[(1, [0, 1])], [(8, [])]]
    # the parameters stay static
    assert all(len(graph.inputs[i].meta.size_exprs) == 0 for i in range(4))
    out = next(v for n in graph.nodes for v in n.outputs if v.id == graph.outputs[0])
    assert [terms(e) for e in out.meta.size_exprs] == [[(1, [0])], [(1, [1])], [(16, [])]]


def test_a_sum_of_sizes_is_a_two_term_polynomial_and_a_shared_symbol_binds_once():
    gm, env = symbolic_graph(lambda x, y: torch.cat([x, y]).relu(), (5, 3), (7, 3))
    graph = lower_symbolic(gm, []).graph
    cat = node(graph, "aten::cat")
    assert [terms(e) for e in cat.outputs[0].meta.size_exprs] == [[(1, [0]), (1, [1])],
                                                                  [(3, [])]]
    assert [(s.input, s.dim) for s in graph.size_symbols] == [(0, 0), (1, 0)]


def test_ranges_come_from_the_capture():
    gm, env = symbolic_graph(lambda x: x * 2, (5, 3))
    sym = next(iter(env.var_to_range))
    env.constrain_symbol_range(sym, compiler_min=3, compiler_max=40)
    graph = lower_symbolic(gm, []).graph
    assert (graph.size_symbols[0].min, graph.size_symbols[0].max) == (3, 40)


def test_a_floor_division_of_a_size_is_refused():
    gm, env = symbolic_graph(lambda x: x.view(x.shape[0] // 2, 2, 3), (6, 3))
    with pytest.raises(NotSymbolic, match="not a polynomial|relied on sizes"):
        lower_symbolic(gm, [])


def test_a_lowering_that_would_need_a_new_guard_is_refused():
    # The trace branches on the size inside one FX leaf: a guard the capture did not make.
    gm, env = symbolic_graph(lambda x: _branchy(x), (6, 3))
    with pytest.raises(NotSymbolic, match="relied on sizes its capture did not guard"):
        lower_symbolic(gm, [])


def _branchy(x):
    return x * 2 if x.shape[0] > 4 else x * 3


torch.fx.wrap("_branchy")


def test_an_in_place_op_is_refused():
    gm, env = symbolic_graph(lambda x: (x * 2).add_(1), (6, 3))
    with pytest.raises(LoweringError, match="mutates its input"):
        lower_symbolic(gm, [])


def test_a_graph_without_symbols_is_refused():
    gm, env = symbolic_graph(lambda x: x * 2, (6, 3), dynamic=[[]])
    with pytest.raises(NotSymbolic, match="no input has a symbolic size"):
        lower_symbolic(gm, [])
