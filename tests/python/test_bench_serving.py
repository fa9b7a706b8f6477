"""bench_serving's check of a generation against eager's: greedy tokens and per-step logits."""
import sys

import torch

import kilnd_harness as harness

sys.path.insert(0, str(harness.REPO / "bench"))
from bench_serving import check_generation  # noqa: E402


def _generation(steps=4, rows=2, vocab=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = [torch.randn(rows, vocab, generator=g) * 4 for _ in range(steps)]
    tokens = torch.stack([l.argmax(-1) for l in logits], 1)
    return tokens, logits


def test_the_same_generation_passes():
    assert check_generation(_generation(), _generation(), 1e-3) is None


def test_logits_off_by_more_than_the_tolerance_fail():
    tokens, logits = _generation()
    bad = [l.clone() for l in logits]
    bad[2][1, 0] += 1.0
    assert "logits differ" in check_generation((tokens, bad), (tokens, logits), 1e-3)


def test_a_different_token_at_a_near_tie_passes_and_stops_the_comparison():
    tokens, logits = _generation()
    near = [l.clone() for l in logits]
    best = logits[1][0].argmax()
    other = (best + 1) % logits[1].shape[1]
    near[1][0, other] = logits[1][0, best] + 1e-4  # the compiled run tips the tie
    logits[1][0, other] = logits[1][0, best] - 1e-4
    ours = tokens.clone()
    ours[0, 1] = other
    ours[0, 2:] = 0  # the texts part: what follows is not compared
    near[2][0] += 100
    assert check_generation((ours, near), (tokens, logits), 1e-2) is None


def test_a_different_token_that_was_no_tie_fails():
    tokens, logits = _generation()
    ours = tokens.clone()
    ours[1, 0] = logits[0][1].argmin()
    assert "chose" in check_generation((ours, logits), (tokens, logits), 1e-3)
