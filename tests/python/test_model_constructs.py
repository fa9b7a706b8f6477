"""Python constructs today's model families use (torchvision, timm, transformers), each captured
without a graph break or an eager frame and compared with eager on random inputs."""
import collections
import dataclasses

import pytest
import torch

import kiln
from kiln.testing import CompileCounter


def _one_graph(fn, *args, graphs=1):
    """fn compiled with a counting backend: its result equals eager's, and capture made
    `graphs` graphs with no break and no frame run eagerly (kiln.explain)."""
    explained = kiln.explain(fn)(*args)
    assert explained.graph_break_count == 0, [str(r) for r in explained.break_reasons]
    assert explained.graph_count == graphs
    kiln.reset()
    cnt = CompileCounter()
    got = kiln.optimize(cnt)(fn)(*args)
    want = fn(*args)
    torch.testing.assert_close(got, want)
    return cnt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_finfo_and_iinfo_of_a_tensor_dtype_are_constants(dtype):
    # LLMs mask with torch.finfo(dtype).min; GPT-Neo, Bloom, T5 broke here.
    def f(x, ids):
        masked = x.masked_fill(x > 0, torch.finfo(x.dtype).min)
        return masked + torch.finfo(x.dtype).eps, ids.clamp(max=torch.iinfo(ids.dtype).max - 1)

    _one_graph(f, torch.randn(4, 4).to(dtype), torch.randint(0, 9, (4,)))


def test_torch_finfo_with_no_argument_is_the_default_dtypes():
    def f(x):
        return x + torch.finfo().eps * 1e6

    x = torch.randn(4)
    cnt = _one_graph(f, x)
    prior = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.testing.assert_close(kiln.optimize(cnt)(f)(x), f(x))
        assert cnt.frame_count == 2  # the default dtype is guarded: a new graph
    finally:
        torch.set_default_dtype(prior)


def _usage(obj):
    """torchvision's _log_api_usage_once: reads a function's attributes."""
    module = obj.__module__
    name = obj.__class__.__name__ if not isinstance(obj, type(_usage)) else obj.__name__
    return f"{module}.{name}"


def test_a_functions_attributes_are_read_and_guarded():
    def scaled(x):
        return x * 2

    def f(x):
        if _usage(scaled).endswith("scaled") and scaled.__class__ is type(_usage):
            return scaled(x) + len(scaled.__qualname__)
        return x

    cnt = _one_graph(f, torch.randn(3))
    scaled.__qualname__ = "other"  # a function's attributes are writable: guarded
    x = torch.randn(3)
    torch.testing.assert_close(kiln.optimize(cnt)(f)(x), f(x))


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    loss: float = 0.0


def test_dataclass_fields_slots_are_read_from_outside_objects():
    # dataclasses.fields() returns Field objects (a __slots__ class): Field.name and
    # Field.default are member descriptors read through the instance.
    def f(x, out):
        total = x
        for fld in dataclasses.fields(out):
            v = getattr(out, fld.name)
            if isinstance(v, torch.Tensor):
                total = total + v
            elif fld.default == 0.0:
                total = total * 2
        return total

    _one_graph(f, torch.randn(3), _Out(torch.randn(3)))


def test_code_object_attributes_and_setattr_are_modelled():
    # transformers' decorators read func.__code__.co_varnames to bind arguments by name.
    class State:
        pass

    def helper(a, b, scale=2):
        return a * scale + b

    def f(x, state):
        names = helper.__code__.co_varnames[:helper.__code__.co_argcount]
        setattr(state, "seen", names)
        return helper(x, x) if names[-1] == "scale" else x

    s_got, s_want = State(), State()
    x = torch.randn(3)
    _one_graph(f, x, s_got)
    f(x, s_want)
    assert s_got.seen == s_want.seen == ("a", "b", "scale")


