"""Warm start: the first call of a second, fresh process on a warm cache, kiln vs torch.compile.

    python bench/bench_warm_start.py [--model resnet50] [--out F]

For each compiler, in a new cache directory: process 1 compiles the model (cold), process 2 —
a fresh interpreter, same cache — times its first call (warm). For kiln, process 3 does the same
after kilnd was stopped and restarted (the RocksDB store survives restarts). torch.compile runs
with its default (inductor) backend and its on-disk caches in TORCHINDUCTOR_CACHE_DIR. Target:
kiln's warm first call at most 10% of torch.compile's.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import command_line, emit, stop_kilnd  # noqa: E402


def child(model: str, compiler: str):
    t0 = time.perf_counter()
    import torch

    from common import build_model, environment, first_tensor

    torch.set_num_threads(int(os.environ.get("KILN_BENCH_THREADS", "2")))
    m, inputs = build_model(model)
    with torch.no_grad():
        ref = first_tensor(m(*inputs))
        if compiler == "kiln":
            import kiln

            cm = kiln.compile(m, backend="kiln")
        else:
            cm = torch.compile(m)
        t = time.perf_counter()
        out = first_tensor(cm(*inputs))
        first = time.perf_counter() - t
        torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
        t = time.perf_counter()
        cm(*inputs)
        second = time.perf_counter() - t
    # What the first call costs beyond running the model once.
    record = {"first_call_s": first, "overhead_s": first - second,
              "process_s": time.perf_counter() - t0, **environment()}
    if compiler == "kiln":
        import kiln

        arts = kiln.debug.artifacts()
        record.update(artifacts=len(arts), compiled=sum(1 for a in arts if not a.cache_hit),
                      index_hits=sum(1 for a in arts if a.index_hit))
    print("RESULT " + json.dumps(record), flush=True)


def run(model, compiler, env):
    done = subprocess.run([sys.executable, __file__, "--child", model, compiler], env=env,
                          capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"{compiler} child failed:\n{done.stderr[-3000:]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--out", default=None)
    p.add_argument("--child", nargs=2)
    a = p.parse_args()
    if a.child:
        child(*a.child)
        return
    root = tempfile.mkdtemp(prefix="kiln-warm-")
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(root, "kiln"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"))
    env.pop("XDG_RUNTIME_DIR", None)
    try:
        kiln_cold = run(a.model, "kiln", env)
        kiln_warm = run(a.model, "kiln", env)
        stop_kilnd(env["KILN_CACHE_DIR"])
        kiln_restart = run(a.model, "kiln", env)  # the client starts a new kilnd
        tc_cold = run(a.model, "torch.compile", env)
        tc_warm = run(a.model, "torch.compile", env)
    finally:
        stop_kilnd(env["KILN_CACHE_DIR"])
        shutil.rmtree(root, ignore_errors=True)
    ratio = kiln_warm["first_call_s"] / tc_warm["first_call_s"]
    print(f"{a.model}: first call of a fresh process")
    print(f"  kiln           cold {kiln_cold['first_call_s']:8.3f} s   warm "
          f"{kiln_warm['first_call_s']:8.3f} s (compiled {kiln_warm['compiled']} of "
          f"{kiln_warm['artifacts']})   after kilnd restart {kiln_restart['first_call_s']:.3f} s")
    print(f"  torch.compile  cold {tc_cold['first_call_s']:8.3f} s   warm "
          f"{tc_warm['first_call_s']:8.3f} s")
    over = kiln_warm["overhead_s"] / tc_warm["overhead_s"]
    print(f"  kiln warm / torch.compile warm = {ratio:.3f} (target <= 0.10); beyond one run of "
          f"the model: {kiln_warm['overhead_s']:.3f} s vs {tc_warm['overhead_s']:.3f} s = "
          f"{over:.3f}")
    emit({"bench": "warm_start", "model": a.model, "command": command_line(),
          "kiln_cold_s": kiln_cold["first_call_s"], "kiln_warm_s": kiln_warm["first_call_s"],
          "kiln_warm_compiled": kiln_warm["compiled"],
          "kiln_after_restart_s": kiln_restart["first_call_s"],
          "torch_compile_cold_s": tc_cold["first_call_s"],
          "torch_compile_warm_s": tc_warm["first_call_s"], "warm_ratio": ratio,
          "kiln_warm_overhead_s": kiln_warm["overhead_s"],
          "torch_compile_warm_overhead_s": tc_warm["overhead_s"], "warm_overhead_ratio": over,
          **{k: v for k, v in kiln_warm.items() if k in ("python", "torch", "threads", "cpu")}},
         a.out)


if __name__ == "__main__":
    main()
