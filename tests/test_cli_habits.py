"""Issue 26 §2: the bugs a new user tripped over, each held closed."""

from __future__ import annotations

import json

import pytest

EST = ("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm")


def test_kernel_overhead_zero_means_none_and_the_ideal_bound_never_moves(run_json):
    base = run_json(*EST)
    zero = run_json(*EST, "--kernel-overhead-us", "0")
    five = run_json(*EST, "--kernel-overhead-us", "5")
    # 0 is honoured (no per-kernel cost), not read as "the engine's default"
    assert zero["tpot_s"] < base["tpot_s"] < five["tpot_s"]
    # 5 us per kernel against none: TPOT grows by exactly the decode step's kernels x 5 us
    kernels = sum(o["kernels"] for o in five["operators"]["decode"])
    assert kernels > 200
    assert five["tpot_s"] - zero["tpot_s"] == pytest.approx(kernels * 5e-6, rel=1e-9)
    # the ideal roofline has no fixed costs whatever is given
    assert base["ideal"]["tpot_s"] == zero["ideal"]["tpot_s"] == five["ideal"]["tpot_s"]


def test_a_gpu_without_bf16_names_fp16(run_cli):
    """An asked-for bf16 (the default falls back to fp16 under vLLM: tests/test_auto_dtype)."""
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "t4", "--weights", "bf16")
    assert code == 2 and "--weights fp16" in err and "--compute fp16" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "t4", "--weights", "fp16")
    assert code == 0, err


def test_a_timed_dataset_is_not_called_infinite_rate(run_cli, tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"prompt_tokens": 100, "output_tokens": 20, "arrival_s": 0}\n'
                 '{"prompt_tokens": 100, "output_tokens": 20, "arrival_s": 0.5}\n')
    sim = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--dataset", str(p))
    code, out, err = run_cli(*sim)
    assert code == 0, err
    assert "at the dataset's arrival times" in " ".join(out.split()) and "inf req/s" not in out
    code, out, err = run_cli(*sim, "--json")
    d = json.loads(out)
    assert d["request_rate"] is None and d["arrivals"] == "dataset"
    code, _, err = run_cli(*sim, "--request-rate", "3")
    assert code == 2 and "arrival_s" in err


def test_a_budget_names_its_ttft_as_the_batch_prefill(run_cli, tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("deployments:\n  - model: llama-3.1-8b\n    gpu: h100-sxm\n"
                 "    workload: {batch: 8, prompt_tokens: 512, output_tokens: 64}\n"
                 "    limits: {ttft_s: 10s}\n")
    code, out, err = run_cli("check", str(p), "--json")
    assert code == 0, err
    assert "batch TTFT (all prompts at once)" in out


@pytest.mark.parametrize("alias, ours", [("--random-input-len", "-p"),
                                         ("--random-output-len", "-o"),
                                         ("--num-prompts", "-n"),
                                         ("--random-range-ratio", "--range-ratio")])
def test_vllm_bench_names_are_accepted(run_json, alias, ours):
    sim = ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--request-rate", "2"]
    given = {"-n": "20", "-p": "300", "-o": "30", "--range-ratio": "0.2"}
    ours_args = [x for k, v in given.items() for x in (k, v)]
    theirs = [x for k, v in given.items() for x in ((alias if k == ours else k), v)]
    assert run_json(*sim, *theirs) == run_json(*sim, *ours_args)


@pytest.mark.parametrize("args, key, value", [
    (("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--measured-tpot", "14ms"),
     ("measured", "tpot_s"), 0.014),
    (("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--measured-ttft", "0.8"),
     ("measured", "ttft_s"), 0.8),
])
def test_durations_take_units(run_json, args, key, value):
    d = run_json(*args)
    assert d[key[0]][key[1]] == pytest.approx(value)


def test_simulate_slos_take_units(run_json, run_cli):
    sim = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "40", "--request-rate",
           "4")
    a = run_json(*sim, "--ttft-slo", "200ms", "--tpot-slo", "10ms")
    b = run_json(*sim, "--ttft-slo", "0.2", "--tpot-slo", "0.01")
    assert a["request_goodput"] == b["request_goodput"]
    code, _, err = run_cli(*sim, "--ttft-slo", "fast")
    assert code == 2 and "--ttft-slo" in err and "not a time" in err