def test_an_ordered_dict_made_and_filled_in_the_frame():
    # torchvision's detection and segmentation models collect feature maps in an OrderedDict.
    import collections

    def f(x):
        out = collections.OrderedDict()
        out["a"] = x + 1
        out["b"] = x * 2
        out.update(c=x - 1)
        names = list(out.keys())
        total = sum(v.sum() for v in out.values())
        return out, names, total

    x = torch.randn(3)
    _one_graph(lambda x: f(x)[2], x)
    got, want = kiln.compile(f, backend="eager")(x), f(x)
    assert type(got[0]) is collections.OrderedDict and list(got[0]) == list(want[0])
    assert got[1] == want[1]


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x * x * ctx.k

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g * ctx.k, None


def _uses_square(x):
    return _Square.apply(x + 1, 3) * 2


def test_autograd_function_apply_without_gradients_is_its_forward_in_the_graph():
    _one_graph(_uses_square, torch.randn(3))
    with torch.no_grad():
        _one_graph(_uses_square, torch.randn(3, requires_grad=True))


def test_autograd_function_apply_with_gradients_keeps_its_backward():
    x = torch.randn(3, requires_grad=True)
    y = kiln.compile(_uses_square, backend="eager")(x)
    y.sum().backward()
    got = x.grad.clone()
    x.grad = None
    _uses_square(x).sum().backward()
    torch.testing.assert_close(got, x.grad)


def test_a_torchvision_class_is_a_user_class_not_torchs():
    # torchvision's ImageList (detection models) was taken for one of torch's own classes
    # (its module's name starts with "torch") and its construction broke the graph.
    image_list = pytest.importorskip("torchvision.models.detection.image_list")

    def f(x):
        il = image_list.ImageList(x, [(2, 2)])
        return il.tensors * 2

    _one_graph(f, torch.randn(2, 2))


def test_a_classes_subclasses_are_the_ones_alive_at_each_call():
    # Registries look their implementations up this way; the list changes as classes are made.
    class Base:
        pass

    class First(Base):
        pass

    def f(x, cls):
        return x + 1, Base.__subclasses__(), cls.__subclasses__()

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    y, subs, subs_of_first = compiled(x, First)
    torch.testing.assert_close(y, x + 1)
    assert subs == [First] and subs_of_first == []

    class Second(Base):
        pass

    class Third(First):
        pass

    _, again, subs_of_first = compiled(x, First)
    assert again == [First, Second] and subs_of_first == [Third]
    assert again is not subs  # a new list each call, as eager's

def test_map_filter_reduce_and_itertools_over_known_items():
    import functools
    import itertools
    import operator

    def f(x, ys):
        a = functools.reduce(operator.add, ys)
        b = list(map(lambda t: t * 2, ys))
        c = list(itertools.chain(ys, [x]))
        d = list(filter(lambda t: t is not None, [x, None, x]))
        e = sum(itertools.starmap(operator.mul, zip(ys, ys)))
        g = functools.reduce(lambda acc, t: acc * t, ys, x)
        return a + b[0] + len(c) + len(d) + e + g + len(list(filter(None, [0, 1, 2])))

    _one_graph(f, torch.randn(3), [torch.randn(3), torch.randn(3)])


def test_map_over_a_function_with_effects_is_left_to_python():
    # map() calls its function as items are taken: one that appends to a list cannot be run
    # when the map is made.
    seen = []

    def note(t):
        seen.append(1)
        return t + 1

    def f(x):
        m = map(note, [x, x])
        before = len(seen)
        return sum(m) + before

    x = torch.randn(3)
    got = kiln.compile(f, backend="eager")(x)
    assert len(seen) == 2
    seen.clear()
    torch.testing.assert_close(got, f(x))  # `before` is 0 in both: the calls came later


def _fullgraph(fn, *args):
    torch.testing.assert_close(kiln.compile(fn, backend="eager", fullgraph=True)(*args),
                               fn(*args))


class _AttrDict(dict):
    def __getattr__(self, key):
        return self[key]


class _Boxes:
    def __init__(self, t):
        self.t = t

    def __len__(self):
        return self.t.shape[0]


class _Items(list):
    def extra(self):
        return 1


class _Guarded(list):
    """A list subclass whose iteration and length are its own (they raise): indexing it still
    runs list's own item access."""

    def __iter__(self):
        raise RuntimeError("not iterable")

    def __len__(self):
        raise RuntimeError("no length")


class _Empty:
    pass


