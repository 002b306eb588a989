"""The CLI through its entry point: exit codes, parsed JSON, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.core.ops import count_params
from planner.io.catalog import model_from_hf_config

HF = Path(__file__).parent / "fixtures" / "hf"
ISSUE_EXAMPLE = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "16",
                 "--prompt-tokens", "2048", "--output-tokens", "256"]
CONTRACT_KEYS = {"params", "active_params", "weights_bytes", "kv_cache_bytes_per_token",
                 "kv_cache_bytes", "activation_bytes", "total_memory_bytes", "fits",
                 "decode_flops_per_token", "prefill_flops", "ridge_flops_per_byte",
                 "optimal_batch", "max_batch", "ttft_s", "tpot_s", "latency_s",
                 "throughput_tokens_per_s", "mbu", "mfu", "bound"}


def test_estimate_report_sections(run_cli):
    code, out, err = run_cli(*ISSUE_EXAMPLE)
    assert code == 0, err
    for word in ("Memory", "weights", "KV cache", "activations", "reserve", "fits", "Compute",
                 "Roofline", "ridge point", "optimal batch", "usable optimum", "TTFT", "TPOT",
                 "latency", "MBU", "MFU", "per 1M output tokens"):
        assert word in out, word


def test_estimate_json_contract(run_json):
    d = run_json(*ISSUE_EXAMPLE)
    assert CONTRACT_KEYS <= d.keys()
    assert d["bound"] in ("memory", "compute")
    assert d["params"] == 8_030_261_248
    assert d["kv_cache_bytes"] == 16 * 2304 * 131_072
    assert d["latency_s"] == pytest.approx(d["ttft_s"] + 255 * d["tpot_s"])
    assert {op["name"] for op in d["operators"]["decode"]} >= {"qkv_proj", "attention",
                                                                "lm_head"}


def test_json_is_the_only_stdout(run_cli):
    code, out, _ = run_cli(*ISSUE_EXAMPLE, "--json")
    assert code == 0
    json.loads(out)  # nothing else on stdout


def test_explain_shows_operator_table(run_cli):
    code, out, _ = run_cli(*ISSUE_EXAMPLE, "--explain")
    assert code == 0
    assert "Decode step operators" in out and "mlp_gate_up_proj" in out and "FLOP/B" in out


def test_measured_tpot(run_json):
    d = run_json("estimate", "-m", "llama-2-7b", "-g", "a100-sxm-80gb", "--measured-tpot",
                 "0.014")
    assert 0 < d["measured"]["mbu"] < 1
    assert d["measured"]["achieved_bandwidth_bytes_per_s"] == pytest.approx(
        d["measured"]["mbu"] * 2.039e12)


def test_models_and_gpus_lists(run_json):
    names = {m["name"] for m in run_json("models")}
    assert {"llama-3.1-8b", "deepseek-v3", "gpt2"} <= names
    g = {x["name"]: x for x in run_json("gpus")}
    assert g["h100-sxm"]["peak_tflops"]["bf16"] == 989.4


def test_yaml_paths_work(run_json, tmp_path):
    from planner.io.catalog import db_dir
    mp, gp = tmp_path / "m.yaml", tmp_path / "g.yaml"
    mp.write_text((db_dir("models_db") / "llama-3.1-8b.yaml").read_text())
    gp.write_text((db_dir("hardware_db") / "h100-sxm.yaml").read_text())
    d = run_json("estimate", "--model", str(mp), "--gpu", str(gp))
    assert d["params"] == 8_030_261_248


@pytest.mark.parametrize("fixture,db_name", [
    ("llama-3.1-8b", "llama-3.1-8b"), ("mixtral-8x7b", "mixtral-8x7b"),
    ("deepseek-v3", "deepseek-v3"), ("gpt2", "gpt2"), ("gemma-2-9b", "gemma-2-9b"),
    ("qwen2.5-7b", "qwen2.5-7b"), ("phi-3-mini", "phi-3-mini"), ("mistral-7b", "mistral-7b"),
    ("qwen3-8b", "qwen3-8b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"), ("gpt-oss-20b", "gpt-oss-20b"),
    ("gemma-3-27b", "gemma-3-27b"), ("llama-3.2-1b", "llama-3.2-1b"), ("phi-4", "phi-4"),
])
def test_hf_config_matches_database(model, fixture, db_name):
    path = HF / f"{fixture}.json"
    m = model_from_hf_config(json.loads(path.read_text()), str(path))
    assert count_params(m) == count_params(model(db_name))
    # every architecture field, not just the total: windows, norms, biases, experts
    skip = {"name", "display_name", "source", "official_params", "official_active_params",
            "official_params_source", "official_active_params_scope",
            "quantization",  # how the checkpoint stores its weights, not its architecture
            "torch_dtype",  # the same: every fixture's is bfloat16 (bf16, the default) or
            # float32 / none (no 16-bit type stated), as the built-in models leave it
            "chat_template"}  # the tokenizer's, not in config.json
    assert m.torch_dtype in ("bf16", None)
    ours, db = m.model_dump(), model(db_name).model_dump()
    assert {k: v for k, v in ours.items() if k not in skip} == \
        {k: v for k, v in db.items() if k not in skip}


def test_hf_config_through_cli(run_json):
    d = run_json("estimate", "--model", str(HF / "deepseek-v3.json"), "--gpu", "h200",
                 "--tp", "8", "--weights", "fp8")
    assert d["kv_cache_bytes_per_token"] == 61 * 576 * 2


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama-3-8b", "--gpu", "h100-sxm"], "did you mean llama-3.1-8b"),
    (["--model", "llama-3.1-8b", "--gpu", "h101"], "unknown GPU 'h101'"),
    (["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "-1"], "--batch"),
    (["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "0"], "--batch"),
    (["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--weights", "fp7"], "'fp7' is not one"),
    (["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--kv-cache", "int4"], "--kv-cache"),
    (["--model", "llama-3.1-8b", "--gpu", "t4", "--weights", "bf16"], "t4 has no bf16"),
    (["--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "3"], "--tp 3 does not divide"),
    (["--model", str(HF / "unsupported.json"), "--gpu", "h100-sxm"],
     "model_type: 'mamba' is not supported; supported: llama"),
    (["--model", "/nonexistent/model.yaml", "--gpu", "h100-sxm"], "no such file"),
])
def test_bad_input_one_line_exit_2(run_cli, args, needle):
    code, out, err = run_cli("estimate", *args)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and out == ""


def test_malformed_yaml_names_file_and_line(run_cli, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nvocab_size: [1\n")
    code, _, err = run_cli("estimate", "--model", str(p), "--gpu", "h100-sxm")
    assert code == 2 and str(p) in err and "line 3" in err and "malformed YAML" in err


def test_misspelled_and_negative_fields_name_the_field(run_cli, tmp_path):
    from planner.io.catalog import db_dir
    src = (db_dir("models_db") / "llama-3.1-8b.yaml").read_text()
    p = tmp_path / "typo.yaml"
    p.write_text(src.replace("num_layers:", "num_layer:"))
    code, _, err = run_cli("estimate", "--model", str(p), "--gpu", "h100-sxm")
    assert code == 2 and "num_layer: unknown key" in err and "num_layers: missing" in err
    g = tmp_path / "neg.yaml"
    g.write_text((db_dir("hardware_db") / "h100-sxm.yaml").read_text()
                 .replace("memory_gib: 80", "memory_gib: -80"))
    code, _, err = run_cli("estimate", "--model", "gpt2", "--gpu", str(g), "-p", "512")
    assert code == 2 and "memory_gib" in err and "greater than 0" in err


def test_require_fit_exit_1(run_cli):
    code, _, err = run_cli("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--require-fit")
    assert code == 1 and "does not fit" in err
    code, _, _ = run_cli("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "4",
                         "--require-fit")
    assert code == 0


def test_console_script_runs_without_heavy_imports():
    # `llmplan estimate` must not import torch, pandas or matplotlib (cold start), nor the
    # published dataset's schema (its error bands need none of it: about 20 ms)
    code = ("import sys; from planner.cli.app import main; rc = main(['estimate', '-m', 'gpt2', "
            "'-g', 'h100-sxm', '-p', '512', '--json']); heavy = [m for m in ('torch', 'pandas', "
            "'matplotlib', 'numpy', 'planner.evidence.validate') if m in sys.modules]; "
            "sys.stderr.write(repr(heavy)); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0
    assert r.stderr.strip() == "[]"


def test_a_hugging_face_snapshot_folder_is_a_model(run_json, run_cli, tmp_path):
    """A downloaded snapshot is a folder holding config.json: it is named by the folder (or
    the config's _name_or_path), never 'hf', and counts as its config does."""
    import shutil

    snap = tmp_path / "Meta-Llama-3.1-8B-Instruct"
    snap.mkdir()
    shutil.copy(HF / "llama-3.1-8b.json", snap / "config.json")
    d = run_json("estimate", "-m", str(snap), "-g", "h100-sxm")
    assert d["model"] == "Meta-Llama-3.1-8B-Instruct"
    assert d["params"] == 8_030_261_248  # Llama-3.1-8B's safetensors count
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli("estimate", "-m", str(tmp_path / "empty"), "-g", "h100-sxm")
    assert code == 2 and "without a config.json" in err
    # a config saved under its own name is named by it, not by the folder it sits in
    assert run_json("estimate", "-m", str(HF / "gpt-oss-20b.json"), "-g",
                    "h100-sxm")["model"] == "gpt-oss-20b"


@pytest.mark.parametrize("field,value,named", [
    ("max_window_layers", "-Infinity", "max_window_layers: -inf"),  # read only with a window
    ("rms_norm_eps", "NaN", "rms_norm_eps: nan"),
    ("rope_scaling", '{"factor": Infinity, "rope_type": "llama"}', "rope_scaling.factor: inf"),
    ("layer_types", '["full_attention", NaN]', "layer_types[1]: nan")])
def test_a_config_with_nan_or_infinity_is_refused_naming_the_field(run_cli, tmp_path, field,
                                                                    value, named):
    """JSON has no NaN or Infinity, but Python's reader takes them: a config holding one, in a
    field read or not, is refused in one line naming the field, exit 2."""
    text = (HF / "qwen3-8b.json").read_text()
    cfg = json.loads(text)
    cfg[field] = "@@"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg).replace('"@@"', value))
    code, out, err = run_cli("estimate", "-m", str(path), "-g", "h100-sxm")
    assert code == 2 and not out
    assert f"{path}: {named} is not a number" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["1e30", "2.5", "-1", "true", '"28"', "false", "0.0", '""',
                                   "[]"])
