"""Guards: what a compiled entry is specialized on (shapes, dtypes, strides, requires_grad,
int/bool/str arguments, None, container lengths, module state) — a changed guard compiles a
new graph, an unchanged one reuses the entry, and results always equal eager."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln.testing import CompileCounter

from .harness import Corpus, check, t

corpus = Corpus()


@corpus(sets=[[(3, 4)], [(3, 4)], [(3, 4)]], frames=1)
def same_shape_new_values_hits_cache(x):
    return x.softmax(-1)


@corpus(sets=[[(3, 4)], [(5, 4)]], frames=2)
def leading_dim_change_recompiles(x):
    return x.sum(0)


@corpus(sets=[[(2, 3)], [(4, 3)], [(2, 3)]], frames=2)
def alternating_shapes_reuse_first_entry(x):
    return x @ x.T


@corpus(sets=[[(4,)], [(2, 2)], [(1, 2, 2)]], frames=3)
def ndim_change_recompiles_each_time(x):
    return x.flatten() * 2


@corpus(sets=[[(4,)], [lambda: torch.randn(4, dtype=torch.float64)]], frames=2)
def dtype_change_recompiles(x):
    return x.exp()


@corpus(sets=[[(4,)], [lambda: torch.randint(0, 5, (4,))]], frames=2)
def float_then_int_input_changes_promotion(x):
    return x / 2


@corpus(sets=[[(4,), 2], [(4,), 2], [(4,), 3]], frames=2)
def int_argument_is_guarded(x, n):
    return x * n


@corpus(sets=[[(4,), True], [(4,), False], [(4,), True]], frames=2)
def bool_flag_both_values(x, flag):
    return x.relu() if flag else x.sigmoid()


@corpus(sets=[[(4,), "sum"], [(4,), "mean"]], frames=2)
def string_argument_is_guarded(x, reduction):
    return x.sum() if reduction == "sum" else x.mean()


@corpus(sets=[[(4,), None], [(4,), (4,)]], frames=2)
def none_then_tensor_recompiles(x, bias):
    return x * 2 if bias is None else x + bias


@corpus(sets=[[lambda: [t(2), t(2)]], [lambda: [t(2), t(2), t(2)]]], frames=2)
def list_length_change_recompiles(xs):
    return torch.stack(xs).sum(0)


@corpus(sets=[[(2, 3), (2, 3)], [(2, 3), lambda: t(3, 2).T]], frames=2)
def non_contiguous_input_recompiles(x, y):
    return x + y


@corpus(sets=[[(3,)], [lambda: torch.randn(3, requires_grad=True)]], frames=2)
def requires_grad_change_recompiles(x):
    return x * 2


@corpus(sets=[[(3,), lambda: (1, 2)], [(3,), lambda: (1, 2)], [(3,), lambda: (2, 1)]], frames=2)
def tuple_of_ints_argument_guarded(x, dims):
    return x.repeat(*dims)


@corpus(sets=[[(3,), 0.5], [(3,), 0.25]], frames=2)
def float_argument_is_guarded(x, p):
    return x * p


@corpus(sets=[[lambda: {"a": t(2)}], [lambda: {"a": t(2), "b": t(2)}]], frames=2)
def dict_keys_change_recompiles(d):
    return sum(v for v in d.values())


@corpus(sets=[[(2, 8)], [(2, 8)], [(2, 16)]], frames=2)
def shape_used_in_python_arithmetic(x):
    return x.view(x.shape[0], 2, x.shape[1] // 2)


@corpus(sets=[[(3,), 1], [(3,), 2], [(3,), 1]], frames=2)
def int_driving_loop_count_reuses(x, n):
    for _ in range(n):
        x = x.cos()
    return x


# A 0-d integer tensor argument read as a number (arange's bounds) makes sizes the graph's
# later ops depend on: the read is data-dependent, a graph break, never a value the capture saw.
@corpus(sets=[[(3,), lambda: torch.tensor(0), lambda: torch.tensor(3)],
              [(3,), lambda: torch.tensor(1), lambda: torch.tensor(5)]], frames=3, breaks=1)
def zero_dim_int_tensor_argument_read_as_a_number(x, lo, hi):
    x = x * 2
    a = torch.arange(lo, hi)
    return x.sum() + x.new_zeros(a.shape[0]) + a


@corpus(sets=[[(4, 4)], [(4, 4)]], frames=1)
def constant_tensor_created_inside(x):
    return x + torch.eye(4)


def test_module_train_eval_toggle_recompiles_and_each_mode_matches_eager():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    ref.load_state_dict(model.state_dict())
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(6, 4)
    for mode in ("train", "eval", "train", "eval"):
        getattr(model, mode)()
        getattr(ref, mode)()
        torch.testing.assert_close(opt(x), ref(x))
    torch.testing.assert_close(model.state_dict(), ref.state_dict())
    assert cnt.frame_count == 2


_SCALE = 2.0


def _uses_global(x):
    return x * _SCALE


def test_module_level_global_change_recompiles():
    global _SCALE
    cnt = CompileCounter()
    opt = kiln.compile(_uses_global, backend=cnt)
    x = torch.randn(3)
    try:
        torch.testing.assert_close(opt(x), x * 2.0)
        _SCALE = 5.0
        torch.testing.assert_close(opt(x), x * 5.0)
    finally:
        _SCALE = 2.0
    assert cnt.frame_count == 2


_GLOBAL_TENSOR = torch.ones(3)


def _uses_global_tensor(x):
    return x + _GLOBAL_TENSOR


def test_global_tensor_mutated_in_place_is_read_fresh():
    cnt = CompileCounter()
    opt = kiln.compile(_uses_global_tensor, backend=cnt)
    x = torch.randn(3)
    try:
        torch.testing.assert_close(opt(x), x + 1)
        _GLOBAL_TENSOR.mul_(3)
        torch.testing.assert_close(opt(x), x + 3)
    finally:
        _GLOBAL_TENSOR.fill_(1.0)
    assert cnt.frame_count == 1


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 1.0

    def forward(self, x):
        return self.lin(x) * self.scale


def test_user_module_float_attribute_change_is_seen():
    model = _Scaled()
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(2, 3)
    torch.testing.assert_close(opt(x), model.lin(x))
    model.scale = 3.0
    torch.testing.assert_close(opt(x), model.lin(x) * 3.0)
    assert cnt.frame_count == 2


def test_parameter_updated_in_place_is_used_without_recompiling():
    model = nn.Linear(3, 3)
    cnt = CompileCounter()
    opt = kiln.compile(model, backend=cnt)
    x = torch.randn(2, 3)
    opt(x)
    with torch.no_grad():
        model.weight.add_(1.0)
    torch.testing.assert_close(opt(x), model(x))
    assert cnt.frame_count == 1


def test_cache_size_limit_falls_back_to_eager_with_right_results():
    kiln.config.cache_size_limit = 2

    def f(x, n):
        return x + n

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = torch.randn(3)
    for n in range(5):
        torch.testing.assert_close(opt(x, n), x + n)
    assert cnt.frame_count == 2


def test_no_grad_caller_vs_grad_caller_are_separate_entries():
    def f(x):
        return x * 2

    cnt = CompileCounter()
    opt = kiln.compile(f, backend=cnt)
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        a = opt(x)
    b = opt(x)
    assert not a.requires_grad and b.requires_grad
    torch.testing.assert_close(a, b.detach())
    assert cnt.frame_count == 2


def test_two_compiled_functions_have_independent_caches():
    def f(x):
        return x + 1

    def g(x):
        return x - 1

    cnt = CompileCounter()
    of, og = kiln.compile(f, backend=cnt), kiln.compile(g, backend=cnt)
    x = torch.randn(3)
    for _ in range(2):
        torch.testing.assert_close(of(x), x + 1)
        torch.testing.assert_close(og(x), x - 1)
    assert cnt.frame_count == 2


def test_resume_function_guards_on_value_passed_across_break():
    def f(x):
        n = int(x.sum().item() > 0)
        return x * (n + 1)

    check(f, arg_sets=[(torch.ones(3),), (torch.ones(3),), (-torch.ones(3),)], frames=3)


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()


# State changed between calls that the compiled entry must notice (a recompile or a fresh
# read): results must equal eager after the change.

STALE = "kiln: WRONG RESULT: the compiled entry keeps using the old {what} (no guard fails)"


def _changed_between_calls(program, change, x, *, frames):
    cnt = CompileCounter()
    opt = kiln.compile(program, backend=cnt)
    torch.testing.assert_close(opt(x), program(x))
    change(program)
    torch.testing.assert_close(opt(x), program(x))
    assert cnt.frame_count == frames


class _OwnParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.w * x


def test_parameter_attribute_replaced_with_a_new_parameter():
    _changed_between_calls(_OwnParam(), lambda m: setattr(m, "w", nn.Parameter(torch.zeros(3))),
                           torch.randn(3), frames=2)


def test_linear_weight_replaced_with_a_new_parameter():
    _changed_between_calls(
        nn.Linear(3, 3), lambda m: setattr(m, "weight", nn.Parameter(torch.zeros(3, 3))),
        torch.randn(2, 3), frames=2)


def test_linear_bias_set_to_none():
    _changed_between_calls(nn.Linear(3, 3), lambda m: setattr(m, "bias", None),
                           torch.randn(2, 3), frames=2)


class _Buffered(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x):
        return x + self.shift


def test_buffer_reassigned_with_a_new_tensor():
    _changed_between_calls(_Buffered(), lambda m: setattr(m, "shift", torch.zeros(3)),
                           torch.randn(3), frames=2)


def test_buffer_updated_in_place_needs_no_recompile():
    _changed_between_calls(_Buffered(), lambda m: m.shift.mul_(4), torch.randn(3), frames=1)


def test_sequential_append_after_compile():
    _changed_between_calls(nn.Sequential(nn.Linear(3, 3)), lambda m: m.append(nn.ReLU()),
                           torch.randn(2, 3), frames=2)


def test_sequential_item_replaced_after_compile():
    _changed_between_calls(nn.Sequential(nn.Linear(3, 3), nn.ReLU()),
                           lambda m: m.__setitem__(1, nn.Tanh()), torch.randn(2, 3), frames=2)


class _HasChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x):
        return self.inner(x).relu()


def test_user_submodule_replaced_after_compile():
    _changed_between_calls(_HasChild(), lambda m: setattr(m, "inner", nn.Linear(3, 3)),
                           torch.randn(2, 3), frames=2)


def test_submodule_eval_only_recompiles():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(1.0))
    model.eval()
    _changed_between_calls(model, lambda m: m[1].train(), torch.randn(2, 3), frames=2)


class _ClassScaled:
    scale = 1.0


def _uses_class_attribute(x):
    return x * _ClassScaled.scale


def test_class_attribute_changed_after_compile():
    try:
        _changed_between_calls(_uses_class_attribute,
                               lambda f: setattr(_ClassScaled, "scale", 4.0), torch.randn(3),
                               frames=2)
    finally:
        _ClassScaled.scale = 1.0


def _closure_over_list():
    box = [1.0]
    return (lambda x: x * box[0]), box


def test_closure_cell_contents_changed_after_compile():
    fn, box = _closure_over_list()
    _changed_between_calls(fn, lambda f: box.__setitem__(0, 3.0), torch.randn(3), frames=2)


def test_function_defaults_changed_after_compile():
    def f(x, s=2.0):
        return x * s

    _changed_between_calls(f, lambda g: setattr(g, "__defaults__", (7.0,)), torch.randn(3),
                           frames=2)


@pytest.mark.parametrize("module, attr, value", [
    (nn.Dropout(0.0), "p", 1.0),
    (nn.LeakyReLU(0.1), "negative_slope", 0.5),
])
def test_torch_nn_constants_are_guarded_when_configured(monkeypatch, module, attr, value):
    # With the default guard_nn_module_constants=False kiln documents that these are taken
    # as fixed; with it on a change must recompile.
    monkeypatch.setattr(kiln.config, "guard_nn_module_constants", True)
    _changed_between_calls(module, lambda m: setattr(m, attr, value), torch.randn(4), frames=2)


def _times_ten_hook(module, inputs, output):
    return output * 10


def test_forward_hook_registered_before_compile_is_applied():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    model[0].register_forward_hook(_times_ten_hook)
    opt = kiln.compile(model, backend=CompileCounter())
    x = torch.randn(2, 3)
    torch.testing.assert_close(opt(x), model(x))


def test_forward_hook_registered_on_child_after_compile():
    _changed_between_calls(nn.Sequential(nn.Linear(3, 3), nn.ReLU()),
                           lambda m: m[0].register_forward_hook(_times_ten_hook),
                           torch.randn(2, 3), frames=2)
    # linear+relu before the hook; after it the hook guard fails and Sequential.forward is
    # captured again with the hook inlined around the child's forward: linear, mul, relu.


def test_forward_hook_registered_on_root_after_compile():
    model = nn.Linear(3, 3)
    opt = kiln.compile(model, backend=CompileCounter())
    x = torch.randn(2, 3)
    opt(x)
    model.register_forward_hook(_times_ten_hook)
    torch.testing.assert_close(opt(x), model(x))


@pytest.fixture
def imported_helpers(monkeypatch):
    """A package with a submodule, both registered in sys.modules as an import leaves them."""
    import sys
    import types

    package = types.ModuleType("kiln_corpus_pkg")
    package.__path__ = []
    helpers = types.ModuleType("kiln_corpus_pkg.helpers")
    helpers.__package__ = "kiln_corpus_pkg"
    helpers.SCALE = 2.0
    helpers.OFFSET = torch.ones(3)
    package.helpers = helpers
    monkeypatch.setitem(sys.modules, "kiln_corpus_pkg", package)
    monkeypatch.setitem(sys.modules, "kiln_corpus_pkg.helpers", helpers)
    return helpers


def _import_in_the_frame(x):
    import kiln_corpus_pkg.helpers
    return x * kiln_corpus_pkg.helpers.SCALE + kiln_corpus_pkg.helpers.OFFSET


def _from_import_in_the_frame(x):
    from kiln_corpus_pkg.helpers import OFFSET, SCALE
    return x * SCALE + OFFSET


def _relative_import_in_the_frame(x):
    from . import helpers
    return x * helpers.SCALE + helpers.OFFSET


def _in_package(fn, package):
    import types
    return types.FunctionType(fn.__code__, {"__name__": f"{package}.user",
                                            "__package__": package, "__builtins__": __builtins__})


@pytest.mark.parametrize("program", [
    _import_in_the_frame, _from_import_in_the_frame,
    _in_package(_relative_import_in_the_frame, "kiln_corpus_pkg"),
], ids=["import", "from_import", "relative_import"])
def test_attributes_of_a_module_imported_in_the_frame_are_guarded(imported_helpers, program):
    cnt = CompileCounter()
    opt = kiln.compile(program, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x), program(x))
    imported_helpers.SCALE = 5.0  # a constant the capture read: a new graph
    torch.testing.assert_close(opt(x), program(x))
    assert cnt.frame_count == 2
    imported_helpers.OFFSET = torch.randn(3)  # a tensor the graph takes: read again, same graph
    torch.testing.assert_close(opt(x), program(x))
    assert cnt.frame_count == 2


def test_module_replaced_in_sys_modules_is_imported_again(imported_helpers, monkeypatch):
    import sys
    import types

    cnt = CompileCounter()
    opt = kiln.compile(_from_import_in_the_frame, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x), _from_import_in_the_frame(x))
    other = types.ModuleType("kiln_corpus_pkg.helpers")
    other.SCALE, other.OFFSET = imported_helpers.SCALE, torch.zeros(3)
    monkeypatch.setitem(sys.modules, "kiln_corpus_pkg.helpers", other)
    torch.testing.assert_close(opt(x), _from_import_in_the_frame(x))
    assert cnt.frame_count == 2
