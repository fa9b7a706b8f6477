"""The "kiln" backend: lower the captured graph to the kiln.v1 IR, have kilnd compile it (or
serve it from its cache), verify the artifact and run its plan in the C++ runtime.

Graphs whose tensors all live on the CPU or all on one CUDA device (a graph that mixes devices
runs eagerly). A graph that records autograd history (training) goes through torch's AOT
autograd first, as torch.compile's graphs do (kiln.backends.aot): its forward and
backward graphs are each compiled here as inference graphs. A CUDA graph is compiled for its GPU's
architecture and, unless turned off (kiln.config.cuda_graphs, kiln.compile's mode and options),
its plan is captured into a CUDA graph and replayed. Any plumbing failure (no daemon, compile
error such as a kilnd without CUDA support, rejected artifact, load failure) runs the graph
eagerly with one warning per kind of failure.
"""
import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from kiln import config
from kiln.backends.fallback import warn_eager_once
from kiln.backends.registry import register_backend
from kiln.daemon.local_artifacts import LocalArtifacts
from kiln.debug import format_artifact
from kiln.graph import stand_in
from kiln.state import STATE

log = logging.getLogger("kiln")


@dataclass
class CompiledArtifact:
    """What the backend made of one graph, for kiln.debug.artifact and KILN_LOG=codegen."""
    key: str
    cache_hit: bool          # the daemon served it without compiling
    index_hit: bool          # this process skipped lowering (the client's index knew the key)
    compile_seconds: float   # the daemon's compile time (0 on a hit)
    client_seconds: float    # lowering + request + verification + loading, in this process
    body: Any                # the verified kiln.v1.ArtifactBody
    plan: Any                # kiln._C.Plan
    aten_graph: Optional[torch.fx.GraphModule] = None
    lowering_seconds: float = 0.0  # of client_seconds: the lowering to kiln.v1 (0 on an index hit)
    size_floors: dict = field(default_factory=dict)  # LoweredGraph.size_floors


def _graph_device(tensors) -> Optional[torch.device]:
    """The one device all `tensors` live on (the CPU when there are none), or None when they
    mix devices or one is on a device kiln does not compile for."""
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if not devices:
        return torch.device("cpu")
    if len(devices) > 1:
        return None
    device = devices.pop()
    return device if device.type in ("cpu", "cuda") else None


def _fallback_reasons(gm, example_inputs) -> Optional[str]:
    from kiln.graph import lowering

    if _graph_device(list(example_inputs) + list(lowering.attr_tensors(gm).values())) is None:
        return "device"
    if not any(n.op == "call_function" or n.op == "call_method" for n in gm.graph.nodes):
        return "empty"
    return None


def cuda_graphs_wanted(mode: Optional[str], options: Optional[dict]) -> bool:
    """Whether a CUDA plan is captured into a CUDA graph, from kiln.compile's mode and options
    (torch.compile's spellings) over kiln.config.cuda_graphs."""
    if options and "triton.cudagraphs" in options:
        return bool(options["triton.cudagraphs"])
    if mode == "max-autotune-no-cudagraphs":
        return False
    if mode == "reduce-overhead":
        return True
    return config.cuda_graphs


def _prepare() -> None:
    """When the backend is chosen (kiln.compile), not in the first call: the import of the
    kiln.v1 messages, which reading a stored capture's artifact needs. Not gRPC's (~0.1 s): a
    process whose artifacts are in its cache directory (kiln.daemon.local_artifacts) never
    talks to kilnd; the first call that does imports it. No channel is opened here: a process
    that forks after kiln.compile must not share one with its children. Failures are left to
    the first call, which reports them and runs eagerly."""
    from kiln.daemon import protocol

    try:
        protocol.messages()
    except protocol.ProtocolUnavailable as e:
        log.debug("kiln backend: client not prepared (%s)", e)


