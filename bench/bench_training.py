"""Training steps: eager vs torch.compile (inductor) vs kiln (backend="kiln"), side by side in one
run, one fresh process per (model, compiler).

    python bench/bench_training.py [--models ...] [--device cpu|cuda] [--rounds N] [--out F]

A step is forward, mean-squared-error loss against a fixed target, backward, and an SGD update of
every parameter (models in training mode: dropout and batch norm as in training). Each compiler's
process trains an eager copy and a compiled copy of the same model from the same weights, timing
their steps in alternating rounds: its speedup is the ratio of its own pair's medians. Also: the
first compiled step (capture, compile, AOT autograd's forward and backward graphs) on a cold
cache, and the largest difference of the first step's loss from eager's. kiln compiles each
forward and backward graph with kilnd where its lowering takes every op, and runs the graph
eagerly where it does not (the record counts the graphs it compiled).
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

MODELS = ["mlp", "transformer_layer", "resnet18"]
COMPILERS = ["inductor", "kiln"]


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
    if name == "resnet18":  # the seed tutorial's size
        from torchvision.models import resnet18

        return resnet18(num_classes=10).to(device), torch.randn(16, 3, 128, 128, device=device)
    raise SystemExit(f"unknown model {name}")


def child(model: str, compiler: str, device: str, rounds: int) -> dict:
    import torch

    eager, x = build(model, device)
    trained = copy.deepcopy(eager)
    target = torch.randn_like(first_tensor(eager(x)).float()).detach()
    if compiler == "kiln":
        import kiln

        compiled = kiln.compile(trained)
    else:
        compiled = torch.compile(trained)

    def make_step(m, run):
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(first_tensor(run(x)).float(), target)
            loss.backward()
            opt.step()
            return loss

        return step

    step_e, step_c = make_step(eager, eager), make_step(trained, compiled)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    want = step_e()
    t = time.perf_counter()
    got = step_c()
    sync()
    first_s = time.perf_counter() - t
    record = {"model": model, "compiler": compiler, "device": device, **environment(),
              "first_step_s": first_s, "loss_diff": abs(got.item() - want.item()),
              "loss": want.item()}
    for _ in range(3):
        step_e(), step_c()
    times = {"eager": [], "compiled": []}
    for _ in range(rounds):
        for key, step in (("eager", step_e), ("compiled", step_c)):
            sync()
            t = time.perf_counter()
            step()
            sync()
            times[key].append(time.perf_counter() - t)
    record["eager_ms"] = statistics.median(times["eager"]) * 1e3
    record["ms"] = statistics.median(times["compiled"]) * 1e3
    record["speedup"] = record["eager_ms"] / record["ms"]
    if compiler == "kiln":
        import kiln

        record["kiln_graphs_compiled"] = len(kiln.debug.artifacts())
    return record


def run_child(model, compiler, device, rounds, cache_root) -> dict:
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(cache_root, "kiln"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_root, "inductor"))
    done = subprocess.run([sys.executable, __file__, "--child", model, compiler, "--device",
                           device, "--rounds", str(rounds)], env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        return {"model": model, "compiler": compiler, "error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--compilers", nargs="+", default=COMPILERS)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None, help="append each record (JSON lines) here")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "COMPILER"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.device, args.rounds)))
        return
    print(f"# {command_line()}")
    rows = []
    for model in args.models:
        for compiler in args.compilers:  # one after another: never two on the CPU at once
            cache_root = tempfile.mkdtemp(prefix="kiln-bench-train-")
            try:
                record = run_child(model, compiler, args.device, args.rounds, cache_root)
            finally:
                stop_kilnd(os.path.join(cache_root, "kiln"))
                shutil.rmtree(cache_root, ignore_errors=True)
            emit(record, args.out)
            rows.append(record)
    print(f"\n{'model':18s} {'compiler':9s} {'eager ms':>9s} {'ms':>9s} {'speedup':>8s} "
          f"{'first s':>8s} {'loss diff':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:18s} {r['compiler']:9s} failed: {r['error'].splitlines()[-1]}")
            continue
        print(f"{r['model']:18s} {r['compiler']:9s} {r['eager_ms']:9.2f} {r['ms']:9.2f} "
              f"{r['speedup']:8.2f} {r['first_step_s']:8.2f} {r['loss_diff']:9.1e}")


if __name__ == "__main__":
    main()
