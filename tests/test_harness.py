"""`llmplan measure` on the CPU, for real: lines, fields, resume after a kill, caps, OOM."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from planner.io import catalog  # noqa: E402

# Each run of LLMPLAN imports torch in a new process (seconds): the tests that start one, or
# use the calibration fixture that does, are marked slow; -m "not slow" keeps the rest.
ROOT = Path(__file__).resolve().parent.parent
LLMPLAN = [sys.executable, "-m", "planner"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


# The tests of what measure writes, resumes and refuses run on a shared 2-core machine whose
# load would mark their points noisy (harness.bench.NOISY_SPREAD): they loosen the limits.
# The tests of noise below keep them.
LOOSE = ["--max-spread", "1e6", "--max-drift", "1e6"]


def llmplan(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    loose = LOOSE if args[0] == "measure" and not {"--max-spread", "--max-drift"} & set(args) \
        else []
    return subprocess.run([*LLMPLAN, *args, *loose], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cal") / "cpu.yaml"
    r = llmplan("measure", "--calibrate", "--device", "cpu", "--quick-calibration",
                "--calibration-out", str(path), "--threads", "1")
    assert r.returncode == 0, r.stderr
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow
def test_calibration_is_plausible(calibration):
    cal = catalog.load_calibration(calibration)
    assert 0.5 < cal.memory_bandwidth_gb_per_s < 5000  # any CPU from a laptop to a server
    bf16 = cal.matmul_tflops[next(k for k in cal.matmul_tflops if k.value == "bf16")]
    assert 1e-4 < bf16 < 200
    assert 0 < cal.kernel_overhead_us < 1000
    # fp8 is timed where a _scaled_mm kernel exists (this CPU build has one), else recorded
    assert "fp8" in {k.value for k in cal.matmul_tflops} or cal.details["skipped"]["fp8"]
    assert cal.details["bandwidth"]["copy_bytes_per_s"] > 0


@pytest.mark.slow
def test_estimate_uses_the_calibration(calibration, run_json):
    d = run_json("estimate", "-m", "gpt2", "-g", "h100-sxm", "-p", "512",
                 "--calibration", str(calibration))
    cal = catalog.load_calibration(calibration)
    assert d["ceilings_source"].startswith("calibration")
    assert d["bandwidth_bytes_per_s"] == pytest.approx(cal.memory_bandwidth_gb_per_s * 1e9)


@pytest.mark.slow
def test_measure_tiny_model_for_real(calibration, tmp_path):
    out, prom = tmp_path / "m.jsonl", tmp_path / "m.prom"
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1,2", "-c",
                "32,64", "--calibration", str(calibration), "--out", str(out), "--budget-s",
                "0.05", "--threads", "1", "--prometheus", str(prom))
    assert r.returncode == 0, r.stderr
    recs = lines(out)
    assert len(recs) == 4 and all(x["status"] == "ok" for x in recs)
    for x in recs:
        t = x["measured"]["tpot_s"]
        assert 0 < t["p10_s"] <= t["median_s"] <= t["p90_s"] and t["reps"] >= 5
        assert x["measured"]["ttft_s"] > 0
        assert x["env"]["harness_version"] and x["env"]["torch"] and x["env"]["device"]["name"]
        assert x["prediction"]["calibrated"]["tpot_s"] > 0
        assert x["prediction"]["datasheet"] is None  # a CPU has no datasheet entry
        assert x["error"]["calibrated"]["tpot_frac"] == pytest.approx(
            x["prediction"]["calibrated"]["tpot_s"] / t["median_s"] - 1)
        assert 0 < x["utilisation"]["calibrated"]["mbu"]
        assert x["telemetry"]["samples"] >= 1
    assert [(x["config"]["batch"], x["config"]["context"]) for x in recs] == \
        [(1, 32), (1, 64), (2, 32), (2, 64)]
    assert "Predicted vs measured" in r.stdout and "median |error|" in r.stdout
    from prometheus_client.parser import text_string_to_metric_families
    fams = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    tpot = fams["llmplan_tpot_seconds"].samples
    assert len(tpot) == 4 and {s.labels["batch"] for s in tpot} == {"1", "2"}
    assert {"device", "model", "precision", "batch", "context"} <= set(tpot[0].labels)


@pytest.mark.slow
def test_killed_run_keeps_lines_and_resume_completes(calibration, tmp_path):
    out = tmp_path / "k.jsonl"
    args = ["measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1,2,3", "-c",
            "16,32,48,64", "--calibration", str(calibration), "--out", str(out),
            "--budget-s", "0.1", "--threads", "1", *LOOSE]  # ~0.3 s a point: killed early
    p = subprocess.Popen([*LLMPLAN, *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)  # no chance to clean up: only fsynced lines survive
    p.wait()
    before = lines(out)
    assert 3 <= len(before) < 12, "the run finished before it could be killed"
    r = llmplan(*args, "--resume")
    assert r.returncode == 0, r.stderr
    after = lines(out)
    keys = [(x["config"]["batch"], x["config"]["context"]) for x in after]
    assert len(after) == 12 and len(set(keys)) == 12
    assert after[:len(before)] == before  # finished points were kept, not redone


@pytest.mark.slow
def test_points_over_the_memory_cap_are_skipped(calibration, tmp_path):
    out = tmp_path / "cap.jsonl"
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1,64", "-c",
                "64,4096", "--calibration", str(calibration), "--out", str(out),
                "--max-memory", "0.02", "--budget-s", "0.05", "--threads", "1")
    assert r.returncode == 0, r.stderr
    recs = {(x["config"]["batch"], x["config"]["context"]): x for x in lines(out)}
    assert recs[(1, 64)]["status"] == "ok"
    big = recs[(64, 4096)]
    assert big["status"] == "skipped" and "exceeds the 0.02 GiB cap" in big["reason"]


@pytest.mark.slow
def test_unsupported_precision_is_recorded(calibration, tmp_path):
    out = tmp_path / "fp8.jsonl"
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1", "-c", "16",
                "--weights", "int4,int8", "--calibration", str(calibration), "--out", str(out),
                "--budget-s", "0.05", "--threads", "1")
    assert r.returncode == 0, r.stderr
    recs = {x["config"]["weights"]: x for x in lines(out)}
    assert recs["int8"]["status"] == "ok"  # weight-only int8 runs on the CPU
    assert recs["int4"]["status"] == "ok"  # and int4 (tinygemm's CPU kernel)
    # a shape the decoder does not build (GPT-2: LayerNorm, plain MLP) is a recorded skip
    out2 = tmp_path / "gpt2.jsonl"
    r = llmplan("measure", "-m", "gpt2", "--layers", "1", "--device", "cpu", "-b", "1", "-c",
                "16", "--calibration", str(calibration), "--out", str(out2), "--budget-s",
                "0.05", "--threads", "1")
    (rec,) = lines(out2)
    assert rec["status"] == "skipped" and "Llama-shaped" in rec["reason"]


@pytest.mark.slow
def test_a_run_that_measured_nothing_exits_1(calibration, tmp_path):
    out = tmp_path / "none.jsonl"
    r = llmplan("measure", "-m", "gpt2", "--layers", "1", "--device", "cpu", "-b", "1", "-c",
                "16", "--calibration", str(calibration), "--out", str(out),
                "--budget-s", "0.05", "--threads", "1")
    assert r.returncode == 1 and "no point was measured" in r.stderr
    assert [x["status"] for x in lines(out)] == ["skipped"]  # the record is still written


@pytest.mark.slow
def test_oom_skips_larger_contexts_of_that_batch(calibration, tmp_path, monkeypatch):
    from harness import measure
    from harness.device import detect

    calls = []

    def fake_point(dec, plan, info, batch, context, time_fn):
        calls.append((batch, context))
        if batch == 2 and context >= 32:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return {"measured": {"tpot_s": {"median_s": 1e-3}, "ttft_s": 2e-3}, "telemetry": {}}

    monkeypatch.setattr(measure, "_measure_point", fake_point)
    plan = measure.Plan(model=catalog.load_model("tiny-llama-test"), layers=4,
                        weights=["bf16"], kv_cache="bf16", batches=[1, 2, 4],
                        contexts=[16, 32, 64], max_memory_bytes=1e12, out=tmp_path / "o.jsonl")
    recs = measure.run(plan, detect("cpu"), catalog.load_calibration(calibration), None)
    status = {(r["config"]["batch"], r["config"]["context"]): r["status"] for r in recs}
    assert status[(2, 32)] == "oom" and status[(2, 64)] == "skipped"
    assert (2, 64) not in calls  # never attempted
    assert status[(4, 16)] == "ok" and status[(1, 64)] == "ok"
    assert len(lines(plan.out)) == 9


@pytest.mark.slow
def test_device_cuda_without_cuda_exits_3():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = llmplan("measure", "--device", "cuda", "-m", "tiny-llama-test")
    assert r.returncode == 3 and "no CUDA device" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_measure_bad_input(calibration):
    r = llmplan("measure", "-m", "mixtral-8x7b", "--device", "cpu", "--layers", "99",
                "--calibration", str(calibration))
    assert r.returncode == 2 and "--layers: 99 exceeds" in r.stderr


@pytest.mark.slow
def test_report_draws_measurements(calibration, tmp_path, run_cli):
    out = tmp_path / "r.jsonl"
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1", "-c",
                "16,32", "--calibration", str(calibration), "--out", str(out), "--budget-s",
                "0.05", "--threads", "1")
    assert r.returncode == 0, r.stderr
    code, stdout, err = run_cli("report", "-m", "tiny-llama-test", "-g", "h100-sxm",
                                "--measured", str(out), "--out", str(tmp_path / "rep"))
    assert code == 0, err
    import pandas as pd
    acc = pd.read_csv(next((tmp_path / "rep").glob("*predicted_vs_measured.csv")))
    assert set(acc.metric) == {"TPOT", "TTFT"}
    assert len(acc[acc.ceilings == "calibrated"]) == 4  # 2 points x TPOT, TTFT
    # TPOT again with the harness's profiled kernel count in place of the planner's
    assert set(acc[acc.ceilings == "calibrated_harness_kernels"].metric) == {"TPOT"}
    roof = pd.read_csv(next((tmp_path / "rep").glob("*roofline.csv")))
    assert (roof.series == "measured").sum() == 2


@pytest.mark.slow
def test_measure_output_paths_are_checked_first(tmp_path):
    for args, needle in ((["--out", str(tmp_path / "missing" / "x.jsonl")], "does not exist"),
                         (["--out", str(tmp_path)], "is a directory"),
                         (["--calibration-out", str(tmp_path / "no" / "c.yaml")],
                          "does not exist")):
        r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", *args)
        assert r.returncode == 2 and needle in r.stderr, r.stderr
        assert "calibrating" not in r.stderr  # refused before any work
    assert not (tmp_path / "missing").exists()


@pytest.mark.slow
@pytest.mark.parametrize("tail", [b'{"status": "ok", "conf', b""])
def test_resume_cuts_a_torn_last_line_before_appending(calibration, tmp_path, tail):
    """A kill mid-write leaves a fragment; the resumed run must not append onto it (seen
    once in 147 random interrupts before the fix: an invalid line and a point measured
    twice)."""
    out = tmp_path / "t.jsonl"
    args = ["measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1", "-c", "16,32",
            "--calibration", str(calibration), "--out", str(out), "--budget-s", "0.02",
            "--threads", "1"]
    assert llmplan(*args).returncode == 0
    first = out.read_bytes().splitlines(keepends=True)[0]
    out.write_bytes(first + tail)
    r = llmplan(*args, "--resume")
    assert r.returncode == 0, r.stderr
    recs = lines(out)  # every line is JSON: nothing was glued to the fragment
    assert [x["config"]["context"] for x in recs] == [16, 32]
    assert json.loads(first) == recs[0]


def test_repair_tail_keeps_a_whole_record_without_its_newline(tmp_path):
    from harness.measure import repair_tail

    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"a": 1}\n{"b": 2}')
    assert repair_tail(p).startswith("newline")
    assert p.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    p.write_bytes(b'{"a": 1}\n{"b": ')
    assert repair_tail(p).startswith("cut")
    assert p.read_bytes() == b'{"a": 1}\n'
    assert repair_tail(p) is None


@pytest.mark.slow
def test_resume_keeps_the_recorded_calibration(calibration, tmp_path):
    out = tmp_path / "c.jsonl"
    base = ["measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1", "--out",
            str(out), "--budget-s", "0.02", "--threads", "1"]
    assert llmplan(*base, "-c", "16", "--calibration", str(calibration)).returncode == 0
    # no --calibration: the recorded one is used, nothing is measured again
    r = llmplan(*base, "-c", "16,32", "--resume")
    assert r.returncode == 0 and "recorded in" in r.stderr and "calibrating" not in r.stderr
    recs = lines(out)
    assert len({json.dumps(x["env"]["calibration"], sort_keys=True) for x in recs}) == 1
    # another calibration on a resumed file is refused: one file, one calibration
    other = tmp_path / "other.yaml"
    other.write_text(calibration.read_text().replace("memory_bandwidth_gb_per_s:",
                                                     "memory_bandwidth_gb_per_s: 1.5 #"))
    r = llmplan(*base, "-c", "16,32,48", "--resume", "--calibration", str(other))
    assert r.returncode == 2 and "differs from the calibration" in r.stderr


@pytest.mark.slow
def test_calibration_covers_only_the_measured_precisions_and_is_reused(tmp_path):
    from harness.calibrate import needed_dtypes

    assert needed_dtypes(["bf16"]) == ("bf16",)
    assert needed_dtypes(["int8", "fp16", "bf16", "fp8"]) == ("bf16", "fp16", "fp8")
    # fp8 weights: attention and the head run in bf16, which the prediction needs the rate of
    assert needed_dtypes(["fp8"]) == ("fp8", "bf16")
    out = tmp_path / "m.jsonl"
    args = ["measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1", "-c", "16",
            "--out", str(out), "--budget-s", "0.02", "--threads", "1", "--quick-calibration"]
    r = llmplan(*args)
    assert r.returncode == 0, r.stderr
    prof = catalog.load_calibration(out.with_suffix(".calibration.yaml"))
    assert {k.value for k in prof.matmul_tflops} == {"bf16"}  # no fp16 timing on a bf16 run
    r = llmplan(*args)
    assert "reusing the calibration" in r.stderr and "calibrating" not in r.stderr
    r = llmplan(*args, "--weights", "fp16")  # a precision the profile lacks: measured anew
    assert "calibrating" in r.stderr and r.returncode == 0
    r = llmplan(*args, "--recalibrate")
    assert "calibrating" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.05, 0.5, 2.0])
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(calibration, tmp_path, delay_s):
    """Start-up (imports), calibration loading, measuring: SIGINT never prints a
    traceback; a finished command keeps its own exit code."""
    out = tmp_path / "i.jsonl"
    p = subprocess.Popen([*LLMPLAN, "measure", "-m", "tiny-llama-test", "--device", "cpu",
                          "-b", "1,2,3,4", "-c", "16,32,64", "--calibration", str(calibration),
                          "--out", str(out), "--budget-s", "0.2", "--threads", "1", *LOOSE],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay_s)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    frames = re.findall(r'File "([^"]+)"', err)
    if frames and not any(("/planner/" in f or "/harness/" in f) for f in frames):
        return  # on a loaded machine the signal beat the interpreter's own start-up (runpy)
    assert "Traceback" not in err, err
    if p.returncode == -signal.SIGINT and not err.strip():
        return  # killed before the interpreter had installed its own SIGINT handler
    assert p.returncode in (130, 0), err
    if p.returncode == 130:
        assert [ln for ln in err.splitlines() if ln.startswith("llmplan: interrupted")], err


@pytest.mark.slow
def test_each_point_records_memory_and_kernels(calibration, tmp_path):
    out = tmp_path / "mk.jsonl"
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "2", "-c", "32",
                "--calibration", str(calibration), "--out", str(out), "--budget-s", "0.02",
                "--threads", "1")
    assert r.returncode == 0, r.stderr
    (rec,) = lines(out)
    m = catalog.load_model("tiny-llama-test")
    mem, pred = rec["measured"]["memory"], rec["memory"]
    # every weight the decoder holds is the memory model's weight figure, byte for byte
    assert mem["weights_bytes"] == pred["predicted_weights_bytes"]
    # K and V, 4 layers, 2 sequences x 32 tokens, 2 KV heads of 32 dims, bf16
    kv = 2 * m.num_layers * 2 * 32 * m.num_kv_heads * m.head_dim_ * 2
    assert mem["kv_cache_bytes"] == pred["predicted_kv_cache_bytes"] == kv
    if "peak_rss_bytes" in mem:  # Linux: the process holds at least the tensors
        assert mem["peak_rss_bytes"] > mem["weights_bytes"] + mem["kv_cache_bytes"]
    # a layer is at least norm, qkv, rope, attention, o, norm, gate_up, act, down: 9 or more
    k = rec["measured"]["decode_kernels"]
    assert k >= 9 * m.num_layers and rec["measured"]["decode_kernels_method"]
    adj = rec["prediction"]["calibrated_harness_kernels"]
    base = rec["prediction"]["calibrated"]
    assert adj["tpot_s"] == pytest.approx(
        base["tpot_s"] + (k - base["decode_kernels"]) * base["kernel_overhead_s"])


def test_oom_is_recognised_through_a_graph_capture_error():
    from harness.bench import is_oom as _is_oom

    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except RuntimeError as inner:
            raise RuntimeError("CUDA error: operation failed due to a previous error "
                               "during capture") from inner
    except RuntimeError as outer:
        assert _is_oom(outer)
    assert _is_oom(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert _is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. "
                                "DefaultCPUAllocator: can't allocate memory: you tried to "
                                "allocate 2560000000000 bytes. Error code 12"))
    assert not _is_oom(RuntimeError("expected scalar type BFloat16 but found Float"))


@pytest.mark.parametrize("args, says", [
    (["-m", "nosuch"], "unknown model 'nosuch'"),
    (["-b", "-1"], "--batch: '-1'"),
    (["--weights", "int3"], "--weights: 'int3'"),
    (["--steps", "0"], "--steps: 0"),
    (["--calibration", "/nonexistent.yaml"], "/nonexistent.yaml: no such file"),
    (["--steps", "abc"], "--steps: invalid int value: 'abc'"),
])
def test_kernel_breakdown_refuses_bad_input_in_one_line(args, says):
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_kernels.py"
    r = subprocess.run([sys.executable, str(script), "--device", "cpu", "-m", "tiny-llama-test",
                        "--prefill", "", "--steps", "1", *args], capture_output=True,
                       text=True, env=ENV, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gpu_kernels: error:")]
    assert len(lines) == 1 and says in lines[0], r.stderr[-2000:]


def test_nvml_is_opened_by_uuid_not_index():
    from harness.device import DeviceInfo, nvml_handle

    calls = []

    class FakeNvml:
        def nvmlInit(self):
            calls.append("init")

        def nvmlDeviceGetHandleByUUID(self, uuid):
            calls.append(("uuid", uuid))
            return "by-uuid"

        def nvmlDeviceGetHandleByIndex(self, i):
            calls.append(("index", i))
            return "by-index"

    info = DeviceInfo(kind="cuda", name="H100", memory_bytes=1, torch_version="x",
                      uuid="GPU-1234")
    assert nvml_handle(FakeNvml(), info) == "by-uuid" and ("uuid", "GPU-1234") in calls
    info = DeviceInfo(kind="cuda", name="H100", memory_bytes=1, torch_version="x")
    assert nvml_handle(FakeNvml(), info) == "by-index"
    assert "index 0" in info.extra["nvml_device"]  # the record says it could not be sure


def test_int8_without_a_kernel_is_a_recorded_skip(monkeypatch):
    from harness import decoder

    def missing(*a, **k):
        raise NotImplementedError("Could not run 'aten::_weight_int8pack_mm' with arguments "
                                  "from the 'CUDA' backend")

    monkeypatch.setattr(torch, "_weight_int8pack_mm", missing)
    monkeypatch.setattr(decoder, "_INT8_OK", {})
    with pytest.raises(decoder.UnsupportedConfig, match="no kernel"):
        decoder.Linear(64, 64, weights="int8", dtype=torch.bfloat16, device="cpu")


@pytest.mark.slow
def test_attention_backend_choices(calibration):
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "--attention-backend",
                "flash", "--calibration", str(calibration))
    assert r.returncode == 2 and "needs a CUDA device" in r.stderr
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "--attention-backend",
                "sdpa", "--calibration", str(calibration))
    assert r.returncode == 2 and "is not one of" in r.stderr


def test_fp8_linear_matches_its_dequantized_weights():
    from harness.decoder import Linear, UnsupportedConfig, fp8_unsupported

    if fp8_unsupported("cpu"):
        with pytest.raises(UnsupportedConfig):
            Linear(256, 512, weights="fp8", dtype=torch.bfloat16, device="cpu")
        return
    torch.manual_seed(0)
    lin = Linear(256, 512, weights="fp8", dtype=torch.bfloat16, device="cpu")
    assert lin.w.dtype == torch.float8_e4m3fn and lin.nbytes == 256 * 512 + 4
    x = torch.randn(3, 5, 256, dtype=torch.bfloat16)
    y = lin(x)
    ref = torch.nn.functional.linear(x.float(), lin.w.float() * lin.scale)
    # the only difference is the activations' own e4m3 rounding (3 mantissa bits: < 6.25%)
    assert y.shape == (3, 5, 512)
    assert (y.float() - ref).abs().max() / ref.abs().max() < 0.0625


@pytest.mark.slow
def test_a_calibration_without_the_measured_precision_is_refused(tmp_path):
    cal = tmp_path / "bf16-only.yaml"
    cal.write_text("device: cpu\nmemory_bandwidth_gb_per_s: 20\nmatmul_tflops: {bf16: 0.2}\n"
                   "kernel_overhead_us: 5\n")
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "--weights", "fp16",
                "--calibration", str(cal), "--out", str(tmp_path / "x.jsonl"))
    assert r.returncode == 2 and "no fp16 matmul rate" in r.stderr


@pytest.mark.slow
def test_gpu_validate_script_runs_end_to_end_on_cpu(tmp_path):
    """benchmarks/gpu_validate.sh with DEVICE=cpu: every step, the engines table, the
    report; then a second run resumes (nothing is measured twice)."""
    env = {**ENV, "DEVICE": "cpu", "PYTHON": sys.executable}
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_validate.sh"
    r = subprocess.run(["bash", str(script), str(tmp_path / "v")], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "median |error| per engine" in r.stdout and "vllm" in r.stdout
    v = tmp_path / "v"
    first = (v / "tiny-llama-test-bf16.jsonl").read_text()
    assert len(first.splitlines()) == 6 and (v / "engines.csv").exists()
    # the fp8 step: one point on a CPU (emulated fp8 is slow on some)
    assert len((v / "tiny-llama-test-fp8.jsonl").read_text().splitlines()) == 1
    assert list((v / "report").glob("*.png"))
    # the operator breakdown: every projection of the decode step found by its weight shape
    recs = [json.loads(x) for x in (v / "kernels" / "breakdown.jsonl").read_text().splitlines()]
    steps = [x for x in recs if "ops" in x]
    assert len(steps) == 2 and any("prefill_tokens" in x for x in recs)
    for x in steps:
        assert [o["op"] for o in x["ops"]][:5] == ["qkv_proj", "o_proj", "mlp_gate_up_proj",
                                                   "mlp_down_proj", "lm_head"]
        assert all(math.isfinite(o["measured_us"]) and o["measured_us"] > 0 for o in x["ops"])
        assert x["ops"][0]["calls"] == 4 and x["ops"][4]["calls"] == 1  # 4 layers, 1 head
    r = subprocess.run(["bash", str(script), str(v)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0
    assert (v / "tiny-llama-test-bf16.jsonl").read_text() == first  # resumed, not redone


@pytest.mark.slow
def test_compiled_layer_computes_what_the_eager_one_does():
    """--mode compile (the default on CUDA) runs the same math through torch.compile: the
    logits of a decode step and of a prefill agree with eager ones, weights shared."""
    from harness.decoder import Decoder, layer_math

    torch.manual_seed(0)
    m = catalog.load_model("tiny-llama-test")
    d = Decoder(m, layers=2, batch=1, max_tokens=1)
    d.alloc_cache(2, 24)
    tok = torch.randint(0, m.vocab_size, (2, 1))
    prompt = torch.randint(0, m.vocab_size, (2, 16))
    with torch.inference_mode():
        eager = (d.prefill(prompt), d.decode_step(tok, 16), d.decode_step(tok, 23))
        d.compiled = torch.compile(layer_math, dynamic=True)
        compiled = (d.prefill(prompt), d.decode_step(tok, 16), d.decode_step(tok, 23))
    for a, b in zip(eager, compiled, strict=True):
        assert torch.allclose(a, b, rtol=0.05, atol=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["int8", "int4", "fp8"])
def test_compiled_layer_takes_quantized_weights(weights):
    """Quantized weights run through the compiled layer too (as gpt-fast and the engines run
    them: the activations' fp8 quantizing fused with its neighbours), computing what the
    eager layer computes, from one compilation for every layer and step."""
    from harness.decoder import Decoder, UnsupportedConfig

    torch.manual_seed(0)
    torch._dynamo.reset()
    m = catalog.load_model("tiny-llama-test")
    try:
        d = Decoder(m, layers=2, batch=1, max_tokens=1, weights=weights, compile=True)
    except UnsupportedConfig as err:  # no kernel for it in this torch build
        pytest.skip(str(err))
    assert d.mode == "compiled" and d.mode_reason is None
    assert isinstance(d.layers[0].qkv.args, tuple) and d.layers[0].qkv.args[0] == weights
    d.alloc_cache(2, 24)
    tok = torch.randint(0, m.vocab_size, (2, 1))
    prompt = torch.randint(0, m.vocab_size, (2, 16))
    with torch.inference_mode():
        compiled = (d.prefill(prompt), d.decode_step(tok, 16), d.decode_step(tok, 23))
        d.compiled = None
        eager = (d.prefill(prompt), d.decode_step(tok, 16), d.decode_step(tok, 23))
    for a, b in zip(eager, compiled, strict=True):
        assert torch.isfinite(b).all()
        assert torch.allclose(a, b, rtol=0.05, atol=0.05)


def test_kernel_breakdown_finds_each_projection_by_its_weight_shape():
    """benchmarks/gpu_kernels.py names a profiled matmul by the weight among its inputs:
    [k, n] (16-bit, fp8's transposed view), [n, k] (int8's kernel), int4's scales and zeros
    [k / group, n, 2]; o_proj's square weight is not mistaken for qkv's."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from gpu_kernels import match_gemm, weight_dims

    dims = weight_dims(catalog.load_model("llama-3.1-8b"))
    assert dims["qkv_proj"] == (4096, 6144) and dims["mlp_down_proj"] == (14336, 4096)
    assert match_gemm([[1, 4096], [4096, 6144]], dims) == "qkv_proj"
    assert match_gemm([[1, 4096], [4096, 4096]], dims) == "o_proj"
    assert match_gemm([[16, 4096], [4096, 28672], [], []], dims) == "mlp_gate_up_proj"
    assert match_gemm([[64, 14336], [4096, 14336], [4096]], dims) == "mlp_down_proj"
    assert match_gemm([[1, 4096], [768, 32, 32, 4], [32, 6144, 2]], dims) == "qkv_proj"
    assert match_gemm([[1, 4096], [4096, 128256]], dims) == "lm_head"
    assert match_gemm([[1, 4096], [4096, 1000]], dims) is None


def test_int8_cast_path_computes_what_the_int8_kernel_does():
    """On CUDA int8 weights are cast and multiplied as gpt-fast does (aten's int8 kernel is
    10x slower than bf16 there): the same product as aten's kernel, to bf16 rounding."""
    from harness.decoder import _int8_mm

    torch.manual_seed(0)
    w = torch.randint(-128, 128, (96, 64), dtype=torch.int8)
    scale = (torch.rand(96) / 100 + 1e-3).to(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    kernel = _int8_mm(x, w, scale, cast=False)
    cast = _int8_mm(x, w, scale, cast=True)
    ref = (x.double() @ w.double().t()) * scale.double()
    for y in (kernel, cast):
        assert y.shape == (5, 96)
        assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_compiled_decoder_may_compile_every_shape_of_a_sweep():
    """A sweep's (batch, prompt or decode, position) combinations each need a graph: past
    dynamo's default of 8 the layer would fall back to eager unseen."""
    from harness.decoder import RECOMPILE_LIMIT, Decoder

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, 8)
    Decoder(catalog.load_model("tiny-llama-test"), layers=1, batch=1, max_tokens=8,
            compile=True)
    assert getattr(cfg, name) == RECOMPILE_LIMIT >= 32


@pytest.mark.slow
def test_measure_mode_choices(calibration):
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "--mode", "fast",
                "--calibration", str(calibration))
    assert r.returncode == 2 and "--mode" in r.stderr


