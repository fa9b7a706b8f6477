"""Shared by the benchmarks: environment line, timing helpers, models, result files."""
import json
import os
import platform
import statistics
import sys
import time

import torch


def environment() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def command_line() -> str:
    return " ".join([os.path.basename(sys.executable)] + sys.argv)


def per_call_us(fn, args, n=20000, warm=1000, repeats=5) -> float:
    """Median over `repeats` of the mean wall time of n calls, in microseconds."""
    for _ in range(warm):
        fn(*args)
    results = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn(*args)
        results.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(results)


def build_model(name: str, device: str = "cpu"):
    torch.manual_seed(0)
    if name == "resnet18":
        from torchvision.models import resnet18

        return resnet18().eval().to(device), (torch.randn(16, 3, 128, 128, device=device),)
    if name == "resnet50":
        from torchvision.models import resnet50

        return resnet50().eval().to(device), (torch.randn(8, 3, 224, 224, device=device),)
    if name == "mlp":
        layers = [torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                                      torch.nn.LayerNorm(1024)) for _ in range(8)]
        return (torch.nn.Sequential(*layers).eval().to(device),
                (torch.randn(64, 1024, device=device),))
    raise SystemExit(f"unknown model {name}")


def emit(record: dict, out_path: str = None):
    line = json.dumps(record)
    print(line, flush=True)
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path, "a") as f:
            f.write(line + "\n")