def test_names_are_case_insensitive_and_unknown_ones_suggest(run_json, run_cli):
    a = run_json("estimate", "-m", "Llama-3.1-8B", "-g", "H100-SXM", "--engine", "VLLM",
                 "--prices", "Hyperscaler-On-Demand")
    b = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm")
    assert (a["model"], a["gpu"], a["tpot_s"]) == (b["model"], b["gpu"], b["tpot_s"])
    assert run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--engine",
                    "VLLM@0.6.3")["tpot_s"] > 0
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8", "-g", "h100-sxm")
    # close names suggested and the lister named, not every known name (300-590 characters)
    assert code == 2 and "did you mean llama-3.1-8b" in err and "llmplan models" in err
    assert len(err) < 250


def test_report_says_when_measurements_are_from_another_device(run_cli, tmp_path):
    """Issue 26: CPU measurements drawn beside an H100 roofline come with a word saying so."""
    from pathlib import Path

    res = Path(__file__).parent / "fixtures" / "measure" / "cpu-results.jsonl"
    code, _, err = run_cli("report", "-m", "tiny-llama-test", "-g", "h100-sxm", "--measured",
                           str(res), "--out", str(tmp_path), "--serving-requests", "0")
    text = " ".join(err.split())
    assert code == 0, err
    assert "was measured on AMD EPYC (cpu), not on h100-sxm" in text


def test_task_progress_draws_on_a_terminal_only(monkeypatch, capsys):
    import sys

    from planner.cli import progress

    monkeypatch.setattr(progress, "SHOW_AFTER_TASK_S", 0.0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with progress.task_progress("replaying served runs", total=3) as advance:
        for i in range(3):
            advance(f"run {i}")
    assert "replaying served runs" in capsys.readouterr().err
    with progress.task_progress("replaying served runs", total=3, enabled=False) as advance:
        advance("x")  # --json: nothing drawn
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    with progress.task_progress("replaying served runs", total=3) as advance:
        advance("x")  # a pipe or a log: nothing drawn
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_plan_shows_progress_on_a_terminal_not_under_json(on_a_terminal, monkeypatch):
    # the bar drawn from the first configuration sized, whatever the machine's speed (the
    # default waits 2 s); under --json none even so
    monkeypatch.setenv("LLMPLAN_PROGRESS_AFTER_S", "0")
    plan = ["plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "2048", "-o", "256",
            "--ttft", "3s", "--tpot", "50ms", "--rps", "5", "--sim-requests", "50"]
    code, _, seen = on_a_terminal(plan)
    assert code == 0 and b"sizing configurations" in seen
    code, _, seen = on_a_terminal([*plan, "--json"])
    assert code == 0 and b"sizing configurations" not in seen


def test_a_block_size_vllm_refuses_is_refused(run_cli, run_json):
    """vLLM's --block-size takes 1, 8, 16, 32, 64, 128 (and 256 later): 7 is refused under
    its profiles, in one line; SGLang's page size is any size."""
    code, _, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "10",
                           "--block-size", "7")
    assert code == 2 and "--block-size: vLLM takes 1, 8, 16" in err
    assert len(err.strip().splitlines()) == 1
    assert run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "10",
                    "--block-size", "32")["completed"] == 10
    assert run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "10",
                    "--block-size", "7", "-e", "sglang")["completed"] == 10


@pytest.mark.parametrize(("x", "digits", "want"), [
    (1130.4, 3, "1,130"), (999.7, 3, "1,000"), (12.345, 3, "12.3"), (1.5, 3, "1.5"),
    (0.0456, 3, "0.0456"), (23_590.0, 4, "23,590"), (104_913.0, 4, "104,900"), (0.0, 3, "0"),
    (-1234.0, 3, "-1,230"), (5e-6, 3, "0.000005")])
def test_significant_digits_never_in_exponent_form(x, digits, want):
    from planner.io import fmt

    assert fmt.sig(x, digits) == want


def test_seconds_and_prefixes_round_before_choosing_the_unit():
    """A figure just under a unit's boundary rounds into the next unit, and a long one groups
    its thousands: no "1e+03 ms", "1.13e+03 s" or "1e+03 G" (a review of 2026-12-04 found
    them in estimate's latency, its --explain totals and sweep's TTFT)."""
    from planner.io import fmt

    assert fmt.seconds(1130.4) == "1,130 s"
    assert fmt.seconds(0.99996) == "1 s"
    assert fmt.seconds(0.0009996) == "1 ms"
    assert fmt.seconds(0.0123) == "12.3 ms"
    assert fmt.si(999.7e9, "FLOP") == "1 TFLOP"
    assert fmt.si(1.234e18, "FLOP") == "1,230 PFLOP"
    assert fmt.count(999.7e9) == "1T"
    assert fmt.per_s(3.4512) == "3.45" and fmt.per_s(12_652.4) == "12,652"


