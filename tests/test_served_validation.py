"""`llmplan validate` replays published serving runs through the simulator."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from planner.evidence.served import ServedDataset
from planner.io import catalog

FIXTURES = Path(__file__).parent / "fixtures" / "servers"
E2EL_MS = 1066.1863177834205  # the fixture's mean_e2el_ms

MANIFEST = {
    "source": {"id": "try", "url": "https://example.invalid/runs", "repo": "someone/runs",
               "commit": "0123456789abcdef0123456789abcdef01234567", "date": "2026-11-21",
               "engine": "vllm", "engine_version": "0.11", "hardware_note": "1xH100-80GB-SXM"},
    "runs": [{"id": "rate-4", "file": "vllm_bench_serve.json", "path": "r/vllm_bench_serve.json",
              "sha256": "7d3b8a27bafb023e21bff5235e306a93f28ac4931f0863775e1b54323b40d897",
              "model": "llama-3.1-8b", "gpu": "h100-sxm"}],
}


def _manifest(tmp_path: Path, data: dict = MANIFEST) -> Path:
    shutil.copy(FIXTURES / "vllm_bench_serve.json", tmp_path)
    p = tmp_path / "try.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_served_figures_are_the_simulators_for_that_run(run_json, tmp_path):
    """Each served figure is what `llmplan compare` simulates for the same file and
    deployment, and its ideal one what the ideal engine simulates; all held out."""
    p = _manifest(tmp_path)
    d = run_json("validate", "--served-dataset", str(p), "--source", "try")
    assert d["rows"] == []
    served = {r["metric"]: r for r in d["served_rows"]}
    assert set(served) == {"mean_ttft_s", "mean_tpot_s", "output_throughput", "mean_e2el_s"}
    runs = run_json("compare", str(FIXTURES / "vllm_bench_serve.json"), "-m", "llama-3.1-8b",
                    "-g", "h100-sxm")
    ideal = run_json("compare", str(FIXTURES / "vllm_bench_serve.json"), "-m", "llama-3.1-8b",
                     "-g", "h100-sxm", "--engine", "ideal")
    runs = runs["runs"] if isinstance(runs, dict) else runs
    ideal = ideal["runs"] if isinstance(ideal, dict) else ideal
    for k, row in served.items():
        assert row["measured"] == runs[0]["metrics"][k]["measured"]
        assert row["predicted"] == pytest.approx(runs[0]["metrics"][k]["simulated"])
        assert row["ideal"] == pytest.approx(ideal[0]["metrics"][k]["simulated"])
        assert row["error"] == pytest.approx(row["predicted"] / row["measured"] - 1)
        assert row["split"] == "held-out"
    # the fixture's measured mean TTFT and TPOT (ms) and output tokens/s, read in SI
    assert served["mean_ttft_s"]["measured"] == pytest.approx(31.490826678050915e-3)
    assert served["mean_tpot_s"]["measured"] == pytest.approx(8.147208591380863e-3)
    assert served["output_throughput"]["measured"] == pytest.approx(501.045058889198)
    assert served["mean_e2el_s"]["measured"] == pytest.approx(E2EL_MS * 1e-3)
    assert served["mean_e2el_s"]["phase"] == "served E2E"
    phases = {s["phase"]: s for s in d["overall"]}
    assert phases["served TPOT"]["n"] == 1
    assert phases["served TPOT"]["median_abs_error"] == pytest.approx(
        abs(served["mean_tpot_s"]["error"]))


def test_served_manifest_errors_name_the_run_and_field(run_cli, tmp_path):
    bad = dict(MANIFEST, runs=[dict(MANIFEST["runs"][0], model="no-such-model")])
    code, _, err = run_cli("validate", "--served-dataset", str(_manifest(tmp_path, bad)),
                           "--source", "try")
    assert code == 2 and "served run try:rate-4" in err and "no-such-model" in err
    bad = dict(MANIFEST, runs=[dict(MANIFEST["runs"][0], file="missing.json")])
    code, _, err = run_cli("validate", "--served-dataset", str(_manifest(tmp_path, bad)),
                           "--source", "try")
    assert code == 2 and "missing.json" in err and len(err.strip().splitlines()) == 1
    bad = dict(MANIFEST, source=dict(MANIFEST["source"], commit="main"))
    code, _, err = run_cli("validate", "--served-dataset", str(_manifest(tmp_path, bad)),
                           "--source", "try")
    assert code == 2 and "commit" in err
    bad = dict(MANIFEST, runs=[dict(MANIFEST["runs"][0], file="../../etc/passwd")])
    code, _, err = run_cli("validate", "--served-dataset", str(_manifest(tmp_path, bad)),
                           "--source", "try")
    assert code == 2 and "file" in err


def test_a_skipped_figure_is_not_compared_and_needs_a_reason(run_json, run_cli, tmp_path):
    run = dict(MANIFEST["runs"][0], skip=["TTFT"], note="prompts served from a warm cache")
    d = run_json("validate", "--served-dataset", str(_manifest(tmp_path, dict(MANIFEST,
                 runs=[run]))), "--source", "try")
    assert {r["phase"] for r in d["served_rows"]} == {"served TPOT", "served throughput",
                                                      "served E2E"}
    run.pop("note")
    code, _, err = run_cli("validate", "--served-dataset", str(_manifest(tmp_path, dict(
        MANIFEST, runs=[run]))), "--source", "try")
    assert code == 2 and "skip needs a note" in err


def test_builtin_served_runs_are_sourced_and_readable():
    """Every built-in served run names the repository, commit and path it was copied from,
    its file lies beside the manifest and is read by the result readers, and its model, GPU
    and engine are in the databases."""
    import hashlib
    import json

    from planner.cli.compare import read_result_file

    manifests = catalog.load_served()
    assert manifests, "planner/data/served holds the published runs"
    n = 0
    for ds, folder in manifests:
        assert isinstance(ds, ServedDataset)
        assert ds.source.url.startswith("https://github.com/" + ds.source.repo) or \
            ds.source.kind == "page"
        catalog.load_engine_spec(ds.source.engine)
        for e in ds.runs:
            catalog.load_model(e.model)
            catalog.load_hardware(e.gpu)
            assert ds.url_of(e).startswith(f"https://github.com/{ds.source.repo}/blob/") or \
                (ds.source.kind == "page" and ds.url_of(e).startswith("https://"))
            raw = (folder / e.file).read_bytes()
            if e.kept in ("verbatim", "excerpt", "table"):  # the published file, the printed
                # block, or the table row transcribed
                assert hashlib.sha256(raw).hexdigest() == e.sha256, e.id
                assert hashlib.sha256(raw).hexdigest() == e.sha256, e.id
            else:  # the published object less the per-request lists nothing reads
                data = json.loads(raw)
                assert not {"ttfts", "itls", "generated_texts", "errors"} & set(data), e.id
            runs = read_result_file(folder / e.file)
            assert runs, e.id
            n += len(runs)
        # the README beside them holds each file's provenance
        readme = (folder / "README.md").read_text()
        assert all(f"`{e.file}`" in readme for e in ds.runs)
    assert n >= 40


@pytest.mark.slow  # replays the whole source (about 15 s)
def test_preempted_requests_reuse_their_cached_blocks_on_a_published_run(run_json):
    """GPUStack's Qwen3-32B on one A100 under vLLM 0.11 (500 prompts of 4,000 tokens at once,
    200 out; measured mean TPOT 96.2 ms, TTFT 567 s, 87.5 tokens/s): some 38,900 KV tokens
    hold nine of them, so requests are preempted all along. vLLM's prefix cache keeps a
    preempted request's blocks and its recompute finds them; recomputing every prompt instead
    made the simulator thrash (4,675 preemptions: TPOT +238%, TTFT +221%, throughput -69%).
    Held out: the vllm-0.8 profile that predicts it was fitted on other sources; its served
    prefill share (0.51) leaves this run some 35% slow (with 0.9 it was within 1%)."""
    d = run_json("validate", "--source", "gpustack-perf-lab", "--no-rows")
    rows = {r["metric"]: r for r in d["served_rows"]
            if r["run"] == "gpustack-qwen3-32b-a100-sxm-80gb-vllm-r4k"}
    assert rows["mean_tpot_s"]["measured"] == pytest.approx(0.09619)
    for k in ("mean_tpot_s", "mean_ttft_s", "output_throughput"):
        assert abs(rows[k]["error"]) < 0.4, (k, rows[k]["error"])
        assert rows[k]["split"] == "held-out" and rows[k]["engine"] == "vllm-0.8"


def test_a_run_after_a_shorter_one_replays_its_cached_beginnings():
    """Scicom's 2,048-token run on 8 H100s came right after the 1,024-token one with the same
    seed: each prompt's first 1,024 tokens were cached. Its manifest says so, and the replay
    finds them: the simulated TTFT is that of prefilling the other half (the files print 1.31 s
    and 1.30 s for the two runs), well under a cold cache's."""
    from dataclasses import replace

    from planner.cli.validate import replay_setup, replayed_runs
    from planner.evidence.compare import simulate_run

    folder = catalog.SERVED_DIR
    ds = ServedDataset.model_validate(
        yaml.safe_load((folder / "scicom-llm-benchmaxxing.yaml").read_text()))
    entry = next(e for e in ds.runs if e.id == "scicom-qwen3-32b-h100-sxm-tp8-in2048-c100")
    assert entry.traffic.cached_prefix_tokens == 1024
    run = replayed_runs(entry, folder, ds)[0]
    assert run.cached_prefix_tokens == 1024
    setup = replay_setup(entry, catalog.load_engine_spec("vllm"))
    warm, notes = simulate_run(run, setup)
    cold, _ = simulate_run(replace(run, cached_prefix_tokens=0), setup)
    assert any("first 1,024 tokens of each prompt" in n for n in notes)
    assert warm["mean_ttft_ms"] < 0.75 * cold["mean_ttft_ms"]
    assert warm["mean_ttft_ms"] == pytest.approx(run.metrics["mean_ttft_s"] * 1e3, rel=0.25)


