"""kiln.graph.symbolic_ir through lower_symbolic: a graph captured with symbolic sizes becomes a
kiln.v1 graph whose sizes, strides and SymInt arguments are canonical polynomials over size
symbols bound to per-call input dimensions with the capture's ranges; what the IR cannot carry
exactly (a floor division, a min, max or mod, a symbol no input gives, an in-place op or input
update, a lowering that would need a guard the capture did not make) is refused with NotSymbolic
or LoweringError, never lowered to another computation. A graph without symbols is the same
bytes as the static lowering makes."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from kiln.daemon import protocol

if not protocol.available():
    pytest.skip("the kiln.v1 modules are not available", allow_module_level=True)

from kiln.graph.aten_nodes import LoweringError  # noqa: E402
from kiln.graph.ir import to_ir  # noqa: E402
from kiln.graph.lowering import attr_tensors, lower_symbolic, to_aten  # noqa: E402
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


def test_an_in_place_op_on_a_value_the_graph_made_is_its_functional_op():
    gm, env = symbolic_graph(lambda x: (x * 2).add_(1), (6, 3))
    graph = lower_symbolic(gm, []).graph
    assert [n.op for n in graph.nodes] == ["aten::mul.Tensor", "aten::add.Tensor"]
    assert not len(graph.input_updates)


def test_a_write_through_a_view_of_an_input_is_refused():
    gm, env = symbolic_graph(lambda x: x[:, :1].add_(1) * 2, (6, 3))
    with pytest.raises(LoweringError, match="mutates its input"):
        lower_symbolic(gm, [])


def test_a_graph_without_symbols_is_refused():
    gm, env = symbolic_graph(lambda x: x * 2, (6, 3), dynamic=[[]])
    with pytest.raises(NotSymbolic, match="no input has a symbolic size"):
        lower_symbolic(gm, [])


def test_a_view_over_the_product_of_two_sizes_takes_a_list_of_expressions():
    gm, env = symbolic_graph(lambda x: x.view(x.size(0) * x.size(1), 3) * 2, (4, 5, 3))
    graph = lower_symbolic(gm, []).graph
    x = graph.inputs[0]
    assert list(x.meta.sizes) == [-1, -1, 3] and list(x.meta.strides) == [0, 3, 1]
    assert [terms(e) for e in x.meta.stride_exprs] == [[(3, [1])], [(3, [])], [(1, [])]]
    view = node(graph, "aten::view")
    assert view.args[1].WhichOneof("kind") == "sym_int_list"
    assert [terms(e) for e in view.args[1].sym_int_list.values] == [[(1, [0, 1])], [(3, [])]]
    out = view.outputs[0].meta
    assert list(out.sizes) == [-1, 3] and list(out.strides) == [3, 1]
    assert [terms(e) for e in out.stride_exprs] == [[(3, [])], [(1, [])]]


def test_an_expression_is_canonical_and_a_lone_size_is_a_sym_int():
    gm, env = symbolic_graph(
        lambda x: x.new_zeros(2 * x.size(1) - 1 + x.size(0) * x.size(0)) + torch.arange(
            x.size(0) * x.size(0) + 2 * x.size(1) - 1), (6, 3), dynamic=[[0, 1]])
    graph = lower_symbolic(gm, []).graph
    canonical = [(-1, []), (1, [0, 0]), (2, [1])]  # constant first, then by symbol list
    assert [terms(e) for e in node(graph, "aten::new_zeros").args[1].sym_int_list.values] == \
        [canonical]
    end = node(graph, "aten::arange").args[0]
    assert end.WhichOneof("kind") == "sym_int_value" and terms(end.sym_int_value) == canonical
    assert list(node(graph, "aten::add.Tensor").outputs[0].meta.sizes) == [-1]


@pytest.mark.parametrize("fn,what", [
    (lambda x, y: x.new_zeros(torch.sym_max(x.size(0), y.size(0))), "Max"),
    (lambda x, y: x.view(-1)[: x.size(0) % 4] + 1, "Mod")])
def test_a_size_that_is_no_polynomial_is_refused(fn, what):
    gm, env = symbolic_graph(fn, (6, 3), (7, 3))
    with pytest.raises(NotSymbolic, match=f"{what}.*not a polynomial"):
        lower_symbolic(gm, [])


def test_an_earlier_inputs_size_may_be_an_expression_of_a_later_inputs_symbol():
    # The capture's guard (x's rows equal cat's 2 * y's) replaced x's symbol by 2 * y's.
    fn = lambda x, y: x + torch.cat([y, y])  # noqa: E731
    gm, env = symbolic_graph(fn, (8, 3), (4, 3))
    fn(*[n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"])
    graph = lower_symbolic(gm, []).graph
    assert [(s.id, s.input, s.dim) for s in graph.size_symbols] == [(0, graph.inputs[1].id, 0)]
    assert [terms(e) for e in graph.inputs[0].meta.size_exprs] == [[(2, [0])], [(3, [])]]


def _one_node_graph(fake, op, args, result):
    """The ATen graph calling `op` over placeholder `fake` (its first argument) and `args`."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = fake
    n = graph.call_function(op, (x, *args))
    n.meta["val"] = result
    graph.output((n,))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _size_symbol(env, hint, name):
    """A SymInt of `env` that no input's size holds (as a symbol made for an int attribute)."""
    from torch._dynamo.source import ConstantSource

    return env.create_symintnode(env.create_symbol(hint, ConstantSource(name),
                                                   dynamic_dim=DimDynamic.DYNAMIC), hint=hint)