def _start_daemon() -> None:
    """Before a frame is traced: a kilnd that the graph's compile will wait on (every compile
    asks it first: its compiler is part of the graph's key) is reached, started if it is local
    and not running, on a thread of its own, so that its start goes on beside the capture
    instead of after it (a capture that first imports torch._dynamo spends a second there,
    a kilnd start ~0.1 s). What fails is remembered by the client, whose next call (the
    compile's) reports it."""
    if STATE.daemon.ready():
        return

    def start():
        try:
            STATE.daemon.client().ensure_running()
        except Exception as e:  # the compile's own call reports it (or what it finds then)
            log.debug("kiln backend: kilnd not reached ahead of the compile (%s: %s)",
                      type(e).__name__, e)

    threading.Thread(target=start, name="kiln-start-kilnd", daemon=True).start()


def compile_symbolic(gm: torch.fx.GraphModule, example_inputs: list, mode: Optional[str] = None,
                     options: Optional[dict] = None):
    """The kiln backend's compile of a graph with symbolic sizes, whole (register_backend's
    `symbolic`): one kilnd artifact whose plan serves every size in the symbols' ranges, reading
    them from each call's inputs. None where the graph cannot be compiled so (it records
    autograd history, mixes devices, or has a size the IR cannot express; kilnd refuses it;
    no kilnd): its calls then run as PyTorch's kernels until a signature's compile serves
    them. (`mode` and `options` choose CUDA graphs: on a GPU the plan records one per shape
    of its inputs, kiln.config.cuda_graph_shapes.)"""
    from kiln.graph.lowering import needs_autograd

    if not config.symbolic_plans or config.compile_only or stand_in.target() is not None:
        return None
    from kiln.graph.cpu_scalars import on_device
    from kiln.graph.lowering import attr_tensors

    graph, example_inputs, scalars = on_device(gm, example_inputs,
                                               list(attr_tensors(gm).values()))
    why = _fallback_reasons(graph, example_inputs)
    if why is None and needs_autograd(graph, example_inputs):
        why = "autograd"
    if why is not None:
        # (Its capture is then not stored for other processes: said under KILN_LOG=cache.)
        config.say("cache", "kiln: a graph with symbolic sizes is not compiled for every size "
                   "(%s); its calls run per signature", why)
        return None
    from kiln.graph.int_inputs import as_carriers
    from kiln.graph.size_floors import SizeFloors, floor_positions
    from kiln.graph.size_outputs import tensors_only

    try:
        # Sizes among its outputs are read from each call's inputs (kiln.graph.size_outputs);
        # ints among its inputs are passed as sizes of carriers (kiln.graph.int_inputs); 0-dim
        # CPU tensors beside a GPU's as tensors on it (kiln.graph.cpu_scalars).
        graph, sizes = tensors_only(graph)
        graph, examples, ints = as_carriers(graph, example_inputs)
        compiled = compile_symbolic_graph(graph, examples, cuda_graphs_wanted(mode, options))
        floors = floor_positions([n.meta.get("example_value") for n in gm.graph.nodes
                                  if n.op == "placeholder"], compiled.size_floors)
    except Exception as e:  # the graph runs as it is, as before this compile existed
        from kiln.daemon.client import DaemonUnavailable
        from kiln.daemon.protocol import ProtocolUnavailable
        from kiln.graph.symbolic_ir import NotSymbolic

        # Its calls then run per signature (a compile for each shape that comes back) and its
        # capture is not stored for other processes: said once per process as a warning, but
        # at debug level for what the IR is known not to carry (a float input) and for no
        # daemon (a signature's compile says that once: warn_eager_once).
        message = (f"a graph with symbolic sizes is not compiled for every size "
                   f"({type(e).__name__}: {e}); its calls run per signature")
        known = (NotSymbolic, DaemonUnavailable, ProtocolUnavailable)
        if not isinstance(e, known) and STATE.first_warning("kiln backend: symbolic"):
            log.warning("kiln: %s", message)
        else:
            config.say("cache", "kiln: %s", message)
        return None
    compiled.plan.fallback = graph.forward  # a run that fails warns once and goes eager
    STATE.artifacts.append(compiled)
    if config.logs("codegen"):
        print(format_artifact(compiled))
    plan = compiled.plan if scalars is None else scalars.adapt(compiled.plan)
    plan = plan if ints is None else ints.adapt(plan)
    plan = plan if sizes is None else sizes.adapt(plan)
    # Sizes the lowering took as 2 or more: calls with 1 there run without the plan.
    return plan if not floors else SizeFloors(plan, floors)


