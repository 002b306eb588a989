"""`llmplan plan`: the cheapest deployments that meet latency targets at a traffic level.

Searches GPUs x TP x weight and KV precision x batch with the vectorized sweep, keeps the
configurations that are supported, fit, and meet the TTFT and TPOT targets, and sizes each for
the traffic with static batching: a replica completes ``batch`` requests every ``latency_s``,
so it serves batch / latency requests per second, and the traffic needs
ceil(requests per second / that) replicas of ``tp`` GPUs each. Ranked by the cost per million
output tokens at that traffic (GPUs x price per GPU-hour / output tokens per hour), then by
latency. Imports numpy and pandas (through the sweep).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from planner.engine import IDEAL, Engine
from planner.specs import Calibration, DType, HardwareSpec, ModelSpec, Options
from planner.sweep import Grid, iter_sweep, to_frame


@dataclass(frozen=True)
class Targets:
    ttft_s: float
    tpot_s: float
    requests_per_s: float


def search(model: ModelSpec, gpus: list[HardwareSpec], *, prompt_tokens: int,
           output_tokens: int, targets: Targets, tps=(1, 2, 4, 8),
           weights=(DType.bf16, DType.fp8, DType.int8, DType.int4),
           kv_cache=(None, DType.fp8), batches=None, options: Options | None = None,
           calibration: Calibration | None = None,
           price_usd_per_gpu_hour: float | None = None, engine: Engine = IDEAL) -> pd.DataFrame:
    """Every configuration searched, with ``meets_targets`` and, for those that do, the
    replicas, GPUs, cost at the traffic and ``rank`` (1 = cheapest)."""
    batches = batches or [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512,
                          768, 1024]
    grid = Grid(models=[model], gpus=gpus, batches=batches, prompt_tokens=[prompt_tokens],
                output_tokens=[output_tokens], weights=list(weights), kv_cache=list(kv_cache),
                tps=list(tps), options=options or Options(), engine=engine)
    df = to_frame(iter_sweep(grid, calibration=calibration,
                             price_usd_per_gpu_hour=price_usd_per_gpu_hour))
    # kv "None" means the weights' 16-bit type; an explicit bf16 would duplicate those rows
    df = df.drop_duplicates(subset=["gpu", "tp", "weights", "kv_cache", "batch"])
    df = df.reset_index(drop=True)
    ok = df["supported"].astype(bool) & df["fits"].astype(bool)
    ttft = pd.to_numeric(df.get("ttft_s"), errors="coerce")
    tpot = pd.to_numeric(df.get("tpot_s"), errors="coerce")
    price = pd.to_numeric(df.get("price_usd_per_gpu_hour"), errors="coerce")
    latency = pd.to_numeric(df.get("latency_s"), errors="coerce")
    df["meets_latency"] = ok & (ttft <= targets.ttft_s) & (tpot <= targets.tpot_s)
    df["priced"] = price.notna()
    df["meets_targets"] = df["meets_latency"] & df["priced"]
    per_replica = df["batch"] / latency
    df["requests_per_s_per_replica"] = per_replica
    replicas = np.ceil(targets.requests_per_s / per_replica)
    df["replicas"] = replicas.where(df["meets_targets"])
    df["total_gpus"] = (replicas * df["tp"]).where(df["meets_targets"])
    df["usd_per_hour"] = (df["total_gpus"] * price).where(df["meets_targets"])
    tokens_per_hour = targets.requests_per_s * output_tokens * 3600
    df["cost_usd_per_million_output_tokens_at_traffic"] = df["usd_per_hour"] / \
        tokens_per_hour * 1e6
    df["memory_headroom_frac"] = 1 - pd.to_numeric(df.get("total_memory_bytes"),
                                                   errors="coerce") / \
        pd.to_numeric(df.get("usable_memory_bytes"), errors="coerce")
    feasible = df[df["meets_targets"]].sort_values(
        ["cost_usd_per_million_output_tokens_at_traffic", "latency_s", "total_gpus"])
    df["rank"] = pd.Series(np.arange(1, len(feasible) + 1), index=feasible.index)
    return df.sort_values(["rank"], na_position="last").reset_index(drop=True)


def pareto_front(feasible: pd.DataFrame) -> pd.DataFrame:
    """Configurations no other beats on both cost at the traffic and latency."""
    f = feasible.sort_values(["latency_s", "cost_usd_per_million_output_tokens_at_traffic"])
    best = np.inf
    keep = []
    for idx, cost in zip(f.index, f["cost_usd_per_million_output_tokens_at_traffic"],
                         strict=True):
        if cost < best:
            keep.append(idx)
            best = cost
    return f.loc[keep]


def plot_pareto(df: pd.DataFrame, path, *, title: str, top: int = 5) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner.report import Labels, plain_log_ticks

    feas = df[df["meets_targets"]]
    fig, ax = plt.subplots(figsize=(10, 6.5))
    ax.scatter(feas["latency_s"], feas["cost_usd_per_million_output_tokens_at_traffic"],
               s=12, color="lightgrey", label=f"meets the targets ({len(feas)})")
    front = pareto_front(feas)
    ax.plot(front["latency_s"], front["cost_usd_per_million_output_tokens_at_traffic"],
            "-o", color="tab:red", ms=5, lw=1.3, label="Pareto front (cost vs latency)")
    labels = Labels(ax, dx_dec=0.05, dy_dec=0.04)
    lines = []
    for r in feas.head(top).itertuples():
        cost = r.cost_usd_per_million_output_tokens_at_traffic
        ax.scatter([r.latency_s], [cost], s=40, facecolor="none", edgecolor="black", zorder=4)
        labels.add(r.latency_s, cost, f"#{int(r.rank)}", color="black", dx=5, dy=4,
                   fontsize=8)
        lines.append(f"#{int(r.rank)}  {int(r.replicas)} x {r.tp} {r.gpu}, {r.weights} "
                     f"weights, {r.kv_cache} KV, batch {r.batch}: ${cost:,.2f}/1M, "
                     f"{r.latency_s:.1f} s")
    ax.text(0.02, 0.02, "cheapest:\n" + "\n".join(lines), transform=ax.transAxes, fontsize=7,
            va="bottom", family="monospace",
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85, "lw": 0.5})
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax)
    ax.set_xlabel("end-to-end latency per request (s)")
    ax.set_ylabel("cost per 1M output tokens at the traffic (USD)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper right")
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