def test_long_runs_print_no_exponents(run_cli):
    code, out, _ = run_cli("estimate", "-m", "llama-3.1-70b", "-g", "a100-sxm-80gb", "--tp", "8",
                           "-b", "256", "-p", "8192", "-o", "8192", "--explain")
    assert code == 0 and "e+0" not in out
    code, out, _ = run_cli("sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "1000")
    assert code == 0 and "e+0" not in out


def test_a_deployment_that_does_not_fit_says_so_beside_its_timing_and_cost(run_cli):
    """estimate still prices a deployment that does not fit (what it would take with the
    memory it lacks), but says so where the figures are, and why it does not fit."""
    code, out, _ = run_cli("estimate", "-m", "llama-3.1-405b", "-g", "h100-sxm",
                           "--weights", "bf16")
    assert code == 0
    lines = out.splitlines()
    assert any(ln.startswith("Timing") and "does not fit" in ln for ln in lines)
    assert any(ln.startswith("per 1M output tokens") and "does not fit" in ln for ln in lines)
    assert "the weights alone" in out and "no room for the KV cache" in out
    code, out, _ = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "1000")
    assert code == 0 and "this batch's KV cache" in out
    code, out, _ = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "64")
    assert code == 0 and "does not fit" not in out


@pytest.mark.parametrize("args", [
    ("estimate", "-m", "\x1b]0;pwned\x07", "-g", "h100-sxm"),
    ("estimate", "-m", "llama-3.1-8b", "-g", "h100\x1b[2J"),
    ("plan", "-m", "llama-3.1-8b", "--rps", "1", "--ttft", "1s", "--tpot", "50ms",
     "--prices", "\x1b[2Jowned")])
def test_an_error_quoting_a_terminal_escape_writes_it_escaped(run_cli, args):
    """An error line quotes what the user gave; a control character in it is written as its
    escape, not sent to the terminal (it had cleared the screen or retitled the window)."""
    code, _, err = run_cli(*args)
    assert code == 2 and "\\x1b" in err
    assert all(c.isprintable() for c in err.strip())


def test_file_errors_say_what_was_found_in_plain_words(run_cli, tmp_path):
    """A fuzz helper's reading of 262 error lines: an empty file had said 'got NoneType', a
    truncated JSON stopped at 'starting at', an emptied price entry 'Unable to extract tag
    using discriminator _entry_kind()', and a bad offer also 'Tuple should have at least 1
    item after validation, not 0'."""
    from pathlib import Path

    def err_of(*args):
        code, _, err = run_cli(*args)
        assert code == 2 and len(err.strip().splitlines()) == 1
        return err

    empty = tmp_path / "m.yaml"
    empty.write_text("")
    assert "the file is empty" in err_of("estimate", "-m", str(empty), "-g", "h100-sxm")
    listed = tmp_path / "l.yaml"
    listed.write_text("- a\n- b\n")
    assert "got a list of 2 items" in err_of("estimate", "-m", str(listed), "-g", "h100-sxm")
    cut = tmp_path / "c.json"
    cut.write_text('{"name": "abc')
    assert "starting at line 1 column 10" in err_of("estimate", "-m", str(cut), "-g",
                                                    "h100-sxm")
    text = (Path(__file__).parents[1] / "planner" / "data" / "prices" /
            "hyperscaler-on-demand.yaml").read_text()
    i, j = text.index("  gb200:\n"), text.index("  h100-nvl:\n")
    emptied = tmp_path / "p.yaml"
    emptied.write_text(text[:i] + "  gb200:\n" + text[j:])
    e = err_of("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--prices", str(emptied))
    assert "gpus.gb200: expected a price entry" in e and "discriminator" not in e
    bad = tmp_path / "q.yaml"
    bad.write_text(text.replace("usd_per_gpu_hour: 6.98", "usd_per_gpu_hour: abc", 1))
    e = err_of("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--prices", str(bad))
    assert "got 'abc'" in e and "at least" not in e


def test_validate_names_an_unknown_engine_as_the_options_fault(run_cli):
    code, _, err = run_cli("validate", "--engine", "vllmm", "--no-served", "--no-rows")
    assert code == 2 and err.startswith("llmplan: error: --engine: unknown engine 'vllmm'")
    assert "validation row" not in err


