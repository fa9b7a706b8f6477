"""kiln._C.Plan, the C++ artifact runtime: plans built by hand as kiln.v1.ExecutionPlan messages
(as kilnd writes them) must compute what eager PyTorch computes; bad plans, and bytes that are no
plan at all, must fail at construction, naming the step or the field."""
import logging
import random
import shutil
import subprocess

import pytest
import torch
from torch.testing import assert_close

from kiln import _C
from kiln.daemon import protocol

if not protocol.available():
    pytest.skip("the kiln.v1 modules are not available (grpcio-tools/protobuf missing)",
                allow_module_level=True)

from kiln.graph.lowering import dtype_to_pb  # noqa: E402 (needs the kiln.v1 modules)

pb = protocol.messages()


def meta(vid, t, dtype=None):
    """A kiln.v1.Value describing tensor `t` (or its shape with another dtype)."""
    v = pb.graph.Value(id=vid)
    v.meta.dtype = dtype_to_pb(dtype if dtype is not None else t.dtype)
    v.meta.sizes.extend(t.shape)
    v.meta.strides.extend(t.stride())
    v.meta.storage_offset = t.storage_offset()
    return v


def value(vid, sizes, dtype=torch.float32):
    return meta(vid, torch.empty(sizes, dtype=dtype))


def pos(kind, payload):
    return ("", kind, payload)


_MEMORY_FORMATS = {torch.contiguous_format: "MEMORY_FORMAT_CONTIGUOUS",
                   torch.preserve_format: "MEMORY_FORMAT_PRESERVE",
                   torch.channels_last: "MEMORY_FORMAT_CHANNELS_LAST"}


def argument(name, kind, payload):
    """A kiln.v1.Argument from (name, kind, Python payload); kind "unset" leaves the oneof empty."""
    a = pb.graph.Argument(name=name)
    if kind == "value":
        a.value = payload
    elif kind == "int":
        a.int_value = payload
    elif kind == "float":
        a.float_value = payload
    elif kind == "bool":
        a.bool_value = payload
    elif kind == "ints":
        a.int_list.values.extend(payload)
    elif kind == "values":
        a.value_list.ids.extend(payload)
    elif kind == "dtype":
        a.dtype_value = dtype_to_pb(payload)
    elif kind == "none":
        a.none.SetInParent()
    elif kind == "str":
        a.string_value = payload
    elif kind == "device":
        device = torch.device(payload)
        a.device_value.kind = pb.graph.DEVICE_KIND_CPU if device.type == "cpu" else \
            pb.graph.DEVICE_KIND_CUDA
        a.device_value.index = device.index or 0
    elif kind == "memory_format":
        a.memory_format_value = pb.graph.MemoryFormat.Value(_MEMORY_FORMATS[payload])
    elif kind == "layout":
        assert payload == torch.strided
        a.layout_value = pb.graph.LAYOUT_STRIDED
    else:
        assert kind == "unset", kind
    return a


def library(op, args, outputs, release=()):
    step = pb.artifact.PlanStep(release=list(release))
    step.library.op = op
    step.library.args.extend(argument(*a) for a in args)
    step.library.outputs.extend(outputs)
    return step


def kernel(symbol, args, writes, release=()):
    step = pb.artifact.PlanStep(release=list(release))
    step.kernel.symbol = symbol
    step.kernel.args.extend(args)
    step.kernel.writes.extend(writes)
    return step


def constant(vid, t):
    """A kiln.v1.Constant holding `t`'s elements (contiguous, as kilnd writes them)."""
    c = pb.graph.Constant(value=meta(vid, t.contiguous()))
    c.data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return c


def plan_bytes(values, inputs, steps, outputs, *, constants=(), buffers=(), arena=0,
               prologue=(), prologue_outputs=()):
    p = pb.artifact.ExecutionPlan(inputs=list(inputs), outputs=list(outputs),
                                  arena_bytes=arena, prologue_outputs=list(prologue_outputs))
    p.values.extend(values)
    p.constants.extend(constants)
    p.steps.extend(steps)
    p.prologue.extend(prologue)
    p.buffers.extend(pb.artifact.Buffer(id=i, in_arena=a, arena_offset=o) for i, a, o in buffers)
    return p.SerializeToString()


