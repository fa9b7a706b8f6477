"""kiln on CUDA: the Target a GPU graph asks kilnd for, the runtime's CUDA plans (library calls,
kernels from a cubin or its PTX, launched on the current stream) and their CUDA graphs (inputs
copied in, outputs copied out, parameters updated in place, prologues recomputed, one pool for
all graphs), and the "kiln" backend on a GPU. Tests that need a GPU skip without one; the rest
run anywhere."""
import contextlib
import ctypes
import ctypes.util
import functools
import glob
import logging
import os

import pytest
import torch
from torch.testing import assert_close

import kiln
from kiln import _C
from kiln.backends import kiln_backend
from kiln.backends.registry import register_backend
from kiln.daemon import protocol

if not protocol.available():
    pytest.skip("the kiln.v1 modules are not available (grpcio-tools/protobuf missing)",
                allow_module_level=True)

from kiln.daemon import artifact  # noqa: E402 (needs the kiln.v1 modules)
from test_kiln_backend import ConvBnRelu  # noqa: E402
from test_runtime import library, meta, plan_bytes, pos, value  # noqa: E402

pb = protocol.messages()
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
with_cuda = pytest.mark.skipif(not getattr(_C, "HAS_CUDA", False),
                               reason="kiln._C was built without CUDA")


def kernel(symbol, args, writes, grid, block, smem=0, release=()):
    step = pb.artifact.PlanStep(release=list(release))
    step.kernel.symbol = symbol
    step.kernel.args.extend(args)
    step.kernel.writes.extend(writes)
    step.kernel.grid.extend(grid)
    step.kernel.block.extend(block)
    step.kernel.shared_memory_bytes = smem
    return step


def cuda_plan(values, inputs, steps, outputs, *, cubin=b"", ptx=b"", params=(), graphs=None,
              device="cuda:0", own_memory=False, **fields):
    return _C.Plan(plan_bytes(values, inputs, steps, outputs, **fields), cubin, list(params),
                   device, kernel_ptx=ptx, cuda_graphs=graphs, own_graph_memory=own_memory)


def driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


# ---- what runs anywhere ----

def test_cuda_arch_is_sm_of_the_compute_capability():
    assert artifact.cuda_arch((9, 0)) == "sm_90"
    assert artifact.cuda_arch((8, 6)) == "sm_86"
    assert artifact.cuda_arch((12, 0)) == "sm_120"


