"""`llmplan measure`, registered with the planner's CLI through the ``llmplan.commands`` entry
point (the planner never imports the harness). torch is imported only when it runs."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer

from harness.bench import NOISY_REPEAT, NOISY_SPREAD
from planner.cli.options import (
    json_out,
    output_path,
    parse_choices,
    positive,
    stderr,
    stdout,
)
from planner.core.errors import Interrupted, LlmplanError, first_line
from planner.core.specs import GIB

# the weight types the harness's kernels run; MXFP4 (gpt-oss's experts) has no torch kernel
# here, so it is refused up front rather than skipped point by point
WEIGHT_CHOICES = ("bf16", "fp16", "fp8", "int8", "int4")


def measure(
    model: Annotated[Optional[str], typer.Option(
        "--model", "-m",
        help="Built-in model, YAML or config.json (Llama-shaped: dense or MoE, GQA).",
        metavar="MODEL")
    ] = None,
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", "-g", help="hardware_db entry to compare with (default: matched by name).",
        metavar="GPU")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cuda or cpu.",
        metavar="auto|cuda|cpu")] = "auto",
    calibrate_only: Annotated[bool, typer.Option(
        "--calibrate", help="Only measure the device's ceilings and save the profile.")] = False,
    collectives: Annotated[bool, typer.Option(
        "--collectives", help="Time all-reduce and all-to-all across the local devices (NCCL; "
                              "gloo across processes on a CPU) and save the fitted latency "
                              "and bus bandwidth into the calibration profile.")] = False,
    world_size: Annotated[Optional[int], typer.Option(
        help="Ranks for --collectives (default: every visible GPU; 2 processes on a CPU).",
        metavar="N")
    ] = None,
    calibration: Annotated[Optional[Path], typer.Option(
        help="Use this calibration profile instead of measuring one.", metavar="FILE")] = None,
    calibration_out: Annotated[Optional[Path], typer.Option(
        help="Where to save the calibration (default: beside --out, or "
             "results/calibration-<device>.yaml).", metavar="FILE")] = None,
    batch: Annotated[str, typer.Option("--batch", "-b", help="Batches: 1,2,4..256.",
        metavar="N,...")] = "1,4,16",
    context: Annotated[str, typer.Option("--context", "-c",
                                         help="Contexts: 512,2048,8192.",
                                         metavar="TOKENS,...")] = "128,512",
    weights: Annotated[str, typer.Option(
        help="Weight precisions: bf16, fp16, fp8, int8, int4.", metavar="PRECISION,...")] = "bf16",
    kv_cache: Annotated[str, typer.Option(help="KV-cache precision: bf16 or fp16.",
        metavar="PRECISION")] = "bf16",
    layers: Annotated[Optional[int], typer.Option(
        help="Build and time N distinct layers (for models that do not fit); the comparison "
             "is with the N-layer prediction.", metavar="N")] = None,
    out: Annotated[Optional[Path], typer.Option(
        help="JSON Lines results (default: results/measure-<model>-<device>.jsonl).",
        metavar="JSONL")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Skip the points --out already holds.")] = False,
    max_memory: Annotated[Optional[float], typer.Option(
        "--max-memory", help="GiB a point may use; points predicted over it are skipped "
                             "(default: 90% of the GPU memory free at start, half the RAM).",
                             metavar="GIB")
    ] = None,
    budget_s: Annotated[float, typer.Option(help="Seconds of repetitions per timing.",
        metavar="SECONDS")] = 0.5,
    threads: Annotated[Optional[int], typer.Option(help="torch threads on CPU.",
        metavar="N")] = None,
    quick_calibration: Annotated[bool, typer.Option(
        "--quick-calibration", help="Smaller calibration sizes (tests, smoke runs).")] = False,
    recalibrate: Annotated[bool, typer.Option(
        "--recalibrate", help="Measure the ceilings again even where a saved profile of this "
                              "device (--calibration-out or the default path) can be reused.")
    ] = False,
    mode: Annotated[str, typer.Option(
        help="auto (compile on CUDA, eager on a CPU), compile (torch.compile of the layer, "
             "fused as a tuned engine runs it; dense models, any weight format) or eager.",
             metavar="MODE")] = "auto",
    attention_backend: Annotated[str, typer.Option(
        help="Attention kernel on CUDA: auto (FlashAttention on compute capability 8.0+, "
             "the memory-efficient kernel before), flash, efficient, cudnn or math.",
             metavar="BACKEND")
    ] = "auto",
    max_spread: Annotated[float, typer.Option(
        "--max-spread", help="A point whose timing has a p90 above this many times its median "
        "is recorded as noisy (the machine was busy), not ok, and left out of summaries.",
        metavar="RATIO")
    ] = NOISY_SPREAD,
    max_drift: Annotated[float, typer.Option(
        "--max-drift", help="A point whose decode step, timed again seconds later, differs "
        "by more than this factor is recorded as noisy.", metavar="FRACTION")] = NOISY_REPEAT,
    prometheus: Annotated[Optional[Path], typer.Option(
        help="Also write the figures in Prometheus text format (textfile collector).",
        metavar="FILE")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Run real decode and prefill steps of a model's shape and compare with predictions."""
    from planner.io import catalog
    from planner.search.sweep import parse_int_list

    # paths the user gave: their folders must exist and they must be files (checked before
    # minutes of calibration, and no folder is created for them)
    output_path(out, "--out")
    output_path(calibration_out, "--calibration-out")
    positive("--budget-s", budget_s)
    positive("--max-memory", max_memory)
    positive("--threads", threads)
    positive("--layers", layers)
    for flag, v in (("--max-spread", max_spread), ("--max-drift", max_drift)):
        positive(flag, v)
        if v < 1:
            raise LlmplanError(f"{flag}: a ratio of timings, at least 1; got {v:g}")
    if len(parse_choices(attention_backend, ("auto", "flash", "efficient", "cudnn", "math"),
                         "--attention-backend")) != 1:
        raise LlmplanError("--attention-backend: give one backend")
    if mode not in ("auto", "compile", "eager"):
        raise LlmplanError(f"--mode: '{mode}' is not one of auto, compile, eager")
    from planner.cli.entry import deferred_sigint

    try:
        with deferred_sigint():  # a Ctrl-C inside torch's import would abort the process
            import torch  # noqa: F401
    except ImportError:
        raise LlmplanError("llmplan measure needs torch: pip install 'llmplan[measure]'") \
            from None
    from harness import calibrate as cal_mod
    from harness.device import detect

    info = detect(device, threads=threads)
    run_mode = "compiled" if mode == "compile" or (mode == "auto" and info.kind == "cuda") \
        else "eager"
    if info.kind == "cpu" and attention_backend not in ("auto", "math"):
        raise LlmplanError(f"--attention-backend: {attention_backend} needs a CUDA device; "
                           "the CPU runs math")
    hw = catalog.load_hardware(gpu) if gpu else (
        catalog.load_hardware(info.hardware_db) if info.hardware_db else None)
    if hw is not None and info.kind == "cpu":
        stderr.print(f"[yellow]note:[/] measuring on the CPU; --gpu {hw.name} is ignored")
        hw = None
    m = catalog.load_model(model) if model else None
    # every input is checked before minutes of calibration
    batches = parse_int_list(batch, "--batch")
    contexts = parse_int_list(context, "--context")
    wlist = parse_choices(weights, WEIGHT_CHOICES, "--weights")
    parse_choices(kv_cache, ("bf16", "fp16"), "--kv-cache")
    n_layers = (layers or m.num_layers) if m else 0
    if m and n_layers > m.num_layers:
        raise LlmplanError(f"--layers: {n_layers} exceeds {m.name}'s {m.num_layers} layers")
    if collectives:
        positive("--world-size", world_size)
        _collectives(info, calibration or calibration_out or
                     Path("results") / f"calibration-{_slug(info)}.yaml", world_size,
                     quick_calibration, as_json)
        return
    dest = out or (Path("results") / f"measure-{m.name}-{_slug(info)}.jsonl" if m else None)
    from harness.measure import sole_writer

    if dest is not None and not calibrate_only:
        dest.parent.mkdir(parents=True, exist_ok=True)  # the default results/ folder
    # one writer per results file: a second run is refused here, before it calibrates
    with sole_writer(dest) if dest is not None and not calibrate_only else nullcontext():
        # a resumed file keeps the calibration its points were predicted with: never two in a file
        recorded = _recorded_calibration(dest) if resume and dest is not None else None
        if calibration is not None and not calibrate_only:
            cal = catalog.load_calibration(calibration)
            if recorded is not None and _cal_key(recorded) != _cal_key(cal):
                raise LlmplanError(f"--calibration: {calibration} differs from the calibration "
                                   f"{dest} was measured with; resume without --calibration, or "
                                   "write a new --out")
        elif recorded is not None and not calibrate_only:
            cal = recorded
            stderr.print(f"resuming with the calibration recorded in {dest}")
        else:
            cal_dest = calibration_out or (out.with_suffix(".calibration.yaml") if out else
                                           Path("results") / f"calibration-{_slug(info)}.yaml")
            need = ("bf16", "fp16", "fp8") if calibrate_only else cal_mod.needed_dtypes(wlist)
            cal = None if recalibrate or calibrate_only else _reusable(cal_dest, info, need)
            if cal is not None:
                stderr.print(f"reusing the calibration in {cal_dest} (--recalibrate to measure "
                             "again)")
            else:
                shapes = _decode_shapes(m, batches) if m else []
                stderr.print(f"calibrating {info.name} ({', '.join(need)}) ...")
                profile = cal_mod.calibrate(
                    info, dtypes=need, decode_shapes=shapes, quick=quick_calibration,
                    max_spread=max_spread, max_drift=max_drift,
                    warn=lambda text: stderr.print(f"[yellow]warning:[/] {text}"))
                cal_mod.save(profile, cal_dest)
                cal = catalog.load_calibration(cal_dest)
                stderr.print(f"calibration saved to {cal_dest}")
            if calibrate_only:
                _print_calibration(cal, hw, as_json)
                return
        if m is None:
            raise LlmplanError("--model: required unless --calibrate")
        missing = [d for d in cal_mod.needed_dtypes(wlist) if d not in _covered(cal)]
        if missing:
            raise LlmplanError(f"the calibration has no {', '.join(missing)} matmul rate to "
                               f"predict --weights {weights} with; calibrate again "
                               "(--recalibrate, or leave out --calibration)")

        from harness.measure import (
            Plan,
            load_done,
            run,
            summarize,
            write_prometheus,
        )

        # default cap: 90% of the GPU memory free at the start (another process's share is not
        # ours), half the available RAM on a CPU
        cap = (max_memory * GIB if max_memory else
               (info.free_memory_bytes or info.memory_bytes) * 0.9 if info.kind == "cuda"
               else info.memory_bytes * 0.5)
        plan = Plan(model=m, layers=n_layers, weights=wlist, kv_cache=kv_cache, batches=batches,
                    contexts=contexts, max_memory_bytes=cap, out=dest, resume=resume,
                    budget_s=budget_s, attention_backend=attention_backend, mode=run_mode,
                    max_spread=max_spread, max_drift=max_drift,
                    argv=["llmplan", *sys.argv[1:]])
        if resume:
            load_done(dest)  # a corrupt results file is refused before the progress bar starts
        from planner.cli.progress import task_progress

        total = len(wlist) * len(batches) * len(contexts)
        try:
            # a bar on a terminal only, never under --json (planner/cli/progress.py); the
            # warnings print above it
            with task_progress("measuring", total=total, enabled=not as_json) as advance:
                records = run(plan, info, cal, hw, progress=advance,
                              warn=lambda t: stderr.print(f"[yellow]warning:[/] {t}",
                                                          highlight=False))
        except KeyboardInterrupt:
            raise Interrupted(f"finished points are in {dest}; rerun with --resume") from None
        summary = summarize(records)
        if prometheus:
            write_prometheus(records, prometheus)
        if as_json:
            json_out({"out": str(dest), "summary": summary})
        else:
            from planner.io.gate import gate

            gate({"summary": summary}, "measure's summary")  # what the table sums up
            _print_points(records, hw is not None)
            _print_summary(summary)
            stdout.print(f"results: {dest}")
        pts = summary["points"]
        if records and not pts["ok"]:
            # nothing was measured: a script must not read this run as a success
            stderr.print(f"no point was measured cleanly ({pts['noisy']} noisy, "
                         f"{pts['skipped']} skipped, {pts['oom']} OOM, {pts['error']} errors)")
            raise typer.Exit(1)
        if pts["noisy"]:
            stderr.print(f"[yellow]warning:[/] {pts['noisy']} of {len(records)} points noisy "
                         f"(the machine was busy), left out of the summary; measure them again "
                         f"on a quiet machine (a new --out)")