def plan(values, inputs, steps, outputs, *, binary=b"", params=(), **fields):
    """`params` are bound to the first of `inputs` once; a call passes the rest."""
    return _C.Plan(plan_bytes(values, inputs, steps, outputs, **fields), binary, list(params))


# ---- kernels following the CPU ABI: extern "C" void sym(void* const* args, parallel_for) ----

KERNELS = r"""
extern "C" void affine12(void* const* a, void*) {  // y = 2x + 1 over a contiguous float[3, 4]
  const float* x = (const float*)a[0]; float* y = (float*)a[1];
  for (int i = 0; i < 12; i++) y[i] = x[i] * 2 + 1;
}
extern "C" void affine16(void* const* a, void*) {  // y = 2x + 1 over float[16]
  const float* x = (const float*)a[0]; float* y = (float*)a[1];
  for (int i = 0; i < 16; i++) y[i] = x[i] * 2 + 1;
}
extern "C" void add16(void* const* a, void*) {  // z = x + y over float[16]
  const float* x = (const float*)a[0]; const float* y = (const float*)a[1]; float* z = (float*)a[2];
  for (int i = 0; i < 16; i++) z[i] = x[i] + y[i];
}
"""


def _build(tmp_path_factory, name, source):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    d = tmp_path_factory.mktemp("kernels")
    (d / f"{name}.cpp").write_text(source)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(d / f"{name}.so"),
                    str(d / f"{name}.cpp")], check=True)
    return (d / f"{name}.so").read_bytes()


@pytest.fixture(scope="module")
def kernels_so(tmp_path_factory):
    return _build(tmp_path_factory, "kernels", KERNELS)


def affine_plan(binary):
    """x: float[3, 4] contiguous -> kernel writes buffer 1 -> output."""
    x = torch.empty(3, 4)
    return plan([meta(0, x), meta(1, x)], [0], [kernel("affine12", [0, 1], [1])], [1],
                binary=binary, buffers=[(1, False, 0)])


# ---- library calls ----

def test_mm_add_with_named_alpha_then_relu_matches_eager():
    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)
    p = plan([value(0, [3, 4]), value(1, [4, 5]), value(2, [3, 5]), value(3, [3, 5]),
              value(4, [3, 5]), value(5, [3, 5])], [0, 1, 2],
             [library("aten::mm", [pos("value", 0), pos("value", 1)], [3]),
              library("aten::add.Tensor", [pos("value", 3), pos("value", 2),
                                           ("alpha", "int", 2)], [4], release=[3]),
              library("aten::relu", [pos("value", 4)], [5], release=[4])], [5])
    assert (p.num_kernels, p.num_library_calls, p.num_inputs) == (0, 3, 3)
    assert_close(p(a, b, c)[0], torch.relu(a @ b + 2 * c))
    assert_close(p.run([a, b, c])[0], torch.relu(a @ b + 2 * c))


def test_permute_and_view_with_int_lists_then_a_library_op():
    x, y = torch.randn(2, 3, 4), torch.randn(4, 6)

    def permute_view_mul(dims):
        permuted = torch.empty(2, 3, 4).permute(*dims)
        return plan([value(0, [2, 3, 4]), value(1, [4, 6]), meta(2, permuted), value(3, [4, 6]),
                     value(4, [4, 6])], [0, 1],
                    [library("aten::permute", [pos("value", 0), pos("ints", dims)], [2]),
                     library("aten::view", [pos("value", 2), ("size", "ints", [4, 6])], [3]),
                     library("aten::mul.Tensor", [pos("value", 3), pos("value", 1)], [4])], [4])

    assert_close(permute_view_mul([2, 0, 1])(x, y)[0], x.permute(2, 0, 1).view(4, 6) * y)
    with pytest.raises(RuntimeError, match=r"step 1 \(aten::view\): view size is not"):
        permute_view_mul([2, 1, 0])(x, y)  # Not viewable: eager raises too; the step is named.


def test_cat_takes_a_values_list():
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    p = plan([value(0, [2, 3]), value(1, [4, 3]), value(2, [6, 3])], [0, 1],
             [library("aten::cat", [pos("values", [0, 1]), ("dim", "int", 0)], [2])], [2])
    assert_close(p(a, b)[0], torch.cat([a, b]))