def test_cuda_target_names_the_gpus_architecture_and_no_cpu_isa(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    target = artifact.target_for(torch.device("cuda", 0))
    assert target == pb.target.Target(device_kind=pb.graph.DEVICE_KIND_CUDA, cuda_arch="sm_90")
    assert artifact.target_for(torch.device("cpu")) == artifact.cpu_target()


def test_graphs_on_mixed_or_unknown_devices_run_eagerly():
    cpu, meta_t = torch.empty(2), torch.empty(2, device="meta")
    assert kiln_backend._graph_device([cpu, cpu]) == torch.device("cpu")
    assert kiln_backend._graph_device([]) == torch.device("cpu")
    assert kiln_backend._graph_device([cpu, meta_t]) is None
    assert kiln_backend._graph_device([meta_t]) is None


def test_cuda_graphs_follow_mode_options_and_config(monkeypatch):
    wanted = kiln_backend.cuda_graphs_wanted
    monkeypatch.setattr(kiln.config, "cuda_graphs", True)
    assert wanted(None, None) and wanted("default", None) and wanted("max-autotune", {})
    assert not wanted("max-autotune-no-cudagraphs", None)
    assert not wanted("reduce-overhead", {"triton.cudagraphs": False})
    monkeypatch.setattr(kiln.config, "cuda_graphs", False)
    assert not wanted(None, None)
    assert wanted("reduce-overhead", None)
    assert wanted(None, {"triton.cudagraphs": True})


def test_compile_passes_mode_and_options_to_a_backend_that_takes_them():
    seen = []

    @register_backend(name="test_cuda_runtime_mode_recorder", takes_mode=True)
    def recorder(gm, example_inputs, mode=None, options=None):
        seen.append((mode, options))
        return gm.forward

    def f(x):
        return x * 2 + 1

    x = torch.randn(4)
    kiln.compile(f, backend="test_cuda_runtime_mode_recorder", mode="reduce-overhead",
                 options={"triton.cudagraphs": False})(x)
    kiln.reset()
    kiln.compile(f, backend="test_cuda_runtime_mode_recorder")(x)
    assert seen == [("reduce-overhead", {"triton.cudagraphs": False}), (None, None)]


def affine_values(n=1000):
    return [value(0, [n]), value(1, [n])]


def affine_step(grid=(4,), block=(256,), smem=0):
    return kernel("kiln_affine", [0, 1], [1], list(grid), list(block), smem)


@with_cuda
def test_a_cuda_kernel_plan_names_its_device_index():
    with pytest.raises(ValueError, match="names its device's index"):
        cuda_plan(affine_values(), [0], [affine_step()], [1], cubin=b"x", device="cuda",
                  buffers=[(1, False, 0)])


@with_cuda
@pytest.mark.skipif(driver_loads(), reason="a CUDA driver is installed here")
def test_without_a_driver_a_cuda_kernel_plan_fails_to_build_naming_libcuda():
    with pytest.raises(ValueError, match=r"cannot load the CUDA driver libcuda\.so\.1"):
        cuda_plan(affine_values(), [0], [affine_step()], [1], cubin=b"\x7fELF not a cubin",
                  buffers=[(1, False, 0)])


def test_without_kernels_a_cuda_plan_needs_no_driver_to_build():
    # Library calls only: nothing is loaded, and the plan is built (running it needs a GPU).
    p = _C.Plan(plan_bytes([value(0, [3]), value(1, [3])], [0],
                           [library("aten::relu", [pos("value", 0)], [1])], [1]),
                b"", [], "cuda:0")
    assert (p.num_kernels, p.num_library_calls, p.cuda_graph) == (0, 1, None)


# ---- a kernel built here with NVRTC, to test the runtime apart from kilnd's code generator ----

KERNELS = r"""
extern "C" __global__ void kiln_affine(const float* x, float* y) {  // y = 2x + 1, float[1000]
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 1000) y[i] = 2.0f * x[i] + 1.0f;
}
extern "C" __global__ void kiln_scale_rows(const float* x, const float* s, float* y) {
  // y[r][c] = x[r][c] * s[r] over float[64][128]; one block per row, staged through dynamic
  // shared memory (64 KiB asked for: past the 48 KiB default).
  extern __shared__ float row[];
  int r = blockIdx.x;
  for (int c = threadIdx.x; c < 128; c += blockDim.x) row[c] = x[r * 128 + c];
  __syncthreads();
  for (int c = threadIdx.x; c < 128; c += blockDim.x) y[r * 128 + c] = row[c] * s[r];
}
"""


def _nvrtc():
    names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    site = os.path.dirname(os.path.dirname(torch.__file__))
    names += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so*")))
    names += sorted(glob.glob("/usr/local/cuda/lib64/libnvrtc.so*"))
    found = ctypes.util.find_library("nvrtc")
    if found:
        names.append(found)
    for name in names:
        if "builtins" in name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    pytest.skip("no NVRTC library found")


def _compile(nvrtc, source: str, arch: str, get: str) -> bytes:
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None,
                                    None) == 0
    opts = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
    rc = nvrtc.nvrtcCompileProgram(prog, 1, opts)
    if rc != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise AssertionError(f"NVRTC: {log.value.decode()}")
    size = ctypes.c_size_t()
    assert getattr(nvrtc, f"nvrtcGet{get}Size")(prog, ctypes.byref(size)) == 0
    out = ctypes.create_string_buffer(size.value)
    assert getattr(nvrtc, f"nvrtcGet{get}")(prog, out) == 0
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return out.raw[:size.value]


@functools.lru_cache(maxsize=1)
def _images():
    major, minor = torch.cuda.get_device_capability(0)
    nvrtc = _nvrtc()
    cubin = _compile(nvrtc, KERNELS, f"sm_{major}{minor}", "CUBIN")
    ptx = _compile(nvrtc, KERNELS, f"compute_{major}{minor}", "PTX").rstrip(b"\0")
    return cubin, ptx


@pytest.fixture
def images():
    return _images()


@pytest.fixture
def pool():
    return _C.CudaGraphPool()


def affine_plan(cubin, ptx=b"", graphs=None):
    return cuda_plan(affine_values(), [0], [affine_step()], [1], cubin=cubin, ptx=ptx,
                     graphs=graphs, buffers=[(1, False, 0)])


