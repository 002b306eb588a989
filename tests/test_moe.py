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


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_matmul_states_the_depth_it_sums_over(tp):
    """Op.k_dim, which the fused MoE kernel's rate depends on (engines_db experts_k_half):
    Qwen3-30B-A3B's experts' gate/up projection sums over the hidden size (2,048), their down
    projection over the expert width TP splits (768 / tp), as a dense MLP's does over its
    own (Qwen3-8B: 12,288 / tp); the lm_head over the hidden size."""
    from planner.core.ops import step_ops
    from planner.core.specs import Precision
    from planner.io import catalog

    for name, hidden, width in (("qwen3-30b-a3b", 2048, 768), ("qwen3-8b", 4096, 12288)):
        ops = {op.name: op for op in step_ops(catalog.load_model(name), Precision(), batch=8,
                                               new_tokens=1, past_tokens=100, tp=tp)}
        prefix = "experts_" if "a3b" in name else "mlp_"
        assert ops[f"{prefix}gate_up_proj"].k_dim == hidden
        assert ops[f"{prefix}down_proj"].k_dim == width / tp
        assert ops["lm_head"].k_dim == hidden
        assert ops[f"{prefix}down_proj"].flops == pytest.approx(
            2 * ops[f"{prefix}down_proj"].k_dim * hidden * 8
            * (8 if "a3b" in name else 1))
