"""Shared by the benchmarks: environment line, timing helpers, models, result files."""
import json
import os
import platform
import statistics
import sys
import time
from typing import Optional

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


def build_model(name: str, device: str = "cpu", batch: Optional[int] = None):
    """The model and its example inputs; `batch` replaces the inputs' leading dimension (rows
    of the default inputs, repeated as needed)."""
    m, inputs = _build_model(name, device)
    if batch is not None:
        inputs = tuple(t[:1].repeat(batch, *[1] * (t.dim() - 1)) for t in inputs)
    return m, inputs


def _build_model(name: str, device: str):
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
    if name == "mobilenet_v3_small":
        from torchvision.models import mobilenet_v3_small

        return mobilenet_v3_small().eval().to(device), (torch.randn(8, 3, 224, 224, device=device),)
    if name == "vit_b_16":
        from torchvision.models import vit_b_16

        return vit_b_16().eval().to(device), (torch.randn(1, 3, 224, 224, device=device),)
    if name == "bert":
        from transformers import BertConfig, BertModel

        m = BertModel(BertConfig(attn_implementation="sdpa")).eval().to(device)
        return m, (torch.randint(0, 30522, (2, 128), device=device),)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2Model

        m = GPT2Model(GPT2Config(use_cache=False, attn_implementation="sdpa")).eval().to(device)
        return m, (torch.randint(0, 50257, (2, 128), device=device),)
    if name == "small_mlp":  # the fleet benchmark's models: small, quick to compile
        from torchvision.ops import MLP

        return (MLP(64, [128, 128, 10], activation_layer=torch.nn.ReLU).eval().to(device),
                (torch.randn(8, 64, device=device),))
    if name == "small_cnn":
        from torchvision.ops import Conv2dNormActivation

        m = torch.nn.Sequential(Conv2dNormActivation(3, 16, 3, stride=2),
                                Conv2dNormActivation(16, 32, 3, stride=2),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(32, 10))
        return m.eval().to(device), (torch.randn(4, 3, 32, 32, device=device),)
    if name == "toy_add":  # seed 000: foo(a, b) = torch.add(a, b)
        return _Fn(lambda a, b: torch.add(a, b)), (torch.randn(64, 64), torch.randn(64, 64))
    if name == "toy_sin_cos":  # seed 000: sin(x) + cos(y)
        return _Fn(lambda x, y: torch.sin(x) + torch.cos(y)), (torch.randn(256, 256),
                                                               torch.randn(256, 256))
    raise SystemExit(f"unknown model {name}")


class _Fn(torch.nn.Module):
    """A plain function as a module, so every benchmark compiles modules."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def first_tensor(out):
    """The first tensor of a model's output (a tensor, a tuple, or a HuggingFace ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0]


def stop_kilnd(cache_dir: str) -> None:
    """Stops the kilnd a benchmark's children started in `cache_dir` (KILN_CACHE_DIR)."""
    import subprocess

    from kiln.state import STATE

    kilnd = STATE.daemon.settings.kilnd
    sock = os.path.join(cache_dir, "kilnd.sock")
    if kilnd and os.path.exists(sock):
        subprocess.run([kilnd, "--stop", "--socket", sock], capture_output=True)


def emit(record: dict, out_path: str = None):
    line = json.dumps(record)
    print(line, flush=True)
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path, "a") as f:
            f.write(line + "\n")


def write_csv(rows, path: str) -> None:
    """`rows` (dicts) as a CSV file, one column per key any row has, in order of appearance."""
    import csv

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fields = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