@pytest.mark.slow
def test_collectives_on_cpu_are_timed_and_feed_the_tp_model(tmp_path, run_json):
    """gloo across 2 processes: all-reduce and all-to-all curves, nccl-tests' bus bandwidth,
    and the fit saved in the profile, which the TP model then uses."""
    prof = tmp_path / "c.yaml"
    prof.write_text("device: cpu\nmemory_bandwidth_gb_per_s: 20\nmatmul_tflops: {bf16: 0.2}\n"
                    "kernel_overhead_us: 5\n")
    r = llmplan("measure", "--device", "cpu", "--collectives", "--calibration", str(prof),
                "--quick-calibration", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["backend"] == "gloo" and res["world_size"] == 2
    for p in res["all_reduce"]:  # 2 ranks: bus = algorithm bandwidth x 2 (n - 1) / n = x 1
        assert p["busbw_bytes_per_s"] == pytest.approx(p["algbw_bytes_per_s"])
        assert p["algbw_bytes_per_s"] == pytest.approx(p["bytes"] / p["time_s"])
    cal = catalog.load_calibration(prof)
    assert cal.allreduce_latency_us > 0 and cal.allreduce_bus_gb_per_s > 0
    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--tp", "2",
                 "--calibration", str(prof))
    # 2 all-reduces a layer x 32 layers, each of batch 1 x 4096 hidden x 2 bytes
    one = 2 * 1 / 2 * 8192 / (cal.allreduce_bus_gb_per_s * 1e9) + cal.allreduce_latency_us / 1e6
    assert d["decode_comm_s"] == pytest.approx(64 * one, rel=1e-6)


