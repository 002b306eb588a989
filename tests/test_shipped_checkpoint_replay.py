"""A published run or row of a model whose own checkpoint stores the weights it names
(DeepSeek-V3 / R1: fp8 in 128 x 128 blocks; gpt-oss: MXFP4 experts) is replayed on that
checkpoint as it ships, not as a 16-bit one the engine quantizes at load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.cli.validate import replay_setup
from planner.core.specs import DType
from planner.evidence.served import ServedDataset
from planner.io import catalog

SERVED = Path(__file__).resolve().parents[1] / "planner" / "data" / "served"


def _entry(manifest: str, run: str):
    ds = ServedDataset.model_validate(yaml.safe_load((SERVED / manifest).read_text()))
    return next(e for e in ds.runs if e.id == run)


def test_a_deepseek_run_named_fp8_is_replayed_on_its_block_scaled_checkpoint():
    e = _entry("inferencex-dsr1-b200-trt.yaml", "inferencex-dsr1-b200-trt-1k1k-tp8-c4")
    assert e.weights == DType.fp8 and e.checkpoint is None
    dep = replay_setup(e, catalog.load_engine_spec("trtllm"), SERVED)
    assert dep.precision.weights == DType.fp8 and dep.precision.fp8_blocks
    assert dep.precision.kv_cache == DType.fp8  # the run's own KV cache stays


def test_a_16bit_model_named_fp8_is_still_quantized_at_load():
    """Qwen3-8B ships 16-bit: --quantization fp8 over it, one scale per tensor."""
    e = _entry("runpod-vllm-bench.yaml", "rpvb-20260401-051617-fp8-full")
    assert e.weights == DType.fp8
    dep = replay_setup(e, catalog.load_engine_spec("vllm"), SERVED)
    assert dep.precision.weights == DType.fp8 and not dep.precision.fp8_blocks


def test_a_static_row_is_measured_as_its_checkpoint_ships(monkeypatch):
    """SGLang's one-batch rows: DeepSeek's fp8 rows estimated on the block-scaled
    checkpoint, the Llama row (16-bit model) as named."""
    from planner.evidence import validate

    ds = next(d for d in catalog.load_datasets() if d.source.id == "sglang-bench-one-batch")
    models = {r.model: catalog.load_model(r.model) for r in ds.rows}
    gpus = {r.gpu: catalog.load_hardware(r.gpu) for r in ds.rows}
    seen = []
    real = validate.estimate

    def spy(model, gpu, **kw):
        seen.append((model.name.lower(), kw["precision"]))
        return real(model, gpu, **kw)
    monkeypatch.setattr(validate, "estimate", spy)
    validate.compare(ds, models=models, gpus=gpus,
                     engines={"sglang": catalog.load_engine_spec("sglang")})
    deepseek = [p for name, p in seen if "deepseek" in name]
    others = [p for name, p in seen if "deepseek" not in name]
    assert deepseek and all(p.fp8_blocks and p.from_checkpoint for p in deepseek)
    assert others and not any(p.from_checkpoint for p in others)


@pytest.mark.parametrize("model, weights, blocks", [("deepseek-v3", "fp8", True),
                                                     ("gpt-oss-120b", "mxfp4", False)])
def test_the_shipped_precision_is_the_checkpoints(model, weights, blocks):
    m = catalog.load_model(model)
    assert not m.quantized_at_load(weights)
    p = m.quantization.precision(None)
    assert p.weights == DType(weights) and p.fp8_blocks == blocks and p.from_checkpoint
    if model.startswith("gpt-oss"):
        assert p.quantized_layers == "experts"
