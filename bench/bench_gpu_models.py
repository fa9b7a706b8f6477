"""The GPU model suite: eager, torch.compile (default, "reduce-overhead",
"max-autotune-no-cudagraphs") and kiln (backend="kiln"), side by side, one fresh process per
(model, dtype, compiler), on the first CUDA device.

    python bench/bench_gpu_models.py [--models ...] [--dtypes fp32 bf16] [--compilers ...]
                                     [--jsonl F] [--csv F] [--png F] [--report-only]
                                     [--resume] [--stop-after S] [--gpus N]

Per model and dtype (fp32; bf16 under torch.autocast): the steady-state median of one call (CUDA
events around each call, after warm-up) and its speedup over eager, the first call (timed from
the compile call, which is where torch.compile imports torch._dynamo) on a cold
cache (kiln: a fresh kilnd cache directory; torch.compile: a fresh TORCHINDUCTOR_CACHE_DIR), and
the first call of a second fresh process on the warm cache. Each compiler's process times eager
and the compiled model in alternating rounds: its speedup over eager is the ratio of its own pair.
kiln is compared with torch.compile by their compiled times, not by the ratio of their speedups:
eager's time in a process is the host's (launches, autocast's casts) and moved by up to 35%
between processes of one run on an H200 (BERT bf16: 4.86 and 6.51 ms), while the compiled
models are CUDA-graph replays bound by the GPU, steady across processes. kiln_over_torch_best is
torch's best mode's time (the fastest mode) over kiln's: above 1, kiln is faster.

With KILN_BENCH_PROFILE=DIR set, each child profiles its compile and first call (cProfile) into
DIR. kiln's records say where its first calls went (capture, lowering, kilnd's compile, ...).

Every record is appended to --jsonl as it is measured, so that a long suite may be run in
several invocations (each under a time limit) and reported at once with --report-only: the same
command with --resume --stop-after S, repeated, skips what was measured on this GPU and starts
nothing new after S seconds, so each invocation fits its limit and the last one reports all.
Targets (issue: the "kiln" backend on the GPU): kiln at least as fast as torch.compile's best
mode on every model, geomean over that best mode >= 1.1x, resnet18 fp32 >= 3x eager, cold first
call <= 20% and warm first call <= 5% of torch.compile's.
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
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import command_line, emit, stop_kilnd  # noqa: E402

MODELS = ["resnet18", "resnet50", "mobilenet_v3_small", "vit_b_16", "bert", "gpt2", "mlp"]
# The suite's batch sizes (the GPU anchors' and the seed tutorial's inputs).
BATCH = {"resnet18": 16, "resnet50": 32, "mobilenet_v3_small": 32, "vit_b_16": 8, "bert": 8,
         "gpt2": 8, "mlp": 64}
COMPILERS = ["inductor", "reduce-overhead", "max-autotune-no-cudagraphs", "kiln"]
DTYPES = ["fp32", "bf16"]


def _event_ms(fn, args, calls: int) -> float:
    """Mean time of one call over `calls` back-to-back calls, by CUDA events, in ms."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def _paired_ms(fns, args, rounds=20, calls=10):
    """The median per-call time of each of `fns`, measured in alternating rounds of `calls`
    calls each (CUDA graphs' launch savings show only over back-to-back calls, as a server
    issues them)."""
    for fn in fns:
        for _ in range(3):
            fn(*args)
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, samples):
            times.append(_event_ms(fn, args, calls))
    return [statistics.median(t) for t in samples]


def _compile(compiler: str, model):
    import torch

    if compiler == "kiln":
        import kiln

        return kiln.compile(model, backend="kiln")
    if compiler == "inductor":
        return torch.compile(model)
    return torch.compile(model, mode=compiler)


