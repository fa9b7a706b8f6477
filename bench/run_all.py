"""Runs every benchmark of bench/ and appends their records to bench/out/results.jsonl."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out", "results.jsonl")


def main():
    for script, extra in (("bench_overhead.py", []), ("bench_capture.py", [])):
        subprocess.run([sys.executable, os.path.join(HERE, script), "--out", OUT, *extra],
                       check=True)
    print(f"# records appended to {OUT}")


if __name__ == "__main__":
    main()
