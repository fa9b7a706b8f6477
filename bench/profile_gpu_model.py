"""Where a model's GPU time goes under each compiler: the CUDA kernels torch.profiler records
over a few calls, by total device time, with the model's median call time beside them.

    python bench/profile_gpu_model.py MODEL [--dtype fp32|bf16] [--compilers kiln inductor ...]
                                      [--rows N] [--calls N]

MODEL and its batch are bench_gpu_models.py's. CUDA graphs are off for every compiler
(kiln.config.cuda_graphs, torch.compile's default mode): a replayed graph shows as one launch,
and the question here is which kernels take the time. The summary line per compiler gives the
sum of kernel times per call against the call's wall time: their difference is launch and host
overhead, which CUDA graphs remove.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

COMPILERS = ["eager", "kiln", "inductor"]


def _compiled(compiler, model):
    import torch

    if compiler == "eager":
        return model
    if compiler == "kiln":
        import kiln

        kiln.config.cuda_graphs = False
        return kiln.compile(model, backend="kiln")
    return torch.compile(model)


def profile_one(compiler, model, inputs, autocast, rows, calls):
    import torch
    from torch.profiler import ProfilerActivity, profile

    cm = _compiled(compiler, model)
    with torch.no_grad(), autocast():
        for _ in range(3):
            cm(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            t = time.perf_counter()
            cm(*inputs)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1e3)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                cm(*inputs)
            torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name[:90]
            total, count = kernels.get(name, (0.0, 0))
            kernels[name] = (total + e.device_time_total, count + 1)
    per_call_us = sum(t for t, _ in kernels.values()) / calls
    print(f"\n== {compiler}: median call {statistics.median(times):.3f} ms (wall, synchronized), "
          f"kernels {per_call_us / 1e3:.3f} ms per call, "
          f"{sum(c for _, c in kernels.values()) // calls} launches per call")
    for name, (total, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:rows]:
        print(f"  {total / calls:9.1f} us  x{count // calls:<4d} {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compilers", nargs="+", default=COMPILERS, choices=COMPILERS)
    p.add_argument("--rows", type=int, default=15)
    p.add_argument("--calls", type=int, default=5)
    a = p.parse_args()

    import torch

    from bench_gpu_models import BATCH
    from common import build_model, command_line

    print(command_line())
    m, inputs = build_model(a.model, device="cuda", batch=BATCH[a.model])

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    for compiler in a.compilers:
        profile_one(compiler, m, inputs, autocast, a.rows, a.calls)


if __name__ == "__main__":
    main()