@gpu
def test_cubin_kernel_runs_on_the_current_stream(images):
    cubin, _ = images
    p = affine_plan(cubin)
    assert (p.num_kernels, p.num_library_calls) == (1, 0)
    x = torch.randn(1000, device="cuda")
    assert_close(p(x)[0], 2 * x + 1)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = torch.randn(1000, device="cuda")
        out = p(y)[0]
    s.synchronize()
    assert_close(out, 2 * y + 1)


@gpu
def test_ptx_loads_where_the_cubin_does_not(images):
    _, ptx = images
    x = torch.randn(1000, device="cuda")
    assert_close(affine_plan(b"", ptx)(x)[0], 2 * x + 1)
    assert_close(affine_plan(b"not a cubin at all", ptx)(x)[0], 2 * x + 1)
    with pytest.raises(ValueError, match="loading the cubin.*loading the PTX"):
        affine_plan(b"not a cubin", b"not ptx either")


@gpu
def test_missing_symbol_and_bad_launch_shapes_fail_the_build(images):
    cubin, _ = images
    bufs = dict(buffers=[(1, False, 0)])
    missing = kernel("kiln_nope", [0, 1], [1], [4], [256])
    with pytest.raises(ValueError, match="no kernel 'kiln_nope'"):
        cuda_plan(affine_values(), [0], [missing], [1], cubin=cubin, **bufs)
    for grid, block, why in (([], [256], "grid has 0 dimensions"),
                             ([4], [0], "block has a 0 extent"),
                             ([4], [64, 32], "block of 2048 threads")):
        with pytest.raises(ValueError, match=why):
            cuda_plan(affine_values(), [0], [affine_step(grid, block)], [1], cubin=cubin, **bufs)


@gpu
def test_kernels_library_calls_and_the_arena_together(images):
    # a = affine(x) in the arena at 0; r = relu(a); b = rows of mm(r.view, w) scaled by s with
    # 64 KiB of dynamic shared memory; out = b.
    cubin, _ = images
    x, w, s = (torch.randn(1000, device="cuda"), torch.randn(1000, 8192, device="cuda") / 30,
               torch.randn(64, device="cuda"))
    vals = [value(0, [1000]), value(1, [1000]), value(2, [1000]), value(3, [1, 1000]),
            value(4, [1000, 8192]), value(5, [1, 8192]), value(6, [64, 128]), value(7, [64]),
            value(8, [64, 128])]
    steps = [kernel("kiln_affine", [0, 1], [1], [4], [256]),
             library("aten::relu", [pos("value", 1)], [2]),
             library("aten::view", [pos("value", 2), pos("ints", [1, 1000])], [3]),
             library("aten::mm", [pos("value", 3), pos("value", 4)], [5]),
             library("aten::view", [pos("value", 5), pos("ints", [64, 128])], [6]),
             kernel("kiln_scale_rows", [6, 7, 8], [8], [64], [128], 64 * 1024)]
    p = cuda_plan(vals, [4, 7, 0], steps, [8], cubin=cubin, params=[w, s], arena=4096,
                  buffers=[(1, True, 0), (8, False, 0)])
    want = (torch.relu(2 * x + 1).view(1, 1000) @ w).view(64, 128) * s[:, None]
    assert_close(p(x)[0], want, rtol=1e-3, atol=1e-3)


@gpu
def test_library_plans_match_eager_for_matmul_and_conv():
    x, w = torch.randn(2, 3, 16, 16, device="cuda"), torch.randn(8, 3, 3, 3, device="cuda")
    a, b = torch.randn(64, 32, device="cuda"), torch.randn(32, 48, device="cuda")
    conv = torch.empty(2, 8, 16, 16)
    p = cuda_plan([value(0, [2, 3, 16, 16]), value(1, [8, 3, 3, 3]), meta(2, conv),
                   value(3, [64, 32]), value(4, [32, 48]), value(5, [64, 48])], [1, 0, 3, 4],
                  [library("aten::convolution",
                           [pos("value", 0), pos("value", 1), pos("none", None),
                            pos("ints", [1, 1]), pos("ints", [1, 1]), pos("ints", [1, 1]),
                            pos("bool", False), pos("ints", [0, 0]), pos("int", 1)], [2]),
                   library("aten::mm", [pos("value", 3), pos("value", 4)], [5])], [2, 5],
                  params=[w])
    got_conv, got_mm = p(x, a, b)
    assert_close(got_conv, torch.nn.functional.conv2d(x, w, padding=1), rtol=1e-3, atol=1e-3)
    assert_close(got_mm, a @ b, rtol=1e-3, atol=1e-3)