def _collectives(info, profile: Path, world: int | None, quick: bool, as_json: bool) -> None:
    """Measure the collectives, print them as nccl-tests does, and merge the all-reduce fit
    into ``profile`` (calibrated first when there is none)."""
    from harness import calibrate as cal_mod
    from harness.collectives import measure as measure_collectives
    from planner.io import catalog
    from planner.io.render import table

    if not profile.is_file():
        stderr.print(f"calibrating {info.name} first ({profile} does not exist) ...")
        cal_mod.save(cal_mod.calibrate(info, quick=quick), profile)
    catalog.load_calibration(profile)  # a damaged profile is a one-line error, not merged into
    stderr.print(f"timing all-reduce and all-to-all on {info.kind} ...")
    res = measure_collectives(info.kind, world=world, max_bytes=(1 << 22) if quick else None,
                              budget_s=0.02 if quick else 0.2)
    data = catalog.read_yaml(profile, what="calibration file")
    data.setdefault("details", {})["collectives"] = res
    ar = (res.get("fit") or {}).get("all_reduce")
    if ar:
        data["allreduce_latency_us"] = ar["latency_s"] * 1e6
        data["allreduce_bus_gb_per_s"] = ar["bus_bandwidth_bytes_per_s"] / 1e9
    cal_mod.save(data, profile)
    catalog.load_calibration(profile)  # what was written reads back as a profile
    if as_json:
        json_out(res)
        return
    if "skipped" in res and not res.get("all_reduce"):
        stdout.print(f"collectives skipped: {res['skipped']}")
        return
    from planner.io import fmt

    rows = []
    for op in ("all_reduce", "all_to_all"):
        for p in res.get(op, []):
            rows.append([op, fmt.si(p["bytes"], "B"), fmt.seconds(p["time_s"]),
                         fmt.si(p["algbw_bytes_per_s"], "B/s"),
                         fmt.si(p["busbw_bytes_per_s"], "B/s")])
    stdout.print(table(f"{res['backend']}, {res['world_size']} ranks",
                       ["op", "size", "time", "algbw", "busbw"], rows, left=1, compact=True))
    for op, why in res.get("skipped", {}).items():
        stdout.print(f"{op}: skipped ({why})")
    if ar:
        stdout.print(f"all-reduce fit: latency {ar['latency_s'] * 1e6:,.1f} us, bus bandwidth "
                     f"{ar['bus_bandwidth_bytes_per_s'] / 1e9:,.2f} GB/s -> saved in {profile}")


