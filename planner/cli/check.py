"""`llmplan check`: capacity budgets in CI (exit 1 when a deployment breaks one)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.options import (
    DEFAULT_ENGINE,
    ExpertImbalanceOpt,
    PriceOpt,
    check_context,
    check_engine_option,
    check_quantized_layers,
    json_out,
    output_path,
    static_bands,
    stdout,
    with_expert_imbalance,
)
from planner.core.errors import LlmplanError
from planner.io import fmt


def _fmt_value(limit: str, v) -> str:
    """A limit's value in the units its kind reads in (``LIMITS``, ``SERVED_LIMITS``)."""
    from planner.evidence.budget import LIMITS, SERVED_LIMITS
    from planner.io import fmt

    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    kind = (LIMITS.get(limit) or SERVED_LIMITS.get(limit) or ("number",))[0]
    return {"time": fmt.seconds, "frac": fmt.pct, "usd": fmt.usd}.get(kind, _number)(v)


def _number(x: float) -> str:
    """Four significant figures, grouped in thousands: 104,900, not 1.049e+05."""
    return fmt.sig(x, 4)


def _junit(results, path: Path, budget: Path) -> None:
    import xml.etree.ElementTree as ET

    suite = ET.Element("testsuite", name=f"llmplan check {budget}", tests=str(len(results)),
                       failures=str(sum(not r.passed for r in results)), errors="0")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=r.deployment, name=r.limit)
        if not r.passed:
            f = ET.SubElement(case, "failure", message=_message(r))
            f.text = _message(r)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def _message(r) -> str:
    op = {"max": "<=", "min": ">=", "eq": "=="}[r.direction]
    got = _fmt_value(r.limit, r.predicted)
    if r.at == "high":
        got += f" at its error band's slow end (predicted {_fmt_value(r.limit, r.prediction)})"
    want = _fmt_value(r.limit, r.bound)
    by = f" ({abs(r.margin_frac):.1%} {'inside' if r.passed else 'outside'})" \
        if r.margin_frac is not None else ""
    return f"{r.deployment}: {r.what} predicted {got}, limit {op} {want}{by}"


def _figures(d, dep):
    """A budget deployment's figures at the workload's sequences and, for ``fits_at``, at
    that many: the estimate of a TP group, or the layout's (``planner.layouts.figures``)
    for pipeline stages or expert parallelism."""
    from planner.core.estimate import resolve_price
    from planner.core.specs import Workload
    from planner.layouts.deployment import estimate_deployment
    from planner.layouts.figures import layout_figures

    wl, lay = dep.workload, d.layout
    layered = lay.pp > 1 or lay.ep > 1
    if layered and dep.limits.mbu_min is not None:
        raise LlmplanError("mbu_min: MBU is not predicted for pp or ep layouts")
    price, _ = resolve_price(d.hardware, dep.price_per_hour)

    def at(batch: int):
        if layered:
            return layout_figures(d.model, d.hardware, d.prepared, d.options, tp=lay.tp,
                                  pp=lay.pp, ep=lay.ep, batch=batch,
                                  prompt_tokens=wl.prompt_tokens,
                                  output_tokens=wl.output_tokens, price_usd_per_gpu_hour=price)
        return estimate_deployment(d, Workload(batch=batch, prompt_tokens=wl.prompt_tokens,
                                               output_tokens=wl.output_tokens),
                                   price_usd_per_gpu_hour=dep.price_per_hour).estimate

    return at(wl.sequences), at(dep.limits.fits_at) if dep.limits.fits_at else None