# ---- CUDA graphs ----

def mm_relu_plan(w, graphs, own_memory=False):
    """relu(x @ w), w bound as a parameter."""
    return cuda_plan([value(0, [16, 32]), value(1, [32, 24]), value(2, [16, 24]),
                      value(3, [16, 24])], [1, 0],
                     [library("aten::mm", [pos("value", 0), pos("value", 1)], [2]),
                      library("aten::relu", [pos("value", 2)], [3], release=[2])], [3],
                     params=[w], graphs=graphs, own_memory=own_memory)


@gpu
def test_graph_replays_inputs_at_new_addresses_and_keeps_held_outputs(pool):
    w = torch.randn(32, 24, device="cuda")
    p = mm_relu_plan(w, pool)
    assert p.cuda_graph == "pending"
    xs = [torch.randn(16, 32, device="cuda") for _ in range(4)]
    outs = [p(x)[0] for x in xs]  # Every input at its own address; every output held.
    assert (p.cuda_graph, p.cuda_graph_captures) == ("captured", 1)
    for x, out in zip(xs, outs):
        assert_close(out, torch.relu(x @ w), rtol=1e-3, atol=1e-3)
    assert len({o.data_ptr() for o in outs}) == len(outs)


@gpu
def test_graph_sees_parameters_updated_in_place_and_recaptures_when_one_moves(pool):
    w = torch.randn(32, 24, device="cuda")
    p = mm_relu_plan(w, pool)
    x = torch.randn(16, 32, device="cuda")
    p(x)
    w.mul_(-1)
    assert_close(p(x)[0], torch.relu(x @ w), rtol=1e-3, atol=1e-3)
    assert p.cuda_graph_captures == 1
    w.data = torch.randn(32, 24, device="cuda")  # new storage: the graph's address is stale
    assert_close(p(x)[0], torch.relu(x @ w), rtol=1e-3, atol=1e-3)
    assert p.cuda_graph_captures == 2


@gpu
def test_graph_reads_the_prologue_recomputed_after_a_parameter_changed(pool):
    # prologue: q = w * 3 (from the bound w); steps: out = x @ q.
    w = torch.randn(32, 24, device="cuda")
    p = cuda_plan([value(0, [16, 32]), value(1, [32, 24]), value(2, [32, 24]),
                   value(3, [16, 24])], [1, 0],
                  [library("aten::mm", [pos("value", 0), pos("value", 2)], [3])], [3],
                  prologue=[library("aten::mul.Tensor", [pos("value", 1), pos("float", 3.0)],
                                    [2])],
                  prologue_outputs=[2], params=[w], graphs=pool)
    x = torch.randn(16, 32, device="cuda")
    assert_close(p(x)[0], x @ (w * 3), rtol=1e-3, atol=1e-3)
    assert_close(p(x)[0], x @ (w * 3), rtol=1e-3, atol=1e-3)
    w.add_(1)
    assert_close(p(x)[0], x @ (w * 3), rtol=1e-3, atol=1e-3)
    assert p.cuda_graph_captures == 1


@gpu
def test_two_graphs_share_the_pool_and_both_stay_right(pool, images):
    cubin, _ = images
    w = torch.randn(32, 24, device="cuda")
    p, q = mm_relu_plan(w, pool), affine_plan(cubin, graphs=pool)
    held = []
    for i in range(3):
        x, y = torch.randn(16, 32, device="cuda"), torch.randn(1000, device="cuda")
        held.append((x, p(x)[0], y, q(y)[0]))
    s = torch.cuda.Stream()  # Replays on another stream are ordered after the ones before.
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x, y = torch.randn(16, 32, device="cuda"), torch.randn(1000, device="cuda")
        held.append((x, p(x)[0], y, q(y)[0]))
    torch.cuda.current_stream().wait_stream(s)
    assert (p.cuda_graph, q.cuda_graph) == ("captured", "captured")
    for x, px, y, qy in held:
        assert_close(px, torch.relu(x @ w), rtol=1e-3, atol=1e-3)
        assert_close(qy, 2 * y + 1)