def _cal_key(cal) -> tuple:
    """What a prediction reads from a calibration: equal keys predict alike."""
    return (round(cal.memory_bandwidth_gb_per_s, 6), round(cal.kernel_overhead_us, 6),
            tuple(sorted((k.value, round(v, 9)) for k, v in cal.matmul_tflops.items())),
            *(None if v is None else round(v, 6)
              for v in (cal.matmul_overhead_us, cal.attention_overhead_us)))


def _recorded_calibration(path: Path):
    """The calibration a results file's points were predicted with (None: no such file or
    no point in it)."""
    from pydantic import ValidationError

    from harness.measure import load_done
    from planner.core.specs import Calibration
    from planner.io import catalog

    for rec in load_done(path).values():  # validated: a corrupt file is a one-line error
        env = rec.get("env") if isinstance(rec.get("env"), dict) else {}
        c = env.get("calibration")
        if isinstance(c, dict):
            try:
                return Calibration(device=str(env.get("device", {}).get("name", "recorded")),
                                   **c)
            except ValidationError as err:  # each field's error, not pydantic's header
                raise LlmplanError(catalog.format_validation(
                    f"{path}: the recorded calibration is not valid", err,
                    within="env.calibration")) from None
            except (TypeError, ValueError) as err:
                raise LlmplanError(f"{path}: the recorded calibration is not valid: "
                                   f"{first_line(err)}") from None
    return None


