"""Capturing for a GPU this machine does not have (`python -m kiln warm --cuda-arch sm_90` on a
build machine): the program runs on the CPU, and kiln captures its CPU tensors as though they
lived on the GPU the fleet runs (kiln.config.capture_cpu_as, "cuda:0"). The capture's fake
tensors report that device to everything the trace asks (x.device, x.is_cuda, which kernels
autocast picks), kilnd compiles the graph for the named architecture, and the stored record
names CUDA tensors: a process on that GPU installs it without tracing. The frame itself then
runs eagerly on the CPU (its graph, traced for the GPU, may create CUDA tensors).

What cannot stand in is refused, so that nothing the GPU process would see differently is
baked into a record: tensors that are views or subclasses (their fakes would need their real
storage's layout), and any question asked of torch.cuda (this machine's answers are not the
GPU's); such a frame runs eagerly and stores nothing."""
from typing import Optional

import torch

from kiln import config
from kiln.graph.meta_rules import fake_of, plain_tensor

# A dense CPU tensor's dispatch keys and the same tensor's on a CUDA device: what a stored
# TENSOR_MATCH guard compares (kiln.stored_capture._tensor_meta).
_CPU_KEYS = "DispatchKeySet(CPU, ADInplaceOrView, AutogradCPU, AutocastCPU)"
_CUDA_KEYS = "DispatchKeySet(CUDA, ADInplaceOrView, AutogradCUDA, AutocastCUDA)"


class CannotStandIn(Exception):
    """A value whose CPU form says nothing certain about its form on the target device."""


def target() -> Optional[torch.device]:
    """The device CPU tensors are captured as, or None (the normal case)."""
    if not config.capture_cpu_as:
        return None
    device = torch.device(config.capture_cpu_as)
    if device.type != "cuda":
        raise ValueError(f"kiln.config.capture_cpu_as: {device} is not a CUDA device")
    return device if device.index is not None else torch.device("cuda", 0)


def device_of(t: torch.Tensor) -> torch.device:
    """The device `t` is captured as: the target for a CPU tensor while standing in."""
    stand = target() if t.device.type == "cpu" else None
    return stand if stand is not None else t.device


def fake(fake_mode, t: torch.Tensor):
    """A fake tensor of `t`'s metadata on the target device (target() must not be None)."""
    if not plain_tensor(t):
        raise CannotStandIn("a view, subclass or non-dense tensor cannot be captured as a "
                            f"{target()} tensor from its CPU form")
    return fake_of(fake_mode, t, target())


def stored_meta(meta: dict) -> dict:
    """A stored TENSOR_MATCH guard's metadata (kiln.stored_capture._tensor_meta) of a CPU
    tensor, as the same tensor's on the target device, while standing in; else `meta`."""
    stand = target()
    if stand is None or meta["device"] != "cpu":
        return meta
    if meta["keys"] != _CPU_KEYS:
        raise CannotStandIn(f"a tensor with dispatch keys {meta['keys']}")
    return dict(meta, device=str(stand), keys=_CUDA_KEYS)


# Where torch answers questions about the machine's GPUs and their libraries: torch.cuda (any
# attribute), and functions of torch.backends.cuda and torch.backends.cudnn (is_available,
# version, is_flash_attention_available; their flags, such as cudnn.allow_tf32, are the
# program's settings and read as usual).
_MACHINE_MODULES = ("torch.cuda",)
_MACHINE_FUNCTION_MODULES = ("torch.cuda", "torch.backends.cuda", "torch.backends.cudnn")


def _in(module: str, roots) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def asks_the_machine(value, called: bool) -> bool:
    """Whether reading `value` (an attribute the trace reached in torch's namespace), or calling
    it when `called`, asks this machine's CUDA state."""
    if isinstance(value, type(torch)):
        return _in(value.__name__, _MACHINE_MODULES)
    module = getattr(value, "__module__", None) or ""
    name = getattr(value, "__name__", "") or ""
    if name.startswith(("_cuda_", "_cudnn_", "_get_cudnn")):  # torch._C's own
        return True
    return _in(module, _MACHINE_FUNCTION_MODULES if called else _MACHINE_MODULES) and \
        callable(value)