@gpu
def test_graph_output_naming_an_input_is_that_input(pool):
    x = torch.randn(16, device="cuda")
    p = cuda_plan([value(0, [16]), value(1, [16])], [0],
                  [library("aten::neg", [pos("value", 0)], [1])], [1, 0, 1], graphs=pool)
    for _ in range(2):
        neg, same, again = p(x)
        assert same is x or same.data_ptr() == x.data_ptr()
        assert neg.data_ptr() == again.data_ptr()
        assert_close(neg, -x)


@gpu
def test_a_plan_that_cannot_be_captured_warns_once_and_runs_without_a_graph(pool, caplog):
    # nonzero synchronises with the host to size its result: not capturable.
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device="cuda")
    nz = torch.empty(2, 1, dtype=torch.int64)
    p = cuda_plan([value(0, [4]), meta(1, nz)], [0],
                  [library("aten::nonzero", [pos("value", 0)], [1])], [1], graphs=pool)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(3):
            assert_close(p(x)[0], torch.nonzero(x))
    assert p.cuda_graph == "off"
    assert sum("cannot be captured as a CUDA graph" in r.getMessage()
               for r in caplog.records) == 1
    # Refused before any capture began: torch's CUDA generator is not left capturing, so the
    # process's random ops still work.
    assert torch.randn(4, device="cuda").shape == (4,)


# ---- the "kiln" backend on a GPU ----

@gpu
@pytest.mark.parametrize("mode", [None, "max-autotune-no-cudagraphs"])
def test_backend_matches_eager_on_a_gpu_across_parameter_updates(kilnd_cache, mode, caplog):
    # Whatever kilnd answers for CUDA (an artifact, or UNIMPLEMENTED: eager with one warning),
    # the answers are eager's, also after the batch norm (folded into a prologue) changes.
    m = ConvBnRelu().cuda().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    compiled = kiln.compile(m, backend="kiln", mode=mode)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(2):
            x = torch.randn(2, 3, 16, 16, device="cuda")
            assert_close(compiled(x), m(x), rtol=1e-3, atol=1e-3)
        m.bn.weight.mul_(1.5)
        m.conv.weight.add_(0.01)
        x = torch.randn(2, 3, 16, 16, device="cuda")
        assert_close(compiled(x), m(x), rtol=1e-3, atol=1e-3)
    from kiln.daemon import protocol
    from kiln.state import STATE
    cuda = STATE.daemon.client().compiler_version_for(protocol.messages().graph.DEVICE_KIND_CUDA)
    if "no-nvrtc" not in (cuda or "no-nvrtc"):  # a kilnd that builds CUDA kernels: compiled
        assert STATE.artifacts, "kilnd builds CUDA kernels, yet the graph ran eagerly"
    if STATE.artifacts:
        plan = STATE.artifacts[-1].plan
        assert plan.cuda_graph == (None if mode else "captured")
        assert not plan.failed
    else:  # kilnd without CUDA: eager, said once
        assert sum("running the graph eagerly" in r.getMessage() for r in caplog.records) == 1


def _compiled_on_gpu(model, make_input, *, autocast=None, calls=3, caplog):
    """kiln.compile(model) on CUDA, called `calls` times on fresh inputs under no_grad (and
    `autocast`, a dtype): every answer compared with eager's; returns the last artifact's plan.
    Fails when the graph ran eagerly (kilnd builds CUDA kernels, or the test skips)."""
    from kiln.state import STATE

    cuda = STATE.daemon.client().compiler_version_for(pb.graph.DEVICE_KIND_CUDA)
    if "no-nvrtc" in (cuda or "no-nvrtc"):
        pytest.skip("kilnd builds no CUDA kernels here (no NVRTC)")
    compiled = kiln.compile(model, backend="kiln")
    ctx = (torch.autocast("cuda", dtype=autocast) if autocast is not None
           else torch.autocast("cuda", enabled=False))
    tol = dict(rtol=3e-2, atol=3e-2) if autocast is not None else dict(rtol=1e-3, atol=1e-3)
    with torch.no_grad(), ctx, caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(calls):
            x = make_input()
            got, want = compiled(x), model(x)
            got = got if isinstance(got, torch.Tensor) else got[0]
            want = want if isinstance(want, torch.Tensor) else want[0]
            assert_close(got.float(), want.float(), **tol)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("kiln")]
    assert STATE.artifacts, "the graph ran eagerly"
    return STATE.artifacts[-1].plan