def test_int4_linear_is_a_4_bit_copy_of_the_16_bit_one():
    from harness.decoder import Linear

    torch.manual_seed(0)
    ref = Linear(512, 256, weights="bf16", dtype=torch.bfloat16, device="cpu")
    torch.manual_seed(0)
    q = Linear(512, 256, weights="int4", dtype=torch.bfloat16, device="cpu")
    # half a byte a weight plus a bf16 scale and zero per group of 128: the planner's bytes
    assert q.nbytes == 512 * 256 // 2 + (512 // 128) * 256 * 2 * 2
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    a, b = ref(x).float(), q(x).float()
    # 16 levels per group: the output differs by the quantization noise, a few percent
    assert 0.005 < ((a - b).norm() / a.norm()).item() < 0.15


TINY_MOE = Path(__file__).resolve().parent / "fixtures" / "models" / "tiny-mixtral-test.yaml"


def test_experts_route_each_token_to_its_top_k():
    """The grouped dispatch equals the per-token definition: softmax over the k best router
    logits, each chosen expert's gated MLP, weighted and summed."""
    import torch.nn.functional as F

    from harness.decoder import Experts

    torch.manual_seed(0)
    m = catalog.load_model(str(TINY_MOE))
    ex = Experts(m.hidden_size, m.moe, weights="bf16", dtype=torch.float32, device="cpu")
    y = torch.randn(2, 5, m.hidden_size)
    got = ex(y)
    want = torch.zeros_like(y).reshape(-1, m.hidden_size)
    for t, v in enumerate(y.reshape(-1, m.hidden_size)):
        top, idx = (ex.router @ v).topk(m.moe.experts_per_token)
        for wt, e in zip(top.softmax(-1), idx, strict=True):
            g, u = (ex.gate_up[e] @ v).chunk(2)
            want[t] += wt * (ex.down[e] @ (F.silu(g) * u))
    assert torch.allclose(got.reshape(-1, m.hidden_size), want, rtol=1e-4, atol=1e-5)
    assert ex.nbytes == 4 * (4 * 256 + 4 * 3 * 256 * 512)  # router + experts, fp32 here


