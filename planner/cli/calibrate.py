"""`llmplan calibrate`: an engine profile's host costs fitted to your served runs, with the
held-out error beside."""

from __future__ import annotations

import math
import os
from datetime import date as _date
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.compare import (
    CachedFromOpt,
    CachedPrefixOpt,
    DatasetNameOpt,
    FilesArg,
    LengthsFromOpt,
    SeedOpt,
    StrictOpt,
    SweepOpt,
    check_runs,
    fmt_error,
    fmt_metric,
    read_result_files,
    server_setup,
    warm_runs,
)
from planner.cli.options import (
    DEFAULT_ENGINE,
    GpuOpt,
    GroupSizeOpt,
    JsonOpt,
    KVOption,
    ModelOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    TpOpt,
    WeightsOption,
    json_out,
    output_path,
    stderr,
    stdout,
)
from planner.core.errors import LlmplanError


def calibrate(
    files: FilesArg,
    model: ModelOpt,
    gpu: GpuOpt,
    out: Annotated[Path, typer.Option("--out", "-o", help="Engine profile YAML to write.",
        metavar="YAML")],
    tp: TpOpt = 1,
    base_engine: Annotated[str, typer.Option(
        "--base-engine", help="Engine profile whose other parameters the fit keeps.",
        metavar="ENGINE")] =
    DEFAULT_ENGINE,
    name: Annotated[Optional[str], typer.Option(
        help="Name of the new profile (default: the output file's stem).", metavar="NAME")] = None,
    weights: WeightsOption = None,
    kv_cache: KVOption = None,
    group_size: GroupSizeOpt = None,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    strict: StrictOpt = False,
    cached_from: CachedFromOpt = None,
    cached_prefix: CachedPrefixOpt = None,
    sweep: SweepOpt = False,
    seed: SeedOpt = None,
    lengths_from: LengthsFromOpt = None,
    dataset_name: DatasetNameOpt = None,
    leave_one_out: Annotated[bool, typer.Option(
        "--leave-one-out/--no-leave-one-out",
        help="Also fit once per run without it, to show the held-out error.")] = True,
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", "-j", metavar="N", min=1,
        help="Processes for the leave-one-out fits, beside the whole fit (default: the "
             "machine's CPUs; the figures do not depend on it).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit an engine profile's per-step cost, decode bandwidth efficiency, the share of its
    kernels' compute rate every matmul attains (prefill) and (with TP) all-reduce latency to
    measured serving runs; write it as a profile every command takes with --engine PATH."""
    from planner.evidence.calibrate import calibrate as fit
    from planner.evidence.fit import get_param
    from planner.io import fmt
    from planner.io.render import plain, table

    output_path(out, "--out")
    if out.suffix.lower() not in (".yaml", ".yml"):
        raise LlmplanError(f"--out: {out} must end in .yaml")
    name = name or out.stem
    if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise LlmplanError(f"--name: '{name}' must be letters, digits, '-', '_' or '.'")
    s, spec = server_setup(model, gpu, base_engine, tp, weights, kv_cache, group_size,
                      quantized_layers)
    runs = warm_runs(read_result_files(files), cached_from, sweep, seed, lengths_from,
                     dataset_name, cached_prefix)
    check_runs(runs, s, strict)
    from planner.cli.progress import task_progress

    try:
        # runs simulated over and over as the fit searches: a count on a terminal, not --json
        with task_progress("calibrating: runs simulated", enabled=not as_json) as advance:
            res = fit(runs, s, spec, name=name, date=_date.today().isoformat(),
                      leave_one_out=leave_one_out, progress=advance,
                      jobs=jobs or os.cpu_count() or 1)
    except ValueError as err:
        raise LlmplanError(f"calibrate: {err}") from None
    payload = {"profile": None if res.refused else str(out), "refused": list(res.refused),
               "base_engine": spec.name, "values": res.values,
               "unidentified": res.unidentified, "runs": list(res.runs),
               "errors": [e.__dict__ for e in res.errors]}
    from planner.io.gate import gate

    gate(payload, "calibrate")  # before the profile is written or a table printed
    if not res.refused:
        _write_profile(res, out, spec.name)
    if as_json:
        json_out(payload)
        _refuse(res, out)
        return
    stdout.print(f"[bold]fitted[/] {len(res.runs)} run(s) of {plain(s.model.name)} on {tp} x "
                 f"{plain(s.hardware.name)}, from {plain(spec.name)}; "
                 + ("[red]not written[/]" if res.refused else f"wrote {plain(out)}"))
    rows = [[p, f"{get_param(spec, p):g}", f"{v:g}"] for p, v in res.values.items()]
    rows += [[p, f"{get_param(spec, p):g}", f"kept: {why}"]
             for p, why in res.unidentified.items()]
    stdout.print(table("Parameters", ["parameter", "base", "fitted"], rows, left=1,
                       compact=True, fold=(2,)))
    stdout.print(_errors_table(res.errors, stdout.width))
    med = _median_abs([e.in_sample for e in res.errors])
    held = _median_abs([e.held_out for e in res.errors])
    stdout.print(f"median |error|: base {fmt.pct(_median_abs([e.before for e in res.errors]))}"
                 f", in-sample {fmt.pct(med)}"
                 + (f", leave-one-out {fmt.pct(held)}" if not math.isnan(held) else ""))
    _refuse(res, out)


def _errors_table(errors, width: int):
    """Error per run and figure, each run's id (file#run, tool, rate) on a line of its own
    over its figures: ids run to 40 characters, more than an 80-column table can give them."""
    from planner.io.render import grouped_table

    groups: list[tuple[str, list]] = []
    for e in errors:
        if not groups or groups[-1][0] != e.run:
            groups.append((e.run, []))
        groups[-1][1].append(["  " + e.metric.removesuffix("_s"),
                              fmt_metric(e.metric, e.measured), fmt_error(e.before),
                              fmt_error(e.in_sample), fmt_error(e.held_out)])
    return grouped_table("Error per run and figure (predicted / measured - 1)",
                         ["figure", "measured", "base", "in-sample", "held out"], groups,
                         width=width, left=1)


def _refuse(res, out: Path) -> None:
    """A fit the physics refuses (a value at the edge of its range): not bad input (exit 2)
    but a fit that stands in for something the model lacks; nothing was written (exit 1)."""
    if not res.refused:
        return
    for why in res.refused:
        stderr.print(f"refused: {why}")
    stderr.print(f"calibrate: nothing written to {out}; the model is missing something "
                 "these runs show: give runs of more shapes, or fit fewer parameters")
    raise typer.Exit(1)


def _median_abs(v: list[float | None]) -> float:
    from planner.core.arith import quantile

    return quantile([abs(x) for x in v if x is not None], 0.5)


def _write_profile(res, out: Path, base: str) -> None:
    import yaml

    data = res.engine.model_dump(mode="json", exclude_none=True)
    head = (f"# Engine profile fitted by `llmplan calibrate` from {base} on "
            f"{_date.today().isoformat()}.\n# Fitted on: {', '.join(res.runs)}\n"
            f"# Parameters fitted: {', '.join(res.values) or 'none'}; kept at {base}'s values:"
            f" {', '.join(res.unidentified) or 'none'}.\n")
    out.write_text(head + yaml.safe_dump(data, sort_keys=False, width=100))