def served_run_text(run: dict) -> str:
    """Which simulated requests a deployment's served limits were measured on, in words."""
    n, m = run["simulated_requests"], run["measured_requests"]
    if run["measured_from_s"] is None:
        return f"measured on {m:,} of {n:,} requests simulated from an empty replica " \
               "(measure: all)"
    text = (f"measured on the {m:,} requests arriving {run['measured_from_s']:.3g}-"
            f"{run['measured_to_s']:.3g} s, of {n:,} simulated per replica")
    if run.get("keeps_up") is False:
        return text + " (the replica does not keep up: its queue grows through the window, " \
            "so it has no steady state)"
    if run.get("capped"):
        return text + (f" (capped at {n:,} requests: the window starts within a request "
                       f"lifetime, {run['lifetime_s']:.3g} s, of the start and ends within "
                       "one of the last arrival, so it is not a steady state)")
    return text + " (steady state)"


def served_lifetime_s(limits, output_tokens: int, request_rate: float) -> float | None:
    """The longest a request meeting a deployment's served time limits lives: its
    end-to-end limit, or its TTFT limit and every later token at the TPOT limit (``plan``'s
    ``request_lifetime_s``), whichever is shorter; None where the limits set neither."""
    from planner.search.plan import Targets, request_lifetime_s

    lives = []
    if limits.served_latency_s is not None:
        lives.append(limits.served_latency_s)
    if limits.served_ttft_s is not None and limits.served_tpot_s is not None:
        lives.append(request_lifetime_s(Targets(limits.served_ttft_s, limits.served_tpot_s,
                                                request_rate), output_tokens))
    return min(lives) if lives else None


