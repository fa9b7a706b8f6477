"""The straight-line examples of the seed documents, with `kiln` in place of torch.compile /
torchdynamo: results, graph counts, op counts and what the custom backends see."""
import copy
from typing import List

import torch
import torch.nn as nn

import kiln
from kiln.testing import CompileCounter


def foo(a: torch.Tensor, b: torch.Tensor):
    return torch.add(a, b)


def test_foo_torch_add_compiles_one_graph_with_one_op():
    cnt = CompileCounter()
    foo_ = kiln.compile(foo, backend=cnt)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(foo_(a, b), foo(a, b))
    torch.testing.assert_close(foo_(a, b), foo(a, b))
    assert (cnt.frame_count, cnt.op_count) == (1, 1)
    entries = kiln.debug.cache_entries(foo_)
    assert len(entries) == 1 and entries[0].hits == 2
    assert any("TENSOR_MATCH" in g and "L['a']" in g for g in entries[0].guards)
    assert any("G['torch']" in g and "ID_MATCH" in g for g in entries[0].guards)


def test_my_compiler_sin_cos_prints_tabular_graph(capsys):
    def my_compiler(gm: torch.fx.GraphModule, example_inputs: List[torch.Tensor]):
        print("my_compiler() called with FX graph:")
        gm.graph.print_tabular()
        return gm.forward

    @kiln.optimize(my_compiler)
    def fn(x, y):
        a = torch.cos(x)
        b = torch.sin(y)
        return a + b

    x, y = torch.randn(10), torch.randn(10)
    torch.testing.assert_close(fn(x, y), torch.cos(x) + torch.sin(y))
    out = capsys.readouterr().out
    assert "my_compiler() called with FX graph:" in out
    for word in ("placeholder", "call_function", "output", "cos", "sin", "add"):
        assert word in out


class MockModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(torch.cos(x))


def test_mock_module_relu_cos_one_graph_two_ops():
    cnt = CompileCounter()
    mod = MockModule()
    optimized_mod = kiln.optimize(cnt)(mod)
    x = torch.randn(10)
    torch.testing.assert_close(optimized_mod(x), mod(x))
    assert (cnt.frame_count, cnt.op_count) == (1, 2)


class MyModule(nn.Module):
    def __init__(self):
        super().__init__()
        self._linear = nn.Linear(100, 3)
        self._dropout = nn.Dropout(p=0.3)

    def forward(self, x: torch.Tensor):
        out = self._linear(x)
        out = self._dropout(out)
        return out


def test_dropout_removing_backend_sees_functional_dropout_and_removes_it():
    new_graphs = []

    def my_backend(gm: torch.fx.GraphModule, sample_inputs):
        new_graph = copy.deepcopy(gm.graph)
        for node in new_graph.nodes:
            if node.target == torch.nn.functional.dropout:
                node.replace_all_uses_with(node.args[0])
                new_graph.erase_node(node)
        new_graph.lint()
        new_graphs.append(new_graph)
        new_gm = torch.fx.GraphModule(root=gm, graph=new_graph)
        return new_gm.forward

    torch.manual_seed(0)
    my_model = MyModule()  # training mode: eager dropout would zero some outputs
    my_model_ = kiln.compile(my_model, backend=my_backend)
    x = torch.randn(10, 100)
    out = my_model_(x)
    expected = my_model._linear(x)  # dropout removed by the backend
    torch.testing.assert_close(out, expected)
    assert len(new_graphs) == 1
    targets = [n.target for n in new_graphs[0].nodes if n.op == "call_function"]
    assert torch.nn.functional.dropout not in targets
    assert out.requires_grad  # parameters are lifted: autograd flows as in eager


def test_my_module_linear_relu_matches_eager_and_lifts_parameters():
    class Lin(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 5)

        def forward(self, x):
            return torch.relu(self.linear(x))

    cnt = CompileCounter()
    m = Lin()
    opt = kiln.compile(m, backend=cnt)
    x = torch.randn(8, 4)
    torch.testing.assert_close(opt(x), m(x))
    gm = cnt.graphs[0]
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert len(attrs) == 2  # weight and bias
    # The compiled module is still the module: parameters, state_dict, train/eval, attributes.
    assert len(list(opt.parameters())) == 2
    assert set(opt.state_dict()) == {"_orig_mod.linear.weight", "_orig_mod.linear.bias"}
    assert opt.linear is m.linear
    opt.eval()
    assert not m.training


def test_tutorial_dynamo_optimize_examples_run_with_kiln():
    def foo2(x, y):
        a = torch.sin(x)
        b = torch.cos(x)
        return a + b

    cnt = CompileCounter()
    opt_foo1 = kiln.optimize(cnt)(foo2)
    x, y = torch.randn(10, 10), torch.randn(10, 10)
    torch.testing.assert_close(opt_foo1(x, y), foo2(x, y))

    @kiln.optimize(cnt)
    def opt_foo2(x, y):
        a = torch.sin(x)
        b = torch.cos(x)
        return a + b

    torch.testing.assert_close(opt_foo2(x, y), foo2(x, y))

    class MyModule2(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(100, 10)

        def forward(self, x):
            return nn.functional.relu(self.lin(x))

    mod = MyModule2()
    opt_mod = kiln.optimize(cnt)(mod)
    x = torch.randn(10, 100)
    torch.testing.assert_close(opt_mod(x), mod(x))
    assert cnt.frame_count == 3


def test_debug_prints_graph_bytecode_and_guards(capsys):
    kiln.config.debug = True

    def toy(a, b):
        x = a / (torch.abs(a) + 1)
        return x * b

    opt = kiln.compile(toy, backend="eager")
    a, b = torch.randn(10), torch.randn(10)
    torch.testing.assert_close(opt(a, b), toy(a, b))
    err = capsys.readouterr().err
    assert "__compiled_fn_" in err
    assert "ORIGINAL BYTECODE" in err and "MODIFIED BYTECODE" in err
    assert "GUARDS:" in err and "TENSOR_MATCH" in err
    assert "opcode" in err and "placeholder" in err


def test_tutorial_optimize_inductor_compiles_with_torch_inductor():
    assert "inductor" in kiln.list_backends()

    def foo3(x, y):
        a = torch.sin(x)
        b = torch.cos(y)
        return a + b

    opt_foo1 = kiln.optimize("inductor")(foo3)
    x, y = torch.randn(10, 10), torch.randn(10, 10)
    torch.testing.assert_close(opt_foo1(x, y), foo3(x, y))
    entries = kiln.debug.cache_entries(foo3)
    assert len(entries) == 1 and entries[0].info.compiled_fn is not None
    assert entries[0].info.compiled_fn is not entries[0].info.graph_module.forward
