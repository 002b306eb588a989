"""`llmplan models`, `gpus` and `engines`: the built-in databases as tables or JSON."""

from __future__ import annotations

from planner.cli.options import JsonOpt, json_out, stdout


def models(as_json: JsonOpt = False) -> None:
    """List the built-in models."""
    from planner.core.ops import active_params, count_params
    from planner.io import catalog
    from planner.io.render import table

    rows = []
    for name in catalog.model_names():
        m = catalog.load_model(name)
        rows.append({"name": name, "architecture": m.architecture, "params": count_params(m),
                     "active_params": active_params(m), "layers": m.num_layers,
                     "hidden_size": m.hidden_size, "attention_heads": m.num_attention_heads,
                     "kv_heads": m.num_kv_heads, "max_context_tokens": m.max_position_embeddings,
                     "moe": m.moe is not None, "mla": m.mla is not None, "source": m.source})
    if as_json:
        json_out(rows)
        return
    from planner.io import fmt
    from planner.io.render import plain
    stdout.print(table("Built-in models (--json for sources)",
                       ["name", "arch", "params", "active", "layers", "hidden", "heads",
                        "kv", "context"],
                       [[plain(r["name"]), plain(r["architecture"]), fmt.count(r["params"]),
                         fmt.count(r["active_params"]), r["layers"], r["hidden_size"],
                         r["attention_heads"], r["kv_heads"],
                         fmt.tokens_short(r["max_context_tokens"])]
                        for r in rows], left=2, compact=True))


def gpus(as_json: JsonOpt = False) -> None:
    """List the built-in GPUs."""
    from planner.io import catalog
    from planner.io.render import plain, table

    rows = []
    for name in catalog.gpu_names():
        h = catalog.load_hardware(name)
        rows.append({"name": name, "display_name": h.display_name, "vendor": h.vendor,
                     "memory_gib": h.memory_gib,
                     "memory_bandwidth_gb_per_s": h.memory_bandwidth_gb_per_s,
                     "peak_tflops": {k.value: v for k, v in h.peak_tflops.items()},
                     "interconnect": h.interconnect.kind,
                     "interconnect_gb_per_s": h.interconnect.bandwidth_gb_per_s,
                     "tdp_w": h.tdp_w,
                     "usd_per_gpu_hour": h.price.usd_per_gpu_hour if h.price else None,
                     "source": h.source})
    if as_json:
        json_out(rows)
        return
    stdout.print(table("Built-in GPUs (dense peak TFLOP/s; --json for sources)",
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
                     "attention_bandwidth_frac": e.attention_bandwidth_frac,
                     "allreduce_latency_us": spec.allreduce_latency_us.value,
                     "memory_utilization_frac": e.memory_utilization_frac,
                     "memory_basis": e.memory_basis,
                     "fitted_rows": sorted(spec.fitted_rows()), "source": spec.source})
    if as_json:
        json_out(rows)
        return
    stdout.print(table("Engine profiles (engines_db; --json for versions and sources)",
                       ["name", "ceilings", "step", "graphs", "kernel", "GEMM BW", "attn BW",
                        "all-reduce", "memory", "fitted on"],
                       [[r["name"], r["ceilings"], f"{r['step_overhead_us']:g} us",
                         "yes" if r["cuda_graphs"] else "no", f"{r['kernel_gap_us']:g} us",
                         f"{r['gemm_bandwidth_frac']:.0%}",
                         f"{r['attention_bandwidth_frac']:.0%}",
                         f"{r['allreduce_latency_us']:g} us",
                         f"{r['memory_utilization_frac']:g} {r['memory_basis']}",
                         f"{len(r['fitted_rows'])} rows"]
                        for r in rows], left=2, compact=True))