def test_user_objects_dunders_getattr_fallback_and_builtin_subclasses():
    x = torch.randn(3)
    _fullgraph(lambda c, x: x + c.offset, _AttrDict(offset=5), x)  # __getattr__ fallback
    _fullgraph(lambda b: len(b) + b.t, _Boxes(torch.ones(2, 4)))  # __len__ inlined
    _fullgraph(lambda lst: lst[0] + lst[1] * len(lst), _Items([x, x]))  # list subclass
    _fullgraph(lambda p, x: x + 1 if p else x, _Empty(), x)  # bool() of a plain object
    _fullgraph(lambda b, x: x + 1 if b else x, _Boxes(torch.ones(0, 4)), x)  # via __len__


class _Value:
    def __init__(self, v):
        self.v = v

    def __add__(self, other):
        return _Value(self.v + (other.v if isinstance(other, _Value) else other))

    def __radd__(self, other):
        return _Value(other + self.v)

    def __mul__(self, other):
        return _Value(self.v * other.v)

    def __lt__(self, other):
        return self.v.shape[0] < other.v.shape[0] + 1


def test_indexing_a_list_subclass_with_its_own_len_and_iter_reads_the_items():
    cnt = CompileCounter()
    fn = kiln.compile(lambda lst: lst[0] + lst[1], backend=cnt, fullgraph=True)
    items = _Guarded([torch.randn(4), torch.randn(4)])
    torch.testing.assert_close(fn(items), list.__getitem__(items, 0) +
                               list.__getitem__(items, 1))
    assert cnt.frame_count == 1 and cnt.op_count == 1
    list.append(items, torch.randn(4))  # another length (counted as list counts): a new graph
    torch.testing.assert_close(fn(items), list.__getitem__(items, 0) +
                               list.__getitem__(items, 1))
    assert cnt.frame_count == 2


def test_a_user_class_operator_methods_are_inlined_in_pythons_order():
    a, b = torch.randn(3), torch.randn(3)
    _fullgraph(lambda a, b: (_Value(a) + _Value(b) * _Value(a)).v, a, b)
    _fullgraph(lambda a: (1 + _Value(a) + 2).v, a)  # __radd__, then __add__
    _fullgraph(lambda a, b: a * 2 if _Value(a) < _Value(b) else a, a, b)


def test_torch_functionals_private_helpers_are_inlined_not_ops():
    import torch.nn.functional as F

    def fn(x):
        m = F._canonical_mask(mask=None, mask_name="m", other_type=None, other_name="o",
                              target_type=x.dtype)
        d = F._none_or_dtype(None)
        return x + 1 if (m is None and d is None) else x - 1

    _one_graph(fn, torch.ones(2))
    counter = CompileCounter()
    kiln.optimize(counter)(fn)(torch.ones(2))
    assert counter.op_count == 1


def test_a_graph_inputs_grad_and_a_tensors_class_are_read():
    def f(x, w):
        g = w.grad
        name = x.__class__.__name__
        return (x * 2 if g is None else x + g), name

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    for grad in (None, torch.ones(3), torch.full((3,), 5.0)):
        w.grad = grad  # guarded: a new value of .grad is read, None to a tensor recompiles
        got, want = compiled(x, w), f(x, w)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] == "Tensor"


def test_an_ordered_dict_from_outside_is_read_in_its_own_order_and_updated_in_place():
    import collections

    def f(feats, x):
        total = x
        for k, v in feats.items():
            total = total * 2 + v.sum()
        feats["seen"] = total.detach()
        return total, list(feats)

    def make():
        torch.manual_seed(0)
        return collections.OrderedDict(a=torch.randn(2), b=torch.randn(3))

    x = torch.randn(1)
    compiled = kiln.compile(f, backend="eager")
    for reorder in (False, True):
        got_in, want_in = make(), make()
        if reorder:  # move_to_end reorders without changing the dict: guarded, recompiles
            got_in.move_to_end("a")
            want_in.move_to_end("a")
        got, want = compiled(got_in, x), f(want_in, x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] and list(got_in) == list(want_in)
        assert type(got_in) is collections.OrderedDict
        torch.testing.assert_close(got_in["seen"], want_in["seen"])
    explained = kiln.explain(f)(make(), x)  # one graph, no break: the dict's update replayed
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_forward_hooks_and_pre_hooks_are_called_around_forward():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    lin.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    lin.register_forward_hook(lambda m, args, out: out + 1)
    lin.register_forward_pre_hook(lambda m, args, kwargs: ((args[0] + 1,), kwargs),
                                  with_kwargs=True)
    lin.register_forward_hook(lambda m, args, kwargs, out: out * 3, with_kwargs=True)
    lin.register_forward_hook(lambda m, args, out: None)  # returns None: out stays

    def f(x):
        return lin(x).relu()

    x = torch.randn(2, 4)
    _one_graph(f, x)
    handle = lin.register_forward_hook(lambda m, args, out: out - 100)  # guarded: recompiles
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))
    handle.remove()
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))


