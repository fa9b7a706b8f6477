"""The model suite: torchvision, timm and transformers models (small random-weight configs,
bench/model_configs.py) through eager, kiln and torch.compile, one fresh process per (model,
compiler), in the spirit of PyTorch's torchbench / huggingface / timm_models dashboards.

    python bench/bench_models.py [--suite torchvision|timm|transformers|all] [--models ...]
        [--compilers eager kiln torch] [--device cpu|cuda] [--dtype fp32|bf16] [--capture-only]
        [--timeout S] [--jsonl F [--resume]] [--csv F] [--png F] [--report-only]

Two kinds of process, each fresh, each under --timeout (a hang or a crash is a record, not the
end of the suite):

- capture (kiln, torch): what capture makes of the model, with each compiler's "eager" backend
  (the captured graphs run by PyTorch: quick, and any difference from eager is capture's).
  kiln: graphs, breaks and their reasons from kiln.explain; frames run eagerly (unsupported
  construct, internal error, backend failure) and cache_size_limit hits from kiln's log; then
  kiln.compile(backend="eager") called twice, its outputs against eager's. torch: the same from
  torch._dynamo.explain, dynamo's frame counters and log, torch.compile(backend="eager").
- speed (eager, kiln, torch; not with --capture-only): kiln.compile (backend "kiln", a fresh
  kilnd cache) or torch.compile (inductor in --torch-mode: reduce-overhead on a GPU, default on
  the CPU; a fresh cache): the first call from the compile call,
  then eager and compiled timed in alternating rounds (bench_cpu_models._paired_ms; CUDA events
  on a GPU): the speedup is the ratio of the process's own pair. eager: eager's first call and
  steady state alone.

"passes": every tensor of the output (tuples, lists, dicts, ModelOutput dataclasses, cache
objects) matches eager's on the same random input (torch.testing.assert_close; float32 within
1e-3 relative and 1e-3 of the tensor's largest magnitude, bfloat16 within 3e-2; integers
exactly). kiln's breaks are kiln.explain's graph_break_count (a frame run eagerly for an
unsupported construct counts as one); torch's are torch._dynamo.explain's (its graphs less one).

Every record is appended to --jsonl as it comes; --resume skips (model, compiler, mode, device,
dtype) already there, so a long suite runs in chunks; --report-only tabulates the jsonl.
"""
import argparse
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, emit, stop_kilnd, write_csv  # noqa: E402
import model_configs  # noqa: E402

COMPILERS = ["eager", "kiln", "torch"]
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


# ---- one model in this process -------------------------------------------------------------


