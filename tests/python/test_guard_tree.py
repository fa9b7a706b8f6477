"""The C++ guard tree (kiln._C.GuardManager): sources, checks, failure reasons, and the rules
that keep it safe on the hot path (no exception left set, no reference leaked)."""
import collections
import gc
import math
import sys
import types
import weakref

import pytest
import torch

import kiln
from kiln import _C

L0 = ("local", 0)
L1 = ("local", 1)


def frame_func(a=None, b=None):
    """The function whose globals, builtins and closure the sources read."""
    return a, b


def manager(*guards):
    g = _C.GuardManager()
    for source, check, description in guards:
        g.add(source, check, description)
    return g


def tensor_guard(example, source=L0, name="L['x']"):
    return manager((source, ("tensor", example), f"{name} TENSOR_MATCH"))


# --- TENSOR_MATCH --------------------------------------------------------------------------------


def test_tensor_match_passes_on_same_metadata_with_other_values():
    g = tensor_guard(torch.randn(3, 4))
    assert g.check((torch.zeros(3, 4),), frame_func)
    assert g.failure_reason((torch.zeros(3, 4),), frame_func) is None


def test_tensor_match_fails_on_shape_change():
    g = tensor_guard(torch.randn(3, 4))
    assert not g.check((torch.randn(4, 4),), frame_func)
    assert g.failure_reason((torch.randn(4, 4),), frame_func) == (
        "L['x'] TENSOR_MATCH: size mismatch at dim 0, expected 3, got 4")


def test_tensor_match_fails_on_rank_change():
    g = tensor_guard(torch.randn(3, 4))
    assert "rank mismatch, expected 2, got 3" in g.failure_reason((torch.randn(3, 4, 1),),
                                                                  frame_func)


def test_tensor_match_fails_on_dtype_change():
    g = tensor_guard(torch.randn(3))
    assert not g.check((torch.randn(3, dtype=torch.float64),), frame_func)
    assert "dtype mismatch, expected torch.float32, got torch.float64" in g.failure_reason(
        (torch.randn(3, dtype=torch.float64),), frame_func)


def test_tensor_match_fails_on_device_change():
    g = tensor_guard(torch.randn(3))
    meta = torch.empty(3, device="meta")
    assert not g.check((meta,), frame_func)
    assert "device mismatch, expected cpu, got meta" in g.failure_reason((meta,), frame_func)


def test_tensor_match_fails_on_requires_grad_change():
    g = tensor_guard(torch.randn(3))
    assert not g.check((torch.randn(3, requires_grad=True),), frame_func)
    assert "requires_grad mismatch, expected False, got True" in g.failure_reason(
        (torch.randn(3, requires_grad=True),), frame_func)


def test_tensor_match_fails_on_stride_change_of_transposed_tensor():
    g = tensor_guard(torch.randn(4, 4))
    transposed = torch.randn(4, 4).t()
    assert not g.check((transposed,), frame_func)
    assert "stride mismatch at dim 0, expected 4, got 1" in g.failure_reason((transposed,),
                                                                            frame_func)


def test_tensor_match_tells_parameter_from_tensor():
    param = torch.nn.Parameter(torch.randn(3))
    g = tensor_guard(param)
    assert g.check((torch.nn.Parameter(torch.randn(3)),), frame_func)
    plain = torch.randn(3, requires_grad=True)
    assert not g.check((plain,), frame_func)
    reason = g.failure_reason((plain,), frame_func)
    assert "expected type torch.nn.parameter.Parameter, got torch.Tensor" in reason
    assert not tensor_guard(torch.randn(3, requires_grad=True)).check((param,), frame_func)


def test_tensor_match_fails_on_non_tensor():
    g = tensor_guard(torch.randn(3))
    assert not g.check(([1.0, 2.0, 3.0],), frame_func)
    assert "got list" in g.failure_reason(([1.0, 2.0, 3.0],), frame_func)


def test_tensor_match_fails_when_inference_mode_changes_dispatch_keys():
    g = tensor_guard(torch.randn(3))
    x = torch.randn(3)
    with torch.inference_mode():
        assert not g.check((x,), frame_func)
        assert "dispatch key set mismatch" in g.failure_reason((x,), frame_func)
    assert g.check((x,), frame_func)


def test_tensor_match_does_not_keep_the_example_alive():
    example = torch.randn(3)
    ref = weakref.ref(example)
    g = tensor_guard(example)
    del example
    gc.collect()
    assert ref() is None
    assert g.check((torch.randn(3),), frame_func)


# --- identity, type, constants, containers --------------------------------------------------------


SENTINEL = object()


def test_global_id_fails_when_the_global_is_rebound():
    global SENTINEL
    g = manager((("global", "SENTINEL"), ("id", SENTINEL), "G['SENTINEL'] ID_MATCH"))
    assert g.check((), frame_func)
    saved = SENTINEL
    try:
        SENTINEL = object()
        assert not g.check((), frame_func)
        assert g.failure_reason((), frame_func).startswith("G['SENTINEL'] ID_MATCH: expected the")
    finally:
        SENTINEL = saved
    assert g.check((), frame_func)