def child(model: str, dtype: str, compiler: str, phase: str):
    """One process: the cold phase measures the first call and the steady state; the warm phase
    (a new process over the cache the cold one filled) the first call only."""
    import torch

    from common import build_model, environment, first_tensor

    import logging

    warnings = []

    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage()[:300])

    logging.getLogger("kiln").addHandler(Keep(logging.WARNING))
    m, inputs = build_model(model, device="cuda", batch=BATCH[model])
    record = {"model": model, "dtype": dtype, "compiler": compiler, "phase": phase,
              **environment()}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16")
    with torch.no_grad(), autocast:
        ref = first_tensor(m(*inputs)).float()
        torch.cuda.synchronize()
        profile = None
        if os.environ.get("KILN_BENCH_PROFILE"):
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        # From the compile call: torch.compile imports torch._dynamo there, kiln on first use.
        t = time.perf_counter()
        cm = _compile(compiler, m)
        record["compile_call_s"] = time.perf_counter() - t
        out = first_tensor(cm(*inputs)).float()
        torch.cuda.synchronize()
        record["first_call_s"] = time.perf_counter() - t
        if profile is not None:
            profile.disable()
            _write_profile(profile, record)
        if compiler == "kiln":
            record["phases"] = _kiln_phases()
        # Relative to the output's magnitude: eager's own float32 convolutions use TF32 (10-bit
        # mantissas), so two correct computations of resnet50's logits differ by ~1e-4 of them.
        tol = 3e-2 if dtype == "bf16" else 1e-3
        err = (out - ref).abs().max().item()
        record["max_abs_err"] = err
        record["matches_eager"] = err <= tol * max(1.0, ref.abs().max().item())
        if phase == "cold":
            record["eager_ms"], record["ms"] = _paired_ms([m, cm], inputs)
            if compiler == "kiln":
                import kiln

                arts = kiln.debug.artifacts()
                record["artifacts"] = len(arts)
                record["kernels"] = sum(a.plan.num_kernels for a in arts)
                record["compile_s"] = sum(a.compile_seconds for a in arts)
                record["cuda_graphs"] = sum(getattr(a.plan, "cuda_graph", None) == "captured"
                                            for a in arts)
    if warnings:
        record["warnings"] = warnings
    print("RESULT " + json.dumps(record), flush=True)


def _kiln_phases() -> dict:
    """Where kiln's first call went, from what kiln recorded: frames installed from stored
    captures and frames traced; per traced frame its capture, lowering, kilnd's compile, the
    rest of its backend call (request, verification, loading the plan) and the storing of its
    capture; per installed one its installation, and kiln.compile's preparation of its plan
    (reading the records, the artifact, building the plan, and its warm run: on a GPU the
    prologue, cuDNN's and cuBLAS's first calls of each kernel, the CUDA graph's capture). What
    the first call took beyond their sum is importing kiln and, for a traced frame, the plan's
    first run."""
    import kiln
    from kiln.state import STATE

    entries = [e for c in list(STATE.compiled_codes) for e in kiln.debug.cache_entries(c)]
    stored = [e for e in entries if e.info.extra.get("stored_capture") is not None]
    traced = [e for e in entries if e.info.extra.get("stored_capture") is None]
    arts = kiln.debug.artifacts()
    return {"frames_stored": len(stored), "frames_traced": len(traced),
            "capture_s": sum(e.info.capture_seconds for e in traced),
            "backend_s": sum(e.info.backend_seconds for e in traced),
            "lowering_s": sum(a.lowering_seconds for a in arts),
            "kilnd_compile_s": sum(a.compile_seconds for a in arts),
            "store_s": sum(e.info.extra.get("store_seconds", 0.0) for e in traced),
            "install_s": sum(e.info.backend_seconds for e in stored),
            # kiln.compile's preparation of the stored plans the first call used.
            **{f"prepare_{part}_s": sum(e.info.extra.get("prepare_seconds", {}).get(part, 0.0)
                                        for e in stored)
               for part in ("records", "artifact", "plan", "warm")}}


def _write_profile(profile, record) -> None:
    """The profile of the compile call and the first call, the 40 costliest functions by
    cumulative time, into $KILN_BENCH_PROFILE/<model>-<dtype>-<compiler>-<phase>.txt."""
    import io
    import pstats

    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(40)
    name = "-".join(record[k] for k in ("model", "dtype", "compiler", "phase")) + ".txt"
    directory = os.environ["KILN_BENCH_PROFILE"]
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "w") as f:
        f.write(out.getvalue())


