"""The "kiln" backend's lowering (captured graph -> ATen graph -> kiln.v1 IR), the largest part of
a cold first call: its time per model, and a digest of the IR it produced, so that a change meant
to make lowering faster can show it produced the very same IR.

    python bench/bench_lowering.py [--models resnet18 ...] [--devices cpu cuda]
                                   [--dtypes fp32 bf16] [--repeats N] [--out F]

Each torchvision model is captured by kiln on the meta device (no weights, no data), BERT, GPT-2
and the MLP (bench/common.build_model) on the CPU with random weights, and each graph is lowered
on fake tensors of the device asked for: on "cuda" no GPU is needed (fake CUDA tensors of an sm_90
device), so CUDA lowering is measured here too. Reported: the first lowering of each graph (a
cold first call's: no shape seen before; the first row's also imports and warms torch's
tracing), the median of the --repeats lowerings after it, the IR's node count, and the sha256 of
its deterministic serialization.
"""
import argparse
import hashlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import command_line, emit  # noqa: E402

MODELS = {"resnet18": (16, 3, 128, 128), "resnet50": (8, 3, 224, 224),
          "mobilenet_v3_small": (8, 3, 224, 224), "vit_b_16": (1, 3, 224, 224)}
BUILT = ("bert", "gpt2", "mlp")  # bench/common.build_model's, captured on the CPU


def captured(name: str, dtype, device: str):
    """(graph module, example inputs) of kiln's capture of `name`: torchvision's on meta
    tensors, the others on the CPU (standing in for a GPU's tensors when `device` is "cuda": the
    graph then names the GPU where the model asks for its inputs' device); the graph with the
    most nodes where there are several."""
    import torch
    import torchvision

    import kiln
    from common import build_model

    if name in MODELS:
        model = getattr(torchvision.models, name)().to("meta").to(dtype).eval()
        inputs = (torch.empty(MODELS[name], device="meta", dtype=dtype),)
    else:
        model, inputs = build_model(name)
        model = model.to(dtype)
        inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    kiln.reset()
    stand_in = name not in MODELS and device == "cuda"
    kiln.config.capture_cpu_as = "cuda:0" if stand_in else None
    try:
        with torch.no_grad():
            kiln.compile(model, backend=backend)(*inputs)
    finally:
        kiln.config.capture_cpu_as = None
    return max(graphs, key=lambda g: len(g[0].graph.nodes))


def on_device(gm, example_inputs, device: str):
    """The graph's parameters, buffers and inputs as fake tensors of `device`, same metadata."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.graph import lowering

    mode = FakeTensorMode()

    def fake(t):
        with mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)

    for target, t in lowering.attr_tensors(gm).items():
        *path, name = target.split(".")
        owner = gm
        for part in path:
            owner = getattr(owner, part)
        if name in owner._parameters:
            owner._parameters[name] = torch.nn.Parameter(fake(t), requires_grad=False)
        elif name in owner._buffers:
            owner._buffers[name] = fake(t)
        else:
            setattr(owner, name, fake(t))
    return [fake(t) for t in example_inputs]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=[*MODELS, *BUILT],
                   choices=[*MODELS, *BUILT])
    p.add_argument("--devices", nargs="+", default=["cpu", "cuda"], choices=["cpu", "cuda"])
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    import torch

    from kiln.graph import lowering

    # Fake CUDA tensors need a device to describe: an H100's (sm_90), with or without a GPU.
    torch.cuda.get_device_capability = lambda index=None: (9, 0)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    rows = []
    for name in a.models:
        for device in a.devices:
            for dtype in a.dtypes:
                gm, example = captured(name, dtypes[dtype], device)
                inputs = on_device(gm, example, device)
                times = []
                with torch.no_grad():
                    for i in range(a.repeats + 1):
                        start = time.perf_counter()
                        lowered = lowering.lower(gm, inputs)
                        times.append(time.perf_counter() - start)
                ir = lowered.graph.SerializeToString(deterministic=True)
                row = {"model": name, "device": device, "dtype": dtype, "first_s": times[0],
                       "lowering_s": statistics.median(times[1:]),
                       "nodes": len(lowered.graph.nodes),
                       "ir_sha256": hashlib.sha256(ir).hexdigest()}
                rows.append(row)
                print(f"{name:20s} {device:5s} {dtype:5s} first {row['first_s']:7.3f} s  then "
                      f"{row['lowering_s']:7.3f} s {row['nodes']:5d} nodes  "
                      f"IR {row['ir_sha256'][:16]}", flush=True)
    emit({"bench": "lowering", "command": command_line(), "rows": rows}, a.out)


if __name__ == "__main__":
    main()