def test_a_runs_e2e_latency_is_compared_and_skippable(run_json, tmp_path):
    """Issue 24's per-run target counts E2E latency: a file that gives it is compared on it
    (mean, else median), its own phase with its own target line; `skip: [E2E]` leaves it out.
    """
    d = run_json("validate", "--served-dataset", str(_manifest(tmp_path)), "--source", "try")
    row = next(r for r in d["served_rows"] if r["phase"] == "served E2E")
    assert row["metric"] == "mean_e2el_s" and row["split"] == "held-out"
    target = next(t for t in d["targets"] if t["target"] == "served E2E, mean per run")
    assert target["n"] == 1 and target["value"] == pytest.approx(abs(row["error"]))
    run = dict(MANIFEST["runs"][0], skip=["E2E"], note="its E2E counted the client's queue")
    d = run_json("validate", "--served-dataset", str(_manifest(tmp_path, dict(MANIFEST,
                 runs=[run]))), "--source", "try")
    assert "served E2E" not in {r["phase"] for r in d["served_rows"]}


def test_a_closed_loop_is_a_stream_the_server_keeps_up_with():
    """A closed loop of clients prints rate inf, yet no request waits for another client's:
    its figures build the unsaturated bands (as `simulate` classes its own closed loops),
    and a burst of every request at once stays saturated. GPUStack's Qwen3-8B under vLLM 0.11
    at 4 clients and its Qwen3-14B burst of 1,000 ShareGPT prompts."""
    from planner.cli.validate import run_served

    (ds, folder), = [m for m in catalog.load_served() if m[0].source.id == "gpustack-perf-lab"]
    keep = {"gpustack-qwen3-8b-h100-sxm-vllm-c4", "gpustack-qwen3-14b-h100-sxm-sglang-sharegpt"}
    small = ds.model_copy(update={"runs": [r for r in ds.runs if r.id in keep]})
    comps, unserved = run_served([(small, folder)])
    assert not unserved
    regimes = {c.run: c.regime for c in comps}
    assert regimes == {"gpustack-qwen3-8b-h100-sxm-vllm-c4": "unsaturated",
                       "gpustack-qwen3-14b-h100-sxm-sglang-sharegpt": "saturated"}, regimes