@register_backend(name="kiln", prepare=_prepare, takes_mode=True, before_capture=_start_daemon,
                  static_shapes=True, symbolic=compile_symbolic)
def kiln(gm: torch.fx.GraphModule, example_inputs: list, mode: Optional[str] = None,
         options: Optional[dict] = None, own_graph_memory: bool = False):
    """Compiles `gm` through kilnd into fused CPU or CUDA kernels plus ATen library calls.
    `own_graph_memory`: a CUDA graph of its plan has memory of its own, lends its outputs and
    reads its inputs in place (AOT autograd's forward and backward graphs: see
    kiln.backends.aot)."""
    from kiln.daemon.artifact import ArtifactRejected
    from kiln.daemon.client import DaemonRefused, DaemonUnavailable
    from kiln.daemon.protocol import ProtocolUnavailable
    from kiln.graph.cpu_scalars import on_device
    from kiln.graph.lowering import LoweringError, attr_tensors, needs_autograd

    program = gm  # what runs where the compile fails
    gm, example_inputs, scalars = on_device(gm, example_inputs, list(attr_tensors(gm).values()))
    reason = _fallback_reasons(gm, example_inputs)
    if reason is not None:
        log.debug("kiln backend: %s graph runs eagerly", reason)
        return program.forward
    if needs_autograd(gm, example_inputs):
        if scalars is not None:
            log.debug("kiln backend: device graph runs eagerly (autograd over a CPU number)")
            return program.forward
        from kiln.backends.aot import through_aot_autograd

        return through_aot_autograd(
            gm, example_inputs, functools.partial(kiln, mode=mode, options=options),
            functools.partial(kiln, mode=mode, options=options, own_graph_memory=True))
    try:
        compiled = compile_graph(gm, example_inputs, cuda_graphs_wanted(mode, options),
                                 load=not config.compile_only, own_graph_memory=own_graph_memory)
    except LoweringError as e:
        warn_eager_once("lowering", f"cannot lower the graph to kiln.v1 ({e})")
        return program.forward
    except DaemonRefused as e:
        warn_eager_once("refused", f"kilnd refused the graph ({e})")
        return program.forward
    except (DaemonUnavailable, ProtocolUnavailable) as e:
        warn_eager_once("daemon", f"no compile daemon ({e})")
        return program.forward
    except CompileFailed as e:
        warn_eager_once("compile", str(e))
        return program.forward
    except ArtifactRejected as e:
        warn_eager_once("artifact", str(e))
        return program.forward
    except (RuntimeError, ValueError) as e:
        warn_eager_once("load", f"cannot load the artifact ({e})")
        return program.forward
    if compiled.plan is None:  # compile_only: kilnd built (and keeps) it; this process runs eager
        compiled.plan = program.forward
        STATE.artifacts.append(compiled)
        return compiled.plan
    compiled.plan.fallback = gm.forward  # a run that fails warns once and goes eager
    STATE.artifacts.append(compiled)
    if config.logs("codegen"):
        print(format_artifact(compiled))
    return compiled.plan if scalars is None else scalars.adapt(compiled.plan)


