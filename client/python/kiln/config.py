"""kiln's configuration: one module-level object per process, read at capture time.

Set attributes directly (`kiln.config.cache_size_limit = 16`) or through the environment
(`KILN_LOG=graph,guards,bytecode`, `KILN_CACHE_SIZE_LIMIT=16`).
"""
import os

# Print the captured graph, the original and transformed bytecode and the guards of every
# compiled frame (what KILN_LOG=graph,guards,bytecode prints).
debug = False

# Compiled entries kept per code object; past it the frame runs eagerly, with one warning.
cache_size_limit = int(os.environ.get("KILN_CACHE_SIZE_LIMIT", "8"))

# Automatic dynamic shapes (kiln.graph.symbolic_shapes): a frame captured again because an
# input's size changed is captured with its inputs' sizes as symbols, one graph for every size.
# Off: a graph per shape (kiln.compile(dynamic=False) for one compile).
# KILN_AUTOMATIC_DYNAMIC_SHAPES=0.
automatic_dynamic_shapes = os.environ.get("KILN_AUTOMATIC_DYNAMIC_SHAPES", "1") != "0"

# False: the first capture of every frame already has symbolic sizes (kiln.compile(dynamic=True)
# for one compile). KILN_ASSUME_STATIC_BY_DEFAULT=0.
assume_static_by_default = os.environ.get("KILN_ASSUME_STATIC_BY_DEFAULT", "1") != "0"

# Specialisations kept per graph with symbolic sizes, for a backend that compiles static sizes
# (kiln.backends.specialize): the most recently used ones, each compiled on its signature's
# first call. KILN_SPECIALIZATIONS_PER_GRAPH.
specializations_per_graph = int(os.environ.get("KILN_SPECIALIZATIONS_PER_GRAPH", "64"))
# ...each compiled on its signature's specialize_after-th call, run by PyTorch's kernels until
# then: a new size on almost every call (a decoder's cache, a server's random shapes) is not
# worth a compile each; the sizes a program keeps coming back to are. KILN_SPECIALIZE_AFTER.
specialize_after = int(os.environ.get("KILN_SPECIALIZE_AFTER", "8"))
# ...or, once the graph's plan for every size (symbolic_plans) is ready, on its
# specialize_after_whole-th call: that plan runs generated kernels over the call's sizes, and a
# signature's own compile (lowering, kilnd, its first run and CUDA graph) pays only for one a
# program calls often, as a decode step with a static cache is, not for each of a dynamic cache's
# lengths that a request of the same batch meets once; never while that plan replays a CUDA
# graph per shape (cuda_graph_shapes). KILN_SPECIALIZE_AFTER_WHOLE.
specialize_after_whole = int(os.environ.get("KILN_SPECIALIZE_AFTER_WHOLE", "32"))
# ...on kiln's background worker, the calls running PyTorch's kernels until it is ready (off:
# the call that reaches specialize_after compiles it and waits). KILN_SPECIALIZE_IN_BACKGROUND=0.
specialize_in_background = os.environ.get("KILN_SPECIALIZE_IN_BACKGROUND", "1") != "0"
# ...and while a graph's calls bring new signatures because some sizes keep changing (a
# decoder's cache length) while others stay, the nodes that involve only the staying sizes are
# compiled per signature in regions of their own (kiln.backends.stable_regions).
# KILN_STABLE_REGIONS=0.
stable_regions = os.environ.get("KILN_STABLE_REGIONS", "1") != "0"
# ...and, with the kiln backend, the graph is compiled once whole for every size in its symbols'
# ranges (one kilnd artifact whose plan reads its sizes from each call's inputs), which runs
# the calls no signature's compile serves instead of PyTorch's kernels from Python.
# KILN_SYMBOLIC_PLANS=0.
symbolic_plans = os.environ.get("KILN_SYMBOLIC_PLANS", "1") != "0"
# How long kiln.reset() waits for background work under way to finish.
reset_waits_for_compiles_s = 120.0

# Default for kiln.compile(backend=...): "kiln" (CPU inference graphs become fused kernels built
# by kilnd; other graphs, and every graph when no daemon answers, run eagerly).
default_backend = os.environ.get("KILN_BACKEND", "kiln")

# CUDA graphs for compiled graphs on a GPU: the "kiln" backend captures a plan once and replays
# it (kiln.compile's mode="max-autotune-no-cudagraphs" or options={"triton.cudagraphs": False}
# turn it off for one compile, mode="reduce-overhead" on; KILN_CUDA_GRAPHS=0 off by default).
cuda_graphs = os.environ.get("KILN_CUDA_GRAPHS", "1") != "0"

# A plan with size symbols on a GPU records one CUDA graph per shape of its inputs, on that
# shape's first call (client/runtime/cuda_graph_shapes.h), within a budget for all such graphs of
# the process: at most cuda_graph_shapes graphs, holding at most cuda_graph_shape_memory (a
# fraction of the GPU memory free when the first CUDA plan is made when <= 1, else bytes) of
# static inputs, outputs and prologue copies. Past it, a shape that has not come back for long is evicted; otherwise new shapes run
# without a graph. Read when the process's graph pool is made (its first CUDA plan).
cuda_graph_shapes = int(os.environ.get("KILN_CUDA_GRAPH_SHAPES", "1024"))
cuda_graph_shape_memory = float(os.environ.get("KILN_CUDA_GRAPH_SHAPE_MEMORY", "0.25"))