def test_missing_global_fails():
    g = manager((("global", "NOT_DEFINED_ANYWHERE"), ("id", None), "G['NOT_DEFINED_ANYWHERE']"))
    assert not g.check((), frame_func)
    assert g.failure_reason((), frame_func) == (
        "G['NOT_DEFINED_ANYWHERE']: global 'NOT_DEFINED_ANYWHERE' is not defined")


def test_global_source_fails_without_a_function_object():
    g = manager((("global", "SENTINEL"), ("id", SENTINEL), "G['SENTINEL'] ID_MATCH"))
    assert not g.check((), None)


def test_builtin_source_reads_the_functions_builtins():
    g = manager((("builtin", "len"), ("id", len), "B['len'] ID_MATCH"))
    assert g.check((), frame_func)
    other = types.FunctionType(frame_func.__code__, {"__builtins__": {"len": max}})
    assert not g.check((), other)


def test_id_check_keeps_its_object_alive():
    obj = type("Anything", (), {})()
    ref = weakref.ref(obj)
    g = manager((L0, ("id", obj), "L['o'] ID_MATCH"))
    del obj
    gc.collect()
    assert ref() is not None
    assert g.check((ref(),), frame_func)


def test_type_check_is_exact():
    g = manager((L0, ("type", dict), "L['d'] TYPE_MATCH dict"))
    assert g.check(({},), frame_func)
    assert not g.check((collections.OrderedDict(),), frame_func)
    assert "expected type dict, got collections.OrderedDict" in g.failure_reason(
        (collections.OrderedDict(),), frame_func)


def test_constant_match_distinguishes_int_float_and_bool():
    for value, others in [(1, [1.0, True, 2]), (1.0, [1, True, 1.5]), (True, [1, 1.0, False])]:
        g = manager((L0, ("constant", value), f"L['n'] CONSTANT_MATCH {value!r}"))
        assert g.check((value,), frame_func)
        for other in others:
            assert not g.check((other,), frame_func), (value, other)


def test_constant_match_fails_on_changed_value_and_says_why():
    g = manager((L0, ("constant", 3), "L['n'] CONSTANT_MATCH 3"))
    assert g.check((3,), frame_func)
    assert g.failure_reason((4,), frame_func) == (
        "L['n'] CONSTANT_MATCH 3: expected 3 (int), got 4 (int)")


def test_constant_match_handles_big_ints_nan_and_signed_zero():
    big = 2**100
    g = manager((L0, ("constant", big), "big"))
    assert g.check((2**100,), frame_func) and not g.check((2**100 + 1,), frame_func)
    assert not manager((L0, ("constant", 5), "five")).check((2**100,), frame_func)
    nan = manager((L0, ("constant", math.nan), "nan"))
    assert nan.check((float("nan"),), frame_func) and not nan.check((0.0,), frame_func)
    zero = manager((L0, ("constant", 0.0), "zero"))
    assert zero.check((0.0,), frame_func) and not zero.check((-0.0,), frame_func)


def test_constant_match_on_none_str_bytes_dtype_and_device():
    cases = [(None, 0), ("abc", "abd"), (b"x", "x"), (torch.float32, torch.float16),
             (torch.device("cpu"), torch.device("meta"))]
    for value, other in cases:
        g = manager((L0, ("constant", value), repr(value)))
        assert g.check((value,), frame_func), value
        assert not g.check((other,), frame_func), value
    assert manager((L0, ("constant", "abc"), "s")).check(("".join(["ab", "c"]),), frame_func)


def test_len_check_on_list_tuple_dict_and_torch_size():
    g = manager((L0, ("len", 2), "L['s'] LEN_MATCH 2"))
    for ok in ([1, 2], (1, 2), {1: 1, 2: 2}, torch.Size([5, 6])):
        assert g.check((ok,), frame_func), ok
    for bad in ([1], (1, 2, 3), {}, "ab"):
        assert not g.check((bad,), frame_func), bad
    assert "length mismatch, expected 2, got 3" in g.failure_reason(([1, 2, 3],), frame_func)


def test_dict_keys_check_is_ordered_and_exact():
    g = manager((L0, ("dict_keys", ("a", "b")), "L['d'] DICT_KEYS ['a', 'b']"))
    assert g.check(({"a": 1, "b": 2},), frame_func)
    assert not g.check(({"b": 2, "a": 1},), frame_func)
    assert not g.check(({"a": 1},), frame_func)
    assert not g.check(({"a": 1, "b": 2, "c": 3},), frame_func)
    assert "expected keys ('a', 'b'), got ('b', 'a')" in g.failure_reason(({"b": 2, "a": 1},),
                                                                         frame_func)