@pytest.mark.filterwarnings("ignore:Raw SymInt")  # k, a raw SymInt argument of the node
def test_a_symbol_no_input_dimension_gives_is_refused():
    gm, env = symbolic_graph(lambda x: x, (6, 3))
    fake = gm.graph.find_nodes(op="placeholder")[0].meta["example_value"]
    k = _size_symbol(env, 5, "k")
    with fake.fake_mode:
        as_arg = _one_node_graph(fake, torch.ops.aten.new_zeros.default, ([k],),
                                 fake.new_zeros(k))
        strided = torch.empty_strided((fake.size(0), 3), (k, 1))
        in_stride = _one_node_graph(strided, torch.ops.aten.mul.Tensor, (2,), strided * 2)
    with pytest.raises(NotSymbolic, match=r"argument size: s\d+ names s\d+, which no input"):
        to_ir(as_arg, num_bound=0)
    with pytest.raises(NotSymbolic, match=r"a stride: s\d+ names s\d+, which no input"):
        to_ir(in_stride, num_bound=0)


def test_a_write_into_an_input_is_an_update_of_the_symbolic_graph():
    gm, env = symbolic_graph(lambda x: x.add_(1) * 2, (6, 3))
    graph = lower_symbolic(gm, []).graph
    (update,) = graph.input_updates
    assert update.input == graph.inputs[0].id
    written = next(v.meta for n in graph.nodes for v in n.outputs if v.id == update.value)
    assert [terms(e) for e in written.size_exprs] == \
        [terms(e) for e in graph.inputs[0].meta.size_exprs]


def test_a_static_graph_is_the_same_bytes_with_or_without_symbols():
    gm = torch.fx.symbolic_trace(_Mlp())
    params = list(attr_tensors(gm).values())
    aten_gm, _ = to_aten(gm, [torch.randn(4, 6, 8)])
    static = to_ir(aten_gm)
    assert not any(len(v.meta.size_exprs) for n in static.nodes for v in n.outputs)
    assert not len(static.size_symbols)
    assert static.SerializeToString(deterministic=True) == \
        to_ir(aten_gm, num_bound=len(params)).SerializeToString(deterministic=True)


def test_a_min_or_max_the_guards_prove_is_its_answer():
    from torch.utils._sympy.functions import Max, Min

    from kiln.graph.symbolic_ir import SizeSymbols
    from kiln.graph.symbolic_shapes import settle_min_max

    gm, env = symbolic_graph(lambda x, y: x, (5, 3), (9, 3))
    fakes = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
    t, n = (f.shape[0].node.expr for f in fakes)
    symbols = SizeSymbols()
    for i, f in enumerate(fakes):
        symbols.bind(i, f)
    # Nothing relates the two sizes yet: the min stays (and the IR refuses it).
    assert symbols._lifted(Min(t, n)) == Min(t, n)
    # The capture settles it to the side the call it saw took (5 <= 9): a guard t <= n.
    settle_min_max(env, [torch.sym_min(fakes[0].shape[0], fakes[1].shape[0])])
    assert any(str(g.expr) in (f"{t} <= {n}", f"{n} >= {t}") for g in env.guards)
    assert symbols._lifted(Min(t, n)) == t
    assert symbols._lifted(Max(t, n) * 2 + 1) == 2 * n + 1
