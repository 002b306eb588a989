"""`llmplan models`, `gpus`, `engines` and `prices`: the built-in databases as tables or
JSON."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.cli.options import JsonOpt, PricesOpt, json_out, stdout
from planner.io.gate import gate


def models(as_json: JsonOpt = False) -> None:
    """List the built-in models."""
    from planner.core.ops import active_params, count_params
    from planner.io import catalog
    from planner.io.render import table

    rows = []
    for name in catalog.model_names():
        m = catalog.load_model(name)
        q = m.quantization  # how its checkpoint ships (quantization_config); None: unquantized
        rows.append({"name": name, "architecture": m.architecture, "params": count_params(m),
                     "active_params": active_params(m), "layers": m.num_layers,
                     "hidden_size": m.hidden_size, "attention_heads": m.num_attention_heads,
                     "kv_heads": m.num_kv_heads, "max_context_tokens": m.max_position_embeddings,
                     "moe": m.moe is not None, "mla": m.mla is not None,
                     "checkpoint_quantization": None if q is None else {
                         "weights": q.weights.value if q.weights else None,
                         "quantized_layers": q.quantized_layers, "label": q.label},
                     "source": m.source})
    if as_json:
        json_out(rows)
        return
    gate(rows, "the models table")  # the figures the table shows
    from planner.io import fmt
    from planner.io.render import plain
    stdout.print(table("Built-in models (quant: the checkpoint's, * experts only, ^ MLP only; "
                       "--json for sources)",
                       ["name", "arch", "params", "active", "layers", "hidden", "heads",
                        "kv", "context", "quant"],
                       [[plain(r["name"]), plain(r["architecture"]), fmt.count(r["params"]),
                         fmt.count(r["active_params"]), r["layers"], r["hidden_size"],
                         r["attention_heads"], r["kv_heads"],
                         fmt.tokens_short(r["max_context_tokens"]),
                         _quant(r["checkpoint_quantization"])]
                        for r in rows], left=2, compact=True))


def _quant(q: dict | None) -> str:
    """A checkpoint's weight type as released ("-": not quantized), * for experts only, ^ for
    the MLP layers only."""
    if q is None:
        return "-"
    return (q["weights"] or "?") + {"experts": "*", "mlp": "^"}.get(q["quantized_layers"], "")


def gpus(prices: PricesOpt = None, as_json: JsonOpt = False) -> None:
    """List the built-in GPUs, each priced in the --prices set."""
    from planner.io import catalog
    from planner.io.render import plain, table

    rows = []
    set_name = catalog.price_set(prices).name
    for name in catalog.gpu_names():
        h = catalog.load_hardware(name, prices)
        rows.append({"name": name, "display_name": h.display_name, "vendor": h.vendor,
                     "memory_gib": h.memory_gib,
                     "memory_bandwidth_gb_per_s": h.memory_bandwidth_gb_per_s,
                     "peak_tflops": {k.value: v for k, v in h.peak_tflops.items()},
                     "interconnect": h.interconnect.kind,
                     "interconnect_gb_per_s": h.interconnect.bandwidth_gb_per_s,
                     "tdp_w": h.tdp_w,
                     "usd_per_gpu_hour": h.price.usd_per_gpu_hour if h.price else None,
                     "price_set": set_name, "price_missing": h.price_missing,
                     "source": h.source})
    if as_json:
        json_out(rows)
        return
    gate(rows, "the gpus table")  # the figures the table shows
    stdout.print(table(f"Built-in GPUs (dense peak TFLOP/s; $/h: price set {set_name}, - where "
                       "it sells none; --json for sources)",
                       ["name", "mem\nGiB", "mem\nGB/s", "bf16", "fp16", "fp8", "int8",
                        "link", "link\nGB/s", "TDP\nW", "$/h"],
                       [[plain(r["name"]), f"{r['memory_gib']:g}",
                         f"{r['memory_bandwidth_gb_per_s']:,.0f}",
                         *[f"{r['peak_tflops'][k]:.0f}" if k in r["peak_tflops"] else "-"
                           for k in ("bf16", "fp16", "fp8", "int8")],
                         plain(r["interconnect"]), f"{r['interconnect_gb_per_s']:g}",
                         f"{r['tdp_w']:g}" if r["tdp_w"] else "-",
                         f"{r['usd_per_gpu_hour']:.2f}" if r["usd_per_gpu_hour"] else "-"]
                        for r in rows], compact=True))


def engines(as_json: JsonOpt = False) -> None:
    """List the engine profiles (engines_db) and their main figures."""
    from planner.io import catalog
    from planner.io.render import table

    rows = []
    for name in catalog.engine_names():
        spec = catalog.load_engine_spec(name)
        e = spec.model()
        rows.append({"name": name, "display_name": spec.display_name,
                     "engine_version": spec.engine_version, "ceilings": spec.ceilings,
                     "step_overhead_us": spec.step_overhead_us.value,
                     "cuda_graphs": e.cuda_graphs, "kernel_gap_us": spec.kernel_gap_us.value,
                     "gemm_bandwidth_frac": e.gemm_bandwidth_frac,
                     # times it by GPU architecture (16-bit GEMMs; {} where none is named)
                     "gemm_bandwidth_arch_frac": dict(e.gemm_bandwidth_by_arch),
                     "gemm_compute_frac": e.gemm_compute_frac,
                     "served_compute_frac": e.served_compute_frac,
                     # times the routed experts' compute share by architecture, 16-bit and
                     # W8A8 fp8 experts ({} where none is named)
                     "experts_compute_frac": dict(e.experts_compute_by_arch),
                     "experts_fp8_compute_frac": dict(e.experts_fp8_compute_by_arch),
                     # the GEMM depth at which those experts reach half that rate, by
                     # architecture, for each lane whose factor is named there ({} where
                     # none is named)
                     "experts_k_half": dict(e.experts_k_half_by_arch),
                     # the fp8 lane's own where it differs ({} where none is named)
                     "experts_fp8_k_half": dict(e.experts_fp8_k_half_by_arch),
                     # device time per MoE layer of MXFP4 routed experts beyond its
                     # operators', by architecture, in us ({} where none is named)
                     "mxfp4_moe_fixed_us": {k: v * 1e6 for k, v in e.mxfp4_moe_fixed_by_arch},
                     # device time per GQA / MHA attention call beyond its kernels', by
                     # architecture, in us ({} where none is named)
                     "attention_fixed_us": {k: round(v * 1e6, 6)
                                            for k, v in e.attention_fixed_by_arch},
                     "attention_bandwidth_frac": e.attention_bandwidth_frac,
                     # times it by GPU architecture ({} where none is named)
                     "attention_bandwidth_arch_frac": dict(e.attention_bandwidth_by_arch),
                     # the most GB/s attention reads an fp8 KV cache at, by architecture
                     "fp8_kv_attention_gb_per_s": {k: v / 1e9 for k, v in
                                                   e.fp8_kv_attention_by_arch},
                     # times attention's compute share over an fp8 cache, by architecture
                     "fp8_kv_attention_compute_frac": dict(
                         e.fp8_kv_attention_compute_by_arch),
                     # a W8A8 fp8 GEMM's rows computed at a time, by architecture: [up to M
                     # (null: every larger M), rows], ...
                     "fp8_gemm_row_tiles": {
                         k: [[None if b == float("inf") else int(b), int(r)] for b, r in t]
                         for k, t in e.fp8_gemm_row_tiles_by_arch},
                     "allreduce_latency_us": spec.allreduce_latency_us.value,
                     "memory_utilization_frac": e.memory_utilization_frac,
                     "memory_basis": e.memory_basis,
                     "fitted_rows": sorted(spec.fitted_rows()), "source": spec.source})
    if as_json:
        json_out(rows)
        return
    gate(rows, "the engines table")  # the figures the table shows
    stdout.print(table("Engine profiles (engines_db; --json for versions and sources; times "
                       "in us; BW: share of the bandwidth reached; FLOP: of the matmul rate, a "
                       "16-bit GEMM's)",
                       ["name", "ceilings", "step", "graphs", "kernel", "GEMM\nBW",
                        "GEMM\nFLOP", "attn\nBW", "all-\nreduce", "memory", "fitted\nrows"],
                       [[r["name"], r["ceilings"], f"{r['step_overhead_us']:g}",
                         "yes" if r["cuda_graphs"] else "no", f"{r['kernel_gap_us']:.3g}",
                         f"{r['gemm_bandwidth_frac']:.0%}",
                         f"{r['gemm_compute_frac'] * r['served_compute_frac']:.0%}",
                         f"{r['attention_bandwidth_frac']:.0%}",
                         f"{r['allreduce_latency_us']:.3g}",
                         f"{r['memory_utilization_frac']:.2g} {r['memory_basis']}",
                         len(r["fitted_rows"])]
                        for r in rows], left=2, compact=True))


def prices(
    name: Annotated[Optional[str], typer.Argument(
        metavar="[SET|FILE]", help="A price set to show GPU by GPU (default: list the sets).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the price sets (planner/data/prices), or one set's price per GPU-hour for each
    GPU with the offers behind it, and the GPUs it does not sell with the reason."""
    from planner.core.prices import Listed, NotSold, Owned
    from planner.io import catalog
    from planner.io.render import plain, table

    if name is None:
        sets = [catalog.load_price_set(n) for n in catalog.price_set_names()]
        rows = [{"name": s.name, "title": s.title, "basis": s.basis, "date": s.date,
                 "kind": s.kind, "default": s.name == catalog.default_prices(),
                 "priced": sum(1 for g in s.gpus if s.hourly(g) is not None),
                 "not_sold": sum(1 for g in s.gpus.values() if isinstance(g, NotSold))}
                for s in sets]
        if as_json:
            json_out(rows)
            return
        gate(rows, "the price sets table")  # the figures the table shows
        stdout.print(table("Price sets (llmplan prices SET for one; --prices SET on estimate, "
                           "plan, sweep, check, report)",
                           ["set", "what", "date", "priced", "unsold"],
                           [[plain(r["name"]) + (" *" if r["default"] else ""),
                             plain(r["title"]), r["date"], r["priced"], r["not_sold"]]
                            for r in rows], left=3, compact=True, fold=(1,)))
        stdout.print("* the default (or $LLMPLAN_PRICES)")
        return
    s = catalog.load_price_set(name)
    rows = []
    for gpu, g in sorted(s.gpus.items()):
        r = {"gpu": gpu, "usd_per_gpu_hour": s.hourly(gpu)}
        if isinstance(g, Listed):
            r["offers"] = [o.model_dump(exclude_none=True) for o in g.offers]
        elif isinstance(g, Owned):
            r.update(g.model_dump(exclude_none=True))
        else:
            r["not_sold"] = g.not_sold
        rows.append(r)
    payload = {"name": s.name, "title": s.title, "basis": s.basis, "date": s.date,
               "notes": list(s.notes), "assumptions": s.assumptions.model_dump()
               if s.assumptions else None, "gpus": rows}
    if as_json:
        json_out(payload)
        return
    gate(payload, "the price set's table")  # the figures the table shows
    out = []
    for r in rows:
        if r["usd_per_gpu_hour"] is None:
            out.append([plain(r["gpu"]), "not sold: " + plain(r["not_sold"]), "-"])
        elif "offers" in r:
            out.append([plain(r["gpu"]), plain(", ".join(
                f"{o['provider']} {o['usd_per_gpu_hour']:.2f}" for o in r["offers"])),
                f"{r['usd_per_gpu_hour']:.2f}"])
        else:
            out.append([plain(r["gpu"]), f"${r['purchase_usd']:,.0f}, {r['power_w']:g} W",
                        f"{r['usd_per_gpu_hour']:.2f}"])
    stdout.print(table(f"{plain(s.title)} ({plain(s.name)}, {s.date}): {plain(s.basis)}",
                       ["gpu", "from", "$/GPU-h"], out, left=2, compact=True, fold=(1,)))