# --- sources ------------------------------------------------------------------------------------


def make_closure(value):
    def inner():
        return value

    return inner


def test_closure_cell_guard_follows_the_cell_contents():
    obj = object()
    inner = make_closure(obj)
    g = manager((("closure", 0), ("id", obj), "C['value'] ID_MATCH"))
    assert g.check((), inner)
    assert not g.check((), make_closure(object()))
    del inner.__closure__[0].cell_contents
    assert not g.check((), inner)
    assert "closure cell 0 is empty" in g.failure_reason((), inner)
    assert not g.check((), frame_func)  # no closure at all


def test_attr_chain_is_read_through_getattr():
    outer = types.SimpleNamespace(inner=types.SimpleNamespace(scale=2))
    g = manager((("attr", ("attr", L0, "inner"), "scale"), ("constant", 2),
                 "L['o'].inner.scale CONSTANT_MATCH 2"))
    assert g.check((outer,), frame_func)
    outer.inner.scale = 3
    assert not g.check((outer,), frame_func)
    del outer.inner
    assert not g.check((outer,), frame_func)
    assert "AttributeError" in g.failure_reason((outer,), frame_func)


def test_shared_source_prefix_is_read_once():
    class Holder:
        reads = 0

        @property
        def child(self):
            Holder.reads += 1
            return self._child

    h = Holder()
    h._child = types.SimpleNamespace(a=1, b="x")
    child = ("attr", L0, "child")
    g = manager((child, ("type", types.SimpleNamespace), "L['h'].child TYPE_MATCH"),
                (("attr", child, "a"), ("constant", 1), "L['h'].child.a CONSTANT_MATCH 1"),
                (("attr", child, "b"), ("constant", "x"), "L['h'].child.b CONSTANT_MATCH 'x'"))
    assert len(g) == 3
    assert g.check((h,), frame_func)
    assert Holder.reads == 1


def test_module_child_through_instance_dict_and_registry_items():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    child = ("item", ("item", ("instance_dict", L0), "_modules"), "0")
    weight = ("item", ("item", ("instance_dict", child), "_parameters"), "weight")
    g = manager((child, ("id", model[0]), "L['m'][0] ID_MATCH"),
                (weight, ("tensor", model[0].weight), "L['m'][0].weight TENSOR_MATCH"))
    assert g.check((model,), frame_func)
    model[0].weight = torch.nn.Parameter(torch.randn(2, 3))
    assert g.check((model,), frame_func)  # same metadata: the graph still fits
    model[0].weight = torch.nn.Parameter(torch.randn(2, 4))
    assert "L['m'][0].weight TENSOR_MATCH: size mismatch at dim 1" in g.failure_reason(
        (model,), frame_func)
    model[0] = torch.nn.Linear(3, 2)
    assert g.failure_reason((model,), frame_func).startswith("L['m'][0] ID_MATCH")


def test_instance_dict_bypasses_descriptors():
    class WithProperty:
        @property
        def value(self):
            return "from the property"

    obj = WithProperty()
    obj.__dict__["value"] = "from the dict"
    g = manager((("item", ("instance_dict", L0), "value"), ("constant", "from the dict"), "d"))
    assert g.check((obj,), frame_func)
    assert not g.check((object(),), frame_func)  # no __dict__ at all


def test_item_source_on_list_tuple_and_mapping():
    g = manager((("item", L0, 1), ("constant", "b"), "L['s'][1]"),
                (("item", L1, -1), ("constant", "z"), "L['t'][-1]"))
    assert g.check((["a", "b"], ("x", "z")), frame_func)
    assert not g.check((["a"], ("x", "z")), frame_func)
    assert "out of range" in g.failure_reason((["a"], ("x", "z")), frame_func)
    assert g.check(({1: "b"}, ("z",)), frame_func)  # dicts use the key
    assert not g.check(({2: "b"}, ("z",)), frame_func)

    class Mapping:
        def __getitem__(self, key):
            return "b" if key == 1 else None

    assert g.check((Mapping(), ("z",)), frame_func)


def test_object_and_type_sources():
    config = {"mode": "fast"}
    g = manager((("item", ("object", config), "mode"), ("constant", "fast"), "config['mode']"),
                (("type", L0), ("id", int), "type(L['n']) ID_MATCH int"))
    assert g.check((3,), frame_func)
    assert not g.check((3.0,), frame_func)
    config["mode"] = "slow"
    assert not g.check((3,), frame_func)


def test_slot_out_of_range_or_empty_fails():
    g = manager((L1, ("constant", 1), "L['b'] CONSTANT_MATCH 1"))
    assert not g.check((1,), frame_func)
    assert "argument slot 1 is out of range (the frame has 1)" in g.failure_reason((1,),
                                                                                  frame_func)


# --- global state ------------------------------------------------------------------------------