# How AOT autograd splits a training graph into its forward and backward graphs
# (kiln.backends.aot): "default" (AOT's default partition: the forward saves every intermediate
# the backward reads) or "min_cut" (torch.compile's: fewer saved, cheap pointwise ops recomputed
# in the backward). KILN_PARTITION.
partition = os.environ.get("KILN_PARTITION", "default")

# Stored captures (kiln.stored_capture): a frame compiled by the "kiln" backend is stored in the
# cache directory, and a process that meets the same code (same kiln, torch, Python) installs it
# without tracing when its guards hold. KILN_STORED_CAPTURES=0 turns both off.
stored_captures = os.environ.get("KILN_STORED_CAPTURES", "1") != "0"

# kiln.compile(model) on a warm cache reads the stored capture of model's forward and loads and
# runs its plan once before returning, so that the first call runs at full speed (the first call
# still checks every guard on its own frame). KILN_PREPARE_STORED=0: the first call does it.
prepare_stored_captures = os.environ.get("KILN_PREPARE_STORED", "1") != "0"

# Compile without running: the "kiln" backend has kilnd build (and keep) each graph's artifact
# and stores the capture, but runs the graph eagerly here (`python -m kiln warm` for a target
# this machine cannot run, such as a CPU ISA it lacks). KILN_COMPILE_ONLY=1.
compile_only = os.environ.get("KILN_COMPILE_ONLY", "0") == "1"

# Capture this process's CPU tensors as tensors of this CUDA device ("cuda:0"), for a GPU the
# machine does not have (`python -m kiln warm --cuda-arch`; kiln.graph.stand_in): stored
# records name CUDA tensors and kilnd builds for cuda_arch; frames run eagerly here. Only with
# compile_only. KILN_CAPTURE_CPU_AS=cuda:0.
capture_cpu_as = os.environ.get("KILN_CAPTURE_CPU_AS") or None

# The architecture kilnd builds CUDA kernels for ("sm_90") in place of the GPU's own: set with
# capture_cpu_as, where there is no GPU to ask. KILN_CUDA_ARCH.
cuda_arch = os.environ.get("KILN_CUDA_ARCH") or None

# What to print, a subset of {"graph", "guards", "bytecode", "recompiles", "codegen", "cache"}
# ("cache": why a stored capture was or was not used):
# KILN_LOG=graph,guards.
log = frozenset(p.strip() for p in os.environ.get("KILN_LOG", "").split(",") if p.strip())

# Guard module attributes that are plain constants (ints, strings, tuples) of torch.nn's own
# modules too (a changed dropout p or batch-norm eps recompiles). On: the guard tree checks a
# module's constants by its __dict__'s version tag, one comparison while nothing changed. Off:
# their configuration (stride, eps, ...) is taken as fixed once the module's identity is
# guarded; `training` is always guarded.
guard_nn_module_constants = True


# A backend that raises makes the frame's call raise kiln.exc.BackendCompilerFailed instead of
# warning once and running the frame eagerly. KILN_RAISE_ON_BACKEND_ERROR=1.
raise_on_backend_error = os.environ.get("KILN_RAISE_ON_BACKEND_ERROR", "0") == "1"


# Tensor.item() in a captured frame is a value the graph computes (a graph output where the
# frame returns it, an operand of later tensor arithmetic) instead of a graph break, as
# torch._dynamo.config.capture_scalar_outputs. Branching on it, or using it as a size, still
# breaks. KILN_CAPTURE_SCALAR_OUTPUTS=1.
capture_scalar_outputs = os.environ.get("KILN_CAPTURE_SCALAR_OUTPUTS", "0") == "1"


# Compile nothing: while KILN_DISABLE=1, kiln.compile and kiln.optimize return what they are
# given as it is; torch's switches for the same (TORCH_COMPILE_DISABLE=1, TORCHDYNAMO_DISABLE=1)
# do it too, so that a program written for torch.compile and moved to kiln is turned off the way
# its operators know. Read at each call of kiln.compile / kiln.optimize, as torch reads its own.
DISABLE_VARIABLES = ("KILN_DISABLE", "TORCH_COMPILE_DISABLE", "TORCHDYNAMO_DISABLE")


def disabled() -> bool:
    """True when the environment turns compiling off (DISABLE_VARIABLES)."""
    return any(os.environ.get(name) == "1" for name in DISABLE_VARIABLES)


def logs(topic: str) -> bool:
    """True when `topic` output is asked for, by KILN_LOG or by `debug`."""
    return debug or topic in log or "all" in log


def say(topic: str, fmt: str, *args) -> None:
    """A message of `topic` on the "kiln" logger: at warning level where that output is asked
    for (logs(topic)), else at debug level."""
    import logging

    logging.getLogger("kiln").log(logging.WARNING if logs(topic) else logging.DEBUG, fmt, *args)