def _served(d, dep, held: str):
    """A budget deployment's served figures under its ``traffic``: one replica simulated at
    its share of the rate (``planner.serving.run``: continuous batching, the engine's
    scheduler defaults under any ``performance_mode``), as ``evaluate_served`` takes them;
    and where it is held at the slow end (``held`` "high"), the same replica with every step
    slowed to the served TPOT band's high end and its TTFT held at the TTFT band's, as ``plan
    --size-at high`` sizes one (``planner.evidence.bands.served_band_factors``), with the
    bands it rests on. The ideal engine, a bound, has no band. Also the run the times were
    measured on (requests simulated, the arrival window measured; ``traffic.measure``).

    At ``measure: steady`` the times are those of the replica's steady state, as ``plan``
    sizes one (``planner.search.plan.sizing_requests``): a stream long enough that at least
    ``num_requests`` requests arrive once the replica has filled (one request lifetime after
    the start) and one lifetime before the stream ends, over two lifetimes at least. The
    lifetime is that of a request meeting the time limits (``served_lifetime_s``; ``plan``
    caps it, for a lightly loaded replica, by what its first requests show
    (``steady_lifetime_s``, ``CountRuns``), and a budget does not, so under limits far
    looser than the replica's latencies the two windows differ); where
    they set none (a throughput limit, or a TTFT limit alone), the end-to-end latency at the
    traffic's percentile of a first run of ``num_requests`` from an empty server."""
    from planner.cli.simulate import request_stream
    from planner.evidence.bands import served_band_factors
    from planner.evidence.budget import SERVED_LIMITS
    from planner.io import catalog
    from planner.search.plan import (
        MAX_SIZING_REQUESTS,
        SimSettings,
        percentile_key,
        sizing_coster,
        sizing_requests,
    )
    from planner.serving import run
    from planner.serving.metrics import keeps_up, summary

    t, wl = dep.traffic, dep.workload
    rate = t.request_rate / t.replicas

    # a published length distribution (sharegpt) keeps its own means where the workload
    # states no lengths, as simulate --dataset-name sharegpt does without -p / -o
    given = wl.model_fields_set

    def stream(n: int):
        return request_stream(None, t.dataset_name, n,
                              wl.prompt_tokens if "prompt_tokens" in given else None,
                              wl.output_tokens if "output_tokens" in given else None,
                              t.range_ratio, rate, 1.0, None, t.seed)

    # as simulate serves: the model's context (the workload's, where it is allowed longer),
    # and the step budget as the prefill chunk
    cfg = run.scheduler(d, mode=dep.performance_mode,
                        max_model_len=max(d.model.max_position_embeddings,
                                          wl.prompt_tokens + wl.output_tokens))
    d = d.with_options(prefill_chunk_tokens=cfg.max_num_batched_tokens)
    coster = run.coster(d)

    def simulated(reqs, step_coster, window):
        s = summary(run.run(d, reqs, cfg, step_coster=step_coster), itl=False, window=window)
        if s["completed"] == 0:
            raise LlmplanError(f"traffic: no request was served ({s.get('failed_reason')})")
        return s

    def figures(s: dict, st: SimSettings, capped: bool = False) -> dict:
        # TTFT and TPOT held at the bands' factors beyond the slowed steps (1 as predicted)
        factors = {"ttft": st.ttft_factor, "tpot": st.tpot_factor}
        out = {}
        for name, (kind, _, figure, _) in SERVED_LIMITS.items():
            if kind == "time":  # at the percentile, ms in the summary
                v = s.get(percentile_key(figure, t.percentile))
                out[name] = None if v is None else v / 1e3 * factors.get(figure, 1.0)
            else:  # a rate: every replica's together, over the window where there is a
                # steady one (a capped run's may be too short for any request to finish)
                rate_of = s[figure] if capped else s.get(f"measured_{figure}", s[figure])
                out[name] = rate_of * t.replicas
        # whether the replica kept up with its share of the traffic over the window
        # (``planner.serving.metrics.keeps_up``): requests a second arriving, and finished
        out["_keeps_up"] = keeps_up(s)
        out["_rates"] = (s.get("measured_arrival_rate"), s.get("measured_request_throughput"))
        return out

    high = held == "high" and d.engine.name != "ideal"
    if high:
        factors, used = served_band_factors(catalog.load_bands(), d.engine.name)
        st = SimSettings(**factors)
        slowed = sizing_coster(coster, st)

    def e2el_s(s: dict) -> float:
        return (s.get(percentile_key("e2el", t.percentile)) or 0.0) / 1e3

    window, life = None, None
    reqs = stream(t.num_requests)
    if t.measure == "steady":
        life = served_lifetime_s(dep.limits, wl.output_tokens, t.request_rate)
        if life is None:  # the run's own: the percentile's end-to-end latency from empty,
            # of the replica held (a slower one's requests live longer, and it fills later)
            life = max(e2el_s(simulated(reqs, coster, None)),
                       e2el_s(simulated(reqs, slowed, None)) if high else 0.0)
        cap = max(MAX_SIZING_REQUESTS, 2 * t.num_requests)
        n, window = sizing_requests(rate, life, SimSettings(num_requests=t.num_requests),
                                    cap=cap)
        reqs = stream(n)
    served_run = {"measure": t.measure, "simulated_requests": len(reqs),
                  "measured_from_s": window[0] if window else None,
                  "measured_to_s": window[1] if window else None,
                  "lifetime_s": life if window else None,
                  # the cap on requests simulated met: the window starts and ends within a
                  # lifetime of the run's ends, so it is not a steady state
                  "capped": bool(window) and window[0] < life}
    nominal_s = simulated(reqs, coster, window)
    capped = served_run["capped"]
    nominal = figures(nominal_s, SimSettings(), capped)
    served_run["measured_requests"] = nominal_s.get("measured_requests", nominal_s["completed"])
    served_run["keeps_up"] = nominal["_keeps_up"]
    if not high:
        return nominal, None, served_run
    tpot, ttft = used["served TPOT"], used["served TTFT"]
    basis = (f"every step x{factors['step_factor']:.2f} (served TPOT band's high end, "
             f"{tpot.engine if tpot.engine != 'all' else 'all engines'}, {tpot.n} held-out "
             f"figures from {tpot.sources} sources), TTFT at least x{ttft.high_ratio:.2f}")
    return nominal, (figures(simulated(reqs, slowed, window), st, capped), basis), served_run


_PACKAGE = Path(__file__).resolve().parent.parent  # planner/


