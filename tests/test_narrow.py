"""Issue 26 §2: at 80 columns, validate's and calibrate's tables cut no id across lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parent / "fixtures" / "servers"
# sources with long ids (qwen2.5-speed-benchmark, scicom-benchmaq-h100-sglang), long row ids
# (trtllm's thr-mixtral-8x7b-a100-sxm-80gb-fp16-tp2-b128-128-2048) and a served run
SOURCES = "qwen2.5-speed-benchmark,trtllm-v0.8.0,scicom-benchmaq-h100-sglang"


@pytest.fixture
def at_80_columns(monkeypatch):
    from planner.cli.options import stdout

    monkeypatch.setattr(stdout, "_width", 80)


def _whole(ids: set[str], text: str) -> None:
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    for i in ids:
        assert any(i in ln for ln in lines), f"{i!r} is cut across lines"


def test_validate_tables_keep_every_id_on_one_line(run_cli, at_80_columns):
    code, out, err = run_cli("validate", "--source", SOURCES, "--json")
    assert code == 0, err
    d = json.loads(out)
    ids = {r["source"] for r in d["rows"] + d["served_rows"]} | {r["row"] for r in d["rows"]}
    ids |= {r["run"] for r in d["served_rows"]}
    assert len(max(ids, key=len)) > 40  # ids longer than an 80-column table gives a column
    code, text, err = run_cli("validate", "--source", SOURCES)
    assert code == 0, err
    _whole(ids, text)
    # the summary alone (--no-rows) too: each source id on its own line
    code, text, err = run_cli("validate", "--source", SOURCES, "--no-rows")
    assert code == 0, err
    _whole({i for i in ids if i in SOURCES.split(",")}, text)


@pytest.mark.slow
def test_calibrate_keeps_every_run_id_on_one_line(run_cli, at_80_columns, monkeypatch,
                                                  tmp_path):
    monkeypatch.setattr("planner.evidence.calibrate.FIT_MAX_REQUESTS", 40)
    files = [str(FIX / "vllm_bench_serve.json"), str(FIX / "sglang_bench_serving.jsonl")]
    args = ("calibrate", *files, "-m", "llama-3.1-8b", "-g", "h100-sxm", "--out",
            str(tmp_path / "p.yaml"), "--no-leave-one-out")
    code, out, err = run_cli(*args, "--json")
    assert code in (0, 1), err
    ids = {e["run"] for e in json.loads(out)["errors"]}
    assert len(ids) == 3 and len(max(ids, key=len)) > 30
    code, text, err = run_cli(*args)
    _whole(ids, text)
