"""Graphs through torch's AOT autograd, each ATen graph it makes compiled as an inference graph
(by the "kiln" backend; "aot_eager" runs them as they are): torch.compile's graphs
(kiln.backends.torch_compile), and kiln's own graphs that record autograd history (training).

AOT autograd turns a captured graph into functional ATen graphs: it applies the graph's in-place
updates of its inputs and rebuilds outputs that alias inputs around the compiled graph, and
splits a graph that needs autograd into a forward and a backward graph. Each of those is compiled
as an inference graph. A graph with symbolic sizes (torch.compile's dynamic=True, or its automatic
dynamic shapes after a size changed) is specialised: compiled for each concrete signature of its
inputs when first called with it (kiln.backends.specialize). Whatever kiln cannot compile runs
eagerly with one warning per kind of failure.
"""
import functools
import logging
from typing import Callable, Optional, Sequence

import torch

from kiln import _C, config
from kiln.backends.fallback import warn_eager_once
from kiln.backends.specialize import PerSignature, tensor_outputs

log = logging.getLogger("kiln")

# Compiles a static ATen inference graph: (graph, example inputs) -> callable (unboxed).
InferenceCompiler = Callable[[torch.fx.GraphModule, list], Callable]


def through_aot_autograd(gm: torch.fx.GraphModule, example_inputs: list,
                         compile_inference: InferenceCompiler,
                         compile_training: Optional[InferenceCompiler] = None) -> Callable:
    """`gm` through torch's AOT autograd, each ATen graph it makes (inference, or a forward and
    a backward) compiled by `compile_inference` (the "kiln" backend with the caller's mode and
    options); a forward and backward pair by `compile_training` where given (the "kiln"
    backend with CUDA graphs of their own memory, which pass the activations from one to the
    other without copies)."""
    from torch._dynamo import exc as dynamo_exc
    from torch._dynamo.backends.common import aot_autograd

    # Dynamo's request to trace the frame again (torch >= 2.6), not a failure of the graph.
    retrace = getattr(dynamo_exc, "TensorifyScalarRestartAnalysis", ())
    # Every compile runs with capture off, so that nothing of kiln's, torch's (make_fx,
    # FakeTensorMode) or the code they generate is ever captured. AOT autograd would compile a
    # backward graph lazily, inside the program's loss.backward() where the program's frame
    # callback is installed, running torch's Python (copies of graph modules, the dataclasses
    # they build) there: the backward is compiled now, beside the forward, in the capture.
    def compiler(compile_graph):
        return _C.FrameRegion(
            functools.partial(compile_aten_graph, compile_inference=compile_graph), None)

    training = compiler(compile_training or compile_inference)
    try:
        with torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
            # Updates of inputs that need no gradient (a batch norm's running statistics) stay
            # in the graphs, as the plan's input updates, rather than one eager copy_ each
            # after every call.
            return aot_autograd(fw_compiler=training, bw_compiler=training,
                                inference_compiler=compiler(compile_inference),
                                keep_inference_input_mutations=True,
                                **_partition())(gm, example_inputs)
    except retrace:
        raise
    except Exception as e:  # what AOT autograd cannot take runs eagerly, as Dynamo's graph
        warn_eager_once(
            "aot", f"torch's AOT autograd cannot take the graph ({type(e).__name__}: {e})")
        return gm.forward


def _partition() -> dict:
    """AOT autograd's split of a training graph into its forward and backward
    (kiln.config.partition): "default" saves every intermediate the backward reads; "min_cut"
    (torch.compile's) saves fewer and recomputes cheap pointwise ops in the backward."""
    if config.partition == "min_cut":
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        return {"partition_fn": min_cut_rematerialization_partition}
    return {}


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs: Sequence,
                       compile_inference: InferenceCompiler) -> Callable:
    """AOT autograd's compiler (forward, backward and inference graphs alike): a callable of the
    boxed convention (one list of arguments). `example_inputs` are FakeTensors and, for a
    dynamic graph, SymInts."""
    from functorch.compile import make_boxed_func

    # What runs the graph (called by autograd's engine for a backward graph, inside the
    # program's frame) is never captured either.
    if any(_symbolic(x) for x in example_inputs):
        static = functools.partial(_compile_static, compile_inference=compile_inference)
        return make_boxed_func(_C.FrameRegion(PerSignature(gm, static, regions=False), None))
    return make_boxed_func(
        _C.FrameRegion(_compile_static(gm, list(example_inputs), compile_inference), None))


def _symbolic(value) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt)
                   for s in (*value.shape, *value.stride(), value.storage_offset()))
    return False


def _compile_static(gm: torch.fx.GraphModule, example_inputs: list,
                    compile_inference: InferenceCompiler) -> Callable:
    """`gm` (static sizes) through the "kiln" backend; a callable of the unboxed convention."""
    tensors_only, rebuild = tensor_outputs(gm)
    if tensors_only is None:
        log.debug("kiln: a graph that returns values other than tensors runs eagerly")
        return gm.forward
    # AOT graphs record no autograd history (torch runs the forward and backward graphs inside
    # its own autograd.Function): the "kiln" backend compiles them as inference graphs.
    with torch.no_grad():
        compiled = compile_inference(tensors_only, example_inputs)
    if rebuild is None:
        return compiled
    return lambda *args: rebuild(compiled(*args), args)
