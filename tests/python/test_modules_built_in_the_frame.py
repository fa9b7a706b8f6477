"""torch.nn modules a compiled frame constructs: each call hands out new modules, the same one
wherever the frame put it, and no module a container holds is one made at capture. Modules a
compiled region builds or copies in Python (kiln.mutation_guard) share one capture; a generator
over a module's members outlives a graph break."""
import collections
import copy

import torch

import kiln
from kiln.testing import CompileCounter


def test_a_module_dict_built_from_an_ordered_dict_holds_the_frames_own_modules():
    def f():
        modules = collections.OrderedDict([("act", torch.nn.ReLU())])
        module_dict = torch.nn.ModuleDict(modules)
        more = {"fc": torch.nn.Linear(5, 6), "act2": torch.nn.Sigmoid()}
        modules.update(more.items())
        module_dict.update(more)
        return modules, module_dict

    compiled = kiln.compile(f, backend="eager")
    seen = []
    for _ in range(3):
        modules, module_dict = compiled()
        assert list(modules) == list(module_dict) == ["act", "fc", "act2"]
        for name, child in zip(modules, module_dict.children()):
            assert modules[name] is child
        seen.append(modules["act"])
    assert len({id(m) for m in seen}) == 3  # a new ReLU each call


def test_one_module_built_in_the_frame_is_one_object_wherever_it_is_returned():
    def f(x):
        act = torch.nn.Sigmoid()
        return act(x), act, [act], {"a": act}

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    y, act, in_list, in_dict = compiled(x)
    torch.testing.assert_close(y, torch.sigmoid(x))
    assert in_list[0] is act and in_dict["a"] is act
    assert compiled(x)[1] is not act


def test_a_container_module_built_from_modules_of_the_frame_holds_them():
    def f(x):
        act = torch.nn.ReLU()
        seq = torch.nn.Sequential(act, torch.nn.Tanh())
        return seq(x), seq, act

    compiled = kiln.compile(f, backend="eager")
    x = torch.randn(4)
    for _ in range(2):
        y, seq, act = compiled(x)
        torch.testing.assert_close(y, f(x)[0])
        assert seq[0] is act


def _copying_forward(model, x):
    net = copy.deepcopy(model)  # a graph break: copy.deepcopy runs in Python
    return net(x) * 2


def test_a_module_the_region_copies_on_every_call_is_captured_once_for_all_copies():
    # Each call's copy is a new object: guarded by identity it would fail on the next call and
    # be captured again until cache_size_limit, then run eagerly.
    counter = CompileCounter()
    compiled = kiln.compile(_copying_forward, backend=counter)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    x = torch.randn(4, 6)
    for _ in range(kiln.config.cache_size_limit + 2):
        torch.testing.assert_close(compiled(model, x), _copying_forward(model, x))
    assert counter.frame_count == 1  # the resume function's graph, shared by every copy
    with torch.no_grad():
        model[0].weight.mul_(-1)  # a change to the model reaches the next copy's graph
    torch.testing.assert_close(compiled(model, x), _copying_forward(model, x))
    assert counter.frame_count == 1


def test_modules_built_in_an_optimize_block_are_tagged_with_its_generation():
    from kiln.mutation_guard import GenerationTracker, built_in_a_region

    with kiln.optimize("eager"):
        pass
    before = torch.nn.Linear(2, 2)
    generation = GenerationTracker.get_generation_value(before)
    with kiln.optimize("eager"):
        inside = torch.nn.Linear(2, 2)
    assert GenerationTracker.get_generation_value(before) == generation
    assert GenerationTracker.get_generation_value(inside) == generation + 1
    assert built_in_a_region(inside) and not built_in_a_region(before)
    copied = copy.deepcopy(before)  # a copy is a module built now
    assert GenerationTracker.get_generation_value(copied) == generation + 1
    assert not built_in_a_region(copied)


def test_a_generator_over_a_modules_parameters_given_to_a_call_that_breaks_the_graph():
    # torch.autograd.grad is a graph break: the generator it takes is rebuilt after the graph
    # (the frame used to run eagerly), and the graph before it is compiled.
    def step(net, x, y):
        loss = torch.nn.functional.cross_entropy(net(x), y)
        params = net.parameters()
        first = next(params)  # advanced once in the graph: the rebuilt one is too
        grads = torch.autograd.grad(loss, params)
        return first.sum(), grads

    counter = CompileCounter()
    compiled = kiln.compile(step, backend=counter)
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    x, y = torch.randn(5, 8), torch.randint(0, 3, (5,))
    got_first, got = compiled(net, x, y)
    want_first, want = step(net, x, y)
    assert len(got) == len(want) == 3  # the first weight was taken before the call
    torch.testing.assert_close(got_first, want_first)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # The frame's own graph (two linears, tanh, the loss: the frame no longer runs eagerly,
    # when only the Sequential's forward was captured) and the resume function's (the sum).
    assert (counter.frame_count, counter.op_count) == (2, 5)