def _reusable(path: Path, info, need: tuple[str, ...]):
    """A saved profile of this very device, from this harness version, holding every
    precision needed (measured, or recorded as impossible here); None otherwise."""
    from harness.calibrate import HARNESS_VERSION
    from planner.io import catalog

    if not path.is_file():
        return None
    try:
        cal = catalog.load_calibration(path)
    except LlmplanError:
        return None  # a damaged profile is measured again, not trusted
    dev = cal.details.get("device")
    dev = dev if isinstance(dev, dict) else {}  # a damaged record: measured again
    same = (dev.get("name") == info.name and dev.get("kind") == info.kind
            and dev.get("torch_threads") == info.torch_threads
            and cal.harness_version == HARNESS_VERSION)
    noise = cal.details.get("noise")
    if isinstance(noise, dict) and noise.get("noisy"):
        return None  # measured on a busy machine: measured again, not trusted
    return cal if same and set(need) <= _covered(cal) else None


def _covered(cal) -> set[str]:
    """The precisions a profile answers for: a measured rate, or recorded as impossible on
    its device (a point in one is a recorded skip, not a missing figure)."""
    skipped = cal.details.get("skipped")
    return {k.value for k in cal.matmul_tflops} | set(skipped if isinstance(skipped, dict)
                                                       else ())


