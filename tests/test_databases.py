"""Every database file loads, carries its sources, and matches published figures."""

from __future__ import annotations

import re

import pytest

from planner.core.ops import active_params, count_params
from planner.core.specs import DType
from planner.io import catalog

URL = re.compile(r"^https?://\S+$")
MODELS = catalog.model_names()
GPUS = catalog.gpu_names()


def test_databases_are_not_empty():
    # issue 2 lists these as the minimum
    assert {"llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b",
            "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b", "qwen2.5-72b",
            "gemma-2-9b", "phi-3-mini", "deepseek-v3", "gpt2"} <= set(MODELS)
    assert {"a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "h100-sxm",
            "h100-pcie", "h100-nvl", "h200", "b200", "l4", "l40s", "a10g", "t4",
            "v100-sxm2-32gb", "rtx-4090", "mi300x"} <= set(GPUS)


@pytest.mark.parametrize("name", MODELS)
def test_model_loads_with_sources(name):
    m = catalog.load_model(name)
    assert m.name == name
    assert m.official_params and m.official_params_source
    if name != "tiny-llama-test":
        assert URL.match(m.source), m.source
        assert URL.match(m.official_params_source), m.official_params_source
    text = (catalog.db_dir("models_db") / f"{name}.yaml").read_text()
    assert "http" in text or name == "tiny-llama-test"


@pytest.mark.parametrize("name", MODELS)
def test_param_count_matches_official_within_1pct(name):
    m = catalog.load_model(name)
    assert count_params(m) == pytest.approx(m.official_params, rel=0.01)


@pytest.mark.parametrize("name", [n for n in MODELS
                                  if catalog.load_model(n).official_active_params])
def test_active_params_match_official(name):
    # the official active counts are given to 2-3 significant figures (12.9B, 37B):
    # agree within the rounding of the figure plus 1%
    m = catalog.load_model(name)
    ours = active_params(m)
    if m.official_active_params_scope == "no_embedding":
        ours -= m.vocab_size * m.hidden_size
    assert ours == pytest.approx(m.official_active_params, rel=0.025)
    assert active_params(m) < count_params(m)


@pytest.mark.parametrize("name", GPUS)
def test_gpu_loads_with_source(name):
    h = catalog.load_hardware(name)
    assert h.name == name
    assert URL.match(h.source)
    assert h.memory_gib > 0 and h.memory_bandwidth_gb_per_s > 0
    assert h.peak_tflops and all(v > 0 for v in h.peak_tflops.values())
    if h.price is not None:
        assert URL.match(h.price.source) and h.price.date


@pytest.mark.parametrize("name,bf16_tflops,fp8_tflops,bw", [
    # dense figures: half of the datasheets' with-sparsity headline numbers
    ("h100-sxm", 989.4, 1978.9, 3350),     # NVIDIA H100 datasheet
    ("h200", 989.4, 1978.9, 4800),         # NVIDIA H200 datasheet
    ("a100-sxm-80gb", 312, None, 2039),    # NVIDIA A100 datasheet
    ("a100-sxm-40gb", 312, None, 1555),
    ("mi300x", 1307.4, 2614.9, 5300),      # AMD MI300X data sheet
    ("l40s", 362.05, 733, 864),            # NVIDIA L40S datasheet
    ("a10", 125, None, 600),               # NVIDIA A10 datasheet
    ("h20", 148, 296, 4000),               # NVIDIA H20 spec sheet as reported (no public datasheet)
    ("b300", 2250, 4500, 7700),            # NVIDIA HGX page totals / 8 / 2; HGX column 7.7 TB/s
    ("gb200", 2500, 5000, 8000),           # NVIDIA GB200 NVL72 page, rack totals / 72 / 2
    ("mi325x", 1307.4, 2614.9, 6000),      # AMD MI325X data sheet
    ("gaudi3", 1835, 1835, 3670),          # Intel Hot Chips 2024 (FP8 at the BF16 rate)
])
def test_published_dense_figures(name, bf16_tflops, fp8_tflops, bw):
    h = catalog.load_hardware(name)
    assert h.peak_tflops[DType.bf16] == pytest.approx(bf16_tflops)
    assert h.peak_tflops.get(DType.fp8) == (pytest.approx(fp8_tflops) if fp8_tflops else None)
    assert h.memory_bandwidth_gb_per_s == bw


def test_no_sparse_figures_slipped_in():
    # Dense FP8 is exactly twice dense BF16 on every part listed, never four times
    # (a sparse FP8 figure next to a dense BF16 one would make it 4x).
    for name in GPUS:
        h = catalog.load_hardware(name)
        if DType.fp8 in h.peak_tflops and DType.bf16 in h.peak_tflops:
            # Intel's Gaudi 3 runs FP8 at its BF16 rate (Hot Chips 2024; no sparsity mode)
            ratio = 1.0 if h.name == "gaudi3" else 2.0
            assert h.peak_tflops[DType.fp8] / h.peak_tflops[DType.bf16] == \
                pytest.approx(ratio, rel=0.03), name


def test_turing_and_volta_have_no_bf16():
    for name in ("t4", "v100-sxm2-32gb"):
        assert DType.bf16 not in catalog.load_hardware(name).peak_tflops


def test_a_spec_file_is_read_once_per_text_and_again_when_edited(tmp_path):
    """The loaders keep what they read by the file's text: a built-in GPU loads once per
    process (validate loads it for every run), and an edited file (even of the same size,
    within one clock tick) is read again."""
    assert catalog.load_engine_spec("vllm") is catalog.load_engine_spec("vllm")
    src = (catalog.db_dir("engines_db") / "ideal.yaml").read_text()
    f = tmp_path / "mine.yaml"
    f.write_text(src)
    first = catalog.load_engine_spec(str(f))
    name = first.display_name  # "ideal roofline"
    edited = src.replace(name, name[::-1])
    assert len(edited) == len(src) and edited != src
    f.write_text(edited)
    second = catalog.load_engine_spec(str(f))
    assert second.display_name != name and second is not first
    f.write_text(src)
    assert catalog.load_engine_spec(str(f)).display_name == name


def test_the_spec_memo_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog, "_SPECS", {})
    monkeypatch.setattr(catalog, "_SPECS_MAX", 3)
    src = (catalog.db_dir("engines_db") / "ideal.yaml").read_text()
    for i in range(7):
        f = tmp_path / f"e{i}.yaml"
        f.write_text(src + f"\n# {i}\n")
        catalog.load_engine_spec(str(f))
        assert len(catalog._SPECS) <= 3