def build(name: str, device: str = "cpu", dtype: str = "fp32"):
    """The registry's model `name` in eval mode on `device` in `dtype`, and its inputs (args,
    kwargs): floating tensors in `dtype`, integer ones as they are."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = model_configs.MODELS[name]
    torch.manual_seed(0)
    model, args, kwargs = spec.build()
    dt = getattr(torch, DTYPES[dtype])
    model = model.eval().to(device=device, dtype=dt)

    def move(x):
        if isinstance(x, torch.Tensor):
            return x.to(device=device, dtype=dt if x.is_floating_point() else x.dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(move(v) for v in x)
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x

    return model, move(args), move(kwargs)


def leaves(obj, path="out", depth=0):
    """(path, value) of every tensor and scalar in a model's output: tensors, tuples, lists,
    dicts (ModelOutput included), dataclasses, and plain objects' attributes (transformers'
    cache objects), in a stable order."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        yield path, obj
    elif depth > 6:
        yield path, f"<{type(obj).__name__}>"
    elif isinstance(obj, dict):
        for k in obj:
            yield from leaves(obj[k], f"{path}[{k!r}]", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{path}[{i}]", depth + 1)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from leaves(getattr(obj, f.name), f"{path}.{f.name}", depth + 1)
    elif hasattr(obj, "__dict__") and not callable(obj):
        for k, v in sorted(vars(obj).items()):
            if not k.startswith("__"):
                yield from leaves(v, f"{path}.{k}", depth + 1)
    else:
        yield path, f"<{type(obj).__name__}>"


def tolerance(dtype: str, device: str) -> float:
    return 3e-2 if dtype == "bf16" else (1e-3 if device == "cpu" else 2e-3)


def compare(out, ref, tol: float):
    """(passes, max abs error over float tensors, None or why not): `out` against eager's
    `ref`, every leaf (see leaves)."""
    import torch

    got, want = list(leaves(out)), list(leaves(ref))
    if [p for p, _ in got] != [p for p, _ in want]:
        only_out = sorted({p for p, _ in got} - {p for p, _ in want})[:3]
        only_ref = sorted({p for p, _ in want} - {p for p, _ in got})[:3]
        return False, None, (f"output structure differs: {len(got)} leaves vs eager's "
                             f"{len(want)} (only compiled: {only_out}; only eager: {only_ref})")
    worst = 0.0
    for (path, a), (_, b) in zip(got, want):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return False, None, f"{path}: {type(a).__name__}, eager's is a tensor"
            if a.shape != b.shape or a.dtype != b.dtype:
                return False, None, (f"{path}: {a.dtype}{list(a.shape)}, eager's "
                                     f"{b.dtype}{list(b.shape)}")
            if b.is_floating_point() and b.numel():
                a32, b32 = a.detach().float(), b.detach().float()
                finite = torch.isfinite(b32)
                scale = b32[finite].abs().max().item() if finite.any() else 1.0
                diff = (a32 - b32).abs()
                err = diff[finite & torch.isfinite(a32)].max().item() if finite.any() else 0.0
                worst = max(worst, err)
                try:
                    torch.testing.assert_close(a32, b32, rtol=tol, atol=tol * max(1.0, scale),
                                               equal_nan=True)
                except AssertionError as e:
                    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
                    return False, worst, f"{path}: {'; '.join(lines[:3])}"
            else:
                try:
                    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
                except AssertionError as e:
                    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
                    return False, worst, f"{path}: {'; '.join(lines[:3])}"
        elif a != b and not (isinstance(a, float) and math.isnan(a) and math.isnan(b)):
            return False, worst, f"{path}: {a!r}, eager's {b!r}"
    return True, worst, None


def _error(e: BaseException) -> str:
    """An exception as one precise line: type, message, and the innermost frame it came from."""
    import traceback

    tb = traceback.extract_tb(e.__traceback__)
    where = f" [{os.path.basename(tb[-1].filename)}:{tb[-1].lineno} in {tb[-1].name}]" if tb else ""
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:600]}{where}"


class LogRecords(logging.Handler):
    """Keeps the records of one logger (and its children) from `level` up while installed (the
    logger's own level lowered to it meanwhile: its other handlers print what they printed)."""

    def __init__(self, name: str, level=logging.INFO):
        super().__init__(level)
        self.records = []
        self.logger = logging.getLogger(name)

    def emit(self, record):
        self.records.append(record)

    def __enter__(self):
        self.old_level = self.logger.level
        if not self.logger.isEnabledFor(self.level):
            self.logger.setLevel(self.level)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.old_level)


def kiln_log_events(records) -> dict:
    """kiln's log records sorted into frames run eagerly ({frame, kind, reason}; kind:
    unsupported, internal, backend) and cache_size_limit hits ({frame, reason}: the guard that
    failed last), and the other warnings. Read from each message's format and arguments
    (kiln/eval_frame.py), with a fallback on the text."""
    eager, limit, other = [], [], []
    for r in records:
        fmt, args, text = str(r.msg), r.args if isinstance(r.args, tuple) else (), r.getMessage()
        if "reached cache_size_limit" in fmt:
            limit.append({"frame": str(args[0]) if args else "?",
                          "reason": str(args[-1]) if args else text})
        elif fmt.startswith("kiln: running %s eagerly: %s") and len(args) == 2:
            eager.append({"frame": str(args[0]), "kind": "unsupported", "reason": str(args[1])})
        elif fmt.startswith("kiln: internal error while capturing") and len(args) == 3:
            eager.append({"frame": str(args[0]), "kind": "internal",
                          "reason": f"{args[1]}: {args[2]}"})
        elif fmt == "kiln: %s; running %s eagerly" and len(args) == 2:
            eager.append({"frame": str(args[1]), "kind": "backend", "reason": str(args[0])})
        elif "eagerly" in text and r.levelno >= logging.INFO:
            eager.append({"frame": "?", "kind": "other", "reason": text})
        elif r.levelno >= logging.WARNING:
            other.append(text)
    return {"eager_frames": eager, "cache_limit": limit, "warnings": other}