def test_global_state_fails_under_no_grad():
    g = manager((None, ("global_state",), "GLOBAL_STATE"))
    assert g.check((), frame_func)
    with torch.no_grad():
        assert not g.check((), frame_func)
        assert g.failure_reason((), frame_func) == (
            "GLOBAL_STATE: grad mode changed, expected True, got False")
    assert g.check((), frame_func)


def test_global_state_recorded_under_no_grad_fails_with_grad():
    with torch.no_grad():
        g = manager((None, ("global_state",), "GLOBAL_STATE"))
        assert g.check((), frame_func)
    assert not g.check((), frame_func)


def test_global_state_tracks_default_dtype_determinism_and_autocast():
    g = manager((L0, ("global_state",), "GLOBAL_STATE"))
    assert g.check((), frame_func)  # the source is ignored: no slot 0 needed
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert "default dtype changed, expected torch.float32, got torch.float64" in (
            g.failure_reason((), frame_func))
    finally:
        torch.set_default_dtype(saved)
    torch.use_deterministic_algorithms(True)
    try:
        assert "deterministic algorithms changed" in g.failure_reason((), frame_func)
    finally:
        torch.use_deterministic_algorithms(False)
    with torch.autocast("cpu"):
        assert "CPU autocast changed" in g.failure_reason((), frame_func)
    assert g.check((), frame_func)


def test_global_state_tracks_the_autocast_dtype():
    # A graph traced under bfloat16 autocast has bfloat16 casts: wrong under float16 autocast.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g = manager((L0, ("global_state",), "GLOBAL_STATE"))
        assert g.check((), frame_func)
        with torch.autocast("cpu", dtype=torch.float16):
            assert ("CPU autocast dtype changed, expected torch.bfloat16, got torch.float16"
                    in g.failure_reason((), frame_func))


def test_a_function_compiled_under_one_autocast_dtype_recompiles_under_another():
    lin = torch.nn.Linear(16, 8).eval()
    x = torch.randn(4, 16)
    compiled = kiln.compile(lin, backend="kiln")
    with torch.no_grad():
        for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
            with torch.autocast("cpu", dtype=dtype):
                out = compiled(x)
                assert out.dtype == lin(x).dtype == dtype


def test_global_state_checks_tf32_flags_only_with_a_cuda_device():
    g = manager((None, ("global_state",), "GLOBAL_STATE"))
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_tf32
    try:
        matmul.allow_tf32 = not saved
        reason = g.failure_reason((), frame_func)
    finally:
        matmul.allow_tf32 = saved
    if torch.cuda.is_available():
        assert reason is not None and "cuBLAS TF32 changed" in reason
    else:  # no device the flag could change a result on: not read, not failed
        assert reason is None
    assert g.check((), frame_func)


# --- the tree as a whole ------------------------------------------------------------------------


def test_failure_reason_names_the_failing_guard_among_many():
    x = torch.randn(2)
    g = manager((L0, ("tensor", x), "L['x'] TENSOR_MATCH"),
                (L1, ("constant", 7), "L['k'] CONSTANT_MATCH 7"),
                (("global", "SENTINEL"), ("id", SENTINEL), "G['SENTINEL'] ID_MATCH"))
    assert g.failure_reason((x, 7), frame_func) is None
    assert g.failure_reason((x, 8), frame_func).startswith("L['k'] CONSTANT_MATCH 7: ")
    assert g.failure_reason((x[:1], 7), frame_func).startswith("L['x'] TENSOR_MATCH: ")


def test_cheap_checks_run_before_tensor_checks_on_one_value():
    g = manager((L0, ("tensor", torch.randn(2)), "L['x'] TENSOR_MATCH"),
                (L0, ("id", SENTINEL), "L['x'] ID_MATCH"))
    assert g.describe() == ["L['x'] ID_MATCH", "L['x'] TENSOR_MATCH"]
    assert g.failure_reason((torch.randn(2),), frame_func).startswith("L['x'] ID_MATCH")


def test_describe_lists_every_guard_and_len_counts_them():
    g = manager((L0, ("type", int), "a"), (("attr", L0, "real"), ("constant", 1), "b"),
                (None, ("global_state",), "c"), (L1, ("len", 0), "d"))
    assert len(g) == 4
    assert sorted(g.describe()) == ["a", "b", "c", "d"]
    assert g.describe()[0] == "c"  # global state sits at the root, before any source


def test_often_failing_child_moves_to_the_front():
    g = manager((L0, ("constant", 1), "first"), (L1, ("constant", 2), "second"))
    assert g.describe() == ["first", "second"]
    for _ in range(3):
        assert not g.check((1, 3), frame_func)
    assert g.describe() == ["second", "first"]
    assert g.check((1, 2), frame_func)
    assert not g.check((0, 2), frame_func)