@pytest.mark.slow
def test_measure_a_moe_model(calibration, tmp_path):
    out = tmp_path / "moe.jsonl"
    r = llmplan("measure", "-m", str(TINY_MOE), "--device", "cpu", "-b", "1,8", "-c", "32",
                "--calibration", str(calibration), "--out", str(out), "--budget-s", "0.02",
                "--threads", "1", "--mode", "compile")
    assert r.returncode == 0, r.stderr
    recs = lines(out)
    assert [x["status"] for x in recs] == ["ok", "ok"]
    for x in recs:  # every expert held: the memory model's weights, byte for byte
        assert x["measured"]["memory"]["weights_bytes"] == x["memory"]["predicted_weights_bytes"]
        assert x["measured"]["mode"] == "eager" and "MoE" in x["measured"]["mode_reason"]


@pytest.mark.slow
@pytest.mark.parametrize("details", ["{skipped: 5, device: 7}", "{skipped: [fp16], device: x}"])
def test_a_damaged_profile_record_is_refused_or_remeasured_not_a_traceback(tmp_path, details):
    prof = tmp_path / "m.calibration.yaml"
    prof.write_text("device: cpu\nmemory_bandwidth_gb_per_s: 20\nmatmul_tflops: {bf16: 0.2}\n"
                    f"kernel_overhead_us: 5\ndetails: {details}\n")
    base = ["measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1", "-c", "16",
            "--out", str(tmp_path / "m.jsonl"), "--budget-s", "0.01", "--threads", "1"]
    r = llmplan(*base, "--weights", "fp16", "--calibration", str(prof))
    assert r.returncode == 2 and "no fp16 matmul rate" in r.stderr  # skipped: not a record
    r = llmplan(*base, "--quick-calibration")  # the saved profile's device record is damaged
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert "calibrating" in r.stderr  # measured again rather than trusted