def run_child(model, dtype, compiler, phase, cache_root, timeout_s, device=None) -> dict:
    """One child process; `device`: what it sees as its only CUDA device (a CUDA_VISIBLE_DEVICES
    entry), None for the parent's own."""
    env = dict(os.environ)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    env["KILN_CACHE_DIR"] = os.path.join(cache_root, "kiln")
    env.pop("XDG_RUNTIME_DIR", None)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "inductor")
    env["TRITON_CACHE_DIR"] = os.path.join(cache_root, "triton")
    try:
        done = subprocess.run([sys.executable, __file__, "--child", model, dtype, compiler, phase],
                              env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def measure(model, dtype, compiler, timeout_s, device=None) -> dict:
    """The cold and the warm process of one (model, dtype, compiler), as one record, on `device`
    (see run_child)."""
    cache_root = tempfile.mkdtemp(prefix="kiln-gpu-bench-")
    try:
        cold = run_child(model, dtype, compiler, "cold", cache_root, timeout_s, device)
        warm = run_child(model, dtype, compiler, "warm", cache_root, timeout_s, device)
    finally:
        stop_kilnd(os.path.join(cache_root, "kiln"))
        shutil.rmtree(cache_root, ignore_errors=True)
    record = {"model": model, "dtype": dtype, "compiler": compiler,
              "gpu": cold.get("cuda"), "torch": cold.get("torch")}
    for k in ("eager_ms", "ms", "max_abs_err", "matches_eager", "kernels", "artifacts",
              "compile_s", "cuda_graphs", "error", "warnings"):
        if k in cold:
            record[k] = cold[k]
    record["first_cold_s"] = cold.get("first_call_s")
    record["first_warm_s"] = warm.get("first_call_s")
    for phase, r in (("cold", cold), ("warm", warm)):  # where the first calls went
        parts = {"compile_call_s": r.get("compile_call_s"), **r.get("phases", {})}
        record.update({f"{phase}_{k}": v for k, v in parts.items() if v is not None})
    if warm.get("error"):
        record["warm_error"] = warm["error"]
    return record


def report(records, csv_path, png_path, gpu=None) -> dict:
    """Rows of (model, dtype) with each compiler's figures and the targets' ratios, from the
    records measured on `gpu` (default: the GPU of the latest record): compiled times are
    compared across processes, which is only sound on one kind of card."""
    if gpu is None and records:
        gpu = records[-1].get("gpu")
    records = [r for r in records if r.get("gpu") == gpu]
    latest = {}
    for r in records:  # a later measurement of the same triple replaces an earlier one
        latest[(r["model"], r["dtype"], r["compiler"])] = r
    rows = []
    keys = sorted({(m, d) for m, d, _ in latest}, key=lambda k: (DTYPES.index(k[1])
                                                                if k[1] in DTYPES else 9,
                                                                MODELS.index(k[0])
                                                                if k[0] in MODELS else 99))
    for model, dtype in keys:
        row = {"model": model, "dtype": dtype}
        eager = []
        for c in COMPILERS:
            r = latest.get((model, dtype, c))
            if r is None:
                continue
            if r.get("eager_ms"):
                eager.append(r["eager_ms"])
            row[f"{c}_ms"] = r.get("ms")
            row[f"{c}_speedup"] = (r["eager_ms"] / r["ms"]
                                   if r.get("eager_ms") and r.get("ms") else None)
            row[f"{c}_first_cold_s"] = r.get("first_cold_s")
            row[f"{c}_first_warm_s"] = r.get("first_warm_s")
            if r.get("error") or r.get("matches_eager") is False:
                row[f"{c}_error"] = r.get("error") or f"differs from eager by {r['max_abs_err']}"
        row["eager_ms"] = statistics.median(eager) if eager else None
        torch_modes = [c for c in COMPILERS if c != "kiln" and row.get(f"{c}_ms")
                       and not row.get(f"{c}_error")]
        if torch_modes:
            best = min(torch_modes, key=lambda c: row[f"{c}_ms"])
            row["torch_best_mode"] = best
            if row.get("kiln_ms") and not row.get("kiln_error"):
                row["kiln_over_torch_best"] = row[f"{best}_ms"] / row["kiln_ms"]
                if row.get("kiln_speedup") and row.get(f"{best}_speedup"):
                    # The same comparison through each process's own eager pair (noisier).
                    row["kiln_over_torch_best_by_speedups"] = (row["kiln_speedup"]
                                                               / row[f"{best}_speedup"])
            colds = [row[f"{c}_first_cold_s"] for c in torch_modes if row.get(f"{c}_first_cold_s")]
            warms = [row[f"{c}_first_warm_s"] for c in torch_modes if row.get(f"{c}_first_warm_s")]
            if row.get("kiln_first_cold_s") and colds:
                row["kiln_cold_over_torch"] = row["kiln_first_cold_s"] / min(colds)
            if row.get("kiln_first_warm_s") and warms:
                row["kiln_warm_over_torch"] = row["kiln_first_warm_s"] / min(warms)
        rows.append(row)
    summary = {"bench": "gpu_models", "command": command_line(), "gpu": gpu, "rows": rows}
    for key in ("kiln_over_torch_best", "kiln_over_torch_best_by_speedups"):
        ratios = [r[key] for r in rows if r.get(key)]
        summary[key.replace("kiln_", "kiln_geomean_", 1)] = \
            math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    _table(rows, summary)
    if csv_path:
        os.makedirs(os.path.dirname(csv_path) or ".", exist_ok=True)
        fields = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("model", "dtype"), k))
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
    if png_path:
        _chart(rows, png_path)
    return summary