def test_exception_in_property_counts_as_failure_and_leaves_none_set():
    class Boom:
        @property
        def value(self):
            raise RuntimeError("boom")

    g = manager((("attr", L0, "value"), ("constant", 1), "L['o'].value CONSTANT_MATCH 1"))
    assert g.check((Boom(),), frame_func) is False
    assert sys.exc_info() == (None, None, None)
    assert g.failure_reason((Boom(),), frame_func) == (
        "L['o'].value CONSTANT_MATCH 1: reading attribute 'value' raised RuntimeError: boom")
    assert sys.exc_info() == (None, None, None)


def test_exception_in_eq_counts_as_failure():
    class BadKey(str):
        def __eq__(self, other):
            raise ValueError("no comparing")

        __hash__ = str.__hash__

    g = manager((L0, ("dict_keys", ("a",)), "L['d'] DICT_KEYS"))
    assert not g.check(({BadKey("b"): 1},), frame_func)


def test_adding_a_guard_while_evaluating_is_refused():
    g = _C.GuardManager()
    errors = []

    class Sneaky:
        @property
        def value(self):
            try:
                g.add(L0, ("constant", 1), "late")
            except ValueError as e:
                errors.append(str(e))
            return 1

    g.add(("attr", L0, "value"), ("constant", 1), "L['o'].value")
    assert g.check((Sneaky(),), frame_func)
    assert errors and "while the tree is being evaluated" in errors[0]
    assert len(g) == 1


def test_evaluation_leaks_no_references():
    value = object()
    holder = types.SimpleNamespace(inner={"k": [value]})
    g = manager((("item", ("item", ("attr", L0, "inner"), "k"), 0), ("id", value), "ok"),
                (("item", ("item", ("attr", L0, "inner"), "k"), 0), ("type", object), "t"))
    bad = manager((("item", ("item", ("attr", L0, "inner"), "k"), 0), ("id", None), "bad"))
    missing = manager((("item", ("attr", L0, "inner"), "nope"), ("id", None), "missing"),
                      (("attr", L0, "nope"), ("id", None), "no attribute"))
    before = (sys.getrefcount(value), sys.getrefcount(holder), sys.getrefcount(holder.inner))
    for _ in range(1000):
        assert g.check((holder,), frame_func)
        for failing in (bad, missing):
            assert not failing.check((holder,), frame_func)
            failing.failure_reason((holder,), frame_func)
    after = (sys.getrefcount(value), sys.getrefcount(holder), sys.getrefcount(holder.inner))
    assert before == after


@pytest.mark.parametrize("source, check, message", [
    ("local", ("constant", 1), "source must be a tuple"),
    ((), ("constant", 1), "source must be a tuple"),
    (("local", -1), ("constant", 1), "needs an int i >= 0"),
    (("local", "x"), ("constant", 1), "needs an int i >= 0"),
    (("local", True), ("constant", 1), "needs an int i >= 0"),
    (("global", 3), ("constant", 1), "needs a str name"),
    (("attr", L0), ("constant", 1), "takes 3 elements"),
    (("attr", L0, 5), ("constant", 1), "needs a str name"),
    (("attr", ("nowhere", 0), "x"), ("constant", 1), "unknown source kind 'nowhere'"),
    (L0, "constant", "check must be a tuple"),
    (L0, ("constant",), "takes 2 elements"),
    (L0, ("constant", [1]), "('constant', value) supports"),
    (L0, ("type", 3), "needs a type"),
    (L0, ("len", -1), "needs an int n >= 0"),
    (L0, ("dict_keys", ["a"]), "needs a tuple of keys"),
    (L0, ("tensor", [1.0]), "needs a torch.Tensor"),
    (L0, ("frobnicate", 1), "unknown check kind 'frobnicate'"),
    (L0, ("shape", 1), "takes 4 elements"),
    (L0, ("tensor", torch.zeros(2), (None, 3), (1,)), "sizes must be a tuple of the example's rank"),
    (L0, ("tensor", torch.zeros(2), (-2,), (1,)), "holds ints >= 0 and Nones"),
])
def test_malformed_add_raises_value_error(source, check, message):
    g = _C.GuardManager()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        g.add(source, check, "bad")
    assert len(g) == 0
    assert g.check((), frame_func)


def test_malformed_source_adds_nothing_to_the_tree():
    g = manager((L0, ("constant", 1), "ok"))
    with pytest.raises(ValueError):
        g.add(("attr", ("attr", L0, "a"), 7), ("constant", 1), "bad")
    assert g.describe() == ["ok"]
    assert g.check((1,), frame_func)


# --- the checks identity and attribute lookups need ---------------------------------------------


class _Obj:
    pass


def test_has_attr_and_no_attr_follow_getattr():
    o = _Obj()
    g = manager((L0, ("no_attr", "flag"), "L['o'] NO_HASATTR 'flag'"))
    assert g.check((o,), frame_func)
    o.flag = 1
    assert g.failure_reason((o,), frame_func) == "L['o'] NO_HASATTR 'flag': attribute 'flag' now exists"
    h = manager((L0, ("has_attr", "flag"), "L['o'] HASATTR 'flag'"))
    assert h.check((o,), frame_func)
    del o.flag
    assert not h.check((o,), frame_func)
    _Obj.flag = 2  # a class attribute counts, as for getattr
    try:
        assert h.check((o,), frame_func)
    finally:
        del _Obj.flag