def test_a_table_row_without_output_throughput_is_compared_on_its_requests(run_json, tmp_path):
    """A row of a published table (`kept: table`) that prints requests a second and no output
    throughput is compared on them; the simulated figure is the same replay's, so with fixed
    output lengths its error is the output throughput's. A row that prints both is compared
    on output tokens."""
    import hashlib
    import json

    full = json.loads((FIXTURES / "vllm_bench_serve.json").read_text())
    row = {k: full[k] for k in ("num_prompts", "request_rate", "completed", "total_input_tokens",
                                "total_output_tokens", "request_throughput", "median_ttft_ms")}
    (tmp_path / "row.json").write_text(json.dumps(row))
    run = dict(MANIFEST["runs"][0], file="row.json", kept="table", sha256=hashlib.sha256(
        (tmp_path / "row.json").read_bytes()).hexdigest())
    p = tmp_path / "try.yaml"
    p.write_text(yaml.safe_dump(dict(MANIFEST, runs=[run])))
    d = run_json("validate", "--served-dataset", str(p), "--source", "try")
    served = {r["phase"]: r for r in d["served_rows"]}
    assert set(served) == {"served TTFT", "served throughput"}
    assert served["served TTFT"]["metric"] == "median_ttft_s"
    thr = served["served throughput"]
    assert thr["metric"] == "request_throughput"
    assert thr["measured"] == pytest.approx(full["request_throughput"])
    # the same replay compared on output tokens: the same error, as every output is the same
    # length in the replay of a file that gives only totals (its mean)
    whole = run_json("validate", "--served-dataset", str(_manifest(tmp_path)), "--source", "try")
    out = next(r for r in whole["served_rows"] if r["metric"] == "output_throughput")
    assert thr["predicted"] * full["total_output_tokens"] / full["completed"] == \
        pytest.approx(out["predicted"], rel=1e-6)


