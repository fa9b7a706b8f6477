"""Where a model's time goes, eager vs the "kiln" backend: torch.profiler's table of ATen ops,
oneDNN calls and kiln's kernels (`kiln_kernel_<n>`), by self CPU time, in one process.

    python bench/profile_model.py MODEL [--threads N] [--rows N] [--calls N]

MODEL is one of bench/common.py's (resnet50, vit_b_16, bert, gpt2, ...). The times printed first
are medians of 10 calls each, eager and kiln alternating twice: a profile explains a ratio that
bench_cpu_models.py measured, it does not replace it.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, default=18)
    p.add_argument("--calls", type=int, default=5, help="profiled calls per compiler")
    a = p.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    import kiln
    from common import build_model, command_line

    torch.set_num_threads(a.threads)
    m, inputs = build_model(a.model)

    def median_ms(f, n=10):
        for _ in range(3):
            f(*inputs)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            f(*inputs)
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    with torch.no_grad():
        cm = kiln.compile(m, backend="kiln")
        cm(*inputs)
        rounds = [(median_ms(m), median_ms(cm)) for _ in range(2)]
        print(f"command: {command_line()}")
        print(f"{a.model}, {a.threads} threads: " + ", ".join(
            f"eager {e:.2f} ms kiln {k:.2f} ms ({e / k:.2f}x)" for e, k in rounds))
        for name, f in (("eager", m), ("kiln", cm)):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(a.calls):
                    f(*inputs)
            print(f"-- {name}, {a.calls} calls")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows,
                                            max_name_column_width=60))
    arts = kiln.debug.artifacts()
    print(f"kiln: {len(arts)} graphs, {sum(x.plan.num_kernels for x in arts)} kernels, "
          f"{sum(x.plan.num_library_calls for x in arts)} library calls")


if __name__ == "__main__":
    main()