@gpu
@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_vit_attention_fast_path_compiles_to_sdpa_on_a_gpu(kilnd_cache, autocast, caplog):
    # nn.MultiheadAttention's inference fast path (_native_multi_head_attention, as torchvision's
    # ViT calls it), and under autocast (no fast path) multi_head_attention_forward, whose
    # attention the trace records as the kernel torch picks (cuDNN's under bfloat16): the
    # attention is kilnd's scaled_dot_product_attention call, not a graph run eagerly.
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                 num_heads=2, hidden_dim=32,
                                                 mlp_dim=64).cuda().eval()
    plan = _compiled_on_gpu(model, lambda: torch.randn(2, 3, 32, 32, device="cuda"),
                            autocast=autocast, caplog=caplog)
    assert plan.cuda_graph == "captured"
    assert _library_ops(kiln.debug.artifacts()[-1]).count(
        "aten::scaled_dot_product_attention") == 2


@gpu
@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_last_linear_is_addmm_and_the_others_mm_with_their_bias_in_a_kernel(
        kilnd_cache, autocast, caplog):
    # A classifier's last linear ends the graph: its bias goes to the GEMM's epilogue (addmm, as
    # eager runs it); the first one's bias fuses into the GELU's kernel after a plain mm.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 10)).cuda().eval()
    _compiled_on_gpu(model, lambda: torch.randn(16, 64, device="cuda"), autocast=autocast,
                     caplog=caplog)
    ops = _library_ops(kiln.debug.artifacts()[-1])
    assert (ops.count("aten::addmm"), ops.count("aten::mm")) == (1, 1), ops


def _library_ops(artifact):
    return [s.library.op for s in artifact.body.plan.steps if s.WhichOneof("kind") == "library"]


class FusedAttentionKernel(torch.nn.Module):
    """One of the kernels scaled_dot_product_attention picks on CUDA, called directly (as a trace
    records it inside a function it enters), over projections of the input."""

    def __init__(self, kind, dim=64, heads=4):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)

    def forward(self, x, bias):
        b, s, d = x.shape
        heads = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = heads.unbind(0)
        aten = torch.ops.aten
        if self.kind == "cudnn":
            r = aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, scale=0.3)
        elif self.kind == "efficient":
            r = aten._scaled_dot_product_efficient_attention(q, k, v, bias, False)
        else:
            r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, scale=0.3)
        return r[0].transpose(1, 2).reshape(b, s, d) * 2