BLOCK_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128]}
STATIC_FP8 = {"quant_method": "compressed-tensors", "ignore": ["lm_head"], "config_groups": {
    "group_0": {"targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "tensor",
                            "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                      "symmetric": True, "dynamic": False}}}}


def _on_checkpoint(qc: dict, **run) -> dict:
    ckpt = {"repo": "someone/Llama-3.1-8B-FP8", "source": "https://example.invalid/card",
            "quote": "fp8 weights", "quantization_config": qc}
    return dict(MANIFEST, runs=[{**MANIFEST["runs"][0], "weights": "fp8", "checkpoint": ckpt,
                                 **run}])


def _served(run_json, p: Path) -> dict:
    d = run_json("validate", "--served-dataset", str(p), "--source", "try")
    return {r["metric"]: r["predicted"] for r in d["served_rows"]}


def test_a_run_on_a_quantized_release_is_replayed_on_its_checkpoint(run_json, tmp_path):
    """A run whose server loaded a quantized release of the model (checkpoint) is replayed as
    `compare` predicts it for a model file carrying that release's quantization_config, not
    as the engine quantizing the 16-bit checkpoint at load (--weights fp8)."""
    got = _served(run_json, _manifest(tmp_path, _on_checkpoint(BLOCK_FP8)))
    model = yaml.safe_load((Path("models_db") / "llama-3.1-8b.yaml").read_text())
    model["quantization_config"] = BLOCK_FP8
    mfile = tmp_path / "llama-fp8-blocks.yaml"
    mfile.write_text(yaml.safe_dump(model))
    runs = run_json("compare", str(FIXTURES / "vllm_bench_serve.json"), "-m", str(mfile),
                    "-g", "h100-sxm")
    runs = runs["runs"] if isinstance(runs, dict) else runs
    for k, v in got.items():
        assert v == pytest.approx(runs[0]["metrics"][k]["simulated"]), k
    at_load = _served(run_json, _manifest(tmp_path, dict(MANIFEST, runs=[dict(
        MANIFEST["runs"][0], weights="fp8")])))
    assert got["mean_ttft_s"] != pytest.approx(at_load["mean_ttft_s"], rel=1e-6)


def test_a_static_scale_checkpoint_quantizes_each_input_in_one_pass(run_json, tmp_path):
    """vLLM finds a per-tensor scale at run time (--quantization fp8) by reading the input
    once more than a checkpoint's static scale needs: the static release's prefill is the
    shorter, its decode about the same."""
    static = _served(run_json, _manifest(tmp_path, _on_checkpoint(STATIC_FP8)))
    at_load = _served(run_json, _manifest(tmp_path, dict(MANIFEST, runs=[dict(
        MANIFEST["runs"][0], weights="fp8")])))
    assert static["mean_ttft_s"] < at_load["mean_ttft_s"]
    assert static["mean_tpot_s"] == pytest.approx(at_load["mean_tpot_s"], rel=0.02)


def test_a_checkpoint_that_disagrees_with_its_run_is_an_error(run_cli, tmp_path):
    for bad, words in (
            (_on_checkpoint(BLOCK_FP8, weights="int4"), ("stores fp8", "says int4")),
            (_on_checkpoint({"quant_method": "hqq"}), ("quant_method", "hqq")),
            (_on_checkpoint(BLOCK_FP8, traffic={
                "server_command": "vllm serve someone/Llama-3.1-8B"}),
             ("checkpoint.repo", "server command"))):
        code, _, err = run_cli("validate", "--served-dataset", str(_manifest(tmp_path, bad)),
                               "--source", "try")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert all(w in err for w in words), err
        assert "rate-4" in err


def test_the_replays_sharing_one_cache_give_what_each_alone_gives(monkeypatch):
    """validate's replays share one CostCache (a third of its time went to timing the same
    operators again for each file): every figure is the one a replay on its own coster gives,
    bit for bit, with files alternating between the H100 and the A100 and between engines,
    and one model on both GPUs."""
    import planner.serving.cost as cost
    from planner.cli.validate import run_served

    (ds, folder), = [m for m in catalog.load_served() if m[0].source.id == "gpustack-perf-lab"]
    order = ["gpustack-gpt-oss-20b-h100-sxm-vllm-r128", "gpustack-qwen3-8b-h100-sxm-vllm-c1",
             "gpustack-gpt-oss-20b-a100-sxm-80gb-vllm-r128",
             "gpustack-qwen3-8b-h100-sxm-sglang-c4", "gpustack-qwen3-8b-h100-sxm-vllm-c2"]
    by_id = {r.id: r for r in ds.runs}
    small = ds.model_copy(update={"runs": [by_id[i] for i in order]})
    shared, unserved = run_served([(small, folder)])
    assert not unserved and {c.run for c in shared} == set(order)
    monkeypatch.setattr(cost, "CostCache", lambda: None)  # each replay its own coster
    alone, _ = run_served([(small, folder)])
    assert shared == alone