def _f(v, width, prec):
    return f"{v:{width}.{prec}f}" if isinstance(v, (int, float)) else f"{'-':>{width}s}"


def _table(rows, summary):
    short = {"inductor": "default", "reduce-overhead": "r-o", "max-autotune-no-cudagraphs": "m-a",
             "kiln": "kiln"}
    head = f"{'model':20s} {'dtype':5s} {'eager ms':>9s}" + "".join(
        f" {short[c] + ' ms':>10s} {'x':>6s}" for c in COMPILERS) + \
        f" {'best/kiln':>9s} {'cold':>6s} {'warm':>6s}"
    print(head)
    for r in rows:
        line = f"{r['model']:20s} {r['dtype']:5s} {_f(r.get('eager_ms'), 9, 3)}"
        for c in COMPILERS:
            line += f" {_f(r.get(c + '_ms'), 10, 3)} {_f(r.get(c + '_speedup'), 6, 2)}"
        line += (f" {_f(r.get('kiln_over_torch_best'), 9, 2)}"
                 f" {_f(r.get('kiln_cold_over_torch'), 6, 3)}"
                 f" {_f(r.get('kiln_warm_over_torch'), 6, 3)}")
        errors = [f"{short[c]}: {r[c + '_error'][:60]}" for c in COMPILERS if r.get(c + "_error")]
        print(line + (f"  [{'; '.join(errors)}]" if errors else ""))
    g = summary.get("kiln_geomean_over_torch_best")
    gs = summary.get("kiln_geomean_over_torch_best_by_speedups")
    print(f"kiln over torch.compile's best mode (its time over kiln's), geomean: {_f(g, 5, 3)}x"
          f" (by the ratio of speedups over each process's eager: {_f(gs, 5, 3)}x)")


