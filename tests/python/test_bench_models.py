"""bench/bench_models.py, the model suite: its registry builds every model, its capture row
measures a small one with kiln's eager backend, its output comparison and log counting see what
they should, and a process that outlives its timeout is a record."""
import logging
import os
import sys

import pytest
import torch

import kiln
import kilnd_harness as harness

sys.path.insert(0, str(harness.REPO / "bench"))
import bench_models as suite  # noqa: E402
import model_configs  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("name", list(model_configs.MODELS))
def test_every_registry_model_constructs(name):
    """Each builder on the meta device (its configuration and construction, without the weights'
    initialization: all ~200 in ~10 s); a builder that reads its tensors' values while it
    constructs (torchvision's regnets) is built for real."""
    spec = model_configs.MODELS[name]
    try:
        with torch.device("meta"):
            model, args, kwargs = spec.build()
    except NotImplementedError as e:
        if "meta" not in str(e).lower():  # torch 2.11 says "Meta tensors", 2.14 "meta"
            raise
        model, args, kwargs = spec.build()
    assert isinstance(model, torch.nn.Module)
    assert isinstance(args, tuple) and isinstance(kwargs, dict)
    assert any(isinstance(v, torch.Tensor) for _, v in suite.leaves((args, kwargs)))


def test_small_models_build_on_the_cpu_with_inputs_they_accept():
    for name in ("squeezenet1_1", "timm_lcnet_050", "hf_bert"):
        model, args, kwargs = suite.build(name)
        assert not model.training
        with torch.no_grad():
            out = model(*args, **kwargs)
        tensors = [v for _, v in suite.leaves(out) if isinstance(v, torch.Tensor)]
        assert tensors and tensors[0].dtype == torch.float32, name


def test_capture_row_of_a_small_model_with_kilns_eager_backend():
    row = suite.capture_row("squeezenet1_1", "kiln")
    for field in ("model", "suite", "compiler", "mode", "graphs", "breaks", "break_reasons",
                  "eager_frames", "cache_limit", "passes", "entries", "capture_s"):
        assert field in row, field
    assert row["passes"], row
    assert (row["suite"], row["compiler"], row["mode"]) == ("torchvision", "kiln", "capture")
    assert row["graphs"] == 1 and row["breaks"] == 0 and row["eager_frames"] == []


def test_compare_sees_a_changed_tensor_a_changed_structure_and_model_outputs():
    from transformers.modeling_outputs import BaseModelOutput

    ref = BaseModelOutput(last_hidden_state=torch.ones(2, 3), hidden_states=(torch.zeros(2),))
    same = BaseModelOutput(last_hidden_state=torch.ones(2, 3) + 1e-6,
                           hidden_states=(torch.zeros(2),))
    assert suite.compare(same, ref, 1e-3)[0]
    off = BaseModelOutput(last_hidden_state=torch.ones(2, 3), hidden_states=(torch.ones(2),))
    ok, _, why = suite.compare(off, ref, 1e-3)
    assert not ok and "hidden_states" in why
    ok, _, why = suite.compare({"boxes": torch.ones(2, 4)}, {"boxes": torch.ones(3, 4)}, 1e-3)
    assert not ok and "[3, 4]" in why
    ok, _, why = suite.compare((torch.ones(1),), (torch.ones(1), torch.ones(1)), 1e-3)
    assert not ok and "structure" in why
    labels = [{"labels": torch.tensor([1, 2])}]
    assert not suite.compare([{"labels": torch.tensor([1, 3])}], labels, 1e-3)[0]


def test_a_frame_past_cache_size_limit_is_counted_with_its_guard():
    kiln.config.cache_size_limit = 2

    def scaled(x):
        return x * 2

    compiled = kiln.compile(scaled, backend="eager", dynamic=False)  # a graph per size
    with suite.LogRecords("kiln") as logs:
        for n in (1, 2, 3, 4):
            compiled(torch.ones(n))
    events = suite.kiln_log_events(logs.records)
    assert [e["frame"] for e in events["cache_limit"]] == ["test_a_frame_past_cache_size_limit_"
                                                          "is_counted_with_its_guard.<locals>."
                                                          "scaled"]
    assert "L['x']" in events["cache_limit"][0]["reason"]
    assert logging.getLogger("kiln").level == logging.NOTSET  # restored


def test_a_process_past_its_timeout_is_a_record(tmp_path):
    rec = suite.run_child("squeezenet1_1", "kiln", "capture", "cpu", "fp32", 0.5, 1.0,
                          str(tmp_path))
    assert rec["timed_out"] and not rec["passes"]
    assert rec["error"].startswith("timed out after")
    assert (rec["model"], rec["compiler"], rec["mode"]) == ("squeezenet1_1", "kiln", "capture")