def test_a_layer_count_that_is_not_one_is_refused_where_no_window_applies(run_cli, tmp_path,
                                                                         value):
    """Qwen2.5-7B's config slides no layer (use_sliding_window false), so max_window_layers is
    not read; a value that is no layer count is a corrupt file all the same: one line, exit 2
    (fuzz seed 137 found 1e30 accepted)."""
    cfg = json.loads((HF / "qwen2.5-7b.json").read_text())
    assert cfg["use_sliding_window"] is False and isinstance(cfg["max_window_layers"], int)
    cfg["max_window_layers"] = "@@"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg).replace('"@@"', value))
    code, out, err = run_cli("estimate", "-m", str(path), "-g", "h100-sxm")
    assert code == 2 and not out
    assert "max_window_layers: expected a whole number" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_compute_says_what_the_matmuls_run_in(run_json, run_cli, tmp_path):
    """T4 and V100 have no bf16: int8 / int4 weights there dequantize to fp16 (--compute
    fp16), and the KV cache follows into fp16. The T4's fp16 datasheet rate is 65 TFLOP/s."""
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "t4", "--weights", "int4")
    assert code == 2 and "--compute" in err
    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "t4", "--weights", "int4",
                 "--compute", "fp16")
    assert d["compute"] == "fp16" and d["kv_cache"] == "fp16"
    assert d["peak_flops_per_s"] == pytest.approx(65e12)
    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "v100-sxm2-32gb", "--weights", "int8",
                 "--compute", "fp16")
    assert d["compute"] == "fp16" and d["fits"]
    code, _, err = run_cli("report", "-m", "llama-3.1-8b", "-g", "t4", "--weights", "int4",
                           "--compute", "fp16", "--out", str(tmp_path / "r"))
    assert code == 0, err


