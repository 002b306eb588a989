"""How many held-out figures of served runs the simulated server keeps up with lie inside the
bands `llmplan simulate` gives them, before and after its near-capacity widening.

    python benchmarks/near_capacity_coverage.py

Each held-out served run (planner/data/served) is replayed as `llmplan validate` replays it.
Where the simulated server keeps up with the run's rate (the unsaturated regime; closed loops
and all-at-once runs are not rates), each compared figure gets the band `simulate` would print
from the built-in table (planner/data/bands.yaml), and the same stream is replayed on a server
whose every step takes the TPOT band's high end times its predicted time; the bands widen where
that server falls past them (planner.evidence.bands.widen_near_capacity). Prints each figure
and the counts inside. The built-in bands include these sources' figures: this checks the
widening, it fits nothing.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.cli.options import figure_bands  # noqa: E402
from planner.cli.validate import at_release, replay_setup, replayed_runs  # noqa: E402
from planner.core.errors import UsageError  # noqa: E402
from planner.evidence.bands import served_regime, widen_near_capacity  # noqa: E402
from planner.evidence.compare import _sim_value, simulate_run  # noqa: E402
from planner.evidence.served import compared_figures  # noqa: E402
from planner.io import catalog  # noqa: E402
from planner.serving import run as serving  # noqa: E402
from planner.serving.steps import SlowedCoster  # noqa: E402


def summary_name(metric: str) -> str:
    """A compared metric's key in the simulator's summary: mean_ttft_s -> mean_ttft_ms (the
    figure keeps the run's unit, seconds; the widening uses only ratios)."""
    return metric[:-2] + "_ms" if metric.endswith("_s") else metric


def main() -> int:
    rows, inside = [], [0, 0]
    for ds, folder in catalog.load_served():
        for e in ds.runs:
            spec = catalog.load_engine_spec(e.engine or ds.source.engine)
            spec = at_release(spec, e.engine_version or ds.source.engine_version)
            if f"{ds.source.id}:{e.id}" in spec.fitted_rows():
                continue  # in-sample: not a held-out figure
            setup = replay_setup(e, spec)
            coster = serving.coster(setup)
            for r in replayed_runs(e, folder, ds):
                try:
                    figures = _figures(e, r, setup, coster)
                except UsageError as err:  # a run the simulator cannot serve, as validate
                    print(f"{ds.source.id}:{e.id}: not replayed: {err}")
                    continue
                for name, m, a, w in figures:
                    before, after = a.low <= m <= a.high, w.low <= m <= w.high
                    inside[0] += before
                    inside[1] += after
                    rows.append((ds.source.id, f"{e.id} {r.label}".strip(), name, m, a.value,
                                 a.low, a.high, w.low, w.high, before, after))
    print(f"{'source':28s} {'run':62s} {'figure':18s} {'measured':>10s} {'predicted':>10s} "
          f"{'band':>21s} {'widened':>21s} in")
    for src, run, name, m, v, lo, hi, wlo, whi, b, a in rows:
        print(f"{src:28s} {run[:62]:62s} {name.removesuffix('_ms'):18s} {m:10.4g} {v:10.4g} "
              f"{lo:10.4g}-{hi:<10.4g} {wlo:10.4g}-{whi:<10.4g} {'yes' if b else 'no'}/"
              f"{'yes' if a else 'no'}")
    n = len(rows)
    print(f"\n{n} held-out figures of unsaturated served runs (times in seconds, throughputs in "
          f"tokens/s): {inside[0]} inside the bands, {inside[1]} inside after the near-capacity "
          "widening")
    return 0


def _figures(e, r, setup, coster) -> list:
    """(name, measured, band, widened band) of each compared figure of run ``r``, where the
    simulated server keeps up with its rate; none otherwise."""
    if r.closed_loop or not math.isfinite(r.request_rate):
        return []
    sim, _ = simulate_run(r, setup, step_coster=coster)
    regime = served_regime(r.request_rate, sim.get("request_throughput"),
                           sim.get("max_running_requests"), setup.engine.max_num_seqs)
    if regime != "unsaturated":
        return []
    figs, measured = {}, {}
    for phase, k, p in compared_figures(e, r, lambda k: _sim_value(sim, k)):
        figs[summary_name(k)] = (p, phase, regime, False)
        measured[summary_name(k)] = r.metrics[k]
    applied = figure_bands(setup.engine.name, figs, gpu_class=setup.hardware.architecture)
    tpot = next((a for n, a in applied.items() if "tpot" in n or "itl" in n), None)
    factor = tpot.high / tpot.value if tpot is not None and tpot.value > 0 else 1.0
    widened = applied
    if factor > 1.0:
        slowed, _ = simulate_run(r, setup, step_coster=SlowedCoster(coster, factor))
        widened, _ = widen_near_capacity(applied, sim, slowed, factor)
    return [(name, measured[name], a, widened[name]) for name, a in applied.items()]


if __name__ == "__main__":
    sys.exit(main())
