"""A chat-completions request reaches the engine wrapped in the model's chat template: tokens
the benchmark client does not count (vLLM's bench serve counts the dataset's prompt), whose
opening is the same in every request."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import yaml
from pydantic import ValidationError

from planner.core.specs import ChatTemplate
from planner.evidence.compare import chat_template_tokens, simulate_run
from planner.evidence.formats import read_vllm
from planner.evidence.runs import ServedRun
from planner.evidence.served import ServedDataset, Traffic
from planner.io import catalog


def test_the_built_in_templates_count_their_turn_markers():
    """Qwen3: '<|im_start|>user\\n' (3) + '<|im_end|>\\n' (2) + '<|im_start|>assistant\\n'
    (3); gpt-oss: harmony's default system message (61) + the user frame (4) + the
    generation prompt (2), of which the system message and '<|start|>user<|message|>' come
    before every message."""
    for name in ("qwen3-8b", "qwen3-32b", "qwen3-235b-a22b"):
        t = catalog.load_model(name).chat_template
        assert (t.tokens, t.prefix_tokens) == (3 + 2 + 3, 3)
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        t = catalog.load_model(name).chat_template
        assert (t.tokens, t.prefix_tokens) == (61 + 4 + 2, 61 + 3)
    assert catalog.load_model("llama-3.1-8b").chat_template is None  # not recorded


def test_a_template_opening_longer_than_the_template_is_refused():
    with pytest.raises(ValidationError,
                       match=r"prefix_tokens \(9\) exceeds chat_template.tokens \(8\)"):
        ChatTemplate(tokens=8, prefix_tokens=9, source="https://example.invalid")


@pytest.mark.parametrize(("command", "endpoint", "chat"), [
    ("vllm bench serve --backend openai-chat --endpoint /v1/chat/completions", None, True),
    ("vllm bench serve --endpoint /v1/chat/completions", None, True),
    ("vllm bench serve --backend vllm --dataset-name sharegpt", None, False),
    (None, None, False),
    ("vllm bench serve --backend openai-chat", "completions", False),
    ("vllm bench serve --backend vllm", "chat", True),
])
def test_the_api_a_client_called_comes_from_its_command_unless_stated(command, endpoint, chat):
    t = Traffic(client_command=command, endpoint=endpoint)
    assert t.chat is chat
    run = ServedRun(source="f", tool="vllm-bench-serve", label="x", request_rate=math.inf,
                    max_concurrency=None, num_prompts=10, completed=10,
                    mean_input_tokens=100, mean_output_tokens=10)
    assert t.apply(run).chat is chat


def test_a_vllm_result_file_says_its_client_used_the_chat_api():
    base = {"completed": 10, "total_input_tokens": 1000, "total_output_tokens": 100,
            "request_rate": "inf"}
    assert read_vllm({**base, "backend": "openai-chat"}, "f")[0].chat
    assert not read_vllm({**base, "backend": "vllm"}, "f")[0].chat
    assert read_vllm({**base, "endpoint_type": "openai-chat"}, "f")[0].chat


def _gpustack(run_id: str):
    from planner.cli.validate import replay_setup, replayed_runs

    folder = catalog.SERVED_DIR
    ds = ServedDataset.model_validate(
        yaml.safe_load((folder / "gpustack-perf-lab.yaml").read_text()))
    entry = next(e for e in ds.runs if e.id == run_id)
    return replayed_runs(entry, folder, ds)[0], replay_setup(entry,
                                                         catalog.load_engine_spec("vllm"))


def test_a_chat_replay_prefills_the_template_and_caches_its_shared_opening():
    """GPUStack's 1,000 128-token prompts to gpt-oss-20b over the chat API: the engine saw
    each 67 tokens longer, 64 of them the same in every request, which vLLM's prefix cache
    (16-token blocks: 4 whole blocks) computes once."""
    run, setup = _gpustack("gpustack-gpt-oss-20b-h100-sxm-vllm-r128")
    assert run.chat and chat_template_tokens(run, setup.model) == 67
    chat, notes = simulate_run(run, setup)
    plain, _ = simulate_run(replace(run, chat=False), setup)
    n = run.num_prompts
    assert chat["total_input_tokens"] - plain["total_input_tokens"] == 67 * n
    assert any("67 tokens longer" in s and "first 64" in s for s in notes)
    assert plain["prefix_cache_hit_rate"] == 0
    # every request after the first finds the 64 shared tokens cached
    hit = (n - 1) * 64 / chat["total_input_tokens"]
    assert chat["prefix_cache_hit_rate"] == pytest.approx(hit, rel=0.05)
    assert chat["duration"] > plain["duration"]


def test_a_model_without_a_recorded_template_is_replayed_as_counted_and_says_so():
    run, setup = _gpustack("gpustack-qwen3-8b-h100-sxm-vllm-c4")
    bare = replace(setup, model=setup.model.model_copy(update={"chat_template": None}))
    sim, notes = simulate_run(run, bare)
    assert chat_template_tokens(run, bare.model) == 0
    assert any("chat-template tokens are not recorded" in s for s in notes)
    assert sim["total_input_tokens"] == sum(run.input_lens[:run.num_prompts])


def test_simulate_with_chat_prompts_prefills_the_template(run_json):
    """`simulate --chat`: Qwen3's 8 template tokens on each of 300 prompts of 1,024 tokens
    (vLLM's random dataset, fixed lengths), said in the JSON."""
    args = ("simulate", "-m", "qwen3-8b", "-g", "h100-sxm", "-n", "300",
            "--request-rate", "10", "-p", "1024", "-o", "64")
    chat, plain = run_json(*args, "--chat"), run_json(*args)
    assert plain["total_input_tokens"] == 300 * 1024 and plain["chat_template_tokens"] == 0
    assert chat["total_input_tokens"] == 300 * (1024 + 8)
    assert chat["chat_template_tokens"] == 8


def test_simulate_chat_needs_the_models_template(run_cli):
    code, out, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "10",
                             "--chat")
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "--chat: llama-3.1-8b's chat template" in err


def test_a_requests_own_prefix_follows_the_templates_opening():
    """A sonnet-like stream sharing a 200-token prefix, as gpt-oss chat messages: the group
    shares the 64-token opening and its own 200 after it; a request without a prefix gets a
    group of its own for the opening alone."""
    from planner.serving.traffic import Request, with_chat_template

    t = ChatTemplate(tokens=67, prefix_tokens=64, source="https://example.invalid")
    reqs = [Request(0, 0.0, 1000, 10, prefix_id=3, prefix_tokens=200),
            Request(1, 0.0, 500, 10)]
    a, b = with_chat_template(reqs, t)
    assert (a.prompt_tokens, a.prefix_id, a.prefix_tokens) == (1067, 3, 264)
    assert (b.prompt_tokens, b.prefix_id, b.prefix_tokens) == (567, 4, 64)
    bare = ChatTemplate(tokens=3, prefix_tokens=0, source="https://example.invalid")
    (c,) = with_chat_template([Request(2, 0.0, 100, 5)], bare)
    assert (c.prompt_tokens, c.prefix_id, c.prefix_tokens) == (103, -1, 0)
