"""bench/bench_gpu_models.py's scheduling of measurements over several GPUs (no GPU needed: the
measurement itself is replaced by a stand-in that records where and when it ran)."""
import json
import sys
import threading
import time

import pytest

import kilnd_harness as harness

sys.path.insert(0, str(harness.REPO / "bench"))
import bench_gpu_models as suite  # noqa: E402


class StandIn:
    """A measurement taking `seconds`, recording (model, dtype, compiler, device, start, end)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, model, dtype, compiler, timeout_s, device):
        start = time.monotonic()
        time.sleep(self.seconds)
        with self.lock:
            self.calls.append((model, dtype, compiler, device, start, time.monotonic()))
        return {"model": model, "dtype": dtype, "compiler": compiler, "device": device}


def todo(models, dtypes, compilers):
    return [(m, d, c) for d in dtypes for m in models for c in compilers]


def test_each_row_is_measured_on_one_gpu_its_compilers_in_order_and_rows_side_by_side(tmp_path):
    jsonl = tmp_path / "records.jsonl"
    stand_in = StandIn(0.05)
    work = todo(["resnet18", "bert", "gpt2"], ["fp32"], ["reduce-overhead", "kiln"])
    assert suite.measure_all(work, str(jsonl), 60, None, ["0", "1"], stand_in) == 6
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert sorted((r["model"], r["compiler"]) for r in records) == sorted(
        (m, c) for m, _, c in work)
    for model in ("resnet18", "bert", "gpt2"):
        calls = [c for c in stand_in.calls if c[0] == model]
        assert [c[2] for c in calls] == ["reduce-overhead", "kiln"]
        assert len({c[3] for c in calls}) == 1  # one card for the whole row
    assert {c[3] for c in stand_in.calls} == {"0", "1"}
    # Two rows ran at once: some measurement on one card overlaps one on the other.
    assert any(a[3] != b[3] and a[4] < b[5] and b[4] < a[5]
               for a in stand_in.calls for b in stand_in.calls)


def test_one_gpu_measures_in_order_and_stop_after_starts_nothing_later(tmp_path):
    jsonl = tmp_path / "records.jsonl"
    stand_in = StandIn(0.2)
    work = todo(["mlp"], ["fp32", "bf16"], ["reduce-overhead", "kiln"])
    assert suite.measure_all(work, str(jsonl), 60, 0.1, [None], stand_in) == 1
    assert [(c[1], c[2], c[3]) for c in stand_in.calls] == [("fp32", "reduce-overhead", None)]
    assert len(jsonl.read_text().splitlines()) == 1
    stand_in = StandIn(0.0)
    assert suite.measure_all(work, str(jsonl), 60, None, [None], stand_in) == 4
    assert [(c[1], c[2]) for c in stand_in.calls] == [(d, c) for _, d, c in work]


def test_a_failing_measurement_is_raised_not_lost(tmp_path):
    def broken(model, dtype, compiler, timeout_s, device):
        raise RuntimeError(f"{model} {compiler} broke")

    with pytest.raises(RuntimeError, match="mlp kiln broke"):
        suite.measure_all([("mlp", "fp32", "kiln")], str(tmp_path / "r.jsonl"), 60, None,
                          ["0", "1"], broken)


def test_the_devices_are_the_visible_ones(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert suite._devices(1) == [None]
    assert suite._devices(2) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5,6")
    assert suite._devices(2) == ["3", "5"]