def test_sliding_window_beyond_the_window_is_a_recorded_skip():
    """The harness attends over the whole context: past a model's window it would measure
    what the planner does not predict, so it refuses rather than compare unlike things."""
    from harness.decoder import Decoder, UnsupportedConfig

    m = catalog.load_model("tiny-llama-test").model_copy(update={"sliding_window": 48})
    dec = Decoder(m, layers=1, batch=1, max_tokens=32)  # within the window: fine
    with pytest.raises(UnsupportedConfig, match="sliding window"):
        dec.alloc_cache(1, 64)


# -- one writer per results file --------------------------------------------------------------

NAMES = ["m.jsonl", "with space.jsonl", "ünïcode.jsonl", "x" * 200 + ".jsonl", ".hidden"]


@pytest.mark.parametrize("name", NAMES)
def test_a_second_writer_of_one_file_is_refused_naming_the_holder(tmp_path, name):
    from harness.measure import lock_path, sole_writer
    from planner.core.errors import LlmplanError

    out = tmp_path / name
    with sole_writer(out):
        assert lock_path(out).read_text().strip() == str(os.getpid())
        for _ in range(3):  # however often it is tried
            with pytest.raises(LlmplanError) as err:
                with sole_writer(out):
                    pytest.fail("two writers held one file")
            msg = str(err.value)
            assert "\n" not in msg and str(out) in msg and f"pid {os.getpid()}" in msg
        with sole_writer(tmp_path / ("other-" + name[:50])):  # another file: no conflict
            pass
    assert not lock_path(out).exists()  # released and removed
    with sole_writer(out):  # and free again
        pass


