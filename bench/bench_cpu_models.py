"""The CPU model suite: eager vs kiln (backend="kiln") vs torch.compile (inductor), side by side
in one run, one fresh process per (model, compiler).

    python bench/bench_cpu_models.py [--models ...] [--threads N] [--out F] [--csv F] [--png F]

Per model: steady-state median time and speedup over eager, the first call on a cold cache
(kiln: a fresh kilnd cache directory; torch.compile: a fresh TORCHINDUCTOR_CACHE_DIR), the first
call again on the warm cache (after kiln.reset() / torch._dynamo.reset(), same process), and
the geomean speedup of each compiler. Target: kiln's geomean >= torch.compile's.

Each compiler's process times eager and the compiled model in alternating rounds (eager ms in
the table: the median of those processes' eager times); its speedup is the ratio of its own
pair, so that the machine's drift between processes does not land in the ratios.
"""
import argparse
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import command_line, emit, stop_kilnd  # noqa: E402

MODELS = ["toy_add", "toy_sin_cos", "mlp", "resnet18", "resnet50", "mobilenet_v3_small",
          "vit_b_16", "bert", "gpt2"]


def _batch_size(fn, args, sample_s=2e-3) -> int:
    """How many calls one sample times: calls shorter than `sample_s` are timed in batches of n
    (n chosen so that a batch takes about `sample_s`), as timeit does: a single microsecond call
    timed alone measures the clock and the loop as much as the call."""
    for _ in range(3):
        fn(*args)
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn(*args)
        if time.perf_counter() - t >= sample_s or n >= 1 << 16:
            return n
        n *= 2


def _paired_ms(fns, args, rounds=15, min_time=1.0, max_samples=200):
    """The median time of one call of each of `fns`, in ms, measured side by side: `rounds`
    rounds, each timing every function in turn for about min_time / rounds seconds (at least one
    sample). A machine that slows down for a while (another tenant, a collection, the clock)
    then slows every function, not whichever one it was timing: the ratios of the medians stay
    put when the times themselves move. 15 rounds: a model of a few hundred ms (bert, resnet50)
    gets one sample a round, and the median of 5 of them moved its ratio by 0.3 between runs."""
    import statistics

    batch = [_batch_size(fn, args) for fn in fns]
    samples = [[] for _ in fns]
    window = min_time / rounds
    for _ in range(rounds):
        for fn, n, times in zip(fns, batch, samples):
            start = time.perf_counter()
            while not times or (time.perf_counter() - start < window
                                and len(times) < max_samples):
                t = time.perf_counter()
                for _ in range(n):
                    fn(*args)
                times.append((time.perf_counter() - t) * 1e3 / n)
    return [statistics.median(t) for t in samples]


def child(model: str, compiler: str):
    import torch

    from common import build_model, environment, first_tensor

    torch.set_num_threads(int(os.environ.get("KILN_BENCH_THREADS", "2")))
    m, inputs = build_model(model)
    record = {"model": model, "compiler": compiler, **environment()}
    with torch.no_grad():
        ref = first_tensor(m(*inputs))
        if compiler == "kiln":
            import kiln

            compile_fn, reset = (lambda mod: kiln.compile(mod, backend="kiln")), kiln.reset
        else:
            compile_fn, reset = torch.compile, torch._dynamo.reset
        cm = compile_fn(m)
        t = time.perf_counter()
        out = first_tensor(cm(*inputs))
        record["first_call_cold_s"] = time.perf_counter() - t
        torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
        # Eager and compiled alternate in this process: the speedup is their ratio.
        record["eager_ms"], record["ms"] = _paired_ms([m, cm], inputs, min_time=3.0)
        if compiler == "kiln":
            import kiln

            arts = kiln.debug.artifacts()
            record["artifacts"] = len(arts)
            record["kernels"] = sum(a.plan.num_kernels for a in arts)
            record["compile_s"] = sum(a.compile_seconds for a in arts)
        reset()
        cm = compile_fn(m)
        t = time.perf_counter()
        cm(*inputs)
        record["first_call_warm_s"] = time.perf_counter() - t
    print("RESULT " + json.dumps(record), flush=True)


