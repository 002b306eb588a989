"""Figures of a mixture-of-experts model that differ from a dense one's."""

from __future__ import annotations

import pytest


def test_a_moes_optimal_batch_reads_every_expert(run_json):
    """A decode step of a mixture of experts reads every expert once B x top-k passes the
    expert count, while each token computes with its active parameters: compute meets the
    weights' read at params / active times the dense figure. Qwen3-30B-A3B on an H200 (989.4
    dense bf16 TFLOP/s, 4.8 TB/s): 989.4e12 x 2 / (2 x 4.8e12) = 206, times 30.5 / 3.35."""
    d = run_json("estimate", "-m", "qwen3-30b-a3b", "-g", "h200")
    dense = 989.4e12 * 2 / (2 * 4.8e12)
    assert dense == pytest.approx(206.1, abs=0.1)
    assert d["optimal_batch"] == pytest.approx(dense * d["params"] / d["active_params"])
    assert 8 < d["params"] / d["active_params"] < 10
    dense_model = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h200")
    assert dense_model["optimal_batch"] == pytest.approx(dense)
