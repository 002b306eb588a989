"""`llmplan validate`: the built-in published measurements, predicted and compared."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.options import check_engine_option, json_out, output_path, stderr, stdout
from planner.core.errors import LlmplanError, SpecError, UsageError

RECORDED = Path(__file__).resolve().parent.parent / "data" / "validation_recorded.yaml"


def run_validation(datasets, engine_override: str | None = None):
    """Every comparison of ``datasets``; the models, GPUs and engines they name are loaded
    once each. A dataset's engine is the profile of the release its source names (a vLLM
    0.9.1 dataset is predicted by vllm-0.8), unless ``engine_override`` sets one for all."""
    from planner.evidence.validate import compare
    from planner.io import catalog

    models, gpus, specs = {}, {}, {}
    out = []
    for ds in datasets:
        engines = {}  # this dataset's: a name means the release its source measured
        if engine_override:
            ds = ds.model_copy(update={
                "source": ds.source.model_copy(update={"engine": engine_override}),
                "rows": [r.model_copy(update={"engine": None}) for r in ds.rows]})
        for r in ds.rows:
            where = f"validation row {ds.source.id}:{r.id}"
            try:
                if r.model not in models:
                    models[r.model] = catalog.load_model(r.model)
                if r.gpu not in gpus:
                    gpus[r.gpu] = catalog.load_hardware(r.gpu)
                name = r.engine or ds.source.engine
                if name not in engines:
                    key = (name, None if engine_override else ds.source.engine_version)
                    if key not in specs:
                        spec = catalog.load_engine_spec(name)
                        specs[key] = spec if engine_override else \
                            at_release(spec, ds.source.engine_version)
                    engines[name] = specs[key]
            except LlmplanError as err:
                raise LlmplanError(f"{where}: {err}") from None
        out += compare(ds, models=models, gpus=gpus, engines=engines)
    return out


def run_served(manifests, engine_override: str | None = None,
               advance=None) -> tuple[list, list[str]]:
    """Every served-run comparison of ``manifests`` ((ServedDataset, folder) pairs): each
    result file read, its runs simulated with the engine's profile and the ideal engine's;
    and the runs the simulator could not replay, each with the reason. ``advance(detail)``:
    called once per result file replayed (progress)."""
    from planner.evidence.served import compare_entry
    from planner.io import catalog
    from planner.serving.cost import CostCache

    out, unserved = [], []
    ideal_spec = catalog.load_engine_spec("ideal")
    cache = CostCache()  # the files of one model, GPU and engine share its operators' times
    for ds, folder in manifests:
        for entry in ds.runs:
            where = f"served run {ds.source.id}:{entry.id}"
            try:
                spec = catalog.load_engine_spec(engine_override or entry.engine
                                                or ds.source.engine)
                spec = at_release(spec, entry.engine_version or ds.source.engine_version,
                                  pick=engine_override is None)
                out += compare_entry(ds.source, entry, replayed_runs(entry, folder, ds),
                                     replay_setup(entry, spec, folder),
                                     replay_setup(entry, ideal_spec, folder),
                                     spec.fitted_rows(), cache)
            except UsageError as err:
                # the simulator cannot serve what the real server did (a prompt longer than
                # the KV cache it predicts): a miss of the model, counted and shown, not a
                # reason to stop
                unserved.append(f"{where}: {err}")
            except LlmplanError as err:
                raise LlmplanError(f"{where}: {err}") from None
            if advance is not None:
                advance(f"{ds.source.id}")
    return out, unserved


def at_release(spec, engine_version: str | None, *, pick: bool = True):
    """``spec`` as the release a served run names in its engine version starts: with
    ``pick``, the engine's profile that covers that release (``vllm`` for a 0.10 run is
    vllm-0.8), and its scheduler defaults at that release (``EngineSpec.at_version``); as it
    is where none is named (a nightly build is the newest line)."""
    from planner.core.engine import release_in
    from planner.io import catalog

    if spec.versions is None:
        return spec
    version = release_in(engine_version, spec.versions.family)
    if version is not None and pick and not spec.versions.covers(version):
        try:
            return catalog.load_engine_spec(f"{spec.versions.family}@{version}")
        except SpecError:
            pass  # no profile covers it: the one named, as it starts that release
    return spec.as_released(engine_version)


def replayed_runs(entry, folder, dataset):
    """The runs of a served entry's result file as they are replayed: the traffic its client
    command states over what the file says; where the file gives only mean lengths, each
    request's drawn again from the client's seed (a random dataset), taken from a run of
    ``dataset`` (the entry's manifest) that sent the same requests and lists them, or shaped
    by a kept length distribution (the dataset the file, else the manifest, names); and each
    request's cached beginning where earlier runs of ``dataset`` sent it."""
    from planner.cli.compare import shape_lengths

    runs = _sent_runs(entry, folder, dataset)
    traffic = entry.traffic
    if traffic is None:
        return runs
    runs = [shape_lengths(r, r.dataset or traffic.dataset) for r in runs]
    if traffic.cached_prefix_runs:  # the earlier runs, each with the lengths it sent
        from planner.evidence.compare import warmed_by

        earlier = [(b.file, _sent_runs(b, folder, dataset))
                   for b in map(dataset.entry, traffic.cached_prefix_runs)]
        where = f"{entry.id}: traffic.cached_prefix_runs: {entry.file}"
        runs = [warmed_by(r, earlier, where) for r in runs]
    return runs


def _sent_runs(entry, folder, dataset):
    """The runs of a served entry's file with the traffic its client command states, and
    each request's lengths where they are known exactly: listed in the file, drawn again
    from the client's seed, or taken from a twin run that sent the same requests."""
    from planner.cli.compare import read_result_file

    runs = read_result_file(folder / entry.file)
    if entry.traffic is None:
        return runs
    traffic = entry.traffic
    runs = [traffic.apply(r) for r in runs]
    if traffic.seed is not None:
        from planner.evidence.redraw import redrawn_all

        runs, n = redrawn_all(runs, traffic.seed, f"{entry.id}: traffic.seed")
        if not n:
            raise LlmplanError(f"{entry.id}: traffic.seed: no run of {entry.file} is of "
                               "SGLang's random dataset without per-request lengths: "
                               "nothing to draw again")
    if traffic.lengths_from:
        from planner.evidence.redraw import copied_all

        twin = dataset.entry(traffic.lengths_from)
        runs, n = copied_all(runs, read_result_file(folder / twin.file), twin.file,
                             f"{entry.id}: traffic.lengths_from")
        if not n:
            raise LlmplanError(f"{entry.id}: traffic.lengths_from: every run of "
                               f"{entry.file} lists its own per-request lengths: nothing "
                               "to take")
    return runs


def replay_setup(entry, spec, folder: Path | None = None):
    """The deployment a served entry was measured on, with ``spec``'s engine: its model, GPU,
    TP and precision, and the scheduler flags of its server command (an options file it
    names, in the manifest's ``folder``)."""
    from planner.cli.compare import MULTI_STEP_FLAGS, served_setup, server_overrides

    server = server_overrides(entry.traffic.server_command if entry.traffic else None, folder)
    if spec.serving is None or spec.serving.scheduler_steps is None:
        # replayed with an engine that has no multi-step scheduling (the ideal baseline,
        # --engine): as that engine runs, every step scheduled
        for flag in MULTI_STEP_FLAGS:
            server.pop(flag, None)
    if spec.serving is None or spec.serving.performance_modes is None:
        server.pop("--performance-mode", None)  # likewise: that engine's own defaults
    ckpt = entry.checkpoint
    weights = entry.weights
    if ckpt is None and _ships(entry.model, weights):
        # the model's own checkpoint stores these weights (DeepSeek-V3's fp8 in 128 x 128
        # blocks, gpt-oss's MXFP4 experts): its server loaded it as it ships, not a 16-bit
        # one quantized at load
        weights = None
    return served_setup(entry.model, entry.gpu, spec, entry.tp, weights, entry.kv_cache,
                        quantized_layers=None, server=server,
                        checkpoint=None if ckpt is None else (
                            f"run {entry.id}: checkpoint {ckpt.repo}",
                            ckpt.quantization_config))


@functools.cache
def _ships(model: str, weights) -> bool:
    """Whether models_db's ``model`` is a checkpoint that stores ``weights`` (its
    quantization_config says so)."""
    from planner.io import catalog

    return not catalog.load_model(model).quantized_at_load(weights)


@functools.cache
def _model_kind(name: str) -> str:
    """A validated run's model: "MoE" (routed experts) or "dense"."""
    from planner.cli.options import model_kind
    from planner.io import catalog

    return model_kind(catalog.load_model(name))


@functools.cache
def _gpu_class(name: str) -> str:
    """A validated row's GPU's class (its hardware file's architecture), for the bands."""
    from planner.io import catalog

    return catalog.load_hardware(name).architecture or ""


def band_figures(comps, served_comps) -> list:
    """The held-out figures of a replay (static rows and served runs, each with its GPU's
    class) that the error bands and their coverage are built from."""
    from planner.evidence import bands as bands_mod

    return bands_mod.figures_of(comps, served_comps, gpu_class=_gpu_class,
                                model_kind=_model_kind)


def write_band_table(path: Path, figures: list) -> None:
    """The bands built from ``figures``, written as planner/data/bands.yaml is."""
    from planner.evidence import bands as bands_mod
    from planner.io import catalog

    catalog.write_bands(path, bands_mod.build(figures), sources=sorted({f.source for f in figures}))


def recorded_limits() -> dict:
    from planner.io import catalog

    data = catalog.read_yaml(RECORDED)
    try:
        return {phase: float(v["median_abs_error"])
                for phase, v in data["held_out"].items()}
    except (KeyError, TypeError, ValueError):
        raise LlmplanError(f"{RECORDED}: expected held_out.<phase>.median_abs_error numbers"
                           ) from None


def validate(
    source: Annotated[Optional[str], typer.Option(
        help="Only these sources (comma-separated ids).", metavar="ID,...")] = None,
    engine: Annotated[Optional[str], typer.Option(
        "--engine", "-e", help="Predict every row with this engine instead of the row's own "
        "(e.g. ideal: the roofline's error).", metavar="ENGINE")] = None,
    dataset: Annotated[Optional[list[Path]], typer.Option(
        help="Dataset files to use instead of the built-in ones (repeatable).",
        metavar="FILE")] = None,
    served: Annotated[bool, typer.Option(
        "--served/--no-served", help="Also replay the published serving runs "
        "(planner/data/served) through the simulator.")] = True,
    served_dataset: Annotated[Optional[list[Path]], typer.Option(
        help="Served-run manifests to use instead of the built-in ones (repeatable).",
        metavar="FILE")] = None,
    rows: Annotated[bool, typer.Option("--rows/--no-rows",
                                       help="Show every row, not only the summary.")] = True,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Every comparison to CSV.",
        metavar="CSV")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="PNG of predicted vs measured (log-log, +-10% and +-25% bands).",
        metavar="PNG")] = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 1 when a held-out median error rises above the figure recorded "
        "in planner/data/validation_recorded.yaml.")] = False,
    write_bands: Annotated[Optional[Path], typer.Option(
        "--write-bands", help="Write the error bands built from these held-out figures to a "
        "YAML file (the built-in table is planner/data/bands.yaml, which estimate, simulate "
        "and plan read).", metavar="YAML")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Predict published measurements (one file per source) and show the error: median and
    90th percentile per source and engine, in-sample (rows a parameter was fitted on) and
    held out apart. Published serving runs (real benchmark result files) are replayed through
    the simulator and compared on TTFT, TPOT, output throughput and (where the file has it)
    E2E latency. Band coverage: the share of held-out figures inside the p10-p90 band built
    from every other source."""
    from planner.evidence import bands as bands_mod
    from planner.evidence.served import summarize_served
    from planner.evidence.validate import (
        SERVED_PHASES,
        by_model_kind,
        served_by_engine,
        summarize,
        targets,
    )
    from planner.io import catalog, fmt
    from planner.io.render import table
    from planner.search.sweep import parse_str_list

    output_path(csv, "--csv")
    output_path(plot, "--plot", ".png")
    output_path(write_bands, "--write-bands", ".yaml")
    if check:  # the recorded figures are of every built-in row, each predicted by its engine
        narrowed = [flag for flag, given in (("--source", source), ("--engine", engine),
                                             ("--dataset", dataset),
                                             ("--served-dataset", served_dataset),
                                             ("--no-served", not served)) if given]
        if narrowed:
            raise LlmplanError(f"--check: holds the whole built-in validation to "
                               f"{RECORDED.name}'s figures; not with {', '.join(narrowed)}")
    datasets = catalog.load_datasets(dataset)
    manifests = catalog.load_served(served_dataset) if served or served_dataset else []
    if dataset and not served_dataset:
        manifests = []  # the datasets asked for, alone
    if source is not None:
        wanted = parse_str_list(source)
        if not wanted:
            raise LlmplanError("--source: no source id given")
        known = [d.source.id for d in datasets] + [d.source.id for d, _ in manifests]
        for w in wanted:
            if w not in known:
                raise LlmplanError(f"--source: unknown source '{w}'; known: {', '.join(known)}")
        datasets = [d for d in datasets if d.source.id in wanted]
        manifests = [(d, f) for d, f in manifests if d.source.id in wanted]
    if engine is not None:
        check_engine_option(engine)
    comps = run_validation(datasets, engine)
    from planner.cli.progress import task_progress

    with task_progress("replaying served runs", total=sum(len(d.runs) for d, _ in manifests),
                       enabled=not as_json) as advance:
        served_comps, unserved = run_served(manifests, engine, advance)
    per_source = summarize(comps) + summarize_served(served_comps)
    overall = summarize(comps, by_source=False) + summarize_served(served_comps,
                                                                   by_source=False)
    kinds = by_model_kind(served_comps, _model_kind)
    by_engine = served_by_engine(served_comps)
    figures = band_figures(comps, served_comps)
    cover = bands_mod.coverage(figures)
    if write_bands:
        write_band_table(write_bands, figures)
        stderr.print(f"wrote {write_bands}")
    failed: list[str] = []
    if check:
        limits = recorded_limits()
        for s in overall:
            lim = limits.get(s.phase)
            if s.split == "held-out" and lim is not None and s.median_abs_error > lim:
                failed.append(f"held-out {s.phase} median error {s.median_abs_error:.1%} is above "
                              f"the recorded {lim:.1%}")
    if csv:
        _write_csv([c.as_dict() for c in comps] + [c.as_dict() for c in served_comps], csv)
        stderr.print(f"wrote {len(comps) + len(served_comps)} rows to {csv}")
    if plot:
        from planner.io.report import plot_validation

        plot_validation(comps + served_comps, plot)
        stderr.print(f"wrote {plot}")
    payload = {"rows": [c.as_dict() for c in comps],
               "served_rows": [c.as_dict() for c in served_comps],
               "summary": [s.as_dict() for s in per_source],
               "overall": [s.as_dict() for s in overall],
               "sources": [d.source.model_dump(mode="json") for d in datasets],
               "served_sources": [d.source.model_dump(mode="json") for d, _ in manifests],
               "targets": [{"target": t.label, "n": t.n,  # no figure: null, not NaN
                            "value": t.value if t.n else None,
                            "limit": t.limit, "met": t.met if t.n else None}
                           for t in targets(comps, served_comps)],
               "served_by_model_kind": [s.as_dict() for s in kinds],
               "served_by_engine": [e.as_dict() for e in by_engine],
               "band_coverage": [{"engine": c.engine, "phase": c.phase, "n": c.n,
                                  "inside": c.inside, "frac": c.frac} for c in cover],
               "check": {"passed": not failed, "failures": failed} if check else None}
    if as_json:
        json_out(payload)
    else:
        from planner.io.gate import gate

        gate(payload, "validate's tables")  # the figures the tables show
        if rows:
            if comps:
                stdout.print(_rows_table(comps, stdout.width))
            if served_comps:
                stdout.print(_served_table(served_comps, stdout.width))
        stdout.print(_summary_table(per_source, stdout.width))
        stdout.print(table("All sources", ["phase", "split", "n", "median", "p90",
                                           "ideal median"],
                           [[s.phase, s.split, s.n, fmt.pct(s.median_abs_error),
                             fmt.pct(s.p90_abs_error), fmt.pct(s.ideal_median_abs_error)]
                            for s in overall], left=2, compact=True))
        if kinds:
            stdout.print(table(
                "Served runs by kind of model (held out, every source and engine)",
                ["model", "phase", "n", "median", "p90", "signed median"],
                [[s.source, s.phase, s.n, fmt.pct(s.median_abs_error), fmt.pct(s.p90_abs_error),
                  f"{s.median_error:+.1%}"] for s in kinds], left=3, compact=True))
        if by_engine:
            stdout.print(table(
                "Held-out served runs by engine: median / mean |error| per run",
                ["engine", "runs", *(p.removeprefix("served ") for p in SERVED_PHASES)],
                [[e.engine, e.runs, *(_med_mean(e.phases.get(p)) for p in SERVED_PHASES)]
                 for e in by_engine], left=1, compact=True))
        tg = targets(comps, served_comps)
        stdout.print(table("Targets (held out; issue 24)", ["target", "n", "now", "limit", ""],
                           [[t.label, t.n, "-" if not t.n else fmt.pct(t.value),
                             fmt.pct(t.limit), ("met" if t.met else "missed") if t.n
                             else "n/a"] for t in tg],
                           left=1, compact=True))
        cov = [c for c in cover if c.phase == "all"]
        if cov:
            stdout.print(table(
                "Band coverage (held out, leave one source out; target 70-90% for p10-p90)",
                ["engine", "figures", "inside band", "coverage"],
                [[c.engine, c.n, c.inside, fmt.pct(c.frac)] for c in cov], left=2,
                compact=True))
    for u in unserved:
        stderr.print(f"[yellow]not replayed:[/] {u}")
    for f in failed:
        stderr.print(f"[red]check failed:[/] {f}")
    if check and not as_json:  # the verdict, on the last line where CI logs end
        checked = sum(1 for s in overall if s.split == "held-out"
                      and recorded_limits().get(s.phase) is not None)
        stderr.print(f"validate --check: {'FAILED' if failed else 'passed'}: "
                     f"{checked - len(failed)} of {checked} held-out median errors at or "
                     "below the figures recorded in planner/data/validation_recorded.yaml")
    if failed:
        raise typer.Exit(1)


def _med_mean(fig) -> str:
    """A phase's held-out (n, median, mean) |error| as 'median / mean'; '-' where no run."""
    return "-" if fig is None else f"{fig[1]:.1%} / {fig[2]:.1%}"


SHORT_METRIC = {"user_tokens_per_s": "tok/s/user", "throughput_tokens_per_s_per_gpu": "tok/s/GPU",
                "throughput_tokens_per_s": "tok/s", "ttft_s": "TTFT", "tpot_s": "TPOT",
                "latency_s": "latency"}


def _grouped(items, key) -> list[tuple[str, list]]:
    """``items`` in runs of one ``key`` (their order kept): [(key, [item, ...]), ...]."""
    out: list[tuple[str, list]] = []
    for it in items:
        k = key(it)
        if not out or out[-1][0] != k:
            out.append((k, []))
        out[-1][1].append(it)
    return out


def _summary_table(per_source, width: int):
    """Error by source, engine and phase; each source id on a line of its own (a column
    wide enough for the longest would not leave 80 columns for the figures)."""
    from planner.io import fmt
    from planner.io.render import grouped_table

    return grouped_table(
        "Error by source, engine and phase (absolute, relative)",
        ["engine", "phase", "split", "n", "median", "p90", "median\nsigned", "ideal\nmedian"],
        [(source, [[s.engine, s.phase, s.split, s.n, fmt.pct(s.median_abs_error),
                    fmt.pct(s.p90_abs_error), f"{s.median_error:+.1%}",
                    fmt.pct(s.ideal_median_abs_error)] for s in group])
         for source, group in _grouped(per_source, lambda s: s.source)],
        width=width, left=3)


def _rows_table(comps, width: int):
    """Every comparison; under 150 columns the source and engine head each group of rows
    and the row name and metric wrap, so that no figure is cut."""
    from planner.io.render import grouped_table, table

    title = f"{len(comps)} published measurements vs predictions"
    if width >= 150:
        return table(title, ["source", "row", "engine", "metric", "measured", "predicted",
                             "error", "ideal err", "split"],
                     [[c.source, c.row, c.engine, c.metric, _num(c.metric, c.measured),
                       _num(c.metric, c.predicted), f"{c.error:+.1%}", f"{c.ideal_error:+.1%}",
                       c.split_label] for c in comps], left=4, compact=True)
    def key(c):
        return c.source, c.engine, c.split_label

    first = {}  # each source's rows together, held out before in-sample, in the files' order
    for i, c in enumerate(comps):
        first.setdefault(key(c)[:2], i)
    ordered = sorted(comps, key=lambda c: (first[key(c)[:2]], c.in_sample))
    columns = ["metric", "measured", "predicted", "error", "ideal\nerror"]

    def figures(c) -> list[str]:
        return [SHORT_METRIC.get(c.metric, c.metric), _num(c.metric, c.measured),
                _num(c.metric, c.predicted), f"{c.error:+.1%}", f"{c.ideal_error:+.1%}"]

    cells = [figures(c) for c in comps]
    need = sum(max(len(h), *(len(r[i]) for r in cells)) + 1 for i, h in enumerate(
        ["metric", "measured", "predicted", "error", "error"]))
    if max(len(c.row) for c in comps) + 1 + need <= width:  # the row's id fits as a column
        return grouped_table(
            title, ["row", *columns],
            [(f"{source} ({engine}), {split}", [[c.row, *figures(c)] for c in group])
             for (source, engine, split), group in _grouped(ordered, key)],
            width=width, left=2)
    groups = []  # else each row's id on a line of its own, its figures under it
    for (source, engine, split), group in _grouped(ordered, key):
        for i, (row, rows) in enumerate(_grouped(group, lambda c: c.row)):
            heading = f"  {row}"
            if i == 0:
                heading = f"{source} ({engine}), {split}\n{heading}"
            groups.append((heading, [["    " + f[0], *f[1:]] for f in map(figures, rows)]))
    return grouped_table(title, columns, groups, width=width, left=1)


def _served_table(comps, width: int):
    """Every replayed serving-run figure, under its source and engine, then its run (the
    run's name, model, layout and traffic on a line of their own, wrapped between words)."""
    from planner.io.render import grouped_table

    groups, seen = [], set()
    for (source, engine, run), group in _grouped(comps, lambda c: (c.source, c.engine, c.run)):
        c = group[0]
        heading = f"  {run} ({c.model}, {c.tp} x {c.gpu}): {c.traffic}"
        if (source, engine) not in seen:  # the source once, over its first run
            seen.add((source, engine))
            heading = f"{source} ({engine})\n{heading}"
        groups.append((heading, [["    " + c.phase.split()[-1], _num(c.metric, c.measured),
                                  _num(c.metric, c.predicted), f"{c.error:+.1%}",
                                  f"{c.ideal_error:+.1%}"] for c in group]))
    return grouped_table(
        f"{len(comps)} published serving-run figures vs the simulator",
        ["metric", "measured", "predicted", "error", "ideal\nerror"], groups, width=width,
        left=1)


def _num(metric: str, v: float) -> str:
    from planner.io import fmt

    return fmt.seconds(v) if metric.endswith("_s") and not metric.endswith("per_s") else \
        fmt.sig(v, 4)


def _write_csv(rows: list[dict], path: Path) -> None:
    import csv

    if not rows:
        path.write_text("")
        return
    with path.open("w", newline="") as f:
        names = list(dict.fromkeys(k for r in rows for k in r))
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        w.writerows(rows)
