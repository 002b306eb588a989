"""vLLM 0.11.0 parses the model's Jinja chat template anew for every chat request
(``EngineSpec.chat_template_parse_us``, a ``ReleaseCost``): the release span it holds in, who
pays it (chat requests of a Jinja-templated model), and its queue at the API server, by hand,
in the simulator and from the CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from planner.core.engine import ReleaseCost
from planner.core.errors import UsageError
from planner.io import catalog
from planner.layouts.deployment import Deployment
from planner.serving import run as serving
from planner.serving.config import SchedulerConfig
from planner.serving.metrics import summary
from planner.serving.traffic import synthetic


def _cost(**kw) -> ReleaseCost:
    return ReleaseCost(value=7000, source="https://example.org", **kw)


def test_the_span_holds_its_releases_only():
    """since 0.11.0, until 0.11.1: 0.11.0 (and 0.11, the line's first release) pays it, its
    span cleared; 0.10.2 and 0.11.1 do not."""
    c = _cost(since="0.11.0", until="0.11.1")
    assert not c.resolved
    for v in ("0.11.0", "0.11"):
        at = c.at(v)
        assert at is not None and at.resolved and at.value == 7000
    assert c.at("0.10.2") is None and c.at("0.11.1") is None and c.at("0.12") is None
    assert _cost().resolved and _cost().at("0.1") is not None


def test_an_empty_span_refused():
    with pytest.raises(ValidationError, match="until"):
        _cost(since="0.11.1", until="0.11.0")
    with pytest.raises(ValidationError):
        _cost(since="0.11.x")


@settings(max_examples=60, deadline=None)
@given(a=st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(0, 5)),
       b=st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(0, 5)),
       v=st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(0, 5)))
def test_a_release_pays_it_exactly_within_the_span(a, b, v):
    since, until = sorted((a, b))
    if since == until:
        return
    name = ".".join(map(str, v))
    c = _cost(since=".".join(map(str, since)), until=".".join(map(str, until)))
    assert (c.at(name) is not None) == (since <= v < until)


def test_the_profile_pays_it_at_0_11_0_only():
    """The vllm-0.8 line states 7 ms from 0.11.0 until 0.11.1, sourced and marked as a guess;
    only a profile at a named release in that span carries it into the engine."""
    spec = catalog.load_engine_spec("vllm-0.8")
    p = spec.chat_template_parse_us
    assert p is not None and (p.since, p.until) == ("0.11.0", "0.11.1")
    assert p.estimated and p.source.startswith("https://github.com/vllm-project/vllm/")
    assert spec.model().chat_template_parse_s == 0.0  # no release named
    assert catalog.load_engine("vllm@0.11.0").chat_template_parse_s == pytest.approx(7e-3)
    for ref in ("vllm@0.10.2", "vllm@0.11.1", "vllm@0.8.5", "vllm", "sglang", "trtllm"):
        assert catalog.load_engine(ref).chat_template_parse_s == 0.0, ref


def _dep(model: str, engine: str = "vllm@0.11.0") -> Deployment:
    return Deployment.build(catalog.load_model(model), catalog.load_hardware("h100-sxm"),
                            engine=catalog.load_engine(engine))


def test_who_pays_it():
    """Chat requests of a model rendered from Jinja (Qwen3) pay it; the completions API does
    not, nor gpt-oss, which vLLM renders with openai_harmony."""
    qwen, oss = _dep("qwen3-8b"), _dep("gpt-oss-20b")
    assert qwen.model.chat_template.renderer == "jinja"
    assert oss.model.chat_template.renderer == "harmony"
    assert serving.chat_parse_s(qwen, True) == pytest.approx(7e-3)
    assert serving.chat_parse_s(qwen, False) == 0.0
    assert serving.chat_parse_s(oss, True) == 0.0
    assert serving.chat_parse_s(_dep("qwen3-8b", "vllm@0.11.1"), True) == 0.0


def test_a_burst_of_chat_requests_queues_for_the_parse():
    """300 chat requests at once through one API server at 1 ms (the profile's front-end
    cost) + 7 ms (the parse): the k-th reaches the engine at k x 8 ms, so they wait
    (1 + 300) / 2 x 8 ms = 1.204 s on average, and no first token comes before its request
    is seen."""
    dep = _dep("qwen3-8b")
    reqs = synthetic(300, prompt_tokens=100, output_tokens=8)
    cfg = serving.scheduler(dep, chat_template_parse_s=serving.chat_parse_s(dep, True))
    res = serving.run(dep, reqs, cfg)
    d = summary(res)
    assert d["mean_api_server_wait_s"] == pytest.approx(301 / 2 * 8e-3, rel=1e-9)
    for k, r in enumerate(sorted(res.requests, key=lambda r: r.id), start=1):
        assert r.first_token_s >= k * 8e-3 - 1e-12
    plain = summary(serving.run(dep, reqs, serving.scheduler(dep)))
    assert plain["mean_api_server_wait_s"] == pytest.approx(301 / 2 * 1e-3, rel=1e-9)


def test_a_bad_parse_time_refused():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="chat template parse"):
            SchedulerConfig(chat_template_parse_s=bad).check()


def test_cli_chat_on_0_11_0(run_cli):
    """simulate --chat on vllm@0.11.0 states the parse and admits 1 / 8 ms = 125 requests a
    second; the same on 0.11.1, or without --chat, none."""
    args = ["simulate", "-m", "qwen3-8b", "--gpu", "h100-sxm", "-n", "200", "-p", "100",
            "-o", "8"]
    code, out, err = run_cli(*args, "--engine", "vllm@0.11.0", "--chat", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["api_server_chat_template_s"] == pytest.approx(7e-3)
    assert d["mean_api_server_wait_s"] == pytest.approx(201 / 2 * 8e-3, rel=1e-9)
    for extra in (["--engine", "vllm@0.11.1", "--chat"], ["--engine", "vllm@0.11.0"]):
        code, out, err = run_cli(*args, *extra, "--json")
        assert code == 0, err
        assert json.loads(out)["api_server_chat_template_s"] == 0.0
    code, out, err = run_cli(*args, "--engine", "vllm@0.11.0", "--chat")
    assert code == 0, err
    flat = "".join(c for c in out if not c.isspace() and c != "│")  # the cell as one line
    assert "admitsupto125req/s,7.0msarequestparsingthechattemplate" in flat


def test_the_first_release_named_decides():
    """As the profile's other release-bound defaults: a profile already at 0.11.0 keeps the
    cost when asked for another release, one at 0.11.1 stays without it."""
    spec = catalog.load_engine_spec("vllm-0.8")
    assert spec.at_version("0.11.0").at_version("0.12").model().chat_template_parse_s == \
        pytest.approx(7e-3)
    assert spec.at_version("0.11.1").at_version("0.11.0").model().chat_template_parse_s == 0.0


def _replayed(run_id: str, version: str | None = None):
    """GPUStack's served run ``run_id`` replayed as validate replays it (its own release, or
    ``version`` in its place): (TTFT in ms, the replay's notes)."""
    import yaml

    from planner.cli.validate import at_release, replay_setup, replayed_runs
    from planner.evidence.compare import simulate_run
    from planner.evidence.served import ServedDataset
    from planner.io.catalog import SERVED_DIR as folder

    ds = ServedDataset.model_validate(yaml.safe_load(
        (folder / "gpustack-perf-lab.yaml").read_text()))
    entry = ds.entry(run_id)
    spec = at_release(catalog.load_engine_spec("vllm"),
                      f"vLLM {version}" if version else entry.engine_version)
    (run,) = replayed_runs(entry, folder, ds)
    sim, notes = simulate_run(run, replay_setup(entry, spec, folder))
    return sim["mean_ttft_ms"], notes


def test_a_replayed_0_11_0_chat_run_pays_it():
    """GPUStack's Qwen3-8B run at one client (vLLM 0.11.0, the chat API) is replayed with the
    parse, said in its notes: each request's first token 7 ms later than the same run
    replayed as 0.11.1 (an idle server: the cost is all on the path); its gpt-oss run at 4
    clients, harmony, pays none."""
    ttft, notes = _replayed("gpustack-qwen3-8b-h100-sxm-vllm-c1")
    later, later_notes = _replayed("gpustack-qwen3-8b-h100-sxm-vllm-c1", "0.11.1")
    assert ttft - later == pytest.approx(7.0, abs=0.05)
    assert any("chat template anew" in n for n in notes)
    assert not any("chat template anew" in n for n in later_notes)
    _, oss = _replayed("gpustack-gpt-oss-120b-a100-sxm-80gb-vllm-tp1-sharegpt-c4")
    assert not any("chat template anew" in n for n in oss)


def test_cli_disaggregated_pools_each_pay_it(run_cli):
    """Each pool's servers get the chat request and parse the template: both pools state it."""
    code, out, err = run_cli("simulate", "-m", "qwen3-8b", "--gpu", "h100-sxm", "-n", "60",
                             "-p", "200", "-o", "8", "--request-rate", "20",
                             "--engine", "vllm@0.11.0", "--chat", "--prefill-instances", "1",
                             "--decode-instances", "1", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["prefill"]["api_server_chat_template_s"] == pytest.approx(7e-3)
    assert d["decode"]["api_server_chat_template_s"] == pytest.approx(7e-3)