def test_a_killed_holder_does_not_block_the_next_run(tmp_path):
    """The kernel drops a dead process's flock: the lock file it left is taken over."""
    from harness.measure import lock_path, sole_writer

    out = tmp_path / "k.jsonl"
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from harness.measure "
            "import sole_writer; from pathlib import Path\n"
            f"with sole_writer(Path({str(out)!r})):\n    print('held', flush=True); "
            "time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env=ENV)
    try:
        assert p.stdout.readline().strip() == "held"
        from planner.core.errors import LlmplanError
        with pytest.raises(LlmplanError, match=f"pid {p.pid}"):
            with sole_writer(out):
                pass
    finally:
        p.kill()
        p.wait()
    assert lock_path(out).exists()  # left behind by the kill
    with sole_writer(out):
        pass


@pytest.mark.slow
def test_two_measure_runs_on_one_file_only_one_writes(calibration, tmp_path):
    out = tmp_path / "both.jsonl"
    args = ["measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1,2", "-c", "16,32",
            "--calibration", str(calibration), "--out", str(out), "--budget-s", "0.3",
            "--threads", "1", *LOOSE]
    first = subprocess.Popen([*LLMPLAN, *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=ENV)
    lock = out.with_name(out.name + ".lock")
    deadline = time.time() + 120
    while time.time() < deadline and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.02)
    second = llmplan(*args)
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert second.returncode == 2, second.stderr
    assert second.stderr.count("\n") == 1 and str(out) in second.stderr
    assert f"pid {first.pid}" in second.stderr
    keys = [(x["config"]["batch"], x["config"]["context"]) for x in lines(out)]
    assert sorted(keys) == [(1, 16), (1, 32), (2, 16), (2, 32)]  # each point once