def _call(fn, args, kwargs):
    return lambda: fn(*args, **kwargs)


def _sync(device):
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def capture_row(name: str, compiler: str, device: str = "cpu", dtype: str = "fp32") -> dict:
    """The capture measurement of one model under `compiler` ("kiln" or "torch"), in this
    process, with the compiler's "eager" backend: graphs, breaks and why, frames run eagerly,
    cache_size_limit hits, and whether two compiled calls match eager."""
    import torch

    spec = model_configs.MODELS[name]
    rec = {"model": name, "suite": spec.suite, "family": spec.family, "compiler": compiler,
           "mode": "capture", "device": device, "dtype": dtype}
    try:
        model, args, kwargs = build(name, device, dtype)
        with torch.no_grad():
            ref = model(*args, **kwargs)
    except Exception as e:
        rec.update(passes=False, eager_failed=True, error=f"eager: {_error(e)}")
        return rec
    with torch.no_grad():
        (_capture_kiln if compiler == "kiln" else _capture_torch)(model, args, kwargs, ref, rec)
    return rec


def _check_calls(compiled, args, kwargs, ref, rec, device, dtype):
    """Two calls of the compiled model: the first's wall time (capture included) and both
    outputs against eager's."""
    t = time.perf_counter()
    try:
        out = compiled(*args, **kwargs)
        _sync(device)
        rec["capture_s"] = time.perf_counter() - t
        out2 = compiled(*args, **kwargs)
    except Exception as e:
        rec.update(passes=False, error=f"compiled call: {_error(e)}")
        return
    tol = tolerance(dtype, device)
    ok, err, why = compare(out, ref, tol)
    if ok:
        ok, _, why = compare(out2, ref, tol)
        why = why and f"second call: {why}"
    rec.update(passes=ok, max_abs_err=err)
    if why:
        rec["mismatch"] = why


def _capture_kiln(model, args, kwargs, ref, rec):
    import kiln
    from kiln.state import STATE

    try:
        ex = kiln.explain(model)(*args, **kwargs)
        rec["graphs"] = ex.graph_count
        rec["breaks"] = ex.graph_break_count
        rec["ops"] = ex.op_count
        rec["break_reasons"] = [{"reason": b.reason[:1500], "where": _last_line(b.where)}
                                for b in ex.break_reasons]
    except Exception as e:
        rec["explain_error"] = _error(e)
    kiln.reset()
    with LogRecords("kiln") as logs:
        compiled = kiln.compile(model, backend="eager")
        _check_calls(compiled, args, kwargs, ref, rec, rec["device"], rec["dtype"])
        entries = [e for c in list(STATE.compiled_codes) for e in kiln.debug.cache_entries(c)]
        rec["entries"] = len(entries)
        rec["entry_graphs"] = sum(e.info.graph_module is not None for e in entries)
    events = kiln_log_events(logs.records)
    rec["eager_frames"] = events["eager_frames"]
    rec["cache_limit"] = events["cache_limit"]
    if events["warnings"]:
        rec["warnings"] = events["warnings"][:20]
    kiln.reset()


def _capture_torch(model, args, kwargs, ref, rec):
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    try:
        ex = torch._dynamo.explain(model)(*args, **kwargs)
        rec["graphs"] = ex.graph_count
        rec["breaks"] = ex.graph_break_count
        rec["ops"] = ex.op_count
        rec["break_reasons"] = [{"reason": str(b.reason)[:1500],
                                 "where": str(b.user_stack[-1]) if b.user_stack else ""}
                                for b in ex.break_reasons]
    except Exception as e:
        rec["explain_error"] = _error(e)
    torch._dynamo.reset()
    counters.clear()
    with LogRecords("torch._dynamo", logging.WARNING) as logs:
        compiled = torch.compile(model, backend="eager")
        _check_calls(compiled, args, kwargs, ref, rec, rec["device"], rec["dtype"])
    frames = counters["frames"]
    rec["frames_total"], rec["frames_ok"] = frames["total"], frames["ok"]
    rec["eager_frames"] = [{"frame": "?", "kind": "failed", "reason": ""}] * max(
        0, frames["total"] - frames["ok"])
    rec["cache_limit"] = [{"frame": "?", "reason": r.getMessage().splitlines()[0]}
                          for r in logs.records if "recompile_limit" in r.getMessage()
                          or "cache_size_limit" in r.getMessage()]
    torch._dynamo.reset()


