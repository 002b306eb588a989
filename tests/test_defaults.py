"""Issue 26 §2: one default workload for every command that predicts, declared once
(``planner.core.specs.Workload``, re-exported as ``planner.cli.options.DEFAULT_*``)."""

from __future__ import annotations

import pytest
import typer

from planner.core.specs import Workload

W = Workload()  # 1 sequence of 1024 prompt and 256 output tokens


def _defaults(command: str) -> dict[str, object]:
    from planner.cli.app import app

    cmd = typer.main.get_command(app).commands[command]
    return {max(p.opts, key=len) if p.opts[0] not in ("--batch", "--prompt-tokens",
                                                      "--output-tokens") else p.opts[0]:
            p.default for p in cmd.params if p.param_type_name == "option"}


def test_the_declared_default_is_the_one_the_docs_state():
    # docs/index.md and each command's page state it: change them with it
    assert (W.batch, W.prompt_tokens, W.output_tokens) == (1, 1024, 256)


@pytest.mark.parametrize("command", ["estimate", "sweep", "simulate", "plan", "report"])
def test_every_command_defaults_to_the_one_workload(command):
    d = _defaults(command)
    if command == "simulate":  # None until the stream is drawn: the workload's lengths for
        # the random dataset, a published distribution's own means (--dataset-name sharegpt)
        from planner.cli.simulate import request_stream

        assert d["--prompt-tokens"] is None and d["--output-tokens"] is None
        reqs = request_stream(None, "random", 3, None, None, 0.0, float("inf"), 1.0, None, 0)
        assert {(r.prompt_tokens, r.output_tokens) for r in reqs} == {
            (W.prompt_tokens, W.output_tokens)}
        return
    assert int(d["--prompt-tokens"]) == W.prompt_tokens
    assert int(d["--output-tokens"]) == W.output_tokens
    if command in ("estimate", "sweep"):  # a static batch of sequences (report's --batch
        assert int(d["--batch"]) == W.batch  # places operators on its roofline chart)


def test_a_budget_without_a_workload_checks_the_default_one(run_json, tmp_path):
    from planner.evidence.budget import BudgetWorkload

    wl = BudgetWorkload()
    assert (wl.sequences, wl.prompt_tokens, wl.output_tokens) == (W.batch, W.prompt_tokens,
                                                                 W.output_tokens)
    assert BudgetWorkload(prompt_tokens=4096).output_tokens == W.output_tokens
    b = tmp_path / "b.yaml"
    b.write_text("deployments:\n  - model: llama-3.1-8b\n    gpu: h100-sxm\n"
                 "    limits:\n      tpot_s: 1s\n      ttft_s: 1s\n")
    got = {r["limit"]: r["predicted"] for r in run_json("check", str(b))["results"]}
    est = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm")
    assert got["tpot_s"] == pytest.approx(est["tpot_s"], rel=1e-12)
    assert got["ttft_s"] == pytest.approx(est["ttft_s"], rel=1e-12)


def test_a_budget_still_refuses_both_batch_and_concurrent_sequences(run_cli, tmp_path):
    b = tmp_path / "b.yaml"
    b.write_text("deployments:\n  - model: llama-3.1-8b\n    gpu: h100-sxm\n"
                 "    workload: {batch: 2, concurrent_sequences: 2}\n"
                 "    limits:\n      tpot_s: 1s\n")
    code, _, err = run_cli("check", str(b))
    assert code == 2 and "batch or concurrent_sequences" in err