def _chart(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no chart")
        return
    fig, ax = plt.subplots(figsize=(12, 4))
    width = 0.8 / len(COMPILERS)
    for i, c in enumerate(COMPILERS):
        ax.bar([j + i * width for j in range(len(rows))],
               [r.get(c + "_speedup") or 0 for r in rows], width, label=c)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks([j + width * (len(COMPILERS) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels([f"{r['model']}\n{r['dtype']}" for r in rows], fontsize=8)
    ax.set_ylabel("speedup over eager")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)


def _devices(n: int) -> list:
    """The CUDA_VISIBLE_DEVICES entry of each of the first `n` visible devices; [None] for one
    (the children see what this process sees)."""
    if n <= 1:
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(n)]
    return names[:n]


def measure_all(todo, jsonl, timeout_s, stop_after, devices, measure_fn=None) -> int:
    """Measures each (model, dtype, compiler) of `todo`, appending its record to `jsonl` as it
    comes. With several `devices`, a row (model, dtype) is measured on one device, its compilers
    one after another there (their times compared on one card), while the other devices measure
    other rows: the compile-bound rows (max-autotune: minutes each) take a fraction of the wall
    time. No measurement starts `stop_after` seconds after the start. Returns how many were
    measured."""
    measure_fn = measure_fn or measure
    rows = {}
    for model, dtype, compiler in todo:
        rows.setdefault((model, dtype), []).append(compiler)
    queue = list(rows.items())
    lock = threading.Lock()
    start = time.monotonic()
    measured = 0
    errors = []

    def work(device):
        try:
            measure_rows(device)
        except BaseException as e:  # re-raised below, as a single process would
            errors.append(e)

    def measure_rows(device):
        nonlocal measured
        while True:
            with lock:
                if not queue:
                    return
                (model, dtype), compilers = queue.pop(0)
            for compiler in compilers:
                if stop_after is not None and time.monotonic() - start > stop_after:
                    return
                record = measure_fn(model, dtype, compiler, timeout_s, device)
                with lock:
                    print(json.dumps(record), flush=True)
                    with open(jsonl, "a") as f:
                        f.write(json.dumps(record) + "\n")
                    measured += 1

    threads = [threading.Thread(target=work, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    left = len(todo) - measured
    if left:
        print(f"# --stop-after {stop_after:.0f} s: {left} not measured", flush=True)
    return measured


def _records(jsonl: str) -> list:
    if not os.path.exists(jsonl):
        return []
    with open(jsonl) as f:
        return [json.loads(line) for line in f if line.strip()]


def _measured(jsonl: str, gpu: str) -> set:
    """(model, dtype, compiler) of the records in `jsonl` measured on `gpu` without an error."""
    return {(r["model"], r["dtype"], r["compiler"]) for r in _records(jsonl)
            if r.get("gpu") == gpu and not r.get("error") and r.get("ms")}


def main():
    out_dir = os.path.join(os.path.dirname(__file__), "out")
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    p.add_argument("--compilers", nargs="+", default=COMPILERS, choices=COMPILERS)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    p.add_argument("--jsonl", default=os.path.join(out_dir, "gpu_models.jsonl"))
    p.add_argument("--csv", default=os.path.join(out_dir, "gpu_models.csv"))
    p.add_argument("--png", default=os.path.join(out_dir, "gpu_models.png"))
    p.add_argument("--out", default=None, help="append the summary line here")
    p.add_argument("--report-only", action="store_true", help="tabulate --jsonl, measure nothing")
    p.add_argument("--gpu", default=None,
                   help="report the records of this GPU (default: this machine's, else the latest's)")
    p.add_argument("--resume", action="store_true",
                   help="skip what --jsonl already holds, measured on this GPU without an error")
    p.add_argument("--stop-after", type=float, default=None, metavar="S",
                   help="start no new measurement S seconds after the start (with --resume, "
                        "a later invocation goes on from there: the suite in time-limited calls)")
    p.add_argument("--gpus", type=int, default=1, metavar="N",
                   help="measure N rows (model, dtype) at once, each on its own GPU of the "
                        "first N visible, its compilers one after another there")
    p.add_argument("--child", nargs=4, metavar=("MODEL", "DTYPE", "COMPILER", "PHASE"))
    a = p.parse_args()
    if a.child:
        child(*a.child)
        return
    gpu = a.gpu
    if not a.report_only:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("bench_gpu_models: no CUDA device")
        os.makedirs(os.path.dirname(a.jsonl) or ".", exist_ok=True)
        gpu = gpu or torch.cuda.get_device_name(0)
        done = _measured(a.jsonl, gpu) if a.resume else set()
        todo = [(m, d, c) for d in a.dtypes for m in a.models for c in a.compilers
                if (m, d, c) not in done]
        if a.gpus > torch.cuda.device_count():
            raise SystemExit(f"bench_gpu_models: --gpus {a.gpus}, but "
                             f"{torch.cuda.device_count()} CUDA devices are visible")
        measure_all(todo, a.jsonl, a.timeout, a.stop_after, _devices(a.gpus))
    summary = report(_records(a.jsonl), a.csv, a.png, gpu)
    emit(summary, a.out)


if __name__ == "__main__":
    main()