# -- noisy points --------------------------------------------------------------------------

def _timing(median: float, spread: float = 1.05, reps: int = 10) -> dict:
    return {"median_s": median, "p10_s": median * 0.97, "p90_s": median * spread,
            "mean_s": median, "min_s": median * 0.95, "reps": reps, "method": "perf_counter"}


@settings(max_examples=300, deadline=None)
@given(median=st.floats(1e-6, 10), spread=st.floats(1.0, 100), repeat=st.floats(0.01, 200),
       which=st.sampled_from(["tpot_s", "prefill_slice_s", "tpot_repeat_s"]))
def test_noise_is_a_wide_spread_or_a_repeat_that_disagrees(median, spread, repeat, which):
    from harness.measure import NOISY_REPEAT, NOISY_SPREAD, noise

    m = {"tpot_s": _timing(median), "prefill_slice_s": _timing(median * 3),
         "tpot_repeat_s": _timing(median * repeat)}
    m[which]["p90_s"] = m[which]["median_s"] * spread
    a, b = m["tpot_s"]["median_s"], m["tpot_repeat_s"]["median_s"]
    expected = (m[which]["p90_s"] / m[which]["median_s"] > NOISY_SPREAD
                or max(a, b) / min(a, b) > NOISY_REPEAT)
    why = noise(m)
    assert (why is not None) == expected, (spread, repeat, why)
    if why:
        assert "\n" not in why and "busy" in why


def _fake_points(monkeypatch, slow: dict):
    """_measure_point replaced: each point's decode is 2 ms, its repeat slow[(b, c)] times
    that (1 where not given)."""
    from harness import measure

    def fake_point(dec, plan, info, batch, context, time_fn):
        r = slow.get((batch, context), 1.0)
        return {"measured": {"tpot_s": _timing(2e-3), "tpot_repeat_s": _timing(2e-3 * r),
                             "prefill_slice_s": _timing(5e-3), "ttft_s": 5e-3},
                "telemetry": {}}
    monkeypatch.setattr(measure, "_measure_point", fake_point)