class _Scaled(torch.nn.Module):
    def forward(self, x, scale=1.0):
        return x * scale


def test_a_pre_hook_that_edits_kwargs_in_place_is_seen_by_forward_and_the_later_hooks():
    # _call_impl hands the hooks and forward one kwargs dict: a pre-hook that sets a key and
    # returns None changes what forward gets (kiln passed forward the dict from before).
    m = _Scaled()

    def pre(mod, args, kwargs):
        kwargs["scale"] = 3.0

    m.register_forward_pre_hook(pre, with_kwargs=True)
    m.register_forward_hook(lambda mod, args, kwargs, out: out + kwargs["scale"],
                            with_kwargs=True)
    _fullgraph(lambda x: m(x, scale=2.0), torch.randn(3))


def test_a_pre_hook_returning_a_namedtuple_gives_forward_its_items():
    Args = collections.namedtuple("Args", ["x"])
    m = _Scaled()
    m.register_forward_pre_hook(lambda mod, args: Args(args[0] + 1))
    _fullgraph(lambda x: m(x), torch.randn(3))


def test_an_int_power_of_an_item_value_has_eager_s_type(monkeypatch):
    # 2 ** k is an int for k >= 0 and a float below: the stand-in (1) said int.
    monkeypatch.setattr(kiln.config, "capture_scalar_outputs", True)

    def f(x, n):
        p = 2 ** n.item()
        return x * p, isinstance(p, float)

    x = torch.randn(3)
    for k in (-2, 3):
        n = torch.tensor(k)
        got, want = kiln.compile(f, backend="eager")(x, n), f(x, n)
        assert got[1] == want[1]
        torch.testing.assert_close(got[0], want[0])


def test_item_is_a_value_the_graph_computes_under_capture_scalar_outputs(monkeypatch):
    monkeypatch.setattr(kiln.config, "capture_scalar_outputs", True)

    def f(a, b):
        s = a[0].item() + b[0].item()
        return a * s + 1, s * 2, torch.max(a).int().item()

    cnt = CompileCounter()
    compiled = kiln.optimize(cnt, nopython=True)(f)
    for _ in range(3):  # new values, one graph: the numbers are computed, not guarded
        a, b = torch.randn(3), torch.randn(3)
        got, want = compiled(a, b), f(a, b)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] and type(got[1]) is float
        assert got[2] == want[2] and type(got[2]) is int
    assert cnt.frame_count == 1

    def sized(a):  # a size or a branch needs the value: still a graph break
        return torch.zeros(int(a.sum().item())) + (1 if a.sum().item() > 0 else 2)

    with pytest.raises(kiln.exc.Unsupported):
        kiln.optimize("eager", nopython=True)(sized)(torch.ones(3))
    torch.testing.assert_close(kiln.compile(sized, backend="eager")(torch.ones(3)),
                               sized(torch.ones(3)))


