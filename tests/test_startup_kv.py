"""vLLM checks at start-up that its KV cache holds one request of its max-model-len (the
model's context unless set: 131,072 for Llama-3.1) and refuses to start otherwise
(vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory; V0's
raise_if_cache_size_invalid). estimate says so, with the longest max-model-len that starts."""

from __future__ import annotations

import json
import re
from pathlib import Path


def test_a_pool_under_the_models_context_is_said_not_to_start(run_json):
    d = run_json("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--weights", "fp8",
                 "--kv-cache", "fp8")
    cap = d["kv_concurrency"]["kv_capacity_tokens"]
    # 80 layers x 8 KV heads x 128 x (K, V) x 1 byte = 163,840 bytes a token in fp8
    assert d["kv_cache_bytes_per_token"] == 80 * 8 * 128 * 2
    note = next(n for n in d["notes"] if "would not start" in n)
    assert "max-model-len of 131,072" in note
    longest = int(re.search(r"max-model-len of ([\d,]+) or less", note)[1].replace(",", ""))
    # the longest request the pool holds: all of it, in whole blocks of 16
    assert longest == cap and cap % 16 == 0 and 0 < cap < 131_072
    for engine in ("vllm-0.8", "vllm-v0"):
        e = run_json("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--weights", "fp8",
                     "--kv-cache", "fp8", "-e", engine)
        assert any("would not start" in n for n in e["notes"]), engine


def test_what_starts_or_is_not_checked_has_no_such_note(run_json):
    for args in (["-m", "llama-3.1-8b", "-g", "h100-sxm"],  # 8B: the pool holds 131,072
                 # SGLang and TensorRT-LLM are not said to check
                 ["-m", "llama-3.1-70b", "-g", "h100-sxm", "--weights", "fp8", "-e", "sglang"],
                 # sliding-window layers: vLLM counts a step's tokens there; not checked
                 ["-m", "gpt-oss-120b", "-g", "h100-sxm"],
                 # the weights alone do not fit: the memory table says so, not this note
                 ["-m", "llama-3.1-70b", "-g", "h100-sxm"]):
        d = run_json("estimate", *args)
        assert not any("would not start" in n for n in d["notes"]), args


def test_plan_titles_give_bare_targets_their_units(run_cli):
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "512", "-o",
                             "128", "--ttft", "2", "--tpot", "0.05", "--rps", "1", "--top", "1",
                             "--disaggregated", "off")
    assert code == 0, err
    assert "TTFT <= 2 s and TPOT <= 50 ms" in " ".join(out.split())


def test_a_prompt_the_engine_refuses_is_said_so(run_json, run_cli, tmp_path):
    """TensorRT-LLM's defaults: 8,192 tokens a step and chunked prefill off, so a 32,000-token
    prompt is refused (simulate refuses it). estimate says so beside its TTFT; plan says it
    is why nothing is found (it called the traffic the bind, every target met for one
    request)."""
    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h200", "-e", "trtllm", "-p", "32000")
    assert any("refuses this prompt" in n and "8,192" in n for n in d["notes"])
    # within its budget; vLLM chunks; vLLM V0 prefills a short context in a step of its own
    for args in (["-e", "trtllm", "-p", "8000"], ["-p", "32000"], ["-e", "vllm-v0", "-p",
                                                                     "32000"]):
        d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h200", *args)
        assert not any("refuses this prompt" in n for n in d["notes"]), args
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "h200", "-e", "trtllm", "-p",
                             "32000", "-o", "256", "--ttft", "5s", "--tpot", "50ms", "--rps",
                             "1", "--disaggregated", "off")
    flat = " ".join(out.split())
    assert code == 1 and "TensorRT-LLM refuses every request with its defaults" in flat, err
    assert "the traffic binds" not in flat
    # the way out it names runs: the profile with chunked prefill on plans the same stream
    assert "serving.chunked_prefill.value: true" in flat
    text = (Path(__file__).parents[1] / "engines_db" / "trtllm.yaml").read_text()
    at = text.index("\nserving:")
    off = "  chunked_prefill:\n    value: false"
    on = tmp_path / "trtllm-chunked.yaml"
    on.write_text(text[:at] + text[at:].replace(off, "  chunked_prefill:\n    value: true", 1))
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "h200", "-e", str(on), "-p",
                             "32000", "-o", "256", "--ttft", "5s", "--tpot", "50ms", "--rps",
                             "1", "--disaggregated", "off", "--top", "1")
    assert code == 0, err


def test_a_static_batch_the_served_pool_cannot_hold_is_said_so(run_json):
    """gpt-oss-120b with an fp8 KV cache on one H100 under vLLM 0.19 (0.9 of the memory):
    the static memory plan fits 170 sequences (the prefill's own activations), but vLLM sizes
    its pool after a whole step's activations and holds 152; served at 170 it preempts, at
    150 it does not."""
    def note(batch):
        d = run_json("estimate", "-m", "gpt-oss-120b", "-g", "h100-sxm", "--kv-cache", "fp8",
                     "-b", str(batch), "-e", "vllm@0.19")
        assert d["fits"] and d["kv_concurrency"]["max_concurrency_paged"] == 152
        return [n for n in d["notes"] if "KV pool holds" in n]
    assert note(170) and "152 requests" in note(170)[0] and not note(150)

    def preemptions(clients):
        return run_json("simulate", "-m", "gpt-oss-120b", "-g", "h100-sxm", "--kv-cache", "fp8",
                        "-n", str(2 * clients), "--max-concurrency", str(clients),
                        "-e", "vllm@0.19")["preemptions"]
    assert preemptions(170) > 0 and preemptions(150) == 0


def test_require_fit_fails_a_deployment_the_engine_would_not_start(run_cli):
    """70B fp8 with an fp8 KV cache on one H100 fits, but vLLM 0.19 (0.9 of the memory) would
    refuse to start it at the model's context: --require-fit, which a CI gate reads, says so
    with exit 1."""
    base = ("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--weights", "fp8",
            "--kv-cache", "fp8", "--require-fit", "-e", "vllm@0.19")
    code, _, err = run_cli(*base)
    assert code == 1 and "does not start" in err and "8,384" in err
    code, out, err = run_cli(*base, "--json")  # the reason on stderr under --json too
    assert code == 1 and "max-model-len of 8,384 or less" in err and json.loads(out)["fits"]
    assert run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--require-fit")[0] == 0