def test_no_item_fails_once_the_key_is_there():
    g = manager((("instance_dict", L0), ("no_item", "m"), "no m"))
    o = _Obj()
    assert g.check((o,), frame_func)
    o.m = 1
    assert not g.check((o,), frame_func)
    with pytest.raises(ValueError, match="hashable"):
        manager((L0, ("no_item", []), "bad"))


def test_is_and_distinct_compare_objects_of_the_same_frame():
    same = manager((L1, ("is", L0), "L['b'] IS L['a']"))
    distinct = manager((L0, ("distinct", (L0, L1)), "L['a'], L['b'] DISTINCT"))
    a, b = object(), object()
    assert same.check((a, a), frame_func) and not same.check((a, b), frame_func)
    assert distinct.check((a, b), frame_func) and not distinct.check((a, a), frame_func)
    assert not distinct.check((a,), frame_func)  # a source that cannot be read fails
    with pytest.raises(ValueError, match="two or more"):
        manager((L0, ("distinct", (L0,)), "one"))


def test_id_match_holds_its_object_weakly_and_tells_when_it_dies():
    deaths = []
    g = _C.GuardManager(on_dead=deaths.append)
    o = _Obj()
    ref = weakref.ref(o)
    g.add(L0, ("id", o), "L['o'] ID_MATCH")
    assert g.check((o,), frame_func)
    del o
    gc.collect()
    assert ref() is None and len(deaths) == 1
    assert not g.check((None,), frame_func)
    assert "no longer exists" in g.failure_reason((None,), frame_func)


def test_id_match_keeps_objects_without_weak_references_alive():
    g = _C.GuardManager(on_dead=lambda ref: None)
    value = (1, 2)  # tuples take no weak references: held strongly
    g.add(L0, ("id", value), "L['t'] ID_MATCH")
    assert g.check((value,), frame_func) and not g.check(((1, 2, 3),), frame_func)


# --- the fast path over unchanged dicts ---------------------------------------------------------


def _module_like():
    o = _Obj()
    o.eps = 1e-5
    o.stride = (1, 2)
    o.items = []
    return o


def _dict_guards():
    d = ("instance_dict", L0)
    return manager((("item", d, "eps"), ("constant", 1e-5), "eps"),
                   (("item", d, "stride"), ("type", tuple), "stride type"),
                   (("item", d, "stride"), ("len", 2), "stride len"),
                   (("item", ("item", d, "stride"), 0), ("constant", 1), "stride[0]"),
                   (("item", ("item", d, "stride"), 1), ("constant", 2), "stride[1]"),
                   (("item", d, "items"), ("len", 0), "items len"),
                   (d, ("no_item", "forward"), "no forward"))


def test_an_unchanged_dict_still_fails_what_its_items_changed_inside():
    o = _module_like()
    g = _dict_guards()
    assert g.check((o,), frame_func) and g.check((o,), frame_func)  # the second is fast
    o.items.append(1)  # mutated in place: the dict's version does not move
    assert not g.check((o,), frame_func)


@pytest.mark.parametrize("change", ["eps", "stride", "forward", "del_eps"])
def test_a_changed_dict_runs_its_checks_again(change):
    o = _module_like()
    g = _dict_guards()
    assert g.check((o,), frame_func) and g.check((o,), frame_func)
    if change == "eps":
        o.eps = 1e-3
    elif change == "stride":
        o.stride = (1, 3)
    elif change == "forward":
        o.forward = print
    else:
        del o.eps
    assert not g.check((o,), frame_func)
    assert g.failure_reason((o,), frame_func) is not None


def test_another_object_with_an_equal_dict_is_checked_in_full():
    g = _dict_guards()
    a, b = _module_like(), _module_like()
    assert g.check((a,), frame_func)
    b.eps = 2.0
    assert not g.check((b,), frame_func)
    assert g.check((a,), frame_func)


def test_a_dict_subclass_is_always_checked_in_full():
    class Answering(dict):
        answer = 1

        def __getitem__(self, key):  # answers from outside the dict's own contents
            return Answering.answer

    d = Answering(k=1)
    g = manager((("item", L0, "k"), ("constant", 1), "d['k'] CONSTANT_MATCH 1"))
    assert g.check((d,), frame_func) and g.check((d,), frame_func)
    Answering.answer = 5  # the dict itself is unchanged
    assert not g.check((d,), frame_func)


