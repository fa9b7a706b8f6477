"""Training steps: eager vs torch.compile (inductor, default and reduce-overhead) vs kiln, side by
side in one run, one fresh process per (model, compiler).

    python bench/bench_training.py [--models ...] [--compilers ...] [--device cpu|cuda]
                                   [--rounds N] [--warmup N] [--out F]

A step is what the seed tutorial times: the compiled function runs the forward, the loss and
`loss.backward()`; the optimizer's zero_grad() and step() run outside it (models in training
mode: dropout and batch norm as in training). `tutorial` is the tutorial exactly as written:
torchvision's resnet18() (1000 classes), a batch of 16 3x128x128 images, cross entropy, Adam.
The others take a mean-squared-error loss against a fixed target and SGD. Each compiler's
process trains an eager copy and a compiled copy of the same model from the same weights,
timing their steps (the compiled function's call, as the tutorial does) in alternating rounds:
its speedup is the ratio of its own pair's medians, after --warmup steps of each that are not
timed (a training run's steady state: reduce-overhead records its CUDA graphs on the first
calls, kiln observes a training graph's inputs over its first calls before it captures). Also: the first compiled step (capture,
compile, AOT autograd's forward and backward graphs) on a cold cache, and the largest
difference of the first step's loss from eager's. kiln compiles each forward and backward graph
with kilnd where its lowering takes every op (the record counts the graphs it compiled).
"""
import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import command_line, emit, environment, first_tensor, stop_kilnd  # noqa: E402

MODELS = ["tutorial", "mlp", "transformer_layer", "resnet18"]
# inductor-ro: torch.compile(mode="reduce-overhead") (CUDA graphs; on the CPU as the default)
COMPILERS = ["inductor", "inductor-ro", "kiln"]


def build(name: str, device: str):
    import torch

    torch.manual_seed(0)
    if name == "mlp":
        layers = []
        for _ in range(4):
            layers += [torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.LayerNorm(512)]
        return torch.nn.Sequential(*layers).to(device), torch.randn(256, 512, device=device)
    if name == "transformer_layer":
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        return layer.to(device), torch.randn(8, 64, 256, device=device)
    if name == "tutorial":  # the seed tutorial's model and batch, as written
        from torchvision.models import resnet18

        return resnet18().to(device), torch.randn(16, 3, 128, 128, device=device)
    if name == "resnet18":  # the seed tutorial's size
        from torchvision.models import resnet18

        return resnet18(num_classes=10).to(device), torch.randn(16, 3, 128, 128, device=device)
    raise SystemExit(f"unknown model {name}")