def test_messages_name_the_field_and_the_value(run_cli, tmp_path):
    """More of a fuzz helper's findings: each refusal names the field it is about and the
    value found, and blames an option (not a budget's line) for the option's fault."""
    import json
    from pathlib import Path

    root = Path(__file__).parents[1]

    def err_of(*args):
        code, _, err = run_cli(*args)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        return err

    rows = tmp_path / "d.jsonl"
    rows.write_text('{"prompt_tokens": 10, "output_tokens": -1}\n')
    assert "row 1: output_tokens: must be in 1..10,000,000, got -1" in err_of(
        "simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--dataset", str(rows))
    gpu = tmp_path / "g.yaml"
    gpu.write_text((root / "hardware_db" / "h100-sxm.yaml").read_text().replace(
        "memory_bandwidth_gb_per_s: 3350", "memory_bandwidth_gb_per_s: 31", 1))
    e = err_of("estimate", "-m", "llama-3.1-8b", "-g", str(gpu))
    assert "the datasheet's memory_bandwidth_gb_per_s, 31 GB/s" in e and "(top level)" not in e
    cfg = json.loads((root / "tests" / "fixtures" / "hf" / "llama-3.1-8b.json").read_text())
    big = tmp_path / "big.json"
    big.write_text(json.dumps(cfg).replace('"hidden_size": 4096', '"hidden_size": 1e999'))
    assert "big.json:1: hidden_size: 1e999" in err_of("estimate", "-m", str(big), "-g",
                                                     "h100-sxm")
    e = err_of("check", "examples/budget.yaml", "--prices", "nosuch")
    assert e.startswith("llmplan: error: --prices: unknown price set") and "budget.yaml" not in e
    assert "--engine: unknown engine" in err_of("check", "examples/budget.yaml", "--engine", "x")
    assert "0.001 <= USD" in err_of("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                                    "--price", "h100-sxm=1e-320")
    e = err_of("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--tp", "2", "--tp", "")
    assert "--tp ''" in e


def test_plan_takes_request_rate_as_simulate_names_it(run_cli):
    base = ("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--ttft", "1s", "--tpot", "50ms",
            "--top", "1", "--disaggregated", "off", "--json")
    a, b = run_cli(*base, "--rps", "5"), run_cli(*base, "--request-rate", "5")
    assert a[0] == b[0] == 0 and a[1] == b[1]
    code, _, err = run_cli(*base, "--rps", "5", "--request-rate", "6")
    assert code == 2 and "disagree" in err


@pytest.mark.parametrize(("args", "want"), [
    (("simulate", "-o", "abc"), "llmplan simulate: error: --output-tokens: 'abc': Input should"),
    (("estimate", "-b", "1.5"), "llmplan estimate: error: --batch: '1.5': Input should"),
    (("estimate", "--attention=foo"), "llmplan estimate: error: --attention: 'foo' is not one")])
def test_a_value_the_parser_refuses_names_one_option_and_the_value(run_cli, args, want):
    """Said as llmplan's own refusals are: the option's long name and the value given, not
    every alias of it ("Invalid value for '--output-tokens' / '-o' / '--random-output-len' /
    '--output-len'") without the value."""
    code, _, err = run_cli(args[0], "-m", "llama-3.1-8b", "-g", "h100-sxm", *args[1:])
    assert code == 2 and err.startswith(want) and "Invalid value for" not in err


@pytest.mark.parametrize(("args", "want"), [
    (("simulate", "--rps", "3"), "No such option: --rps; simulate calls it --request-rate"),
    (("simulate", "--ttft", "1"), "No such option: --ttft; simulate calls it --ttft-slo"),
    (("estimate", "--kv-dtype", "fp8"),
     "No such option: --kv-dtype; estimate calls it --kv-cache-dtype")])
def test_another_commands_name_for_an_option_is_translated(run_cli, args, want):
    """click guessed by spelling (simulate --rps: "Possible options: --ep, --pp, --tp");
    a name plan or an engine's tool uses for an option this command has is named."""
    code, _, err = run_cli(args[0], "-m", "llama-3.1-8b", "-g", "h100-sxm", *args[1:])
    assert code == 2 and want in err
    # a name no command of ours has for one this command takes: click's guess stands
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--rps", "3")
    assert code == 2 and "calls it" not in err
