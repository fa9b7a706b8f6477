"""First-call capture time with backend="eager": kiln vs torch.compile, each in a fresh process
(nothing cached in memory), for resnet18 and resnet50 forward.

    python bench/bench_capture.py [--models resnet18 resnet50] [--device cpu|cuda] [--out F]

The parent starts one child per (model, compiler) and reports their ratio: kiln's capture as it
times it (its entries' capture_seconds), torch.compile's as its first call's extra time over the
second. kiln's target: at least 10x faster than torch.compile(backend="eager").
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import command_line, emit  # noqa: E402


def child(model: str, compiler: str, device: str):
    import torch

    from common import build_model, environment

    torch.set_num_threads(int(os.environ.get("KILN_BENCH_THREADS", "2")))
    m, inputs = build_model(model, device)
    with torch.no_grad():
        ref = m(*inputs)
        if compiler == "kiln":
            import kiln

            cm = kiln.compile(m, backend="eager")
        else:
            cm = torch.compile(m, backend="eager")
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = cm(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        first = time.perf_counter() - t
        torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)
        t = time.perf_counter()
        cm(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        second = time.perf_counter() - t
    graphs = None
    capture = first - second  # torch.compile: the first call's extra time
    if compiler == "kiln":
        import kiln

        entries = kiln.debug.cache_entries(m)
        graphs = len(entries)
        # kiln times its capture itself (the backend, "eager" here, apart): the difference of
        # two calls goes negative on a loaded machine.
        capture = sum(e.info.capture_seconds for e in entries)
    print(json.dumps({"model": model, "compiler": compiler, "first_call_s": first,
                      "second_call_s": second, "capture_s": capture, "graphs": graphs,
                      **environment()}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None)
    p.add_argument("--child", nargs=3, metavar=("MODEL", "COMPILER", "DEVICE"))
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    for model in args.models:
        results = {}
        for compiler in ("kiln", "torch.compile"):
            proc = subprocess.run([sys.executable, __file__, "--child", model, compiler,
                                   args.device], capture_output=True, text=True, check=False)
            lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(proc.stdout, proc.stderr, file=sys.stderr)
                raise SystemExit(f"{compiler} on {model} failed")
            results[compiler] = json.loads(lines[-1])
        k, t = results["kiln"], results["torch.compile"]
        record = {"bench": "capture", "command": command_line(), "model": model,
                  "device": args.device, "kiln_first_call_s": round(k["first_call_s"], 4),
                  "torch_compile_first_call_s": round(t["first_call_s"], 4),
                  "kiln_capture_s": round(k["capture_s"], 4),
                  "torch_compile_capture_s": round(t["capture_s"], 4),
                  "capture_speedup": round(t["capture_s"] / max(k["capture_s"], 1e-9), 2),
                  "first_call_speedup": round(t["first_call_s"] / k["first_call_s"], 2),
                  "kiln_graphs": k["graphs"], "threads": k["threads"], "torch": k["torch"],
                  "python": k["python"], "cuda": k["cuda"]}
        emit(record, args.out)
        print(f"# {model}: first call kiln {k['first_call_s'] * 1e3:.0f} ms vs torch.compile "
              f"{t['first_call_s'] * 1e3:.0f} ms -> {record['first_call_speedup']}x; capture "
              f"alone {record['capture_speedup']}x")


if __name__ == "__main__":
    main()