def test_to_copy_with_dtype_none_layout_and_device():
    x = torch.randn(3, 4)
    p = plan([value(0, [3, 4]), value(1, [3, 4], torch.float64)], [0],
             [library("aten::_to_copy", [pos("value", 0), ("dtype", "dtype", torch.float64),
                                         ("layout", "none", None),
                                         ("device", "device", "cpu")], [1])], [1])
    out = p(x)[0]
    assert out.dtype == torch.float64
    assert_close(out, x.double())


def test_full_with_size_float_fill_dtype_and_device():
    p = plan([value(0, [2, 3], torch.int64)], [],
             [library("aten::full", [pos("ints", [2, 3]), pos("float", 7.0),
                                     ("dtype", "dtype", torch.int64),
                                     ("layout", "layout", torch.strided),
                                     ("device", "device", torch.device("cpu")),
                                     ("pin_memory", "none", None)], [0])], [0])
    assert_close(p()[0], torch.full((2, 3), 7, dtype=torch.int64))


def test_scalar_arguments_keep_int_and_float_apart():
    x = torch.arange(6).reshape(2, 3)
    ints = plan([value(0, [2, 3], torch.int64), value(1, [2, 3], torch.int64)], [0],
                [library("aten::add.Scalar", [pos("value", 0), pos("int", 2)], [1])], [1])
    floats = plan([value(0, [2, 3], torch.int64), value(1, [2, 3])], [0],
                  [library("aten::add.Scalar", [pos("value", 0), pos("float", 2.0)], [1])], [1])
    wrapped = plan([value(0, [2, 3], torch.int64), value(1, [2, 3], torch.int64)], [0],
                   [library("aten::mul.Tensor", [pos("value", 0), pos("int", 3)], [1])], [1])
    assert ints(x)[0].dtype == torch.int64 and torch.equal(ints(x)[0], x + 2)
    assert floats(x)[0].dtype == torch.float32 and torch.equal(floats(x)[0], x + 2.0)
    assert wrapped(x)[0].dtype == torch.int64 and torch.equal(wrapped(x)[0], x * 3)


def test_int_for_an_int_list_and_optional_tensor_lists():
    x, idx = torch.randn(3, 4), torch.tensor([2, 0])
    p = plan([value(0, [3, 4]), value(1, [2], torch.int64), value(2, [3]), value(3, [2, 4])],
             [0, 1],
             [library("aten::sum.dim_IntList", [pos("value", 0), pos("int", 1)], [2]),
              library("aten::index.Tensor", [pos("value", 0), pos("values", [1])], [3])], [2, 3])
    total, picked = p(x, idx)
    assert_close(total, x.sum(1))
    assert_close(picked, x[idx])


def test_memory_format_argument():
    x = torch.randn(2, 3, 4, 5)
    p = plan([value(0, [2, 3, 4, 5]), meta(1, x.contiguous(memory_format=torch.channels_last))],
             [0], [library("aten::clone", [pos("value", 0),
                                           ("memory_format", "memory_format", torch.channels_last)], [1])], [1])
    out = p(x)[0]
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert_close(out, x)


def test_tensor_list_and_tuple_returns_bind_in_order():
    x = torch.randn(4, 3)
    p = plan([value(0, [4, 3]), value(1, [2, 3]), value(2, [2, 3]), value(3, [4]),
              value(4, [4], torch.int64)], [0],
             [library("aten::split.Tensor", [pos("value", 0), pos("int", 2)], [1, 2]),
              library("aten::max.dim", [pos("value", 0), ("dim", "int", 1)], [3, 4])],
             [2, 1, 3, 4])
    hi, lo, values, indices = p(x)
    assert_close((lo, hi), tuple(x.split(2)))
    assert_close((values, indices), tuple(torch.max(x, 1)))


def test_outputs_may_repeat_and_name_an_input():
    x = torch.randn(3)
    p = plan([value(0, [3]), value(1, [3])], [0],
             [library("aten::neg", [pos("value", 0)], [1])], [1, 0, 1])
    a, b, c = p(x)
    assert a is c and b is x
    assert_close(a, -x)


