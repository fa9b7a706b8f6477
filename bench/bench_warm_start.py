"""Warm start: the first call of a second, fresh process on a warm cache, kiln vs torch.compile.

    python bench/bench_warm_start.py [--model resnet50] [--batch N] [--warm-runs N]
                                     [--steady N] [--threads N] [--device cpu|cuda] [--out F]

For each compiler, in a new cache directory: process 1 compiles the model (cold), then
--warm-runs fresh interpreters, same cache, each time their first call (warm; every number
reported for "warm" is the median over these processes). kiln's warm processes install the
stored capture (no tracing, no torch._dynamo import), whose plan kiln.compile() has loaded and
run once (StoredCaptures.prepare); "kiln not prepared" are the same with KILN_PREPARE_STORED=0,
which leaves all of it to the first call; "kiln traced" are the same processes with
KILN_STORED_CAPTURES=0, which capture again and fetch the artifacts from kilnd; "kiln background"
are warm processes under kiln.set_stance("compile_in_background"): their first call installs the
stored capture at once, as in the default stance (a miss with no stored capture would run
eagerly while a worker thread captures it), and the next call is timed too. For kiln, one more process does the
same after kilnd was stopped and restarted (the RocksDB store survives restarts). torch.compile runs
with its default (inductor) backend and its on-disk caches in TORCHINDUCTOR_CACHE_DIR. Target:
kiln's warm first call at most 10% of torch.compile's. --batch changes the inputs' batch size
(resnet50's default is 8; 1 is a serving fleet's latency case): the run of the model, which
both compilers pay in full, is the part of the first call that grows with it.

What each process measures, the same way for both compilers, with the model built and run
once eagerly beforehand (torch, torchvision and the weights are loaded before any clock):
  first call   the call of the compiled model: capture (or a stored capture's installation),
               cache lookup or compile, loading, and one run of the model.
  beyond eager first call - the median of 3 eager calls made just before it: what a serving
               process's first request costs beyond eager's (target: 30 ms with stored
               captures). `import kiln` and kiln.compile() (or torch.compile()) are
               outside it: a server calls compile() at startup, before its first request;
               "compile() call" is kiln.compile()'s own time (the stored capture's
               preparation) and "import + compile() + first call" counts them all.
  steady call  the median of --steady later calls of the same process.
  overhead     first call - steady call: what the first call costs beyond running the model.
The clocks start after gc.collect(): a garbage collection owed by building the model would
otherwise land in whichever call allocates next. Collections inside the first call are the
compiler's own and are counted (and shown as "gc inside the first call").
With --device cuda the model and inputs are on the first GPU and every timed call ends with
torch.cuda.synchronize(), so a call's time includes its GPU work.
"""
import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import command_line, emit, stop_kilnd  # noqa: E402