def example_dirs() -> tuple[Path, ...]:
    """Where the example budgets are: the checkout's ``examples/`` (a clone, an editable
    install), or the copy a wheel carries inside the package (pyproject's force-include)."""
    return (_PACKAGE.parent / "examples", _PACKAGE / "_data" / "examples")


def resolve_budget(budget: Path) -> Path:
    """``budget`` as given when it exists; else, for ``examples/NAME`` (the path the docs
    use), the shipped example of that name, so a wheel install runs the docs' command from
    any directory. Anything else is left for the loader to refuse by name."""
    if budget.exists() or budget.is_absolute() or budget.parts[:1] != ("examples",):
        return budget
    for folder in example_dirs():
        shipped = folder.joinpath(*budget.parts[1:])
        if shipped.is_file():
            import sys

            print(f"{budget}: not in this directory; using the example shipped with llmplan: "
                  f"{shipped}", file=sys.stderr)
            return shipped
    return budget


def check(
    budget: Annotated[Path, typer.Argument(help=(
        "Budget YAML. The examples the docs use ship with llmplan: examples/budget.yaml "
        "where no such file is here is the shipped copy."))],
    engine: Annotated[str, typer.Option(
        "--engine", "-e", help="Engine profile for deployments that name none (a deployment's "
        "own `engine:` wins).", metavar="ENGINE")] = DEFAULT_ENGINE,
    calibration: Annotated[Optional[Path], typer.Option(
        help="Use measured ceilings from `llmplan measure --calibrate`.", metavar="FILE")] = None,
    junit: Annotated[Optional[Path], typer.Option(
        help="Also write JUnit XML (one test case per limit).", metavar="XML")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    expert_imbalance: ExpertImbalanceOpt = None,
    prices: Annotated[Optional[str], typer.Option(
        "--prices", metavar="SET|FILE",
        help="The price set costs are on for deployments that name none (a deployment's "
        "own `prices:` wins): hyperscaler-on-demand (default), specialty-on-demand, "
        "committed-1y, committed-3y, owned, or a YAML file.")] = None,
    price: PriceOpt = None,
    at: Annotated[Optional[str], typer.Option(
        "--at", metavar="predicted|high",
        help="Hold the limits at the prediction, or at the slow end of its error band "
        "(the high end of TTFT, TPOT and latency, the low end of throughput and MBU, the "
        "cost at that throughput: p90 of measured / predicted on held-out published runs, "
        "planner/data/bands.yaml), for deployments that name none (a deployment's own "
        "`at:` wins). Default: predicted.")] = None,
) -> None:
    """Check deployments against capacity budgets: exit 0 if every limit holds, 1 if any
    fails, 2 for a bad budget file."""
    from planner.core.specs import Options
    from planner.evidence.budget import evaluate, evaluate_served
    from planner.io import catalog
    from planner.io.render import plain, table
    from planner.layouts.deployment import Deployment, Layout

    output_path(junit, "--junit")
    if at not in (None, "predicted", "high"):
        raise LlmplanError(f"--at: must be predicted or high, got {at!r}")
    budget = resolve_budget(budget)
    opts = with_expert_imbalance(Options(), expert_imbalance)
    overrides = catalog.parse_price_overrides(price)
    if prices is not None:  # the option's fault, named as such (not a deployment's line)
        catalog.load_price_set(prices)
    check_engine_option(engine)
    b = catalog.load_budget(budget)
    cal = catalog.load_calibration(calibration) if calibration else None
    text = catalog.read_text(budget, what="budget file")
    results, lines = [], {}
    for i, dep in enumerate(b.deployments):
        lines[dep.label] = catalog.yaml_line(text, ("deployments", i))
        where = f"{budget}:{lines[dep.label] or '?'}"
        try:
            m = catalog.load_model(dep.model)
            hw = catalog.load_hardware(dep.gpu, dep.prices or prices, overrides)
            check_context(m, dep.workload.prompt_tokens, dep.workload.output_tokens,
                          dep.allow_longer_context, "workload prompt_tokens + output_tokens")
            eng = catalog.load_engine(dep.engine or engine)
            prec = m.precision_of(dep.weights, dep.kv_cache, compute=dep.compute,
                                  quantized_layers=check_quantized_layers(
                                      m, dep.quantized_layers))
            d = Deployment.build(m, hw, engine=eng, precision=prec,
                                 layout=Layout(dep.tp, dep.pp, dep.ep), options=opts,
                                 calibration=cal)
            est, at_fits = _figures(d, dep)
            held = dep.at or at or "predicted"
            served = _served(d, dep, held) if dep.traffic is not None else None
        except (LlmplanError, ValueError) as err:  # ValueError: pydantic's, e.g. weights fp32
            errs = getattr(err, "errors", None)
            msg = errs()[0]["msg"].removeprefix("Value error, ") if callable(errs) else str(err)
            # the budget file's keys where the message names the command line's flags
            msg = msg.replace("with --compute", "with compute: (fp16, bf16, fp8 or int8) in "
                                                 "the deployment")
            msg = msg.replace("--performance-mode ", "performance_mode: ")
            msg = msg.replace("--dataset-name: ", "traffic dataset_name: ")
            msg = msg.replace("--weights fp16 (vLLM's --dtype half, as vLLM itself asks on "
                              "such GPUs) or --compute fp16",
                              "weights: fp16, or compute: (fp16, bf16, fp8 or int8) in the "
                              "deployment")
            if msg.startswith("traffic"):  # the traffic block's own line
                where = f"{budget}:{catalog.yaml_line(text, ('deployments', i, 'traffic')) or '?'}"
            raise LlmplanError(f"{where}: deployment {dep.label}: {msg}") from None
        results += evaluate(dep, est, at_fits, static_bands(d, est, dep.workload.sequences)
                            if held == "high" else None)
        if served is not None:
            figures, high, run = served
            results += evaluate_served(dep, figures, high, run)
    failed = [r for r in results if not r.passed]
    if junit:
        _junit(results, junit, budget)
    if os.environ.get("GITHUB_ACTIONS") == "true":  # annotations on the pull request
        import sys

        out = sys.stderr if as_json else sys.stdout  # --json keeps stdout pure JSON
        for r in failed:
            # the failing limit's own line, else its deployment's
            i = next(k for k, d in enumerate(b.deployments) if d.label == r.deployment)
            at = catalog.yaml_line(text, ("deployments", i, "limits", r.limit)) \
                or lines.get(r.deployment)
            line = f",line={at}" if at else ""
            print(f"::error file={budget}{line},title=llmplan budget::{_message(r)}", file=out)
    payload = {"budget": str(budget), "passed": not failed,
               "results": [r.as_dict() for r in results]}
    if as_json:
        json_out(payload)
    else:
        from planner.io.gate import gate

        gate(payload, "check's table")  # the figures the table shows
        rows = []
        for r in results:
            op = {"max": "<=", "min": ">=", "eq": "=="}[r.direction]
            what = r.what + (" (band's slow end)" if r.at == "high" else "")
            rows.append([plain(r.deployment), what, _fmt_value(r.limit, r.predicted),
                         f"{op} {_fmt_value(r.limit, r.bound)}",
                         "[green]pass[/]" if r.passed else "[red]FAIL[/]",
                         f"{r.margin_frac:+.1%}" if r.margin_frac is not None else ""])
        stdout.print(table(f"Budget {budget}", ["deployment", "limit", "predicted", "limit",
                                                "result", "margin"], rows, left=2))
        runs = {r.deployment: r.run for r in results if r.run is not None}
        for label, run in runs.items():
            stdout.print(plain(f"{label}: served limits {served_run_text(run)}"))
        stdout.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if failed:
        raise typer.Exit(1)
