"""Per-call cost after warm-up on a tiny function: eager vs kiln vs torch.compile, all with the
eager backend, side by side in one process.

    python bench/bench_overhead.py [--out bench/out/overhead.jsonl]

Reports microseconds per call and what each adds over eager. kiln's target: at most 2 us over
eager (torch.compile adds about 19 us on the GPU machine's host, see shared/anchors).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import command_line, emit, environment, per_call_us  # noqa: E402

import kiln  # noqa: E402


def foo(a, b):
    return torch.add(a, b)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args()
    torch.set_num_threads(1)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    kfoo = kiln.compile(foo, backend="eager")
    tfoo = torch.compile(foo, backend="eager")
    torch.testing.assert_close(kfoo(a, b), foo(a, b))
    torch.testing.assert_close(tfoo(a, b), foo(a, b))
    eager = per_call_us(foo, (a, b), n=args.calls)
    kiln_us = per_call_us(kfoo, (a, b), n=args.calls)
    tc_us = per_call_us(tfoo, (a, b), n=args.calls)
    record = {"bench": "overhead", "command": command_line(), **environment(),
              "eager_us": round(eager, 3), "kiln_us": round(kiln_us, 3),
              "torch_compile_us": round(tc_us, 3),
              "kiln_added_us": round(kiln_us - eager, 3),
              "torch_compile_added_us": round(tc_us - eager, 3),
              "kiln_over_eager": round(kiln_us / eager, 3),
              "torch_compile_over_kiln": round(tc_us / kiln_us, 3)}
    emit(record, args.out)
    print(f"# per call: eager {eager:.2f} us, kiln {kiln_us:.2f} us (+{kiln_us - eager:.2f}), "
          f"torch.compile {tc_us:.2f} us (+{tc_us - eager:.2f}); "
          f"torch.compile/kiln = {tc_us / kiln_us:.1f}x")


if __name__ == "__main__":
    main()
