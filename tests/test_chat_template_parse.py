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