def _slug(info) -> str:
    if info.hardware_db:
        return info.hardware_db
    return "cpu" if info.kind == "cpu" else info.name.lower().replace(" ", "-")


def _decode_shapes(m, batches: list[int]) -> list[tuple[int, int, int]]:
    """The matmuls of the model's decode step at each batch: (M, K, N)."""
    if m.moe or m.mla:
        return []
    h, hd = m.hidden_size, m.head_dim_
    shapes = []
    for b in batches:
        shapes += [(b, h, (m.num_attention_heads + 2 * m.num_kv_heads) * hd),
                   (b, h, 2 * m.intermediate_size), (b, m.intermediate_size, h)]
    return shapes


def _print_calibration(cal, hw, as_json: bool) -> None:
    from planner.io.render import table

    if as_json:
        json_out(cal.model_dump(mode="json"))
        return
    rows = [["memory bandwidth", f"{cal.memory_bandwidth_gb_per_s:,.1f} GB/s",
             f"{hw.memory_bandwidth_gb_per_s:,.0f} GB/s" if hw else "-",
             f"{cal.memory_bandwidth_gb_per_s / hw.memory_bandwidth_gb_per_s:.0%}" if hw
             else "-"]]
    for dt, v in cal.matmul_tflops.items():
        sheet = hw.peak_tflops.get(dt) if hw else None
        rows.append([f"matmul {dt.value}", f"{v:,.2f} TFLOP/s",
                     f"{sheet:,.1f} TFLOP/s" if sheet else "-",
                     f"{v / sheet:.0%}" if sheet else "-"])
    rows.append(["kernel launch", f"{cal.kernel_overhead_us:.2f} us", "-", "-"])
    for name, v in (("matmul fixed cost", cal.matmul_overhead_us),
                    ("attention fixed cost", cal.attention_overhead_us)):
        if v is not None:
            rows.append([name, f"{v:.2f} us", "-", "-"])
    for dt, why in cal.details.get("skipped", {}).items():
        rows.append([f"matmul {dt}", "skipped", why[:50], ""])
    noise = cal.details.get("noise")
    if isinstance(noise, dict) and noise.get("worst_spread"):
        rows.append(["timing spread", f"{noise['worst_spread']:.2f}x p90/median",
                     "noisy" if noise.get("noisy") else "ok", ""])
    stdout.print(table(f"Calibration of {cal.device}", ["ceiling", "measured", "datasheet",
                                                        "of datasheet"], rows))


def _print_points(records: list[dict], datasheet: bool) -> None:
    from planner.io import fmt
    from planner.io.render import table

    cols = ["w", "batch", "ctx", "status", "TPOT", "pred\n(cal)", "err", "TTFT", "pred\n(cal)",
            "err", "MBU\n(cal)"]
    if datasheet:
        cols += ["TPOT err\n(sheet)"]
    rows = []
    for r in records:
        c = r["config"]
        key = [c["weights"], c["batch"], c["context"]]
        if r["status"] not in ("ok", "noisy"):
            rows.append(key + [r["status"], r.get("reason", "")[:36]] + [""] * (len(cols) - 5))
            continue
        p, e = r["prediction"]["calibrated"], r["error"]["calibrated"]
        row = key + [r["status"], fmt.seconds(r["measured"]["tpot_s"]["median_s"]),
                     fmt.seconds(p["tpot_s"]), f"{e['tpot_frac']:+.1%}",
                     fmt.seconds(r["measured"]["ttft_s"]), fmt.seconds(p["ttft_s"]),
                     f"{e['ttft_frac']:+.1%}", fmt.pct(r["utilisation"]["calibrated"]["mbu"])]
        if datasheet:
            row.append(f"{r['error']['datasheet']['tpot_frac']:+.1%}")
        rows.append(row)
    stdout.print(table("Predicted vs measured", cols, rows, left=1, compact=True))


def _print_summary(summary: dict) -> None:
    pts = summary["points"]
    stdout.print(f"points: {pts['ok']} ok, {pts['noisy']} noisy (not in the errors below), "
                 f"{pts['skipped']} skipped, {pts['oom']} OOM, {pts['error']} errors")
    for k, v in summary.items():
        if k == "points":
            continue
        stdout.print(f"{k}: median |error| {v['median_abs']:.1%}, worst {v['worst_abs']:.1%} "
                     f"over {v['points']} points")