def _last_line(where: str) -> str:
    lines = [l.strip() for l in (where or "").splitlines() if l.strip()]
    return " | ".join(lines[-2:])


def speed_row(name: str, compiler: str, device: str = "cpu", dtype: str = "fp32",
              min_time: float = 2.0, torch_mode: str = "default") -> dict:
    """The speed measurement of one model under `compiler` in this process: the first call
    (from the compile call), the compiled output against eager's, and eager and compiled timed
    in alternating rounds. torch.compile runs in `torch_mode`."""
    import torch

    spec = model_configs.MODELS[name]
    rec = {"model": name, "suite": spec.suite, "family": spec.family, "compiler": compiler,
           "mode": "speed", "device": device, "dtype": dtype}
    try:
        model, args, kwargs = build(name, device, dtype)
    except Exception as e:
        rec.update(passes=False, eager_failed=True, error=f"build: {_error(e)}")
        return rec
    eager = _call(model, args, kwargs)
    with torch.no_grad(), LogRecords("kiln") as logs:
        try:
            t = time.perf_counter()
            ref = eager()
            _sync(device)
            if compiler == "eager":
                rec["first_call_s"] = time.perf_counter() - t
                rec["eager_ms"] = rec["ms"] = _paired_ms([eager], device, min_time)[0]
                rec["passes"] = True
                return rec
        except Exception as e:
            rec.update(passes=False, eager_failed=True, error=f"eager: {_error(e)}")
            return rec
        try:
            t = time.perf_counter()
            if compiler == "kiln":
                import kiln

                cm = kiln.compile(model, backend="kiln")
            else:
                rec["torch_mode"] = torch_mode
                cm = torch.compile(model, mode=None if torch_mode == "default" else torch_mode)
            out = cm(*args, **kwargs)
            _sync(device)
            rec["first_call_s"] = time.perf_counter() - t
        except Exception as e:
            rec.update(passes=False, error=f"compile or first call: {_error(e)}")
            return rec
        ok, err, why = compare(out, ref, tolerance(dtype, device))
        rec.update(passes=ok, max_abs_err=err)
        if why:
            rec["mismatch"] = why
        try:
            rec["eager_ms"], rec["ms"] = _paired_ms([eager, _call(cm, args, kwargs)], device,
                                                    min_time)
            rec["speedup"] = rec["eager_ms"] / rec["ms"]
        except Exception as e:
            rec["error"] = f"timed calls: {_error(e)}"
        if compiler == "kiln":
            import kiln

            arts = kiln.debug.artifacts()
            rec["artifacts"] = len(arts)
            rec["kernels"] = sum(a.plan.num_kernels for a in arts)
            rec["compile_s"] = sum(a.compile_seconds for a in arts)
    events = kiln_log_events(logs.records)
    rec.update(eager_frames=events["eager_frames"], cache_limit=events["cache_limit"])
    if events["warnings"]:
        rec["warnings"] = events["warnings"][:20]
    return rec


def _paired_ms(fns, device, min_time):
    if device == "cuda":
        from bench_gpu_models import _paired_ms as gpu_paired

        return gpu_paired(fns, ())
    from bench_cpu_models import _paired_ms as cpu_paired

    return cpu_paired(fns, (), min_time=min_time)