def test_a_function_the_frame_makes_keeps_its_names_and_annotations():
    # torch.nn.modules.utils' _ntuple: `parse.__name__ = name`; a returned function with
    # annotations was rebuilt without them (the frame ran eagerly).
    def nested_name(x):
        def g(v):
            return v * 2

        g.__name__ = "h"
        return g(x), g, g.__name__

    def annotated(x):
        def fn2(a: int, b: torch.Tensor) -> torch.Tensor:
            return a + b

        return fn2, x * 2

    x = torch.randn(3)
    got = kiln.compile(nested_name, backend="eager", fullgraph=True)(x)
    want = nested_name(x)
    torch.testing.assert_close(got[0], want[0])
    assert (got[1].__name__, got[1].__qualname__, got[2]) == \
        (want[1].__name__, want[1].__qualname__, want[2])
    fn, _ = kiln.compile(annotated, backend="eager", fullgraph=True)(x)
    assert fn.__annotations__ == annotated(x)[0].__annotations__
    torch.testing.assert_close(fn(1, x), 1 + x)


def test_a_namedtuple_made_in_the_frame():
    import collections

    point = collections.namedtuple("point", ["a", "b", "c"], defaults=[7])

    def f(a, b):
        t = point(a, b=a + b)
        return t.b * t.c + t[0], t

    x = torch.randn(3)
    got = kiln.compile(f, backend="eager", fullgraph=True)(x, x)
    want = f(x, x)
    torch.testing.assert_close(got[0], want[0])
    assert type(got[1]) is point and got[1].c == 7


def test_functools_partial_from_outside_and_made_in_the_frame():
    # transformers' GELUTanh: self.act = functools.partial(F.gelu, approximate="tanh").
    import functools

    act = functools.partial(torch.nn.functional.gelu, approximate="tanh")

    def scale(x, k, shift=0.0):
        return x * k + shift

    def f(x):
        twice = functools.partial(scale, k=2.0)
        return act(x) + twice(x, shift=1.0), twice

    x = torch.randn(4)
    _one_graph(lambda x: f(x)[0], x)
    got = kiln.compile(f, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(got[0], f(x)[0])
    assert isinstance(got[1], functools.partial) and got[1](x, shift=0.0).equal(x * 2.0)
    act.keywords["approximate"] = "none"  # a partial's keywords are guarded
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x)[0], f(x)[0])


def test_a_slice_argument_is_a_guarded_constant():
    def f(items, i, t):
        return items[i] + [100], t[i]

    x = torch.randn(5)
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    for sl in (slice(0, 2), slice(1, 4), slice(None, None, 2)):
        got, want = compiled(list(range(5)), sl, x), f(list(range(5)), sl, x)
        assert got[0] == want[0]
        torch.testing.assert_close(got[1], want[1])


def test_dict_update_with_pairs():
    def f(x, d):
        out = dict(a=x)
        out.update(d.items())
        out.update([("c", x * 3)], e=x * 5)
        return out

    x = torch.randn(2)
    _one_graph(lambda x, d: sum(f(x, d).values()), x, {"b": torch.ones(2)})
    got, want = kiln.compile(f, backend="eager")(x, {"b": x}), f(x, {"b": x})
    assert list(got) == list(want)


def test_islice_over_containers_and_lazily_over_iterators():
    import itertools

    def f(x):
        tmp1, tmp2 = [x + 1, x + 2], (x + 3, x + 4)
        a, b = list(itertools.islice(itertools.chain(tmp1, tmp2), 1, 3))
        c = list(itertools.islice([x, x * 2, x * 3, x * 4], 0, None, 2))
        it = iter([x, x * 2, x * 3, x * 4, x * 5])
        s = itertools.islice(it, 1, 4, 2)
        first = next(s)
        after = next(it)  # islice took only what it yielded from `it`
        return a + b + sum(c) + first * 10 + after * 100

    _one_graph(f, torch.randn(3))


def test_itertools_repeat_with_a_count():
    # torch.nn.modules.utils._pair / _ntuple: tuple(repeat(x, n)) for a conv's kernel size.
    import itertools

    def f(x):
        size = torch.nn.modules.utils._pair(x.shape[0])
        twice = [t * 2 for t in itertools.repeat(x, 2)]
        none = tuple(itertools.repeat(x, -1))
        return torch.zeros(size) + sum(twice) + len(none)

    _one_graph(f, torch.randn(3))