def child(model: str, compiler: str, steady_calls: int, batch):
    t0 = time.perf_counter()
    import torch

    from common import build_model, environment, first_tensor

    torch.set_num_threads(int(os.environ.get("KILN_BENCH_THREADS", "2")))
    device = os.environ.get("KILN_BENCH_DEVICE", "cpu")
    m, inputs = build_model(model, device=device, batch=batch)
    gc_spans = []

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    # The compiled model against eager: on a GPU, cuDNN's TF32 convolutions pick other
    # algorithms for the compiled (channels-last) layout.
    tol = dict(rtol=5e-2, atol=5e-2) if device == "cuda" else dict(rtol=2e-3, atol=2e-3)

    def gc_clock(phase, info):
        gc_spans.append(time.perf_counter() if phase == "start" else -time.perf_counter())

    with torch.no_grad():
        ref = first_tensor(m(*inputs))
        eager = []
        for _ in range(3):
            sync()
            t = time.perf_counter()
            m(*inputs)
            sync()
            eager.append(time.perf_counter() - t)
        gc.collect()
        t_import = time.perf_counter()
        if compiler in ("kiln", "kiln-background"):
            import kiln

            if compiler == "kiln-background":
                kiln.set_stance("compile_in_background")
            t_compile = time.perf_counter()
            cm = kiln.compile(m, backend="kiln")
        else:
            t_compile = time.perf_counter()
            cm = torch.compile(m)
        compile_s = time.perf_counter() - t_compile
        gc.callbacks.append(gc_clock)
        dynamo_before = "torch._dynamo" in sys.modules  # torchvision's ops import it
        sync()
        t = time.perf_counter()
        out = first_tensor(cm(*inputs))
        sync()
        done = time.perf_counter()
        gc.callbacks.remove(gc_clock)
        first = done - t
        torch.testing.assert_close(out, ref, **tol)
        if compiler == "kiln-background":
            # Any work left to the worker (none where the stored capture installed), then the
            # next call.
            kiln.wait_for_compiles(600)
            ready_s = time.perf_counter() - t
            t = time.perf_counter()
            out = first_tensor(cm(*inputs))
            sync()
            switch_s = time.perf_counter() - t
            torch.testing.assert_close(out, ref, **tol)
        steady = []
        for _ in range(steady_calls):
            t = time.perf_counter()
            cm(*inputs)
            sync()
            steady.append(time.perf_counter() - t)
    second = statistics.median(steady)
    gc_s = sum(-end - begin for begin, end in zip(gc_spans[::2], gc_spans[1::2]))
    # What the first call costs beyond running the model once.
    eager_s = statistics.median(eager)
    record = {"first_call_s": first, "overhead_s": first - second, "steady_call_s": second,
              "eager_call_s": eager_s, "beyond_eager_s": first - eager_s,
              "import_compile_first_call_s": done - t_import, "gc_in_first_call_s": gc_s,
              "compile_call_s": compile_s,
              "process_s": time.perf_counter() - t0, **environment()}
    if compiler == "kiln-background":
        record.update(ready_s=ready_s, switch_call_s=switch_s)
    if compiler != "torch.compile":
        import kiln

        arts = kiln.debug.artifacts()
        from kiln.state import STATE

        # Every frame kiln compiled (a decorated forward's frame is the decorator's wrapper).
        entries = [e for code in list(STATE.compiled_codes)
                   for e in kiln.debug.cache_entries(code)]
        record.update(stored_captures=sum(1 for e in entries
                                          if e.info.extra.get("stored_capture")),
                      prepared_plans=sum(1 for e in entries
                                         if e.info.extra.get("prepared_plan")),
                      install_s=sum(e.info.backend_seconds for e in entries
                                    if e.info.extra.get("stored_capture")),
                      dynamo_imported_by_call=not dynamo_before and "torch._dynamo" in sys.modules,
                      artifacts=len(arts), compiled=sum(1 for a in arts if not a.cache_hit),
                      index_hits=sum(1 for a in arts if a.index_hit),
                      client_s=sum(a.client_seconds for a in arts))
    else:
        # Whether torch.compile's warm start was served by its caches (FX graph cache; AOT
        # autograd cache where this torch has one) or compiled again.
        from torch._dynamo.utils import counters

        inductor = counters["inductor"]
        record.update({k: inductor.get(k, 0) for k in (
            "fxgraph_cache_hit", "fxgraph_cache_miss", "aot_autograd_cache_hit",
            "aot_autograd_cache_miss")})
    print("RESULT " + json.dumps(record), flush=True)


def run(model, compiler, env, steady_calls, batch):
    args = [sys.executable, __file__, "--child", model, compiler, "--steady", str(steady_calls)]
    if batch is not None:
        args += ["--batch", str(batch)]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"{compiler} child failed:\n{done.stderr[-3000:]}")