def test_an_entry_whose_guarded_objects_die_at_interpreter_exit_prints_nothing():
    # The weak references' callbacks run while the interpreter tears its modules down (sys
    # among them): they printed "Exception ignored in ... on_dead" at every exit.
    import subprocess
    import sys

    program = (
        "import sys, types, torch\n"
        "early = types.ModuleType('early')\n"  # torn down after kiln's modules
        "early.m = torch.nn.Linear(3, 3)\n"
        "sys.modules['early'] = early\n"
        "import kiln\n"
        "f = kiln.compile(lambda x: early.m(x) * 2, backend='eager')\n"
        "f(torch.randn(2, 3))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


# --- dict_keys of an OrderedDict (and other dict subclasses): the order iteration yields ----------

ABC = ("a", "b", "c")


def _keys_guard(source=L0, name="L['d']"):
    return (source, ("dict_keys", ABC), f"{name} DICT_KEYS ['a', 'b', 'c']")


def test_dict_keys_passes_an_ordered_dict_with_the_same_keys_in_the_same_order():
    g = manager(_keys_guard())
    od = collections.OrderedDict(a=1, b=2, c=3)
    assert g.check((od,), frame_func) and g.check((od,), frame_func)
    assert g.failure_reason((od,), frame_func) is None
    assert not g.check((collections.OrderedDict(b=2, a=1, c=3),), frame_func)
    assert "expected a dict, got list" in g.failure_reason(([("a", 1)],), frame_func)
    assert not g.check((types.MappingProxyType({"a": 1, "b": 2, "c": 3}),), frame_func)


def _reorder(od, change):
    if change == "move_to_end":
        od.move_to_end("a")
    elif change == "move_to_front":
        od.move_to_end("c", last=False)
    elif change == "insertion":
        od["d"] = 4
    elif change == "deletion":
        del od["b"]
    else:  # popped and put back: the same keys, the same dict size, another order
        od["a"] = od.pop("a")


_AFTER = {"move_to_end": ("b", "c", "a"), "move_to_front": ("c", "a", "b"),
          "insertion": ("a", "b", "c", "d"), "deletion": ("a", "c"),
          "pop_and_reinsert": ("b", "c", "a")}


@pytest.mark.parametrize("change", list(_AFTER))
def test_dict_keys_fails_once_an_ordered_dicts_order_or_keys_change(change):
    od = collections.OrderedDict(a=1, b=2, c=3)
    g = manager(_keys_guard(), (("item", L0, "a"), ("constant", 1), "L['d']['a'] CONSTANT_MATCH 1"))
    assert g.check((od,), frame_func) and g.check((od,), frame_func)
    _reorder(od, change)
    assert not g.check((od,), frame_func)
    assert g.failure_reason((od,), frame_func) == (
        f"L['d'] DICT_KEYS ['a', 'b', 'c']: expected keys {ABC!r}, got {_AFTER[change]!r}")


@pytest.mark.parametrize("change", ["move_to_end", "move_to_front"])
def test_an_ordered_dict_reordered_inside_an_unchanged_dict_fails_its_keys_guard(change):
    # move_to_end changes neither the OrderedDict's version tag nor its parent's: the fast path
    # over the unchanged parent must not take the OrderedDict's keys as unchanged too.
    od = collections.OrderedDict(a=1, b=2, c=3)
    features = {"feats": od}
    feats = ("item", L0, "feats")
    g = manager((L0, ("type", dict), "L['x'] TYPE_MATCH dict"),
                (L0, ("dict_keys", ("feats",)), "L['x'] DICT_KEYS ['feats']"),
                (feats, ("type", collections.OrderedDict), "L['x']['feats'] TYPE_MATCH"),
                _keys_guard(feats, "L['x']['feats']"))
    assert g.check((features,), frame_func) and g.check((features,), frame_func)
    _reorder(od, change)
    assert not g.check((features,), frame_func)
    assert "L['x']['feats'] DICT_KEYS" in g.failure_reason((features,), frame_func)


def test_dict_keys_with_a_type_match_fails_a_plain_dict_with_the_same_keys():
    g = manager((L0, ("type", collections.OrderedDict), "L['d'] TYPE_MATCH OrderedDict"),
                _keys_guard())
    assert g.check((collections.OrderedDict(a=1, b=2, c=3),), frame_func)
    assert not g.check(({"a": 1, "b": 2, "c": 3},), frame_func)
    assert g.failure_reason(({"a": 1, "b": 2, "c": 3},), frame_func) == (
        "L['d'] TYPE_MATCH OrderedDict: expected type collections.OrderedDict, got dict")
    # The keys alone do not tell the two apart: that is the type check's part.
    assert manager(_keys_guard()).check(({"a": 1, "b": 2, "c": 3},), frame_func)


def test_dict_keys_of_a_dict_subclass_follow_its_own_iteration_order():
    class Reversed(dict):
        def __iter__(self):
            return reversed(list(dict.__iter__(self)))

    g = manager((L0, ("dict_keys", ("c", "b", "a")), "L['d'] DICT_KEYS ['c', 'b', 'a']"))
    assert g.check((Reversed(a=1, b=2, c=3),), frame_func)
    assert not g.check((Reversed(c=3, b=2, a=1),), frame_func)


class _CountingKey(str):
    """A key equal to another str key of its class only through __eq__, which it counts."""
    compared = 0
    on_compare = None

    def __eq__(self, other):
        _CountingKey.compared += 1
        if _CountingKey.on_compare is not None:
            _CountingKey.on_compare()
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_unchanged_exact_dict_skips_its_keys_check_and_an_ordered_dict_never_does():
    # The guard's key and the dict's are equal but not the same object: comparing them calls
    # __eq__, which counts the comparisons the check makes.
    g = manager((L0, ("dict_keys", (_CountingKey("k"),)), "L['d'] DICT_KEYS ['k']"))
    d = {_CountingKey("k"): 1}
    _CountingKey.compared = 0
    assert g.check((d,), frame_func) and g.check((d,), frame_func)
    assert _CountingKey.compared == 1  # the second check saw the same version tag
    d[next(iter(d))] = 2  # a new version: compared again
    assert g.check((d,), frame_func)
    assert _CountingKey.compared == 2

    od = collections.OrderedDict(d)
    _CountingKey.compared = 0
    for _ in range(3):
        assert g.check((od,), frame_func)
    assert _CountingKey.compared == 3


@pytest.mark.parametrize("kind", [dict, collections.OrderedDict])
def test_dict_keys_fails_when_a_key_comparison_changes_the_dict(kind):
    d = kind([(_CountingKey("a"), 1), (_CountingKey("b"), 2)])
    g = manager((L0, ("dict_keys", (_CountingKey("a"), _CountingKey("b"))), "L['d'] DICT_KEYS"))
    added = iter(range(100))
    _CountingKey.on_compare = lambda: d.__setitem__(f"added{next(added)}", 0)
    try:
        assert not g.check((d,), frame_func)  # failed, with no exception left set
    finally:
        _CountingKey.on_compare = None
    assert len(d) > 2


def test_ordered_dict_keys_check_leaks_no_references():
    g = manager(_keys_guard())
    same = collections.OrderedDict(a=1, b=2, c=3)
    reordered = collections.OrderedDict(b=2, a=1, c=3)
    longer = collections.OrderedDict(a=1, b=2, c=3, d=4)
    before = [sys.getrefcount(same), sys.getrefcount(reordered), sys.getrefcount(longer)]
    for _ in range(1000):
        assert g.check((same,), frame_func)
        assert not g.check((reordered,), frame_func) and not g.check((longer,), frame_func)
        assert g.failure_reason((longer,), frame_func) is not None
    after = [sys.getrefcount(same), sys.getrefcount(reordered), sys.getrefcount(longer)]
    assert after == before


def test_a_dict_item_source_reads_a_dict_subclass_s_storage_without_its_getitem():
    class Loud(dict):
        def __getitem__(self, key):
            raise AssertionError("the guard ran the class's __getitem__")

    d = Loud(a=1)
    m = _C.GuardManager()
    m.add(("dict_item", ("local", 0), "a"), ("constant", 1), "d['a'] == 1")
    assert m.check((d,), None)
    d2 = Loud(a=2)
    assert not m.check((d2,), None)
    assert "2" in m.failure_reason((d2,), None)
    assert not m.check((Loud(),), None)  # absent
    assert not m.check(([1],), None)  # not a dict


def test_a_weakref_source_reads_what_the_reference_refers_to():
    class Obj:
        pass

    class Ref(weakref.ref):
        def __call__(self):
            raise AssertionError("the guard called a subclass's __call__")

    a, b = Obj(), Obj()
    m = _C.GuardManager()
    m.add(("weakref", ("local", 0)), ("id", a), "r() is a")
    assert m.check((weakref.ref(a),), None)
    assert not m.check((weakref.ref(b),), None)
    assert not m.check((Ref(a),), None)  # not weakref.ref itself
    assert "weakref.ref" in m.failure_reason((a,), None)
    dead = Obj()
    r = weakref.ref(dead)
    none = _C.GuardManager()
    none.add(("weakref", ("local", 0)), ("constant", None), "r() is None")
    assert not none.check((r,), None)
    del dead
    assert none.check((r,), None)


def test_failure_reasons_run_no_repr_of_the_program():
    calls = []

    def loud_repr(self):
        calls.append(1)
        return "Loud()"

    Loud = type("Loud", (), {"__repr__": loud_repr})

    expected, other = Loud(), Loud()
    g = manager((L0, ("id", expected), "L['x'] ID_MATCH"),
                (L1, ("constant", 3), "L['y'] CONSTANT_MATCH 3"))
    reason = g.failure_reason((other, 3), frame_func)
    assert "Loud object at 0x" in reason
    reason = g.failure_reason((expected, (Loud(), "a", 1.5)), frame_func)
    assert "Loud object at 0x" in reason and "'a', 1.5)" in reason
    assert not calls