def test_calls_take_tensors_by_position_only():
    x = torch.randn(3)
    p = plan([value(0, [3]), value(1, [3])], [0],
             [library("aten::neg", [pos("value", 0)], [1])], [1])
    assert_close(p(x)[0], -x)
    assert_close(p.run([x])[0], -x)
    assert_close(p.__call__(x)[0], -x)  # the method read as an attribute is the same call
    with pytest.raises(TypeError, match="argument 0 is a float, not a tensor"):
        p(1.5)
    with pytest.raises(TypeError, match="by position only"):
        p(x=x)
    with pytest.raises(RuntimeError, match="takes 1 inputs, got 2"):
        p(x, x)
    with pytest.raises(TypeError):
        type("SubPlan", (_C.Plan,), {})  # final: every Plan instance is the C++ plan
    assert_close(p(x)[0], -x)  # still serving after the refused calls


def test_released_values_are_gone_but_outputs_stay_right():
    x = torch.randn(5)
    steps = [library("aten::exp", [pos("value", 0)], [1]),
             library("aten::neg", [pos("value", 1)], [2], release=[1]),
             library("aten::abs", [pos("value", 2)], [3], release=[2])]
    p = plan([value(i, [5]) for i in range(4)], [0], steps, [3])
    for _ in range(3):
        assert_close(p(x)[0], x.exp())
    with pytest.raises(ValueError, match="releases plan output"):
        plan([value(i, [5]) for i in range(4)], [0], steps, [3, 2])
    with pytest.raises(ValueError, match="used after its release"):
        plan([value(i, [5]) for i in range(5)], [0],
             steps + [library("aten::neg", [pos("value", 1)], [4])], [3])


# ---- kernels ----

def test_kernel_plan_runs_the_shared_object(kernels_so):
    p = affine_plan(kernels_so)
    assert (p.num_kernels, p.num_library_calls) == (1, 0)
    x = torch.randn(3, 4)
    assert_close(p(x)[0], x * 2 + 1)
    first, second = p(x)[0], p(x)[0]
    assert first.data_ptr() != second.data_ptr()  # A fresh output buffer per call.
    assert_close(second, x * 2 + 1)


def test_params_feed_kernels_and_library_calls(kernels_so):
    c = torch.randn(4, 3).t()  # Not in the metadata's strides: relaid once at construction.
    x = torch.randn(3, 4)
    vals = [value(0, [3, 4]), value(1, [3, 4]), value(2, [3, 4]), value(3, [3, 4])]
    steps = [kernel("affine12", [1, 2], [2]),
             library("aten::add.Tensor", [pos("value", 2), pos("value", 0)], [3])]
    p = plan(vals, [1, 0], steps, [3], binary=kernels_so, params=[c], buffers=[(2, False, 0)])
    assert p.num_inputs == 1
    assert_close(p(x)[0], c * 2 + 1 + x)
    with pytest.raises(ValueError, match="parameter value 1 is Double"):
        plan(vals, [1, 0], steps, [3], binary=kernels_so, params=[c.double()],
             buffers=[(2, False, 0)])
    with pytest.raises(ValueError, match="binds 3 parameters to a plan of 2 inputs"):
        plan(vals, [1, 0], steps, [3], binary=kernels_so, params=[c, c, c],
             buffers=[(2, False, 0)])


def test_constants_come_from_the_plans_bytes():
    c = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    empty = torch.empty(0, 4)
    p = plan([value(0, [3, 4], torch.float64), value(1, [3, 4], torch.float64),
              value(2, [3, 4], torch.float64), value(3, [0, 4]), value(4, [0, 4])], [0],
             [library("aten::mul.Tensor", [pos("value", 0), pos("value", 1)], [2]),
              library("aten::neg", [pos("value", 3)], [4])], [2, 4],
             constants=[constant(1, c), constant(3, empty)])
    x = torch.randn(3, 4, dtype=torch.float64)
    out, none = p(x)
    assert_close(out, x * c)
    assert none.shape == (0, 4)
    short = pb.graph.Constant(value=value(1, [3, 4], torch.float64), data=b"\0" * 95)
    with pytest.raises(ValueError, match="constant value 1 has 95 bytes, its metadata needs 96"):
        plan([value(0, [3, 4], torch.float64), value(1, [3, 4], torch.float64)], [0], [], [1],
             constants=[short])