def test_itertools_repeat_outliving_the_graph_is_a_repeat_of_what_is_left():
    import itertools

    def f(x):
        it = itertools.repeat(x + 1, 3)
        first = next(it)
        return first, it, isinstance(it, itertools.repeat)

    x = torch.randn(3)
    assert kiln.explain(f)(x).graph_break_count == 0
    kiln.reset()
    first, it, is_repeat = kiln.compile(f, backend="eager")(x)
    assert type(it) is itertools.repeat and is_repeat
    rest = list(it)
    assert len(rest) == 2 and all(r is first for r in rest)  # the one object, as eager's
    torch.testing.assert_close(rest[0], x + 1)
    torch.testing.assert_close(first, x + 1)


def test_membership_in_a_frozenset_of_functions():
    funcs = frozenset([torch.add])

    def fn(x, func):
        if func in funcs:
            x = torch.add(x, 1.0)
        return torch.mul(x, 1.0)

    x = torch.randn(1)
    for func in (torch.add, torch.sub):
        torch.testing.assert_close(
            kiln.compile(fn, backend="eager", fullgraph=True)(x, func), fn(x, func))


def test_a_model_output_from_outside_is_read_as_its_dict():
    generic = pytest.importorskip("transformers.utils.generic")
    out = generic.ModelOutput(a=torch.randn(10), b=torch.randn(10), c=torch.randn(10))
    for fn in (lambda x: x["a"] + 1, lambda x: x.a + 1, lambda x: x.to_tuple()[0] + 1,
               lambda x: x[0] + 1, lambda x: sum(v.sum() for v in x.values()) + len(x.keys())):
        cnt = CompileCounter()
        torch.testing.assert_close(kiln.optimize(cnt, nopython=True)(fn)(out), fn(out))
        assert cnt.frame_count == 1


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x + x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _ByInstance(torch.nn.Module):
    def forward(self, x):
        return _Twice().apply(x)  # the old spelling