def test_sweep_compute_matches_estimate(run_json):
    rows = run_json("sweep", "-m", "llama-3.1-8b", "-g", "t4", "-b", "1,8", "--weights", "int4",
                    "--compute", "fp16")
    for r in rows:
        e = run_json("estimate", "-m", "llama-3.1-8b", "-g", "t4", "-b", str(r["batch"]),
                     "--weights", "int4", "--compute", "fp16")
        assert r["compute"] == "fp16" and r["tpot_s"] == pytest.approx(e["tpot_s"], rel=1e-9)


def test_a_measured_time_faster_than_the_gpu_is_warned_of(run_cli):
    """--measured-tpot 1us (a unit slip for 1ms): Llama-3.1-8B's 15 GB a step in a
    microsecond is thousands of times the H100's bandwidth: a warning on stderr, the figures
    still given (exit 0); a plausible measurement warns of nothing."""
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                             "--measured-tpot", "1us", "--measured-ttft", "1e-9")
    assert code == 0 and "measured MBU" in out
    assert "--measured-tpot gives" in err and "datasheet bandwidth (mbu)" in err
    assert "--measured-ttft gives" in err and "(prefill_mfu)" in err
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                           "--measured-tpot", "8ms", "--measured-ttft", "60ms")
    assert code == 0 and "warning" not in err