def median_record(records):
    """Per numeric field, the median over the processes (other fields from the first)."""
    out = dict(records[0])
    for k, v in out.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = statistics.median(r[k] for r in records)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=None,
                   help="batch size of the inputs (default: the model's, 8 for resnet50)")
    p.add_argument("--warm-runs", type=int, default=3, help="fresh warm processes per compiler")
    p.add_argument("--steady", type=int, default=3, help="later calls timed per process")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads in every process (default: $KILN_BENCH_THREADS or 2)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=None)
    p.add_argument("--child", nargs=2)
    a = p.parse_args()
    if a.child:
        child(*a.child, a.steady, a.batch)
        return
    root = tempfile.mkdtemp(prefix="kiln-warm-")
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(root, "kiln"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"))
    env.pop("XDG_RUNTIME_DIR", None)
    if a.threads:
        env["KILN_BENCH_THREADS"] = str(a.threads)
    env["KILN_BENCH_DEVICE"] = a.device
    try:
        kiln_cold = run(a.model, "kiln", env, a.steady, a.batch)
        kiln_warm = median_record([run(a.model, "kiln", env, a.steady, a.batch)
                                   for _ in range(a.warm_runs)])
        kiln_traced = median_record([run(a.model, "kiln", dict(env, KILN_STORED_CAPTURES="0"),
                                         a.steady, a.batch) for _ in range(a.warm_runs)])
        kiln_unprepared = median_record([run(a.model, "kiln", dict(env, KILN_PREPARE_STORED="0"),
                                             a.steady, a.batch) for _ in range(a.warm_runs)])
        kiln_bg = median_record([run(a.model, "kiln-background", env, a.steady, a.batch)
                                 for _ in range(a.warm_runs)])
        stop_kilnd(env["KILN_CACHE_DIR"])
        # The client starts a new kilnd.
        kiln_restart = run(a.model, "kiln", env, a.steady, a.batch)
        tc_cold = run(a.model, "torch.compile", env, a.steady, a.batch)
        tc_warm = median_record([run(a.model, "torch.compile", env, a.steady, a.batch)
                                 for _ in range(a.warm_runs)])
    finally:
        stop_kilnd(env["KILN_CACHE_DIR"])
        shutil.rmtree(root, ignore_errors=True)
    ratio = kiln_warm["first_call_s"] / tc_warm["first_call_s"]
    command = command_line()
    print(f"command: {command}")
    batch = f", batch {a.batch}" if a.batch is not None else ""
    print(f"{a.model}{batch} on {a.device}: first call of a fresh process (warm: median of "
          f"{a.warm_runs})")
    print(f"  kiln           cold {kiln_cold['first_call_s']:8.3f} s   warm "
          f"{kiln_warm['first_call_s']:8.3f} s (compiled {kiln_warm['compiled']} of "
          f"{kiln_warm['artifacts']})   after kilnd restart {kiln_restart['first_call_s']:.3f} s")
    print(f"  kiln traced    (KILN_STORED_CAPTURES=0)   warm {kiln_traced['first_call_s']:8.3f} s")
    print(f"  torch.compile  cold {tc_cold['first_call_s']:8.3f} s   warm "
          f"{tc_warm['first_call_s']:8.3f} s (FX graph cache: {tc_warm['fxgraph_cache_hit']} "
          f"hits, {tc_warm['fxgraph_cache_miss']} misses; AOT autograd cache: "
          f"{tc_warm['aot_autograd_cache_hit']} hits, {tc_warm['aot_autograd_cache_miss']} "
          f"misses)")
    over = kiln_warm["overhead_s"] / tc_warm["overhead_s"]
    print(f"  kiln warm / torch.compile warm = {ratio:.3f} (target <= 0.10); beyond one run of "
          f"the model: {kiln_warm['overhead_s']:.3f} s vs {tc_warm['overhead_s']:.3f} s = "
          f"{over:.3f}")
    print(f"  kiln warm: stored captures installed in {kiln_warm['install_s'] * 1e3:.1f} ms "
          "(guards, artifact lookup, verification, plan loading)")
    print(f"  kiln warm beyond one eager call: {kiln_warm['beyond_eager_s'] * 1e3:.1f} ms "
          f"(target <= 30 ms; stored captures installed: {kiln_warm['stored_captures']}, "
          f"their plans prepared by kiln.compile(): {kiln_warm['prepared_plans']}, which took "
          f"{kiln_warm['compile_call_s'] * 1e3:.1f} ms; torch._dynamo imported by it: "
          f"{kiln_warm['dynamo_imported_by_call']}); not prepared (KILN_PREPARE_STORED=0): "
          f"{kiln_unprepared['beyond_eager_s'] * 1e3:.1f} ms; traced: "
          f"{kiln_traced['beyond_eager_s'] * 1e3:.1f} ms; torch.compile: "
          f"{tc_warm['beyond_eager_s'] * 1e3:.1f} ms")
    print(f"  kiln warm, compile_in_background stance: first call "
          f"{kiln_bg['first_call_s']:.3f} s, beyond one eager call "
          f"{kiln_bg['beyond_eager_s'] * 1e3:.1f} ms (installs the stored capture at once; "
          f"stored captures: "
          f"{kiln_bg['stored_captures']}); entry ready {kiln_bg['ready_s']:.3f} s after the "
          f"first call began; the call that switched {kiln_bg['switch_call_s'] * 1e3:.1f} ms, "
          f"steady {kiln_bg['steady_call_s'] * 1e3:.1f} ms, eager "
          f"{kiln_bg['eager_call_s'] * 1e3:.1f} ms")
    rows = [("first call", "first_call_s"),
            ("beyond one eager call", "beyond_eager_s"),
            ("overhead: first call - steady call", "overhead_s"),
            ("compile() call", "compile_call_s"),
            ("import + compile() + first call", "import_compile_first_call_s"),
            (f"steady call (median of {a.steady})", "steady_call_s"),
            ("gc inside the first call", "gc_in_first_call_s")]
    print(f"{a.model}, warm fresh process, seconds, median of {a.warm_runs} processes (the "
          f"docstring says what each includes):")
    print(f"  {'':38}{'kiln':>9}{'torch.compile':>15}{'kiln / tc':>11}")
    for label, k in rows:
        print(f"  {label:38}{kiln_warm[k]:9.3f}{tc_warm[k]:15.3f}"
              f"{kiln_warm[k] / tc_warm[k] if tc_warm[k] > 0 else float('nan'):11.3f}")
    print(f"  (kiln's backend on the warm hit: {kiln_warm['client_s']:.3f} s of lookup, "
          f"verification and loading; {kiln_warm['index_hits']} of {kiln_warm['artifacts']} "
          f"graphs found by the client's index, not lowered)")
    emit({"bench": "warm_start", "model": a.model, "batch": a.batch, "device": a.device,
          "command": command,
          "torch_compile_warm_fxgraph_cache_hit": tc_warm["fxgraph_cache_hit"],
          "torch_compile_warm_fxgraph_cache_miss": tc_warm["fxgraph_cache_miss"],
          "kiln_cold_s": kiln_cold["first_call_s"], "kiln_warm_s": kiln_warm["first_call_s"],
          "kiln_warm_compiled": kiln_warm["compiled"],
          "kiln_after_restart_s": kiln_restart["first_call_s"],
          "torch_compile_cold_s": tc_cold["first_call_s"],
          "torch_compile_warm_s": tc_warm["first_call_s"], "warm_ratio": ratio,
          "kiln_warm_overhead_s": kiln_warm["overhead_s"],
          "kiln_warm_beyond_eager_s": kiln_warm["beyond_eager_s"],
          "kiln_traced_warm_s": kiln_traced["first_call_s"],
          "kiln_traced_beyond_eager_s": kiln_traced["beyond_eager_s"],
          "kiln_unprepared_beyond_eager_s": kiln_unprepared["beyond_eager_s"],
          "kiln_warm_prepared_plans": kiln_warm["prepared_plans"],
          "kiln_warm_compile_call_s": kiln_warm["compile_call_s"],
          "torch_compile_warm_compile_call_s": tc_warm["compile_call_s"],
          "torch_compile_warm_beyond_eager_s": tc_warm["beyond_eager_s"],
          "kiln_warm_stored_captures": kiln_warm["stored_captures"],
          "kiln_warm_dynamo_imported_by_call": kiln_warm["dynamo_imported_by_call"],
          "torch_compile_warm_overhead_s": tc_warm["overhead_s"], "warm_overhead_ratio": over,
          "kiln_warm_steady_s": kiln_warm["steady_call_s"],
          "torch_compile_warm_steady_s": tc_warm["steady_call_s"],
          "kiln_warm_import_compile_first_call_s": kiln_warm["import_compile_first_call_s"],
          "torch_compile_warm_import_compile_first_call_s":
              tc_warm["import_compile_first_call_s"],
          "kiln_warm_gc_s": kiln_warm["gc_in_first_call_s"],
          "torch_compile_warm_gc_s": tc_warm["gc_in_first_call_s"],
          "kiln_warm_client_s": kiln_warm["client_s"],
          "kiln_warm_install_s": kiln_warm["install_s"], "warm_runs": a.warm_runs,
          "kiln_background_first_call_s": kiln_bg["first_call_s"],
          "kiln_background_beyond_eager_s": kiln_bg["beyond_eager_s"],
          "kiln_background_ready_s": kiln_bg["ready_s"],
          "kiln_background_switch_call_s": kiln_bg["switch_call_s"],
          "kiln_background_steady_s": kiln_bg["steady_call_s"],
          **{k: v for k, v in kiln_warm.items() if k in ("python", "torch", "threads", "cpu")}},
         a.out)


if __name__ == "__main__":
    main()
