"""What the client checks before it loads an artifact, and the hand-over of a verified
ArtifactBody to the C++ runtime's Plan. Nothing from the wire is executed before its MAC,
its key and its plan's inputs have been checked."""
import hashlib
import hmac
import os
import platform
from functools import lru_cache
from pathlib import Path
from typing import List, Sequence

import torch


class ArtifactRejected(RuntimeError):
    """The artifact failed verification (MAC, key, target or input metadata)."""


def _signed_body(artifact, mac_key: bytes):
    """The parsed ArtifactBody once HMAC-SHA256(mac_key, body) equals the artifact's MAC
    (compared in constant time); nothing is parsed before."""
    from kiln.daemon import protocol

    mac = hmac.new(mac_key, artifact.body, hashlib.sha256).digest()
    if not hmac.compare_digest(mac, artifact.mac):
        raise ArtifactRejected("artifact MAC does not verify: refusing to load it "
                               "(another daemon's key, or the bytes were altered)")
    try:
        return protocol.messages().artifact.ArtifactBody.FromString(artifact.body)
    except Exception as e:  # google.protobuf's DecodeError
        raise ArtifactRejected(f"signed artifact body does not parse ({e})") from None


def _check_key(body, expected_key: str) -> None:
    if not hmac.compare_digest(body.key.encode(), expected_key.encode()):
        raise ArtifactRejected(f"artifact is for key {body.key[:16]}…, not {expected_key[:16]}…")


def verify(artifact, mac_key: bytes, expected_key: str):
    """The ArtifactBody of `artifact` once its MAC verifies under `mac_key` and its signed key
    is `expected_key`: a key this client computed itself or read from its own authenticated
    index, never one taken from the same answer."""
    body = _signed_body(artifact, mac_key)
    _check_key(body, expected_key)
    return body


def verify_for_request(artifact, mac_key: bytes, request):
    """The ArtifactBody of `artifact` once it verifies as the answer to `request`: its signed
    key must be the key of this very request (request_key, under the compiler version the body
    names) and its target the request's. A validly signed artifact of another graph, however it
    arrives (a swapped answer, a confused daemon), is refused."""
    body = _signed_body(artifact, mac_key)
    _check_key(body, request_key(request, body.compiler_version))
    if body.target != request.target:
        raise ArtifactRejected("artifact was built for another target")
    return body


_KEY_DOMAIN = b"kiln.v1.cache-key"


def request_key(request, compiler_version: str) -> str:
    """The cache key of a CompileRequest under `compiler_version`: the same bytes as the
    daemon's CacheKey (cache/cache_key.h): each part serialized deterministically and
    prefixed with its length (8 bytes, little-endian), extra options sorted by key then value."""
    options = type(request.options)()
    options.CopyFrom(request.options)
    extra = sorted(options.extra, key=lambda o: (o.key.encode(), o.value.encode()))
    copies = [type(o)(key=o.key, value=o.value) for o in extra]
    del options.extra[:]
    options.extra.extend(copies)
    canonical = bytearray(_KEY_DOMAIN)
    for part in (compiler_version.encode(), request.graph.SerializeToString(deterministic=True),
                 request.target.SerializeToString(deterministic=True),
                 options.SerializeToString(deterministic=True)):
        canonical += len(part).to_bytes(8, "little") + part
    return hashlib.sha256(bytes(canonical)).hexdigest()