def test_arena_buffers_at_the_same_offset_with_disjoint_lifetimes(kernels_so):
    # b1 = 2x + 1 (arena @0); t = b1 * x; b2 = 2t + 1 (arena @0, over b1's dead bytes);
    # s = b2 + t (arena @64); out = clone(s).
    vals = [value(i, [16]) for i in range(7)]
    steps = [kernel("affine16", [0, 1], [1]),
             library("aten::mul.Tensor", [pos("value", 1), pos("value", 0)], [2]),
             kernel("affine16", [2, 3], [3]),
             kernel("add16", [3, 2, 4], [4], release=[2]),
             library("aten::clone", [pos("value", 4)], [5])]
    p = plan(vals, [0], steps, [5], binary=kernels_so, arena=128,
             buffers=[(1, True, 0), (3, True, 0), (4, True, 64)])
    x = torch.randn(16)
    t = (x * 2 + 1) * x
    assert_close(p(x)[0], (t * 2 + 1) + t)
    assert p.arena_bytes == 128


def test_non_contiguous_input_is_copied_into_the_kernels_layout(kernels_so):
    p = affine_plan(kernels_so)
    x = torch.randn(4, 3).t()  # [3, 4] with strides (1, 3)
    assert_close(p(x)[0], x * 2 + 1)
    base = torch.randn(13)
    y = base[1:].view(3, 4)  # contiguous strides, storage offset 1
    assert_close(p(y)[0], y * 2 + 1)
    assert_close(x, x.contiguous())  # Inputs are never written.