def test_noisy_points_are_recorded_warned_and_left_out_of_the_summary(tmp_path, monkeypatch,
                                                                      capsys):
    from harness import measure
    from harness.device import detect

    _fake_points(monkeypatch, {(1, 32): 170.0, (2, 16): 1 / 40})
    plan = measure.Plan(model=catalog.load_model("tiny-llama-test"), layers=4,
                        weights=["bf16"], kv_cache="bf16", batches=[1, 2], contexts=[16, 32],
                        max_memory_bytes=1e12, out=tmp_path / "n.jsonl")
    recs = measure.run(plan, detect("cpu"), catalog.load_calibration(
        ROOT / "tests" / "fixtures" / "measure" / "cpu-calibration.yaml"), None)
    status = {(r["config"]["batch"], r["config"]["context"]): r["status"] for r in recs}
    assert status == {(1, 16): "ok", (1, 32): "noisy", (2, 16): "noisy", (2, 32): "ok"}
    written = lines(plan.out)
    assert [r["status"] for r in written] == [r["status"] for r in recs]
    assert "170.0x slower" in written[1]["reason"] and "faster" in written[2]["reason"]
    err = capsys.readouterr().err
    assert err.count("warning:") == 2 and "batch 1 context 32" in err
    assert "load average" in err and "--threads" in err  # what the busy machine was doing
    s = measure.summarize(recs)
    assert s["points"]["noisy"] == 2 and s["calibrated_tpot_frac"]["points"] == 2
    assert measure.load_done(plan.out).keys() == {measure.point_key(r) for r in recs}


def test_a_busy_timer_marks_a_real_point_noisy(tmp_path, monkeypatch):
    """The real decoder on the CPU; the timer of the repeat sees a machine 170x slower."""
    from harness import bench, measure
    from harness.device import detect

    real = bench.time_fn
    calls = []

    def busy(fn, **kw):
        t = real(fn, **kw)
        calls.append(1)
        if len(calls) % 3 == 0:  # decode, prefill, decode again: the third is the repeat
            t = bench.Timing(**{**t.as_dict(), "median_s": t.median_s * 170,
                                "p10_s": t.p10_s * 170, "p90_s": t.p90_s * 170})
        return t

    monkeypatch.setattr(bench, "time_fn", busy)
    plan = measure.Plan(model=catalog.load_model("tiny-llama-test"), layers=4,
                        weights=["bf16"], kv_cache="bf16", batches=[1], contexts=[16],
                        max_memory_bytes=1e12, out=tmp_path / "b.jsonl", budget_s=0.02)
    recs = measure.run(plan, detect("cpu", threads=1), catalog.load_calibration(
        ROOT / "tests" / "fixtures" / "measure" / "cpu-calibration.yaml"), None,
        warn=lambda t: None)
    assert [r["status"] for r in recs] == ["noisy"]
    # 170x less what this busy test machine's own jitter took off
    m = recs[0]["measured"]
    assert m["tpot_repeat_s"]["median_s"] > m["tpot_s"]["median_s"] * 10
    # the machine's own load may have tripped the spread first; the drift is there anyway
    assert "slower when timed again" in measure.noise(m, max_spread=math.inf)


def test_compare_leaves_noisy_points_out(tmp_path, run_cli):
    src = (ROOT / "tests" / "fixtures" / "measure" / "cpu-results.jsonl").read_text()
    recs = [json.loads(x) for x in src.splitlines()]
    args = ["-m", "tiny-llama-test", "-g", "h100-sxm", "--engine", "ideal", "--json"]
    for noisy in ([1], [0, 3], list(range(len(recs)))):
        f = tmp_path / f"r{len(noisy)}.jsonl"
        f.write_text("".join(json.dumps({**r, "status": "noisy"} if i in noisy else r) + "\n"
                             for i, r in enumerate(recs)))
        code, out, err = run_cli("compare", str(f), *args)
        if len(noisy) == len(recs):
            assert code == 2 and err.count("\n") == 1 and "noisy" in err
            continue
        assert code == 0, err
        runs = json.loads(out)["runs"]
        assert len(runs) == len(recs) - len(noisy)
        assert {r["source"] for r in runs}.isdisjoint({f"{f}:{i + 1}" for i in noisy})
        assert f"{len(noisy)} noisy point(s) left out" in err


@pytest.mark.slow
def test_a_run_whose_every_point_is_noisy_says_so_and_exits_1(calibration, tmp_path, run_cli):
    """Limits no timing meets (p90 never under the median): every point noisy, warned about
    one line each, the run exits 1 and compare refuses the file."""
    out = tmp_path / "noisy.jsonl"
    r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1", "-c", "16,32",
                "--calibration", str(calibration), "--out", str(out), "--budget-s", "0.05",
                "--threads", "1", "--max-spread", "1", "--max-drift", "1")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("recorded as noisy") == 2
    assert "no point was measured cleanly (2 noisy" in r.stderr
    assert [x["status"] for x in lines(out)] == ["noisy", "noisy"]
    code, _, err = run_cli("compare", str(out), "-m", "tiny-llama-test", "-g", "h100-sxm")
    assert code == 2 and "noisy" in err and err.count("\n") == 1


@pytest.mark.slow
def test_noise_limits_are_ratios_of_at_least_one(calibration, tmp_path):
    for flag in ("--max-spread", "--max-drift"):
        for bad in ("0", "-1", "0.5", "nan", "inf", "abc", ""):
            r = llmplan("measure", "-m", "tiny-llama-test", "--device", "cpu", "--calibration",
                        str(calibration), "--out", str(tmp_path / "x.jsonl"), flag, bad)
            assert r.returncode == 2 and r.stderr.count("\n") == 1, (flag, bad, r.stderr)
            assert flag in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("path", [("error", "calibrated_harness_kernels", "tpot_frac"),
                                  ("achieved", "bandwidth_bytes_per_s"),
                                  ("measured", "tpot_repeat_s", "median_s"),
                                  ("telemetry", "samples")])
def test_a_resumed_record_with_a_non_finite_number_anywhere_is_refused(tmp_path, bad, path):
    """Found by benchmarks/fuzz.py: a NaN under a key the named checks missed reached the
    summary (and the output gate) after the progress bar had started."""
    from harness import measure
    from planner.core.errors import SpecError

    rec = json.loads((ROOT / "tests" / "fixtures" / "measure" / "cpu-results.jsonl")
                     .read_text().splitlines()[0])
    node = rec
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = bad
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(rec) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(SpecError, match=".".join(path)):
        measure.load_done(f)