class CompileFailed(RuntimeError):
    """kilnd answered with a CompileError."""


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list,
                  cuda_graphs: bool = True, load: bool = True,
                  own_graph_memory: bool = False) -> CompiledArtifact:
    """The loaded artifact for `gm`. A graph the client's index knows is fetched by key without
    lowering; any doubt about that artifact (missing, another compiler's, rejected) lowers and
    compiles as a graph seen for the first time would. `cuda_graphs`: a plan on a GPU is
    captured into a CUDA graph and replayed (`own_graph_memory`: see kiln()). `load=False`:
    compiled (or found) and verified, not loaded (plan None: a target this machine cannot run,
    kiln.config.compile_only)."""
    from kiln.daemon import artifact as art
    from kiln.daemon import protocol
    from kiln.daemon.graph_index import GraphIndex
    from kiln.graph import lowering

    start = time.perf_counter()
    pb = protocol.messages()
    client, mac_key = _daemon()
    params = list(lowering.attr_tensors(gm).values())
    example_inputs = list(example_inputs)
    device = _graph_device(params + example_inputs)
    standing_in = device.type == "cpu" and stand_in.target() is not None
    if standing_in:
        # Lowered and built for the GPU the CPU tensors stand for; nothing to load here.
        device, params, example_inputs = _stood_in(params, example_inputs)
        load = False
    inputs = params + example_inputs
    target = art.target_for(device)
    index = GraphIndex(client.settings.cache_dir / "graphs", mac_key)
    # The daemon's compiler is part of the key: after an upgrade the index misses, and the
    # graph is compiled by the new compiler instead of being served what the old one built.
    compiler_version = client.compiler_version_for(target.device_kind) or ""
    # The index describes the graph's own tensors, which are not the ones lowered when
    # standing in: it is neither read nor written then.
    skey = None if standing_in else lowering.structure_key(
        gm, example_inputs, target.SerializeToString() + b"\0" + compiler_version.encode())

    known = index.get(skey) if skey is not None else None
    if known is not None:
        try:
            body, plan = load_artifact_by_key(known, params, list(example_inputs), device,
                                              cuda_graphs, load=load,
                                              own_graph_memory=own_graph_memory)
            return CompiledArtifact(known, True, True, 0.0, time.perf_counter() - start,
                                    body, plan)
        except art.ArtifactRejected as e:
            log.debug("kiln: index entry %s… not used (%s); lowering the graph", skey[:16], e)

    lowering_start = time.perf_counter()
    lowered = lowering.lower(gm, example_inputs, params)
    lowering_seconds = time.perf_counter() - lowering_start
    request = pb.service.CompileRequest(graph=lowered.graph, target=target)
    response, body = _compiled(client, request, mac_key)
    art.check_inputs(body, inputs)
    plan = build_plan_for(body, params, len(example_inputs), device, cuda_graphs,
                          own_graph_memory) if load else None
    if skey is not None:
        index.put(skey, body.key)
    return CompiledArtifact(body.key, response.cache_hit, False, response.compile_seconds,
                            time.perf_counter() - start, body, plan, lowered.aten_graph,
                            lowering_seconds)


def _daemon():
    """(client, MAC key) of the running kilnd, started if it is local and not running."""
    from kiln.daemon.client import read_mac_key

    client = STATE.daemon.client()
    client.ensure_running()
    return client, read_mac_key(client.settings.mac_key_file)


def _compiled(client, request, mac_key):
    """(response, verified body) of kilnd's compile of `request`, the artifact kept in the cache
    directory. Raises CompileFailed when kilnd answers with a CompileError."""
    from kiln.daemon import artifact as art
    from kiln.daemon import protocol

    response = client.compile(request)
    if response.WhichOneof("result") == "error":
        err = response.error
        raise CompileFailed(f"kilnd could not compile the graph: "
                            f"{protocol.messages().service.CompileError.Code.Name(err.code)}: "
                            f"{err.message}")
    # The key is the client's own (of the request it sent), not the answer's: only then is the
    # artifact known to be this graph's, and only then may the index remember it.
    body = art.verify_for_request(response.artifact, mac_key, request)
    LocalArtifacts(client.settings, mac_key).keep(response.artifact, body)
    return response, body