def test_kernel_argument_of_wrong_sizes_raises_naming_the_step(kernels_so):
    p = affine_plan(kernels_so)
    with pytest.raises(RuntimeError, match=r"step 0 \(kernel affine12\).*\[4, 3\]"):
        p(torch.randn(4, 3))
    with pytest.raises(RuntimeError, match="Double"):
        p(torch.randn(3, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="takes 1 inputs, got 2"):
        p(torch.randn(3, 4), torch.randn(3, 4))


def test_failed_run_warns_once_and_uses_the_fallback(kernels_so, caplog):
    p = affine_plan(kernels_so)
    p.fallback = lambda x: [x * 2 + 1]
    with caplog.at_level(logging.WARNING, logger="kiln"):
        x = torch.randn(4, 3)
        assert_close(p(x)[0], x * 2 + 1)
        assert p.failed
        y = torch.randn(3, 4)
        assert_close(p(y)[0], y * 2 + 1)  # Later calls go to the fallback too.
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1


PARALLEL_KERNEL = r"""
#include <cstdint>
typedef void (*range_fn)(int64_t, int64_t, void* const*);
typedef void (*parallel_for_fn)(int64_t, int64_t, int64_t, range_fn, void* const*);
static void mark(int64_t begin, int64_t end, void* const* a) {  // y[i] = its chunk's first index
  float* y = (float*)a[0];
  for (int64_t i = begin; i < end; i++) y[i] = (float)begin;
}
extern "C" void chunks(void* const* a, parallel_for_fn parallel_for) {
  parallel_for(0, 1024, 1, mark, a);
}
"""


def test_kernels_parallel_for_runs_chunks_on_torchs_threads(tmp_path_factory):
    # The ABI's parallel_for is at::parallel_for: with 2 threads, [0, 1024) is two chunks run at
    # once (a runtime built without OpenMP ran one chunk on the calling thread).
    binary = _build(tmp_path_factory, "parallel", PARALLEL_KERNEL)
    p = plan([value(0, [1024])], [], [kernel("chunks", [0], [0])], [0], binary=binary,
             buffers=[(0, False, 0)])
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = p()[0]
    finally:
        torch.set_num_threads(saved)
    assert sorted(set(out.tolist())) == [0.0, 512.0]
    assert_close(out, torch.tensor([0.0] * 512 + [512.0] * 512))


def test_two_libraries_with_the_same_symbol_stay_apart(tmp_path_factory):
    # Both are loaded through /proc/self/fd/N with the same N; each plan must run its own k0.
    def so(expr):
        return _build(tmp_path_factory, "k", 'extern "C" void k0(void* const* a, void*) {'
                      ' const float* x = (const float*)a[0]; float* y = (float*)a[1];'
                      f' for (int i = 0; i < 4; i++) y[i] = {expr}; }}')
    first, second = so("x[i] + 1"), so("x[i] * 10")
    x = torch.arange(4.0)
    mk = lambda b: plan([value(0, [4]), value(1, [4])], [0], [kernel("k0", [0, 1], [1])], [1],
                        binary=b, buffers=[(1, False, 0)])
    p1 = mk(first)
    p2 = mk(second)
    assert_close(p1(x)[0], x + 1)
    assert_close(p2(x)[0], x * 10)
    del p1
    assert_close(mk(first)(x)[0], x + 1)


# ---- construction errors ----

def test_unknown_op_fails_at_construction():
    with pytest.raises(ValueError, match=r"step 0 \(aten::no_such_op\)"):
        plan([value(0, [2]), value(1, [2])], [0],
             [library("aten::no_such_op", [pos("value", 0)], [1])], [1])


def test_missing_kernel_symbol_fails_at_construction(kernels_so):
    with pytest.raises(ValueError, match=r"step 0 \(kernel nope\).*'nope'"):
        plan([value(0, [3, 4]), value(1, [3, 4])], [0], [kernel("nope", [0, 1], [1])], [1],
             binary=kernels_so, buffers=[(1, False, 0)])
    with pytest.raises(ValueError, match="not an ELF"):
        plan([value(0, [3, 4]), value(1, [3, 4])], [0], [kernel("k", [0, 1], [1])], [1],
             binary=b"not a shared object", buffers=[(1, False, 0)])


def test_unbindable_arguments_fail_at_construction():
    vals = [value(0, [2, 2]), value(1, [2, 2]), value(2, [2, 2])]
    with pytest.raises(ValueError, match=r"step 0 \(aten::mm\).*required argument 'mat2'"):
        plan(vals, [0], [library("aten::mm", [pos("value", 0)], [1])], [1])
    with pytest.raises(ValueError, match="no argument 'beta'"):
        plan(vals, [0, 1], [library("aten::add.Tensor", [pos("value", 0), pos("value", 1),
                                                         ("beta", "int", 1)], [2])], [2])
    with pytest.raises(ValueError, match="'other' is given twice"):
        plan(vals, [0, 1], [library("aten::add.Tensor", [pos("value", 0), pos("value", 1),
                                                         ("other", "value", 1)], [2])], [2])
    with pytest.raises(ValueError, match="argument 'dim': a str cannot bind"):
        plan(vals, [0], [library("aten::sum.dim_IntList", [pos("value", 0),
                                                           pos("str", "x")], [1])], [1])
    with pytest.raises(ValueError, match="None cannot bind"):  # a number is not optional
        plan(vals, [0], [library("aten::mul.Scalar", [pos("value", 0), pos("none", None)],
                                 [1])], [1])
    with pytest.raises(ValueError, match="used before it is computed"):
        plan(vals, [0], [library("aten::mm", [pos("value", 0), pos("value", 1)], [2])], [2])
    with pytest.raises(ValueError, match=r"step 0 \(aten::relu\): argument 0 has no value"):
        plan(vals, [0], [library("aten::relu", [pos("unset", None)], [1])], [1])


def test_arena_misuse_fails_at_construction(kernels_so):
    vals = [value(0, [16]), value(1, [16]), value(2, [16])]
    with pytest.raises(ValueError, match="arena buffer"):  # An arena buffer as plan output.
        plan(vals, [0], [kernel("affine16", [0, 1], [1])], [1], binary=kernels_so, arena=64,
             buffers=[(1, True, 0)])
    with pytest.raises(ValueError, match="ends at byte 64 of an arena of 32"):
        plan(vals, [0], [kernel("affine16", [0, 1], [1]),
                         library("aten::neg", [pos("value", 1)], [2])], [2],
             binary=kernels_so, arena=32, buffers=[(1, True, 0)])
    with pytest.raises(ValueError, match="view of arena buffer"):
        plan(vals, [0], [kernel("affine16", [0, 1], [1]),
                         library("aten::view", [pos("value", 1), pos("ints", [4, 4])], [2])],
             [2], binary=kernels_so, arena=64, buffers=[(1, True, 0)])


# ---- bytes that are no plan ----

def test_bytes_that_do_not_decode_fail_naming_the_field():
    good = plan_bytes([value(0, [2]), value(1, [2])], [0],
                      [library("aten::neg", [pos("value", 0)], [1])], [1])
    with pytest.raises(ValueError, match="does not decode: .*at byte"):
        _C.Plan(good[:-1])
    with pytest.raises(ValueError, match=r"does not decode: steps\[0\]: at byte \d+: the step "
                                         r"names neither"):
        _C.Plan(plan_bytes([], [], [pb.artifact.PlanStep(release=[1])], []))
    with pytest.raises(TypeError):
        _C.Plan("not bytes")


def test_every_cut_and_garbled_plan_is_refused_or_runs(kernels_so):
    # Whatever the bytes, building either raises ValueError or gives a plan: never a crash, never
    # another error. (Decoding alone is checked against protobuf in tests/cpp, and fuzzed.)
    x = torch.empty(3, 4)
    good = plan_bytes([meta(0, x), meta(1, x), value(2, [3, 4]), value(3, [3, 1])], [0],
                      [kernel("affine12", [0, 1], [1]),
                       library("aten::add.Tensor", [pos("value", 1), pos("value", 0),
                                                    ("alpha", "float", 0.5)], [2]),
                       library("aten::sum.dim_IntList", [pos("value", 2), pos("ints", [1]),
                                                         ("keepdim", "bool", True)], [3],
                               release=[2])],
                      [3], buffers=[(1, True, 0)], arena=64)
    x = torch.randn(3, 4)
    assert_close(_C.Plan(good, kernels_so)(x)[0], (x * 2 + 1 + 0.5 * x).sum(1, keepdim=True))
    rng = random.Random(7)
    variants = [good[:n] for n in range(len(good))]
    for _ in range(1500):
        b = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        variants.append(bytes(b))
    built = 0
    for v in variants:
        try:
            _C.Plan(v, kernels_so)
            built += 1
        except ValueError:
            pass
    assert 0 < built < len(variants)


def test_prologue_results_take_the_dtype_and_layout_the_steps_were_planned_for():
    # prologue: q = w * s, a bfloat16 weight times a float32 scale, which ATen promotes to
    # float32, and t = q.t().clone(), which ATen lays out as q.t() is (column-major); the plan's
    # metadata says q is bfloat16 and t row-major, as a generated kernel would have made them.
    # steps: out = x + q, and t read as [12] through a view (only a row-major t has that view).
    w = torch.randn(4, 3).to(torch.bfloat16)
    s = torch.rand(4, 1) + 0.5
    q_meta = value(2, [4, 3], torch.bfloat16)
    p = plan([value(0, [4, 3], torch.bfloat16), value(1, [4, 3], torch.bfloat16),
              value(5, [4, 1]), q_meta, meta(3, torch.empty(4, 3).t(), torch.bfloat16),
              value(4, [3, 4], torch.bfloat16), value(6, [4, 3], torch.bfloat16),
              value(7, [12], torch.bfloat16)],
             [1, 5, 0],
             [library("aten::add.Tensor", [pos("value", 0), pos("value", 2)], [6]),
              library("aten::view", [pos("value", 4), pos("ints", [12])], [7])], [6, 7],
             prologue=[library("aten::mul.Tensor", [pos("value", 1), pos("value", 5)], [2]),
                       library("aten::t", [pos("value", 2)], [3]),
                       library("aten::clone", [pos("value", 3)], [4])],
             prologue_outputs=[2, 4], params=[w, s])
    x = torch.randn(4, 3).to(torch.bfloat16)
    out, flat = p(x)
    q = (w * s).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and flat.dtype == torch.bfloat16
    assert_close(out, x + q)
    assert_close(flat, q.t().reshape(12))
