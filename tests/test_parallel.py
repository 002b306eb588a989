"""Parallelism across servers: TP beyond a node pays the inter-node network."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.estimate import estimate
from planner.specs import DType, Parallelism, Precision, Workload


def _allreduce_s(est) -> float:
    return sum(t.comm_s for t in est.decode.ops if t.op.kind == "allreduce")


def test_tp_across_nodes_pays_the_inter_node_link():
    # H100 SXM in hardware_db: 8 per AWS p5.48xlarge, NVLink 900 GB/s both ways (450 one way),
    # EFA 3,200 Gb/s per node = 50 GB/s per GPU one way
    m, hw = catalog.load_model("llama-3.1-405b"), catalog.load_hardware("h100-sxm")
    assert hw.node.gpus_per_node == 8 and hw.node.inter_node.bandwidth_gb_per_s == 50
    kw = dict(precision=Precision(weights=DType.fp8, kv_cache=DType.fp8),
              workload=Workload(batch=32, prompt_tokens=1024, output_tokens=128))
    e8 = estimate(m, hw, parallelism=Parallelism(tp=8), **kw)
    e16 = estimate(m, hw, parallelism=Parallelism(tp=16), **kw)
    # ideal engine: 2 (N-1)/N x S / link, S = 32 tokens x 16,384 x 2 bytes, 2 per layer
    s = 32 * 16384 * 2
    per8 = 2 * 7 / 8 * s / 450e9 + 5e-6
    per16 = 2 * 15 / 16 * s / 50e9 + 5e-6
    assert _allreduce_s(e8) == pytest.approx(2 * 126 * per8)
    assert _allreduce_s(e16) == pytest.approx(2 * 126 * per16)
    # a GPU file without a node block keeps its intra-node link at any TP
    bare = hw.model_copy(update={"node": None})
    e16b = estimate(m, bare, parallelism=Parallelism(tp=16), **kw)
    assert _allreduce_s(e16b) == pytest.approx(2 * 126 * (2 * 15 / 16 * s / 450e9 + 5e-6))