def child(name, compiler, mode, device, dtype, min_time):
    import torch

    if os.environ.get("KILN_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["KILN_BENCH_THREADS"]))
    if mode == "capture":
        rec = capture_row(name, compiler, device, dtype)
    else:
        rec = speed_row(name, compiler, device, dtype, min_time,
                        os.environ.get("KILN_BENCH_TORCH_MODE", "default"))
    rec["torch"] = torch.__version__
    rec["threads"] = torch.get_num_threads()
    print("RESULT " + json.dumps(rec, default=str), flush=True)


# ---- the suite: one process per (model, compiler, mode) --------------------------------------


def kiln_tree() -> str:
    """The kiln source a process ran: HEAD and a digest of the uncommitted change to client/ and
    compiler/ (a suite that runs for hours beside engineers' edits can say which records came
    from which tree)."""
    import hashlib

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short=10", "HEAD"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        diff = subprocess.run(["git", "-C", repo, "diff", "HEAD", "--", "client", "compiler"],
                              capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (f"+{hashlib.sha1(diff).hexdigest()[:8]}" if diff else "")


def run_child(name, compiler, mode, device, dtype, timeout_s, min_time, cache_root) -> dict:
    """One fresh process; a timeout or a crash is a record with `error`."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               KILN_CACHE_DIR=os.path.join(cache_root, "kiln"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_root, "inductor"),
               TRITON_CACHE_DIR=os.path.join(cache_root, "triton"))
    env.pop("XDG_RUNTIME_DIR", None)
    spec = model_configs.MODELS[name]
    base = {"model": name, "suite": spec.suite, "family": spec.family, "compiler": compiler,
            "mode": mode, "device": device, "dtype": dtype, "kiln_tree": kiln_tree()}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, compiler, mode,
           "--device", device, "--dtype", dtype, "--min-time", str(min_time)]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's session: it and what it started
        stdout, stderr = proc.communicate()
        return {**base, "passes": False, "timed_out": True, "wall_s": timeout_s,
                "error": f"timed out after {timeout_s:.0f} s", "stderr_tail": stderr[-1500:]}
    wall = time.perf_counter() - t
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[len("RESULT "):]), "kiln_tree": base["kiln_tree"],
                    "wall_s": wall}
    lines = [l for l in stderr.strip().splitlines() if l.strip()]
    why = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return {**base, "passes": False, "wall_s": wall, "stderr_tail": stderr[-1500:],
            "error": f"crashed ({why}): {lines[-1][:500] if lines else 'no output'}"}


def _key(r):
    return (r["model"], r["compiler"], r["mode"], r["device"], r["dtype"])


def records(jsonl):
    if not jsonl or not os.path.exists(jsonl):
        return []
    with open(jsonl) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_suite(specs, compilers, modes, device, dtype, timeout_s, min_time, jsonl, done=()):
    """Measures each (model, compiler, mode) not in `done`, appending each record to `jsonl`."""
    todo = [(s.name, c, m) for s in specs for m in modes for c in compilers
            if (m == "speed" or c != "eager")
            and (s.name, c, m, device, dtype) not in done]
    print(f"# {len(todo)} processes to run", flush=True)
    for i, (name, compiler, mode) in enumerate(todo, 1):
        cache_root = tempfile.mkdtemp(prefix="kiln-models-")
        try:
            rec = run_child(name, compiler, mode, device, dtype, timeout_s, min_time, cache_root)
        finally:
            stop_kilnd(os.path.join(cache_root, "kiln"))
            shutil.rmtree(cache_root, ignore_errors=True)
        if jsonl:
            with open(jsonl, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")
        print(f"[{i}/{len(todo)}] {name} {compiler} {mode}: " + _brief(rec), flush=True)


def _brief(r) -> str:
    parts = ["pass" if r.get("passes") else "FAIL"]
    for k in ("graphs", "breaks", "speedup", "first_call_s", "wall_s"):
        if r.get(k) is not None:
            parts.append(f"{k}={r[k]:.3g}" if isinstance(r[k], float) else f"{k}={r[k]}")
    if r.get("eager_frames"):
        parts.append(f"eager_frames={len(r['eager_frames'])}")
    why = r.get("error") or r.get("mismatch")
    return " ".join(parts) + (f"  [{why[:160]}]" if why else "")


# ---- the report ----------------------------------------------------------------------------


def rows_of(recs, device, dtype):
    """One row per model from the latest record of each (model, compiler, mode)."""
    latest = {}
    for r in recs:
        if r.get("device") == device and r.get("dtype") == dtype:
            latest[_key(r)] = r
    models = [m for m in model_configs.MODELS if any(k[0] == m for k in latest)]
    rows = []
    for m in models:
        spec = model_configs.MODELS[m]
        row = {"suite": spec.suite, "model": m}
        for c in ("kiln", "torch"):
            cap = latest.get((m, c, "capture", device, dtype))
            if cap:
                row[f"{c}_passes"] = bool(cap.get("passes"))
                row[f"{c}_graphs"] = cap.get("graphs")
                row[f"{c}_breaks"] = cap.get("breaks")
                row[f"{c}_eager_frames"] = len(cap.get("eager_frames") or [])
                row[f"{c}_cache_limit"] = len(cap.get("cache_limit") or [])
                row[f"{c}_capture_s"] = cap.get("capture_s")
                why = cap.get("error") or cap.get("mismatch") or cap.get("explain_error")
                if why:
                    row[f"{c}_error"] = why
        for c in COMPILERS:
            sp = latest.get((m, c, "speed", device, dtype))
            if not sp:
                continue
            row[f"{c}_ms"] = sp.get("ms")
            row[f"{c}_first_s"] = sp.get("first_call_s")
            if c != "eager":
                row[f"{c}_speedup"] = sp.get("speedup")
                row[f"{c}_accurate"] = bool(sp.get("passes"))
                why = sp.get("error") or sp.get("mismatch")
                if why:
                    row[f"{c}_speed_error"] = why
        rows.append(row)
    return rows


def captured(row) -> bool:
    """kiln captured the model whole as torch.compile did, or better: its output passes, no
    frame ran eagerly, and it made at least one graph (where torch.compile did) and no more than
    torch.compile's."""
    k, t = row.get("kiln_graphs"), row.get("torch_graphs")
    return (bool(row.get("kiln_passes")) and not row.get("kiln_eager_frames")
            and k is not None and t is not None and min(t, 1) <= k <= t)


def summary_of(rows) -> dict:
    kiln = [r for r in rows if "kiln_passes" in r]
    both = [r for r in kiln if r.get("kiln_graphs") is not None
            and r.get("torch_graphs") is not None]
    s = {"models": len(rows),
         "kiln_pass": sum(r["kiln_passes"] for r in kiln), "kiln_measured": len(kiln),
         "torch_pass": sum(bool(r.get("torch_passes")) for r in rows if "torch_passes" in r),
         "torch_measured": sum("torch_passes" in r for r in rows),
         "kiln_graphs_le_torch": sum(captured(r) for r in both),
         "compared_graphs": len(both),
         "kiln_one_graph": sum(r["kiln_passes"] and r.get("kiln_graphs") == 1
                               and r.get("kiln_breaks") == 0 and not r.get("kiln_eager_frames")
                               for r in kiln)}
    for c in ("kiln", "torch"):
        sp = [r[f"{c}_speedup"] for r in rows if r.get(f"{c}_speedup") and r.get(f"{c}_accurate")]
        s[f"{c}_geomean_speedup"] = (math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None)
    return s


def _v(v, width, prec=2):
    if v is None:
        return f"{'-':>{width}s}"
    if isinstance(v, bool):
        return f"{'ok' if v else 'FAIL':>{width}s}"
    if isinstance(v, float):
        return f"{v:{width}.{prec}f}"
    return f"{v!s:>{width}s}"


def print_table(rows, summary):
    short = {"torchvision": "tv", "timm": "timm", "transformers": "hf"}
    head = (f"{'suite':5s} {'model':40s} {'pass k/t':>9s} {'graphs k/t':>10s} {'breaks k/t':>10s}"
            f" {'eagerfr k/t':>11s} {'climit k/t':>10s} {'speedup k/t':>11s} {'first s k/t':>11s}")
    print(head)
    for r in rows:
        def pair(key, width, prec=2):
            return (f"{_v(r.get('kiln_' + key), width // 2, prec)}/"
                    f"{_v(r.get('torch_' + key), width - width // 2 - 1, prec)}")

        line = (f"{short.get(r['suite'], r['suite'])[:5]:5s} {r['model'][:40]:40s} {pair('passes', 9)}"
                f" {pair('graphs', 10)} {pair('breaks', 10)} {pair('eager_frames', 11)}"
                f" {pair('cache_limit', 10)} {pair('speedup', 11)} {pair('first_s', 11, 1)}")
        errs = [f"{c}: {r[k][:90]}" for c in ("kiln", "torch")
                for k in (f"{c}_error", f"{c}_speed_error") if r.get(k)]
        print(line + (f"  [{'; '.join(errs)}]" if errs else ""))
    s = summary
    print(f"kiln passes {s['kiln_pass']}/{s['kiln_measured']} models, torch.compile "
          f"{s['torch_pass']}/{s['torch_measured']}; kiln passes in 1..torch.compile's graphs on "
          f"{s['kiln_graphs_le_torch']}/{s['compared_graphs']} (none run eagerly); in one graph "
          f"on {s['kiln_one_graph']}/{s['kiln_measured']}; geomean speedup kiln "
          f"{_v(s['kiln_geomean_speedup'], 0, 3)}x, torch.compile "
          f"{_v(s['torch_geomean_speedup'], 0, 3)}x")


def reasons(recs, device, dtype, compiler="kiln") -> dict:
    """What went wrong for `compiler`, grouped by its exact reason, most common first: graph
    breaks (explain's reasons), frames run eagerly (kind: reason), cache_size_limit hits (the
    last failed guard), failures (error or mismatch). Each: reason -> [(model, where)]."""
    latest = {}
    for r in recs:
        if (r.get("device"), r.get("dtype"), r.get("compiler")) == (device, dtype, compiler):
            latest[_key(r)] = r
    out = {k: defaultdict(list) for k in ("breaks", "eager_frames", "cache_limit", "failures")}
    for r in latest.values():
        m = r["model"] if r["mode"] == "capture" else f"{r['model']} (speed)"
        if r["mode"] == "capture":
            for b in r.get("break_reasons") or []:
                out["breaks"][_normalize(b["reason"])].append((m, b.get("where", "")))
        for e in r.get("eager_frames") or []:
            if e.get("reason"):
                key = _normalize(f"{e['kind']}: {e['reason']}")
                out["eager_frames"][key].append((m, e["frame"]))
        for e in r.get("cache_limit") or []:
            out["cache_limit"][_normalize(e["reason"].splitlines()[0])].append((m, e["frame"]))
        why = r.get("error") or r.get("mismatch") or r.get("explain_error")
        if why:
            out["failures"][_normalize(why)].append((m, why))
    return {k: sorted(v.items(), key=lambda kv: (-len(kv[1]), kv[0])) for k, v in out.items()}


def _normalize(why: str) -> str:
    """A reason without what varies between models and runs: object addresses, and the numbers
    of a mismatch."""
    why = re.sub(r"0x[0-9a-f]+", "0x…", why)
    why = re.sub(r"^out[^:]*: ", "<output>: ", why)
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", why) if "Mismatched elements" in why else why


def print_reasons(groups, compiler="kiln", limit=None):
    titles = {"breaks": "graph breaks", "eager_frames": "frames run eagerly",
              "cache_limit": "cache_size_limit hits", "failures": "failures"}
    for kind, items in groups.items():
        total = sum(len(v) for _, v in items)
        print(f"\n## {compiler} {titles[kind]}: {total} in {len(items)} reasons")
        for reason, where in items[:limit]:
            models = sorted({m for m, _ in where})
            print(f"{len(where):4d}  {reason.splitlines()[0][:300]}")
            print(f"      models ({len(models)}): {', '.join(models[:12])}"
                  + (" ..." if len(models) > 12 else ""))
            if where[0][1] and where[0][1] != reason:
                print(f"      e.g. {where[0][1][:200]}")


def chart(rows, path):
    """Speedup over eager per model (kiln beside torch.compile), and graphs per model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no chart")
        return
    panels = [("speedup", "speedup over eager")] if any(
        r.get("kiln_speedup") or r.get("torch_speedup") for r in rows) else []
    panels.append(("graphs", "graphs (eager backend)"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(12, 0.16 * len(rows)), 4 * len(panels)),
                             squeeze=False)
    x = range(len(rows))
    for ax, (key, label) in zip(axes[:, 0], panels):
        for i, (c, name) in enumerate((("kiln", "kiln"), ("torch", "torch.compile"))):
            ax.bar([j + (i - 0.5) * 0.4 for j in x], [r.get(f"{c}_{key}") or 0 for r in rows],
                   0.4, label=name)
        if key == "speedup":
            ax.axhline(1.0, color="gray", lw=0.8)
        else:
            ax.set_yscale("symlog")
        ax.set_xticks(list(x))
        ax.set_xticklabels([r["model"] for r in rows], rotation=90, fontsize=6)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=None, help="names or name prefixes")
    p.add_argument("--suite", choices=list(model_configs.SUITES) + ["all"], default="all")
    p.add_argument("--compilers", nargs="+", choices=COMPILERS, default=COMPILERS)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="default: fp32 on the CPU, bf16 on a GPU")
    p.add_argument("--capture-only", action="store_true",
                   help="graphs, breaks and correctness only (eager backends): no timing")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per process")
    p.add_argument("--threads", type=int, default=None, help="torch threads in each process")
    p.add_argument("--min-time", type=float, default=2.0,
                   help="seconds of timed calls per compiler and model (CPU)")
    p.add_argument("--torch-mode", default=None,
                   choices=["default", "reduce-overhead", "max-autotune",
                            "max-autotune-no-cudagraphs"],
                   help="torch.compile's mode in the speed rows; default: reduce-overhead on a "
                        "GPU (its CUDA graphs, as kiln's plans use them), default on the CPU")
    p.add_argument("--jsonl", default=os.path.join(OUT_DIR, "models.jsonl"))
    p.add_argument("--resume", action="store_true", help="skip what --jsonl already holds")
    p.add_argument("--csv", default=os.path.join(OUT_DIR, "models.csv"))
    p.add_argument("--png", default=os.path.join(OUT_DIR, "models.png"), help='"": no chart')
    p.add_argument("--report-only", action="store_true", help="tabulate --jsonl, run nothing")
    p.add_argument("--reasons", type=int, default=None, metavar="N",
                   help="print only the N most common reasons of each kind")
    p.add_argument("--out", default=None, help="append the summary line here")
    p.add_argument("--list", action="store_true", help="list the selected models and exit")
    p.add_argument("--child", nargs=3, metavar=("MODEL", "COMPILER", "MODE"))
    a = p.parse_args()
    a.dtype = a.dtype or ("bf16" if a.device == "cuda" else "fp32")
    if a.threads:
        os.environ["KILN_BENCH_THREADS"] = str(a.threads)
    if not a.child:  # the children (speed_row) read it
        os.environ["KILN_BENCH_TORCH_MODE"] = a.torch_mode or (
            "reduce-overhead" if a.device == "cuda" else "default")
    if a.child:
        child(*a.child, a.device, a.dtype, a.min_time)
        return
    specs = model_configs.select(a.models, a.suite)
    if a.list:
        for s in specs:
            print(f"{s.suite:12s} {s.family:16s} {s.name}")
        return
    modes = ["capture"] if a.capture_only else ["capture", "speed"]
    if not a.report_only:
        if a.jsonl:
            os.makedirs(os.path.dirname(a.jsonl) or ".", exist_ok=True)
        done = {_key(r) for r in records(a.jsonl)} if a.resume else set()
        run_suite(specs, a.compilers, modes, a.device, a.dtype, a.timeout, a.min_time, a.jsonl,
                  done)
    recs = records(a.jsonl)
    chosen = {s.name for s in specs}
    rows = [r for r in rows_of(recs, a.device, a.dtype) if r["model"] in chosen]
    summary = summary_of(rows)
    print_table(rows, summary)
    wanted = {r["model"] for r in rows}
    print_reasons(reasons([r for r in recs if r["model"] in wanted], a.device, a.dtype),
                  limit=a.reasons)
    if a.csv:
        write_csv(rows, a.csv)
    if a.png:
        chart(rows, a.png)
    print(f"# jsonl {a.jsonl}, csv {a.csv or 'none'}, chart {a.png or 'none'}")
    emit({"bench": "models", "command": command_line(), "device": a.device, "dtype": a.dtype,
          **summary}, a.out)


if __name__ == "__main__":
    main()