@gpu
@pytest.mark.parametrize("kind", ["cudnn", "efficient", "flash"])
def test_a_fused_attention_kernel_the_trace_records_runs_as_sdpa_with_its_arguments(
        kilnd_cache, kind, caplog):
    # The kernel's mask, causal flag and scale are scaled_dot_product_attention's in the plan;
    # its answer is the kernel's own (eager runs the very kernel).
    torch.manual_seed(0)
    model = FusedAttentionKernel(kind).cuda().to(torch.bfloat16).eval()
    bias = torch.randn(2, 4, 16, 16, device="cuda", dtype=torch.bfloat16)
    make = lambda: torch.randn(2, 16, 64, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    try:
        with torch.no_grad():
            model(make(), bias)
    except RuntimeError as e:  # this GPU or build lacks that kernel for these inputs
        pytest.skip(f"{kind} attention does not run here: {str(e)[:200]}")
    plan = _compiled_on_gpu(lambda x: model(x, bias), make, autocast=torch.bfloat16,
                            caplog=caplog)
    assert plan.cuda_graph == "captured"
    ops = _library_ops(kiln.debug.artifacts()[-1])
    assert "aten::scaled_dot_product_attention" in ops
    assert not [op for op in ops if op.startswith("aten::_scaled_dot_product")]


class ExpandedIds(torch.nn.Module):
    """BERT's embeddings' pattern: a buffer of ids sliced to the sequence and broadcast over the
    batch (a view with stride 0, derived from a buffer alone: a prologue value)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ids", torch.zeros(1, 64, dtype=torch.long))
        self.emb = torch.nn.Embedding(4, 16)
        self.scale = torch.nn.Parameter(torch.randn(1, 16))
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        b, s, _ = x.shape
        ids = self.ids[:, :s].expand(b, s)
        return self.lin(x + self.emb(ids) * self.scale.expand(s, 16))


@gpu
def test_a_broadcast_prologue_value_is_captured_in_its_layout(kilnd_cache, caplog):
    torch.manual_seed(0)
    model = ExpandedIds().cuda().eval()
    plan = _compiled_on_gpu(model, lambda: torch.randn(4, 8, 16, device="cuda"), caplog=caplog)
    assert plan.cuda_graph == "captured"
    compiled = kiln.compile(model, backend="kiln")
    with torch.no_grad():
        x = torch.randn(4, 8, 16, device="cuda")
        compiled(x)
        model.scale.mul_(-2)  # the prologue recomputed: the graph reads the new values
        model.emb.weight.add_(1)
        assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)


@gpu
def test_bert_runs_as_one_cuda_graph(kilnd_cache, caplog):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=512)
    model = transformers.BertModel(config).cuda().eval()
    plan = _compiled_on_gpu(
        lambda ids: model(input_ids=ids).last_hidden_state,
        lambda: torch.randint(0, 512, (2, 32), device="cuda"), caplog=caplog)
    assert plan.cuda_graph == "captured"


class MaskedAttention(torch.nn.Module):
    """BERT's attention shape: q, k and v projected and split into heads, an expanded boolean
    mask (strides [0, S, 1, 0], as transformers builds it), the heads merged back."""

    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Parameter(torch.randn(dim, dim) / dim**0.5)
                                              for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape
        split = [b, s, self.heads, d // self.heads]
        q, k, v = (torch.nn.functional.linear(x, w).view(split).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        keep = torch.arange(s, device=x.device)[None, None, :, None] >= 0
        mask = keep.expand(b, 1, s, s)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return torch.nn.functional.linear(out.transpose(1, 2).reshape(b, s, d), self.wo)


def test_attention_takes_a_dense_mask_and_merges_heads_without_a_copy(kilnd_cache, monkeypatch):
    # Compile only, on fake CUDA tensors: the expanded mask is copied dense (CUDA's fused kernels
    # refuse a mask whose last stride is not 1), the attention's result has the fused kernels'
    # [batch, tokens, heads, dim] layout, and merging the heads back is a view, not a kernel.
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    with FakeTensorMode():
        with torch.device("cuda"):
            m = MaskedAttention().eval()
        x = torch.empty(2, 8, 32, device="cuda")
    gm = torch.fx.symbolic_trace(m)
    with torch.no_grad():
        try:
            art = kiln_backend.compile_graph(gm, [x], cuda_graphs=False, load=False)
        except kiln_backend.CompileFailed as e:
            if "builds no CUDA kernels" in str(e):
                pytest.skip(f"kilnd has no NVRTC here: {e}")
            raise
    plan = art.body.plan
    values = {v.id: v.meta for v in plan.values}
    steps = list(plan.steps)
    (at,) = [i for i, s in enumerate(steps) if s.WhichOneof("kind") == "library"
             and s.library.op == "aten::scaled_dot_product_attention"]
    sdpa = steps[at].library
    mask = values[sdpa.args[3].value]
    assert list(mask.sizes) == [2, 1, 8, 8] and list(mask.strides) == [64, 64, 8, 1]
    out = values[sdpa.outputs[0]]
    assert list(out.sizes) == [2, 2, 8, 16] and list(out.strides) == [256, 16, 32, 1]
    # After the attention: views and the output projection only.
    after = steps[at + 1:]
    assert all(s.WhichOneof("kind") == "library" for s in after), after
    assert {s.library.op for s in after} <= {"aten::view", "aten::transpose.int", "aten::mm",
                                             "aten::_unsafe_view"}


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["auto", "math"])
def test_masked_attention_matches_eager_whichever_kernel_attention_picks(kilnd_cache, dtype,
                                                                          backend):
    # "math": ATen's math kernel returns a contiguous result, not the layout the plan expects;
    # the plan copies it into that layout and the answer stays eager's.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = MaskedAttention().cuda().to(dtype).eval()
    x = torch.randn(2, 8, 32, device="cuda", dtype=dtype)
    choice = sdpa_kernel([SDPBackend.MATH]) if backend == "math" else contextlib.nullcontext()
    with torch.no_grad(), choice:
        expected = model(x)
        compiled = kiln.compile(model, backend="kiln")
        first = compiled(x).clone()
        again = compiled(x).clone()
    assert kiln.debug.artifacts(), "the graph ran eagerly instead of through kilnd"
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert_close(first, expected, rtol=tol, atol=tol)
    assert_close(again, expected, rtol=tol, atol=tol)