def child(model: str, compiler: str, device: str, rounds: int, warmup: int = 10) -> dict:
    import torch

    eager, x = build(model, device)
    trained = copy.deepcopy(eager)
    if model == "tutorial":
        target = torch.randint(1000, (x.shape[0],), device=device)

        def train(mod, data):  # the tutorial's train(), returning its loss
            pred = mod(data[0])
            loss = torch.nn.CrossEntropyLoss()(pred, data[1])
            loss.backward()
            return loss

        def optimizer(params):
            return torch.optim.Adam(params)
    else:
        target = torch.randn_like(first_tensor(eager(x)).float()).detach()

        def train(mod, data):
            loss = torch.nn.functional.mse_loss(first_tensor(mod(data[0])).float(), data[1])
            loss.backward()
            return loss

        def optimizer(params):
            return torch.optim.SGD(params, lr=1e-3)
    if compiler == "kiln":
        import kiln

        compiled = kiln.compile(train)
    elif compiler == "inductor-ro":
        compiled = torch.compile(train, mode="reduce-overhead")
    else:
        compiled = torch.compile(train)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    data = (x, target)

    def make_step(m, run):
        opt = optimizer(m.parameters())
        pending = []

        def step():
            if pending:  # the previous step's update, outside the timed call
                opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            t = time.perf_counter()
            loss = run(m, data)
            sync()
            pending.append(True)
            return loss, time.perf_counter() - t

        return step

    step_e, step_c = make_step(eager, train), make_step(trained, compiled)
    want, _ = step_e()
    got, first_s = step_c()
    record = {"model": model, "compiler": compiler, "device": device, **environment(),
              "first_step_s": first_s, "loss_diff": abs(got.item() - want.item()),
              "loss": want.item(), "warmup": warmup, "rounds": rounds}
    for _ in range(warmup):
        step_e(), step_c()
    times = {"eager": [], "compiled": []}
    for _ in range(rounds):
        for key, step in (("eager", step_e), ("compiled", step_c)):
            times[key].append(step()[1])
    record["eager_ms"] = statistics.median(times["eager"]) * 1e3
    record["ms"] = statistics.median(times["compiled"]) * 1e3
    record["speedup"] = record["eager_ms"] / record["ms"]
    if device == "cuda":
        # Peak memory of one more step of each, and what the caching allocator holds after it
        # (a CUDA graph's private pool stays reserved between steps).
        for key, step in (("eager", step_e), ("compiled", step_c)):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            step()
            record[f"{key}_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
            record[f"{key}_reserved_mb"] = torch.cuda.memory_reserved() / 2**20
    if compiler == "kiln":
        import kiln

        record["kiln_graphs_compiled"] = len(kiln.debug.artifacts())
        # Per plan: its CUDA graph ("captured", "pending", "off" or None), how often captured,
        # and how many lent outputs it moved aside (client/runtime/cuda_graph_memory.h).
        record["kiln_cuda_graphs"] = [
            (getattr(a.plan, "cuda_graph", None), getattr(a.plan, "cuda_graph_captures", 0),
             getattr(a.plan, "cuda_graph_moved_outputs", 0)) for a in kiln.debug.artifacts()]
    return record


def run_child(model, compiler, device, rounds, warmup, cache_root) -> dict:
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(cache_root, "kiln"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_root, "inductor"))
    done = subprocess.run([sys.executable, __file__, "--child", model, compiler, "--device",
                           device, "--rounds", str(rounds), "--warmup", str(warmup)],
                          env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        return {"model": model, "compiler": compiler, "error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--compilers", nargs="+", default=COMPILERS,
                    choices=["inductor", "inductor-ro", "kiln"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps of each first")
    ap.add_argument("--out", default=None, help="append each record (JSON lines) here")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "COMPILER"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.device, args.rounds, args.warmup)))
        return
    print(f"# {command_line()}")
    rows = []
    for model in args.models:
        for compiler in args.compilers:  # one after another: never two on the CPU at once
            cache_root = tempfile.mkdtemp(prefix="kiln-bench-train-")
            try:
                record = run_child(model, compiler, args.device, args.rounds, args.warmup,
                                   cache_root)
            finally:
                stop_kilnd(os.path.join(cache_root, "kiln"))
                shutil.rmtree(cache_root, ignore_errors=True)
            emit(record, args.out)
            rows.append(record)
    print(f"\n{'model':18s} {'compiler':11s} {'eager ms':>9s} {'ms':>9s} {'speedup':>8s} "
          f"{'first s':>8s} {'loss diff':>9s} {'peak MB':>15s}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:18s} {r['compiler']:11s} failed: {r['error'].splitlines()[-1]}")
            continue
        # eager/compiled peak allocated memory of one step (GPU only)
        peak = (f"{r['eager_peak_mb']:.0f}/{r['compiled_peak_mb']:.0f}"
                if "compiled_peak_mb" in r else "")
        print(f"{r['model']:18s} {r['compiler']:11s} {r['eager_ms']:9.2f} {r['ms']:9.2f} "
              f"{r['speedup']:8.2f} {r['first_step_s']:8.2f} {r['loss_diff']:9.1e} {peak:>15s}")


if __name__ == "__main__":
    main()