@lru_cache(maxsize=1)
def cpu_isa() -> str:
    """The x86-64 microarchitecture level of this CPU (what kernels may use), or "" elsewhere."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ""
    try:
        flags = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return "x86-64"
    v2 = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}
    v3 = v2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"}
    v4 = v3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
    override = os.environ.get("KILN_CPU_ISA")
    if override:
        return override
    for name, need in (("x86-64-v4", v4), ("x86-64-v3", v3), ("x86-64-v2", v2)):
        if need <= flags:
            return name
    return "x86-64"


def cpu_target():
    from kiln.daemon import protocol

    pb = protocol.messages()
    return pb.target.Target(device_kind=pb.graph.DEVICE_KIND_CPU, cpu_isa=cpu_isa(),
                            cpu_onednn=has_onednn())


def cuda_arch(capability) -> str:
    """The SM architecture of a GPU of compute capability (major, minor): (9, 0) -> "sm_90"."""
    major, minor = capability
    return f"sm_{int(major)}{int(minor)}"


def cuda_target(index: int):
    """The Target of code for GPU `index` (cubins for exactly its architecture; for
    kiln.config.cuda_arch's where that is set: a GPU this machine may not have)."""
    from kiln import config
    from kiln.daemon import protocol

    pb = protocol.messages()
    arch = config.cuda_arch or cuda_arch(torch.cuda.get_device_capability(index))
    return pb.target.Target(device_kind=pb.graph.DEVICE_KIND_CUDA, cuda_arch=arch)


def target_for(device: torch.device):
    """What kilnd compiles for to run on `device` (a CPU or a CUDA device with its index)."""
    if device.type == "cuda":
        return cuda_target(device.index if device.index is not None else 0)
    return cpu_target()


def has_onednn() -> bool:
    """Whether this torch registers oneDNN's fused operators, which plans may then call."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def check_inputs(body, tensors: Sequence[torch.Tensor], leading: bool = False) -> None:
    """Refuses a plan whose inputs do not describe `tensors` exactly (a wrong hit must never
    run: this also catches a stale client-side index). `leading`: `tensors` are its first
    inputs only (the parameters it binds, before the inputs of a call are known)."""
    from kiln.graph.lowering import device_from_pb, dtype_from_pb

    plan = body.plan
    if len(plan.inputs) != len(tensors) and not (leading and len(tensors) <= len(plan.inputs)):
        raise ArtifactRejected(f"plan takes {len(plan.inputs)} inputs, not {len(tensors)}")
    wanted = set(plan.inputs[:len(tensors)])
    metas = {v.id: v.meta for v in plan.values if v.id in wanted}
    # On the first call's path (hundreds of parameters): each enum decoded once.
    dtypes, devices = {}, {}
    for i, (vid, t) in enumerate(zip(plan.inputs, tensors)):
        meta = metas.get(vid)
        if meta is None:
            raise ArtifactRejected(f"plan input {i} has no metadata")
        dtype = dtypes.get(meta.dtype)
        if dtype is None:
            dtype = dtypes[meta.dtype] = dtype_from_pb(meta.dtype)
        where = (meta.device.kind, meta.device.index)
        device = devices.get(where)
        if device is None:
            device = devices[where] = device_from_pb(meta.device)
        # The device too: a plan's kernels given another device's memory would not fail
        # cleanly (a GPU plan handed a module's parameters still on the CPU). An input whose
        # sizes are a symbolic plan's symbols has them checked per call by the runtime.
        symbolic = len(meta.size_exprs) > 0
        if dtype != t.dtype or device != t.device or (symbolic and len(meta.sizes) != t.dim()) or \
                (not symbolic and (tuple(meta.sizes) != tuple(t.shape) or
                                   tuple(meta.strides) != t.stride())):
            want = (dtype, tuple(meta.sizes), tuple(meta.strides), device)
            have = (t.dtype, tuple(t.shape), tuple(t.stride()), t.device)
            raise ArtifactRejected(f"plan input {i} is {want}, the graph's is {have}")


def build_plan(body, bound: List[torch.Tensor], num_user_inputs: int,
               device: torch.device = torch.device("cpu"), cuda_graphs=None,
               own_graph_memory: bool = False):
    """The runtime's Plan for a verified body: its ExecutionPlan crosses to C++ once, in
    kiln.v1's wire format, and is decoded and validated there. `bound` (parameters) are fixed at load
    and take the plan's first inputs; the call passes the remaining `num_user_inputs` tensors.
    On a CUDA `device` the kernels are the body's cubin (its PTX where the cubin does not load),
    and `cuda_graphs` (a kiln._C.CudaGraphPool, or None) has the plan captured and replayed
    (`own_graph_memory`: in memory of its own, lending its outputs and reading its inputs in
    place, see client/runtime/cuda_graph_runner.h)."""
    from kiln import _C
    from kiln.daemon import protocol

    n_bound = len(body.plan.inputs) - num_user_inputs
    if n_bound != len(bound):
        raise ArtifactRejected(f"plan binds {n_bound} parameters, the graph has {len(bound)}")
    if device.type != "cuda":
        return _C.Plan(body.plan.SerializeToString(), body.kernel_binary, bound)
    if body.kernel_binary and body.format != protocol.messages().artifact.BINARY_FORMAT_CUBIN:
        raise ArtifactRejected("a CUDA artifact's kernels are not a cubin")
    return _C.Plan(body.plan.SerializeToString(), body.kernel_binary, bound,
                   f"cuda:{device.index if device.index is not None else 0}",
                   kernel_ptx=body.kernel_ptx, cuda_graphs=cuda_graphs,
                   own_graph_memory=own_graph_memory)