class _ByStoredApply(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fn = _Twice.apply

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("module", [_ByInstance, _ByStoredApply])
def test_autograd_function_apply_through_an_instance_or_a_stored_apply(module):
    m = module()
    _fullgraph(lambda x: m(x) * 3, torch.ones(2, 3))


_WEIGHT = torch.randn(3, requires_grad=True)


class _ScaleByGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * _WEIGHT  # apply runs forward with grad mode off: no gradient to _WEIGHT

    @staticmethod
    def backward(ctx, g):
        return g * 100


class _FromDict(torch.autograd.Function):
    @staticmethod
    def forward(ctx, d):
        return d["x"] * 2

    @staticmethod
    def backward(ctx, g):
        return None


def test_autograd_function_forward_runs_with_grad_mode_off_as_apply_runs_it():
    def f(x):
        return _ScaleByGlobal.apply(x)

    x = torch.randn(3)
    got, want = kiln.compile(f, backend="eager")(x), f(x)
    assert got.requires_grad == want.requires_grad is False
    torch.testing.assert_close(got, want)


class _Refuses(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise ValueError("refused")

    @staticmethod
    def backward(ctx, g):
        return g


def test_grad_mode_is_back_on_after_an_autograd_function_forward_that_raised():
    def f(x, w):
        try:
            _Refuses.apply(x)
        except ValueError:
            pass
        return x * w

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    got, want = kiln.compile(f, backend="eager")(x, w), f(x, w)
    assert got.requires_grad == want.requires_grad is True
    torch.testing.assert_close(got, want)


def test_autograd_function_given_a_dict_of_tensors_that_need_grad_records_no_gradient():
    # A tensor inside a dict is no input of the Function's autograd node: eager's result needs
    # no gradient, and the inlined forward (grad mode off) computes one that needs none too.
    def f(x):
        return _FromDict.apply({"x": x}).sum()

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not require grad"):  # eager: no grad_fn
        f(x).backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        kiln.compile(f, backend="eager")(x).backward()


def test_an_lru_cached_availability_check_is_called_once_at_capture():
    import functools

    calls = []

    @functools.lru_cache
    def is_feature_available(name="x"):
        calls.append(name)
        return True

    def f(x):
        return x * 2 if is_feature_available() else x

    _one_graph(f, torch.randn(3))
    assert calls == ["x"]  # called once, as eager's first call would, then cached


def test_a_typing_subscript_in_jit_annotate_is_made_at_capture():
    # timm's crossvit: torch.jit.annotate(List[torch.Tensor], []). List[...] runs typing's
    # cache (an lru_cache on 3.11, a dict keyed by functions on 3.12): made at capture instead
    # (typing constructs are immutable), not a break in every block.
    from typing import Dict, List, Optional, Union

    def f(x):
        outs = torch.jit.annotate(List[torch.Tensor], [])
        outs.append(x * 2)
        maybe = torch.jit.annotate(Optional[torch.Tensor], None)
        named = torch.jit.annotate(Dict[str, torch.Tensor], {"y": x})
        none = torch.jit.annotate(Union[int, None], None)
        return outs[0] + named["y"] if maybe is None and none is None else x

    _fullgraph(f, torch.randn(3))


def test_a_typing_construct_swapped_for_another_of_its_type_recompiles():
    # typing.List and typing.Tuple are objects of one class: the subscript made at capture
    # holds only while the global is the same object.
    import typing

    scope = {"typing": typing, "ALIAS": typing.List}
    exec("def f(x):\n    return x + 1, ALIAS[int]\n", scope)
    compiled = kiln.compile(scope["f"], backend="eager")
    assert compiled(torch.ones(1))[1] == typing.List[int]
    scope["ALIAS"] = typing.Tuple
    assert compiled(torch.ones(1))[1] == typing.Tuple[int] == scope["f"](torch.ones(1))[1]


def test_a_typing_subscript_made_at_capture_outlives_the_graph():
    # A nested function annotated with List[a local class] returned from the frame: the
    # subscript's value is rebuilt after the graph as the object typing made (immutable).
    import typing

    class Node:
        pass

    def f(x):
        y = x / 3.0

        def inner(nodes: typing.List[Node]) -> typing.Optional[torch.Tensor]:
            return y + 1

        return inner, typing.Tuple[Node, int]

    x = torch.randn(3)
    assert kiln.explain(f)(x).graph_break_count == 0
    kiln.reset()
    (inner, pair), (want_inner, want_pair) = kiln.compile(f, backend="eager")(x), f(x)
    assert inner.__annotations__ == want_inner.__annotations__
    assert inner.__annotations__["nodes"] is typing.List[Node] and pair is want_pair
    torch.testing.assert_close(inner([]), want_inner([]))


def test_an_rnn_reads_its_weak_references_to_its_weights_in_the_graph():
    # nn.LSTM checks its flat weights through weak references before each call (ref() is
    # weight): two breaks per LSTM (timm's sequencer: 21 graphs). The reference's referent is
    # read and guarded through it; a weight replaced after the capture fails that guard, and
    # the LSTM then re-reads its weights as eager does.
    torch.manual_seed(0)
    m = torch.nn.LSTM(8, 8, batch_first=True, bidirectional=True).eval()
    x = torch.randn(2, 5, 8)

    def f(x):
        return m(x)[0] * 2

    with torch.no_grad():
        explained = kiln.explain(f)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
        compiled = kiln.compile(f, backend="eager")
        torch.testing.assert_close(compiled(x), f(x))
        m.weight_hh_l0 = torch.nn.Parameter(torch.randn_like(m.weight_hh_l0))
        for _ in range(2):
            torch.testing.assert_close(compiled(x), f(x))


def test_an_lru_cached_check_is_not_answered_while_capturing_for_another_device(monkeypatch):
    # Capturing CPU tensors as a GPU's (kiln.graph.stand_in): this machine's answer to
    # is_torch_cuda_available() is not the GPU machine's, so it is not baked into the record.
    import functools

    @functools.lru_cache
    def is_cuda_available():
        return torch.cuda.is_available()

    def f(x):
        return x * 2 if is_cuda_available() else x + 1

    monkeypatch.setattr(kiln.config, "capture_cpu_as", "cuda:0")
    with pytest.raises(kiln.exc.Unsupported, match="lru_cache.*while capturing for cuda:0"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3))


def test_fx_tracing_flag_and_shape_as_tensor():
    def f(x, y):
        if torch.fx._symbolic_trace.is_fx_tracing():
            return x - 1
        return y + 1 + torch._shape_as_tensor(x)[0]

    _one_graph(f, torch.randn(3), torch.randn(3))