def compile_symbolic_graph(gm: torch.fx.GraphModule, example_inputs: list,
                           cuda_graphs: bool = False) -> CompiledArtifact:
    """The loaded artifact of `gm` (symbolic sizes, its placeholders' fakes carrying them) for
    every size in the symbols' ranges (see compile_symbolic); `cuda_graphs`: a plan on a GPU
    replays a CUDA graph per shape of its inputs."""
    from kiln.daemon import artifact as art
    from kiln.daemon import protocol
    from kiln.graph import lowering

    start = time.perf_counter()
    pb = protocol.messages()
    client, mac_key = _daemon()
    params = list(lowering.attr_tensors(gm).values())
    device = _graph_device(params + list(example_inputs))
    lowering_start = time.perf_counter()
    lowered = lowering.lower_symbolic(gm, params)
    lowering_seconds = time.perf_counter() - lowering_start
    request = pb.service.CompileRequest(graph=lowered.graph, target=art.target_for(device))
    response, body = _compiled(client, request, mac_key)
    art.check_inputs(body, params + list(example_inputs))
    plan = build_plan_for(body, params, len(example_inputs), device, cuda_graphs)
    return CompiledArtifact(body.key, response.cache_hit, False, response.compile_seconds,
                            time.perf_counter() - start, body, plan, lowered.aten_graph,
                            lowering_seconds, lowered.size_floors)


def _stood_in(params: list, example_inputs: list):
    """(device, params, inputs) of a graph of CPU tensors captured for kiln.config.capture_cpu_as:
    that device, and fakes of the tensors on it, of one fake mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.graph.lowering import LoweringError

    device = stand_in.target()
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(t):
        try:
            return stand_in.fake(mode, t)
        except stand_in.CannotStandIn as e:
            raise LoweringError(str(e)) from None

    return device, [fake(t) for t in params], [fake(t) for t in example_inputs]


def load_artifact_by_key(key: str, params: list, inputs: list, device: torch.device,
                         cuda_graphs: bool, load: bool = True, own_graph_memory: bool = False):
    """(body, plan) of the artifact under `key`, a key this client computed or read from its own
    authenticated records, for these parameters and inputs on `device`: from the artifacts
    imported into the cache directory (`python -m kiln cache import`), else from kilnd. Raises
    ArtifactRejected when there is no such artifact, or it is another compiler's, another
    target's or for other inputs; DaemonUnavailable when it must come from kilnd and no kilnd
    answers. `load=False`: plan None."""
    from kiln.daemon import artifact as art

    body = artifact_body_by_key(key, device)
    art.check_inputs(body, params + inputs)
    if not load:
        return body, None
    return body, build_plan_for(body, params, len(inputs), device, cuda_graphs, own_graph_memory)


def artifact_body_by_key(key: str, device: torch.device):
    """The verified body of the artifact under `key` for `device`'s target (see
    load_artifact_by_key), its inputs not yet checked: from the cache directory (imported, or
    kept from this machine's kilnd while its compiler is the same), else from kilnd."""
    from kiln.daemon import artifact as art
    from kiln.daemon.client import DaemonUnavailable, read_mac_key

    settings = STATE.daemon.settings
    target = art.target_for(device)
    try:
        mac_key = read_mac_key(settings.mac_key_file)
    except DaemonUnavailable:
        mac_key = None  # no kilnd has made one yet: nothing is kept either
    local = LocalArtifacts(settings, mac_key)
    # An imported artifact carries its compiler's version in its signed body and key: the fleet's
    # compiler, whatever (if any) kilnd this machine runs.
    body = local.imported(key) or local.kept(key, target.device_kind)
    if body is None:
        client = STATE.daemon.client()
        client.ensure_running()
        mac_key = read_mac_key(client.settings.mac_key_file)
        compiler_version = client.compiler_version_for(target.device_kind) or ""
        found = client.lookup_key(key)
        if not found.found:
            raise art.ArtifactRejected(f"kilnd holds no artifact {key[:16]}…")
        body = art.verify(found.artifact, mac_key, key)
        if body.compiler_version != compiler_version:
            raise art.ArtifactRejected("artifact from another compiler")
        local.keep(found.artifact, body)
    if body.target != target:
        raise art.ArtifactRejected("artifact for another target")
    return body


def build_plan_for(body, params: list, num_inputs: int, device: torch.device,
                   cuda_graphs: bool, own_graph_memory: bool = False):
    """The loaded plan of a checked body, in the process's CUDA graph pool when it replays
    (`own_graph_memory`: see kiln())."""
    from kiln.daemon import artifact as art

    pool = STATE.cuda_graph_pool() if cuda_graphs and device.type == "cuda" else None
    return art.build_plan(body, params, num_inputs, device, pool, own_graph_memory)