def run_child(model: str, compiler: str, cache_root: str) -> dict:
    env = dict(os.environ)
    env["KILN_CACHE_DIR"] = os.path.join(cache_root, "kiln")
    env.pop("XDG_RUNTIME_DIR", None)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "inductor")
    done = subprocess.run([sys.executable, __file__, "--child", model, compiler], env=env,
                          capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"model": model, "compiler": compiler,
            "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--compilers", nargs="+", default=["kiln", "inductor"],
                   help="each is timed against eager in its own process")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--csv", default=os.path.join(os.path.dirname(__file__), "out", "cpu_models.csv"))
    p.add_argument("--png", default=os.path.join(os.path.dirname(__file__), "out", "cpu_models.png"))
    p.add_argument("--child", nargs=2, metavar=("MODEL", "COMPILER"))
    a = p.parse_args()
    if a.threads:
        os.environ["KILN_BENCH_THREADS"] = str(a.threads)
    if a.child:
        child(*a.child)
        return
    a.compilers = [c for c in a.compilers if c != "eager"]  # eager runs beside each of them
    rows = []
    for model in a.models:
        cache_root = tempfile.mkdtemp(prefix="kiln-bench-")
        try:
            by = {c: run_child(model, c, cache_root) for c in a.compilers}
        finally:
            stop_kilnd(os.path.join(cache_root, "kiln"))
            shutil.rmtree(cache_root, ignore_errors=True)
        eager = [r["eager_ms"] for r in by.values() if r.get("eager_ms")]
        row = {"model": model, "eager_ms": statistics.median(eager) if eager else None}
        for c in a.compilers:
            r = by[c]
            row[f"{c}_ms"] = r.get("ms")
            row[f"{c}_eager_ms"] = r.get("eager_ms")
            paired = r.get("eager_ms") and r.get("ms")
            row[f"{c}_speedup"] = r["eager_ms"] / r["ms"] if paired else None
            row[f"{c}_first_cold_s"] = r.get("first_call_cold_s")
            row[f"{c}_first_warm_s"] = r.get("first_call_warm_s")
            if r.get("error"):
                row[f"{c}_error"] = r["error"]
        if "kiln" in by:
            row["kiln_kernels"] = by["kiln"].get("kernels")
            row["kiln_compile_s"] = by["kiln"].get("compile_s")
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {"bench": "cpu_models", "command": command_line(), "rows": rows}
    for c in a.compilers:
        sp = [r[f"{c}_speedup"] for r in rows if r.get(f"{c}_speedup")]
        summary[f"{c}_geomean_speedup"] = math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None
    _table(rows, a.compilers, summary)
    os.makedirs(os.path.dirname(a.csv) or ".", exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k != "model", k))
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    if a.png:  # --png "": no chart
        _chart(rows, a.compilers, a.png)
    print(f"# csv {a.csv}, chart {a.png or 'none'}")
    emit(summary, a.out)


def _table(rows, compilers, summary):
    comps = [c for c in compilers if c != "eager"]
    head = f"{'model':20s} {'eager ms':>9s}" + "".join(
        f" {c + ' ms':>12s} {'x':>6s} {'cold s':>7s} {'warm s':>7s}" for c in comps)
    print(head)
    for r in rows:
        line = f"{r['model']:20s} {_f(r.get('eager_ms'), 9, 4)}"
        for c in comps:
            line += (f" {_f(r.get(c + '_ms'), 12, 4)} {_f(r.get(c + '_speedup'), 6, 2)}"
                     f" {_f(r.get(c + '_first_cold_s'), 7, 2)} {_f(r.get(c + '_first_warm_s'), 7, 3)}")
            if r.get(c + "_error"):
                line += f"  [{c}: {r[c + '_error'][:80]}]"
        print(line)
    print("geomean speedup over eager: " + ", ".join(
        f"{c} {summary.get(c + '_geomean_speedup') or float('nan'):.3f}x" for c in comps))


def _f(v, width, prec):
    return f"{v:{width}.{prec}f}" if isinstance(v, (int, float)) else f"{'-':>{width}s}"


def _chart(rows, compilers, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no chart")
        return
    comps = [c for c in compilers if c != "eager"]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / max(1, len(comps))
    for i, c in enumerate(comps):
        ax.bar([j + i * width for j in range(len(rows))],
               [r.get(c + "_speedup") or 0 for r in rows], width, label=c)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks([j + width * (len(comps) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["model"] for r in rows], rotation=20)
    ax.set_ylabel("speedup over eager")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
