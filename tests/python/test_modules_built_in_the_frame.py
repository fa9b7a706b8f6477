"""torch.nn modules a compiled frame constructs: each call hands out new modules, the same one
wherever the frame put it, and no module a container holds is one made at capture."""
import collections

import torch

import kiln


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