@pytest.mark.parametrize(("field", "value"), [
    ("num_key_value_heads", 0), ("num_key_value_heads", []), ("num_key_value_heads", ""),
    ("num_key_value_heads", True), ("head_dim", 0), ("head_dim", []), ("head_dim", {}),
    ("head_dim", False), ("head_dim", 127.5), ("attention_bias", "no"), ("mlp_bias", 1),
    ("tie_word_embeddings", "false"), ("torch_dtype", "float7"), ("torch_dtype", 5)])
def test_a_config_field_of_the_wrong_kind_is_refused_not_read_as_absent(run_cli, tmp_path,
                                                                        field, value):
    """A falsy value is not an absent one: 0, [] or "" key-value heads had been read as full
    multi-head attention (8x Qwen3-30B-A3B's KV cache), a head_dim of 0 as hidden / heads, and
    "no" as a bias, each with exit 0. Absent or null still takes the default."""
    cfg = json.loads((HF / "qwen3-30b-a3b.json").read_text())
    cfg[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, _, err = run_cli("estimate", "-m", str(path), "-g", "h100-sxm")
    assert code == 2 and f"{field}: expected" in err and len(err.strip().splitlines()) == 1


def test_a_null_or_absent_optional_field_takes_the_default(run_json, tmp_path):
    base = run_json("estimate", "-m", str(HF / "qwen3-30b-a3b.json"), "-g", "h100-sxm")
    cfg = json.loads((HF / "qwen3-30b-a3b.json").read_text())
    cfg["attention_bias"] = None
    cfg.pop("mlp_bias", None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    d = run_json("estimate", "-m", str(path), "-g", "h100-sxm")
    assert d["kv_cache_bytes_per_token"] == base["kv_cache_bytes_per_token"] == 98_304
    assert d["params"] == base["params"]


@pytest.mark.parametrize(("fixture", "field", "value", "said"), [
    ("qwen3-30b-a3b", "num_hidden_layers", 1e30, "num_hidden_layers: expected a whole number"),
    ("qwen3-30b-a3b", "num_key_value_heads", 3,
     "num_attention_heads (32) is not a multiple of num_key_value_heads (3)"),
    ("gpt2", "n_positions", -5, "n_positions: Input should be greater than 0, got -5")])
def test_a_config_error_names_the_key_as_the_file_spells_it(run_cli, tmp_path, fixture, field,
                                                            value, said):
    """An HF config's bad value is named by its key in the file (num_hidden_layers,
    n_positions), not llmplan's field (num_layers, max_position_embeddings)."""
    cfg = json.loads((HF / f"{fixture}.json").read_text())
    cfg[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, _, err = run_cli("estimate", "-m", str(path), "-g", "h100-sxm", "-p", "256", "-o",
                           "16")
    assert code == 2 and said in err, err
