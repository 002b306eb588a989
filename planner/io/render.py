"""Rich rendering of estimates and tables (edge: imported by the CLI only)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.core.estimate import Estimate
from planner.core.roofline import (
    StepTime,
    experts_compute_factor,
    experts_depth_factor,
    fp8_kernels,
)
from planner.core.specs import DType
from planner.io import fmt


def _window_note(m) -> str:
    """How a sliding window caps the cache, for the KV line."""
    n = m.num_sliding_layers
    if not n:
        return ""
    which = "all layers" if n == m.num_layers else f"{n} of {m.num_layers} layers"
    return f"; {which} keep the last {m.sliding_window:,}"


def table(title: str | None, columns: list[str], rows: list[list], *,
          left: int = 1, compact: bool = False, fold: tuple[int, ...] = ()) -> Table:
    """A table whose first ``left`` columns are left-aligned and the rest (numbers) right;
    the columns in ``fold`` wrap onto more lines in a narrow terminal instead of being cut."""
    t = Table(title=title, title_justify="left", header_style="bold",
              box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, pad_edge=not compact,
              padding=(0, 0) if compact else (0, 1),  # compact: the box's one space between
              show_edge=not compact)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i < left else "right",
                     no_wrap=(compact or i == 0) and i not in fold,
                     overflow="fold" if i in fold else "ellipsis")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    return t


def grouped_table(title: str | None, columns: list[str],
                  groups: list[tuple[str, list[list]]], *, width: int, left: int = 1,
                  fold: tuple[int, ...] = ()):
    """``table``'s compact table with its rows in groups, each under a heading line of its
    own (a source id, a run id): the heading spans the whole line, so a narrow terminal never
    folds an id into a column a few characters wide (a heading longer than the line wraps
    between words). The columns are sized once, over every
    group's rows at ``width``, so that they line up from group to group."""
    from rich.console import Group
    from rich.text import Text

    rows = [[str(x) for x in r] for _, g in groups for r in g]
    console = Console(width=width)
    sized = table(None, columns, rows, left=left, compact=True, fold=fold)
    widths = sized._calculate_column_widths(console, console.options.update_width(width))

    def part(rows_: list[list], *, header: bool) -> Table:
        t = table(None, columns, rows_, left=left, compact=True, fold=fold)
        t.show_header = header
        for col, w in zip(t.columns, widths, strict=True):
            col.width = w
        return t

    parts: list = [Text(title, style="italic")] if title else []
    parts.append(part([], header=True))
    for heading, g in groups:
        parts += [Text(heading, style="bold"),  # a long one wraps between words
                  part(g, header=False)]
    return Group(*parts)


def plain(text: object) -> str:
    """Text from a file or a name, shown as is: rich must not read [brackets] as markup."""
    return escape(str(text))


def _section(title: str, rows: list[tuple[str, str, str]]) -> Table:
    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False,
              title_style="bold")
    t.add_column("what", style="cyan", no_wrap=True)
    t.add_column("value", justify="right", no_wrap=True)
    t.add_column("note", style="dim", overflow="fold")  # a long URL folds, is not cut
    for r in rows:
        t.add_row(*r)
    return t


def _tp_link(hw, tp: int) -> str:
    """Which link the TP all-reduces cross: the server's, or the network between servers."""
    node = hw.node
    if node is None or tp <= node.gpus_per_node:
        return f"per decode step, over {hw.interconnect.kind}"
    nodes = -(-tp // node.gpus_per_node)
    if node.inter_node is None:
        return (f"per decode step; {nodes} servers of {node.gpus_per_node}, but hardware_db has "
                f"no inter-node figure: {hw.interconnect.kind} assumed")
    net = node.inter_node
    return (f"per decode step across {nodes} servers of {node.gpus_per_node}: over "
            f"{net.kind}, {net.bandwidth_gb_per_s:g} GB/s per GPU")


def render_estimate(console: Console, e: Estimate, *, explain: bool = False,
                    weights_source: str | None = None, speculation=None) -> None:
    """The estimate as `llmplan estimate` prints it: what was planned (``weights_source``:
    where the weights' precision came from), then memory, compute, roofline, timing,
    utilisation and cost, the notes, and with ``explain`` each step's operators. With
    ``speculation`` (a ``SpeculationResult``) timing and cost show the speculative figures,
    those without speculation beside them."""
    _print_header(console, e)
    if weights_source is not None:
        console.print(f"weights: {e.precision.weights.value} ({escape(weights_source)})")
    for section in (_memory, _compute, _roofline):
        console.print(section(e))
    if speculation is None:
        console.print(_timing(e))
    else:
        console.print(_spec_timing(e, speculation))
    console.print(_utilisation(e))
    console.print(_cost(e) if speculation is None else _spec_cost(e, speculation))
    for n in e.notes:
        console.print(f"[yellow]note:[/] {n}")
    if explain:
        _print_operators(console, e)


def _print_header(console: Console, e: Estimate) -> None:
    """The model, GPUs, precisions and workload; then the engine and the time model."""
    m, hw, p = e.model, e.hardware, e.precision
    gpus = f"{e.tp} x {hw.display_name}" if e.tp > 1 else hw.display_name
    quant = (f", group {p.group_size}, {p.quantized_bytes_per_param:.4g} B/param incl. scales"
             if p.weights.value in ("int8", "int4") else
             f", blocks of 32, {p.quantized_bytes_per_param:.4g} B/param incl. scales"
             if p.weights.value == "mxfp4" else "")
    if p.quantized_layers != "all":
        which = "routed experts" if p.quantized_layers == "experts" else "MLP layers"
        quant += f" ({which} only; the rest in {p.half_dtype.value})"
    console.print(f"[bold]{escape(m.label)}[/] on [bold]{escape(gpus)}[/]  "
                  f"weights {p.weights.value}{quant}, "
                  f"KV {p.kv_cache.value}, compute {p.compute_dtype.value}; "
                  f"batch {e.batch}, prompt {e.prompt_tokens}, output {e.output_tokens} tokens")
    eng = e.engine
    overlap = f", overlap {eng.overlap_frac:.0%}" \
        if eng.overlap_frac < 1 and e.options.time_model == "roofline" else ""
    console.print(f"[dim]engine: {escape(eng.display_name or eng.name)}"
                  f"{f' ({escape(eng.version)})' if eng.version and eng.version != '-' else ''}; "
                  f"ceilings: {e.ceilings.source}; time model: {e.options.time_model}{overlap}; "
                  f"attention: {e.options.attention}[/]")


# what each memory basis's fraction is a fraction of (planner.core.engine.MEMORY_BASES)
_BASIS_TEXT = {"total": "of capacity",
               "measured": "of capacity, less a margin kept free (sized after warm-up)",
               "static": "of capacity less the reserve, for weights and KV cache",
               "free": "of what weights, activations and reserve leave, for KV cache"}


def _usable_note(mem, o) -> str:
    """What the usable memory is: the engine's fraction on its basis, or the KV cache given
    outright (``Options.kv_cache_memory_bytes``) beside the rest; a token cap said after."""
    pool, cap = o.kv_cache_memory_bytes, o.kv_cache_max_tokens
    if pool is None:
        text = f"{fmt.pct(mem.utilization_frac)} {_BASIS_TEXT[mem.utilization_basis]}"
    elif not mem.kv_pool_bytes:
        text = "weights, activations and reserve alone: the KV cache given has no room"
    else:
        text = f"weights, activations and reserve, and a {fmt.gib(pool)} KV cache given outright"
    return text if cap is None else f"{text}; KV cache of at most {cap:,} tokens"


def _memory(e: Estimate) -> Table:
    mem = e.memory
    kc = e.kv_concurrency()
    fits = "[green]yes[/]" if mem.fits else "[red]NO[/]"
    return _section(f"Memory{' per GPU' if e.tp > 1 else ''}", [
        ("weights", fmt.gib(mem.weights_bytes), f"{fmt.count(e.params)} params" + (
            f"; {fmt.gib(mem.offloaded_weights_bytes)} more in host memory, over the host "
            "link every step" if mem.offloaded_weights_bytes else "")),
        ("KV cache", fmt.gib(mem.kv_cache_bytes),
         f"{e.kv_cache_bytes_per_token / 1024:,.1f} KiB/token x {e.batch} x "
         f"{e.context_tokens} tokens{_window_note(e.model)}"),
        ("activations (peak)", fmt.gib(mem.activation_bytes), f"prefill, {e.options.attention}"),
        ("reserve", fmt.gib(mem.reserve_bytes), "CUDA context, workspaces"),
        ("total", fmt.gib(mem.total_bytes),
         f"{fmt.pct(mem.used_frac)} of {fmt.gib(mem.capacity_bytes)}"),
        ("usable", fmt.gib(mem.usable_bytes), _usable_note(mem, e.options)),
        ("fits", fits, "" if mem.fits else _misfit(mem, e.options)),
        ("concurrency, paged KV", f"{kc.paged:,}",
         f"{kc.capacity_tokens:,} KV tokens in {kc.block_size}-token blocks; "
         f"{fmt.pct(kc.paged_used_frac)} hold tokens" if kc.capacity_tokens
         else "no room for the KV cache beside the weights"),
        ("concurrency, contiguous", f"{kc.contiguous:,}",
         f"{kc.max_model_len:,} tokens reserved each; {fmt.pct(kc.contiguous_used_frac)} "
         "hold tokens" if kc.capacity_tokens else ""),
    ])


def _misfit(mem, o) -> str:
    """Why a deployment does not fit, in one phrase."""
    pool = o.kv_cache_memory_bytes
    if pool is not None and not mem.kv_pool_bytes:
        return (f"the {fmt.gib(pool)} KV cache given does not fit beside the weights, the "
                f"reserve and the activations of the engine's profiling step in "
                f"{fmt.gib(mem.capacity_bytes)}: vLLM would fail to allocate it")
    if pool is not None:
        return (f"this batch's KV cache ({fmt.gib(mem.kv_cache_bytes)}) exceeds the "
                f"{fmt.gib(pool)} given; a smaller batch or a larger --kv-cache-memory-bytes")
    if mem.weights_bytes >= mem.usable_bytes:
        return (f"the weights alone ({fmt.gib(mem.weights_bytes)}) exceed the usable "
                f"{fmt.gib(mem.usable_bytes)}: more GPUs (--tp, --pp) or smaller weights")
    return (f"this batch's KV cache and activations need {fmt.gib(mem.total_bytes)}; a smaller "
            "batch or more GPUs")


NOT_FIT = "[red]does not fit[/]: these assume the memory it lacks"


def _compute(e: Estimate) -> Table:
    m = e.model
    return _section("Compute", [
        ("params", fmt.count(e.params),
         f"official {fmt.count(m.official_params)}" if m.official_params else ""),
        ("active params", fmt.count(e.active_params), "per token" if m.moe else ""),
        ("FLOPs / decoded token", fmt.si(e.decode_flops_per_token, "FLOP"),
         f"2N = {fmt.si(e.flops_per_token_2n, 'FLOP')} + attention"),
        ("prefill FLOPs", fmt.si(e.prefill_flops, "FLOP"), f"{e.batch} x {e.prompt_tokens} tokens"),
    ])


def _roofline(e: Estimate) -> Table:
    p, mem = e.precision, e.memory
    engine_ceilings = [] if e.ideal is None else [
        ("engine's compute", fmt.si(e.ceilings.peak(p.compute_dtype), "FLOP/s"),
         e.ceilings.flops_source_of(p.compute_dtype)),
        ("engine's bandwidth", fmt.si(e.ceilings.bandwidth_bytes_per_s, "B/s"),
         e.ceilings.bandwidth_source)]
    origin = e.ceilings.allreduce_origin(e.tp) if e.ideal is not None else None
    if origin is not None:  # TP: whose all-reduce times the engine's collectives
        engine_ceilings.append(("engine's all-reduce", *origin))
    return _section("Roofline", [
        ("peak compute", fmt.si(e.peak_flops_per_s, "FLOP/s"),
         f"{p.compute_dtype.value}, {e.ref.source}"),
        ("peak bandwidth", fmt.si(e.ref.bandwidth_bytes_per_s, "B/s"), e.ref.source),
        *engine_ceilings,
        ("ridge point", f"{e.ridge_flops_per_byte:,.0f} FLOP/B", ""),
        ("decode bound", e.bound, f"at batch {e.batch}"),
        ("optimal batch", f"{e.optimal_batch:,.0f}", "peak x bytes/param / (2 x bandwidth)"
         + (" x params / active (every expert read)" if e.model.moe is not None else "")),
        ("usable optimum", f"{e.usable_optimal_batch:,}",
         "capped by memory" if mem.max_batch < e.optimal_batch else "memory allows it"),
        ("max batch that fits", f"{mem.max_batch:,}", f"at {e.context_tokens} tokens"),
    ])


def _vs(e: Estimate, text: str, ideal: str) -> str:
    """A row's note, with the ideal roofline's figure beside where the engine is not ideal."""
    return text if e.ideal is None else f"{text}; ideal {ideal}"


def _timing(e: Estimate) -> Table:
    b = e.ideal
    rows = [
        ("TTFT", fmt.seconds(e.ttft_s), _vs(e, "prefill of the batch",
                                            fmt.seconds(b.ttft_s) if b else "")),
        ("TPOT", fmt.seconds(e.tpot_s), _vs(e, f"decode step at {e.decode_context_tokens:,.0f} "
                                            "tokens", fmt.seconds(b.tpot_s) if b else "")),
        ("latency", fmt.seconds(e.latency_s), _vs(e, "TTFT + TPOT x (output - 1)",
                                                  fmt.seconds(b.latency_s) if b else "")),
        ("decode throughput", f"{fmt.per_s(e.throughput_tokens_per_s)} tok/s",
         _vs(e, "batch / TPOT", f"{fmt.per_s(b.throughput_tokens_per_s)} tok/s" if b else "")),
        ("end-to-end throughput", f"{fmt.per_s(e.e2e_throughput_tokens_per_s)} tok/s",
         _vs(e, "batch x output / latency",
             f"{fmt.per_s(b.e2e_throughput_tokens_per_s)} tok/s" if b else "")),
    ]
    if e.tp > 1:
        rows.append(("TP communication", fmt.seconds(e.decode.comm_s), _tp_link(e.hardware, e.tp)))
    if b is not None:
        rows.append(("engine overhead", fmt.seconds(e.decode.overhead_s),
                     f"per decode step: {e.decode.kernels:,.0f} kernels"
                     + (f" + operators' own {fmt.seconds(e.decode.operator_fixed_s)}"
                        if e.decode.operator_fixed_s else "")
                     + _host_text(e.decode)
                     + (f" + worker hand-off {fmt.seconds(e.decode.serial_s)}"
                        if e.decode.serial_s else "")))
    title = "Timing" if b is None else f"Timing ({e.engine.name}; the ideal roofline beside)"
    if not e.memory.fits:
        title += f"; {NOT_FIT}"
    return _section(title, rows)


def _host_text(step: StepTime) -> str:
    """The step's host work (its cost per step and per running request) as the step pays
    it: all of it, or under async scheduling (the host's work beside the GPU's) only what
    outlasts the GPU's work."""
    host = fmt.seconds(step.fixed_s)
    if not step.overlapped:
        return f" + host work {host} (per step and per request)"
    exposed = step.exposed_host_s
    if exposed <= 0:
        return (f"; its {host} of host work (per step and per request) runs beside the GPU's "
                "(async scheduling)")
    return (f" + host work {fmt.seconds(exposed)} beyond the GPU's (async scheduling; "
            f"{host} in all)")


def _ep_host_text(x) -> str:
    """An expert-parallel step's host cost as ``_host_text`` gives a step's, and the
    hand-off to its workers."""
    hand = f" + worker hand-off {fmt.seconds(x.handoff_s)}" if x.handoff_s else ""
    if not x.overlapped:
        return f" + host {fmt.seconds(x.fixed_s)}{hand}"
    exposed = x.tpot_s - x.handoff_s - (x.dense_s + x.experts_s + x.comm_s)
    if exposed < 1e-9:  # rounding's residue
        return f"{hand}; host {fmt.seconds(x.fixed_s)} beside it (async scheduling)"
    return (f" + host {fmt.seconds(exposed)} beyond it (async scheduling; of "
            f"{fmt.seconds(x.fixed_s)}){hand}")


def _spec_headline(e: Estimate, s):
    from dataclasses import replace

    return replace(e.headline, tpot_s=s.tpot_s)


def _spec_timing(e: Estimate, s) -> Table:
    """Timing with speculative decoding: its figures, then those without it."""
    h, b = _spec_headline(e, s), e.headline
    without = "[dim]without speculation[/]"
    rows = [
        ("TTFT", fmt.seconds(h.ttft_s), "prefill of the batch (speculation leaves it)"),
        ("TPOT", fmt.seconds(h.tpot_s), f"{without} {fmt.seconds(b.tpot_s)}: "
                                        f"{s.speedup:.2f}x at batch {s.batch}"),
        ("latency", fmt.seconds(h.latency_s), f"{without} {fmt.seconds(b.latency_s)}"),
        ("decode throughput", f"{fmt.per_s(h.throughput_tokens_per_s)} tok/s",
         f"{without} {fmt.per_s(b.throughput_tokens_per_s)} tok/s"),
        ("end-to-end throughput", f"{fmt.per_s(h.e2e_throughput_tokens_per_s)} tok/s",
         f"{without} {fmt.per_s(b.e2e_throughput_tokens_per_s)} tok/s"),
        ("break-even batch", "-" if s.break_even_batch is None else f"{s.break_even_batch:,}",
         "first batch where speculation is slower" if s.break_even_batch else
         f"faster at every batch up to {s.batch_limit:,} (what fits, max_num_seqs)"),
    ]
    if e.tp > 1:
        rows.append(("TP communication", fmt.seconds(e.decode.comm_s), _tp_link(e.hardware, e.tp)))
    return _section(f"Timing ({e.engine.name}, speculative decoding: {s.config.method}; "
                    "without it beside)", rows)


def _spec_cost(e: Estimate, s) -> Table:
    cost, base = _spec_headline(e, s).cost_usd_per_million_output_tokens, \
        e.cost_usd_per_million_output_tokens
    return _section("Cost", [
        ("price", fmt.usd(e.price_usd_per_gpu_hour) + "/GPU-h" if e.price_usd_per_gpu_hour
         else "n/a", _price_text(e)),
        ("per 1M output tokens", fmt.usd(cost),
         f"[dim]without speculation[/] {fmt.usd(base)}" if cost else ""),
    ])


def _utilisation(e: Estimate) -> Table:
    b = e.ideal
    util = [
        ("MBU", fmt.pct(e.mbu), _vs(e, "weights + KV read per step / TPOT / datasheet bandwidth",
                                    fmt.pct(b.mbu) if b else "")),
        ("MFU (decode)", fmt.pct(e.mfu), _vs(e, "", fmt.pct(b.mfu) if b else "").lstrip("; ")),
        ("MFU (prefill)", fmt.pct(e.prefill_mfu),
         _vs(e, "", fmt.pct(b.prefill_mfu) if b else "").lstrip("; ")),
    ]
    mm = e.measured
    if mm is not None and mm.tpot_s is not None:
        util += [("measured TPOT", fmt.seconds(mm.tpot_s), ""),
                 ("achieved bandwidth", fmt.si(mm.achieved_bandwidth_bytes_per_s, "B/s"), ""),
                 ("measured MBU", fmt.pct(mm.mbu), ""),
                 ("measured MFU", fmt.pct(mm.mfu), "")]
    if mm is not None and mm.ttft_s is not None:
        util += [("measured TTFT", fmt.seconds(mm.ttft_s), ""),
                 ("achieved prefill", fmt.si(mm.achieved_prefill_flops_per_s, "FLOP/s"), ""),
                 ("measured prefill MFU", fmt.pct(mm.prefill_mfu), "")]
    return _section("Utilisation", util)


def _price_text(e: Estimate) -> str:
    """Where the price comes from, without its URL (in --json): the price set and the offer,
    or why there is none."""
    if e.price_source:
        return e.price_source.split(", http")[0]
    why = e.hardware.price_missing or "no price"
    return f"{why}; --prices SET or --price GPU=USD"


def _cost(e: Estimate) -> Table:
    cost = e.cost_usd_per_million_output_tokens
    return _section("Cost", [
        ("price", fmt.usd(e.price_usd_per_gpu_hour) + "/GPU-h" if e.price_usd_per_gpu_hour
         else "n/a", _price_text(e)),
        ("per 1M output tokens", fmt.usd(cost),
         "" if not cost else "end-to-end throughput" if e.memory.fits else NOT_FIT),
    ])


def _print_operators(console: Console, e: Estimate) -> None:
    """--explain: each step's operators, and what their efficiency columns mean."""
    p, c = e.precision, e.ceilings
    console.print(operator_table("Decode step operators", e.decode, console.width))
    console.print(operator_table("Prefill operators", e.prefill, console.width))
    console.print(f"[dim]eff BW, eff FLOP: the engine's efficiency ({e.engine.name}) times the "
                  f"ceilings: bandwidth {fmt.si(c.bandwidth_bytes_per_s, 'B/s')} "
                  f"({c.bandwidth_source}), {p.compute_dtype.value} "
                  f"{fmt.si(c.peak(p.compute_dtype), 'FLOP/s')} "
                  f"({c.flops_source_of(p.compute_dtype)}); kernels: per step, each "
                  f"paying the engine's per-kernel cost; bound: what sets an operator's "
                  f"time, its arithmetic (compute), its bytes (memory), its kernels' fixed "
                  f"costs where they outweigh both (latency) or outside a CUDA graph the "
                  f"host launching them (host), and in the total row what takes most of the "
                  f"step; fixed: the engine's per-step cost"
                  + (f"; a 16-bit GEMM's eff BW is the profile's times "
                     f"{e.engine.gemm_bandwidth_arch_frac:g} on this GPU's architecture "
                     "(gemm_bandwidth_arch_frac)" if e.engine.gemm_bandwidth_arch_frac != 1
                     else "")
                  + (f"; attention's, the profile's times "
                     f"{e.engine.attention_bandwidth_arch_frac:g} on this architecture "
                     "(attention_bandwidth_arch_frac)"
                     if e.engine.attention_bandwidth_arch_frac != 1 else "")
                  + _matmul_factors(e) + _fp8_kernels_text(e)
                  + (f"; an fp8 KV cache is read at no more than "
                     f"{fmt.si(e.engine.fp8_kv_attention_bytes_per_s, 'B/s')} on this "
                     "architecture (fp8_kv_attention_gb_per_s)"
                     if e.engine.fp8_kv_attention_bytes_per_s
                     and p.kv_cache == DType.fp8 else "")
                  + "".join(f"; {name}: its {fmt.seconds(st.fixed_s)} of host work runs "
                            "beside the GPU's (async scheduling), the row the part that "
                            "outlasts it" for name, st in (("decode", e.decode),
                                                          ("prefill", e.prefill))
                            if st.overlapped and st.fixed_s) + "[/]")


def _matmul_factors(e: Estimate) -> str:
    """--explain's legend for the factors on a matmul's eff FLOP that the profile states: the
    share its served steps attain (every matmul), and the fused MoE kernel's, for the routed
    experts' type on this GPU (16-bit, or fp8 weights in fp8 arithmetic)."""
    eng, out = e.engine, ""
    if eng.served_compute_frac != 1:
        out += (f"; every matmul's eff FLOP is its kernel's times "
                f"{eng.served_compute_frac:g}, the share this release line's served steps "
                "attain (served_compute_frac)")
    experts = [t.op for t in e.decode.ops
               if t.op.kind == "matmul" and t.op.name.startswith("experts_")]
    if not experts:
        return out
    factor, field = experts_compute_factor(experts[0], eng)
    if factor != 1:
        out += (f"; a routed expert's eff FLOP also times {factor:g} on this GPU's "
                f"architecture: the engine's fused MoE kernel against its plain GEMMs "
                f"({field})")
    depths = [(op.name.removeprefix("experts_"), experts_depth_factor(op, eng))
              for op in experts]
    if any(d != 1 for _, d in depths):
        fp8 = field == "experts_fp8_compute_frac"
        k_half = eng.experts_fp8_k_half if fp8 else eng.experts_k_half
        named = eng.experts_fp8_k_half_field if fp8 else "experts_k_half"
        out += ("; and" if factor != 1 else "; a routed expert's eff FLOP times") + (
                f" K / (K + {k_half:g}) for its GEMM's depth K, the "
                "kernel's fixed work per output tile ("
                + ", ".join(f"{name} {d:.2f}" for name, d in depths) + f"; {named})")
    return out


def _fp8_kernels_text(e: Estimate) -> str:
    """--explain's legend for the kernels a W8A8 fp8 matmul launches beside itself where the
    step has such matmuls and the profile states any (``roofline.fp8_kernels``)."""
    eng = e.engine
    fp8 = [t.op for t in e.decode.ops if t.op.kind == "matmul" and t.op.dtype == DType.fp8]
    counts = sorted({(op.fp8_blocks, op.name.startswith("experts_"), fp8_kernels(op, eng))
                     for op in fp8})
    if not any(q for *_, q in counts):
        return ""
    lane = "block-scaled" if any(b for b, *_ in counts) else "per-tensor"
    dense = max(q for _, experts, q in counts if not experts) if any(
        not x for _, x, _ in counts) else 0.0
    text = (f"; each {lane} fp8 matmul's kernels include {dense:g} of the plain cost beside it: "
            "its input's quantization, or its GEMM's fixed cost counted in kernels "
            "(fp8_quant_kernels" + (".block" if lane == "block-scaled" else "") + ")")
    if eng.fp8_quant_dense_only and any(x for _, x, _ in counts):
        text += ", none for the routed experts' fused MoE kernel (dense_only)"
    dense_ops = [op for op in fp8 if not op.name.startswith("experts_")]
    experts = len(dense_ops) < len(fp8) and not eng.fp8_quant_dense_only
    # one scale per tensor found at run time, where the profile reads the input more for it
    dyn = any(op.fp8_dynamic_tensor for op in fp8) and \
        eng.fp8_dynamic_tensor_reads != eng.fp8_input_reads
    reads = eng.fp8_dynamic_tensor_reads if dyn else eng.fp8_input_reads
    if (dense_ops or experts) and reads:
        text += (", and that quantization's pass before the GEMM, in series, in its memory "
                 "time: each 16-bit input value read "
                 + {1.0: "once", 2.0: "twice"}.get(reads, f"{reads:g} times")
                 + " and written once in fp8 (fp8_quant_kernels."
                 + ("dynamic_tensor_reads: one scale per tensor found at run time"
                    if dyn else "input_reads") + ")"
                 + ("; a MoE layer's once, its tokens before the experts and their routed "
                    "copies before the down projection" if experts else ""))
    return text


def operator_table(title: str, step: StepTime, width: int = 200) -> Table:
    """Per-operator figures; under 90 columns the dtype and FLOP/B columns are left out
    (the footer says so) so that the rest is not cut."""
    wide = width >= 90
    cols = ["operator", "x", "dtype", "FLOP", "bytes", "FLOP/B", "eff\nBW", "eff\nFLOP",
            "kernels", "time", "share", "bound"]
    keep = [i for i, c in enumerate(cols) if wide or c not in ("dtype", "FLOP/B")]
    t = table(title, [cols[i] for i in keep], [], left=1, compact=True)

    def add(*cells: str, style: str | None = None) -> None:
        t.add_row(*[cells[i] for i in keep], style=style)

    total = step.time_s
    for ot in step.ops:
        op = ot.op
        inten = op.intensity_flops_per_byte
        comm = op.kind in ("allreduce", "host_transfer")
        add(op.name, str(op.count), op.dtype.value, fmt.si(op.flops * op.count, ""),
            fmt.si(op.bytes * op.count, "B") if not comm
            else fmt.si(op.comm_bytes * op.count, "B"),
            "-" if comm else f"{inten:,.1f}", f"{ot.bandwidth_frac:.0%}",
            "-" if comm else f"{ot.compute_frac:.0%}", f"{ot.kernels:,.0f}",
            fmt.seconds(ot.time_s), fmt.pct(ot.time_s / total), ot.bound)
    if step.fixed_s:
        # under async scheduling the step waits only for what outlasts the GPU's work
        host = step.exposed_host_s
        add("fixed (per step)" if not step.overlapped else "host beyond GPU", "", "", "", "",
            "", "", "", "", fmt.seconds(host), fmt.pct(host / total), "cpu")
    if step.serial_s:
        add("worker hand-off", "", "", "", "", "", "", "", "",
            fmt.seconds(step.serial_s), fmt.pct(step.serial_s / total), "cpu")
    add("total", "", "", fmt.si(step.flops, ""), fmt.si(step.bytes, "B"),
        f"{step.flops / step.bytes:,.1f}", "", "", f"{step.kernels:,.0f}",
        fmt.seconds(total), "100%", step.limiter, style="bold")
    if not wide:
        t.caption = "dtype and FLOP/B: in a terminal of 90 columns or more, or with --json"
        t.caption_justify = "left"
    return t


def render_speculative(console, s) -> None:
    """The speculative-decoding section of ``llmplan estimate``."""
    c = s.config
    who = {"draft-model": f"draft {plain(c.draft.name) if c.draft else '-'}",
           "mtp": "the model's MTP layer", "ngram": "n-gram prompt lookup",
           "eagle": "an EAGLE head", "eagle3": "an EAGLE-3 head"}[c.method]
    title = f"Speculative decoding ({who}, k = {c.k}, acceptance {c.acceptance:.3g})"
    console.print(_section(title, [
        ("acceptance from", "", escape(c.acceptance_source)),
        ("tokens per step", f"{s.tokens_per_step:.2f}", "(1 - a^(k+1)) / (1 - a), per sequence"),
        ("step", fmt.seconds(s.step_s), f"verify {fmt.seconds(s.verify_s)} (k + 1 tokens) + "
                                        f"draft {fmt.seconds(s.draft_s)}"),
        ("TPOT", fmt.seconds(s.tpot_s), f"without {fmt.seconds(s.baseline_tpot_s)}: "
                                        f"{s.speedup:.2f}x at batch {s.batch}"),
        ("decode throughput", f"{fmt.per_s(s.throughput_tokens_per_s)} tok/s", "batch / TPOT"),
        ("drafter memory", fmt.gib(s.extra_weights_bytes + s.extra_kv_cache_bytes),
         f"weights {fmt.gib(s.extra_weights_bytes)}, KV {fmt.gib(s.extra_kv_cache_bytes)}; "
         + ("fits" if s.fits else "[red]does not fit[/]")),
        ("stops paying", "-" if s.break_even_batch is None else f"batch {s.break_even_batch}",
         "first batch where it is slower" if s.break_even_batch else
         f"faster at every batch up to {s.batch_limit:,} (what fits, max_num_seqs)"),
    ]))
    console.print(table(None, ["batch", "TPOT", "with spec.", "speedup"],
                        [[f"{p.batch:,}", fmt.seconds(p.baseline_tpot_s), fmt.seconds(p.tpot_s),
                          f"{p.speedup:.2f}x"] for p in s.by_batch], left=0, compact=True))


def render_pipeline(console, p, batch: int, output_tokens: int,
                    price: float | None) -> None:
    """The Pipeline section of ``llmplan estimate --pp``: the deployment's own figures."""
    fits = "[green]yes[/]" if p.fits else "[red]NO[/]"
    cost = p.cost_usd_per_million_output_tokens(price, batch, output_tokens)
    console.print(_section(
        f"Pipeline: {p.pp} stages x {p.tp} GPUs = {p.gpus} GPUs (the sections above are the "
        f"whole model on one group of {p.tp})", [
            ("TTFT", fmt.seconds(p.ttft_s), "the batch's prefill through every stage"),
            ("TPOT", fmt.seconds(p.tpot_s), f"{p.micro_batches} micro-batches of "
                                            f"{p.micro_batch} in flight"),
            ("decode throughput", f"{fmt.per_s(p.throughput_tokens_per_s(batch))} tok/s",
             "batch / TPOT"),
            ("latency", fmt.seconds(p.latency_s(output_tokens)), "TTFT + TPOT x (output - 1)"),
            ("memory per GPU", fmt.gib(p.max_memory_per_gpu_bytes), "the fullest stage"),
            ("fits", fits, "every stage"),
            ("per 1M output tokens", fmt.usd(cost),
             f"{p.gpus} GPUs"),
        ]))
    console.print(table(None, ["stage", "layers", "weights", "KV", "total", "decode",
                               "prefill", "send"],
                        [[str(s.index), f"{s.layers[0]}-{s.layers[1] - 1}",
                          fmt.gib(s.weights_bytes), fmt.gib(s.kv_cache_bytes),
                          fmt.gib(s.total_bytes) + ("" if s.fits else " !"),
                          fmt.seconds(s.decode_s), fmt.seconds(s.prefill_s),
                          ("-" if s.send_s == 0 else fmt.seconds(s.send_s)
                           + (" (net)" if s.crosses_node else ""))]
                         for s in p.stages], left=2, compact=True))


def render_expert(console, x, batch: int, output_tokens: int = 1,
                  price: float | None = None) -> None:
    """The Expert parallel section of ``llmplan estimate --ep``: the deployment's figures."""
    fits = "[green]yes[/]" if x.fits else "[red]NO[/]"
    link = "the network" if x.crosses_node else "the intra-node link"
    if x.tp == 1:
        title = (f"Expert parallel: {x.ep} GPUs, each 1/{x.ep} of the experts and "
                 f"{x.batch_per_gpu} of the sequences (attention data-parallel)")
    else:
        groups = f"{x.dp} attention groups of TP {x.tp}, each" if x.dp > 1 else \
            f"attention TP {x.tp} over all of them,"
        title = (f"Expert parallel: {x.ep} GPUs, each 1/{x.ep} of the experts; {groups} "
                 f"{x.batch_per_gpu} of the sequences")
    if x.dp == 1:
        comm = ("experts' all-reduce", fmt.seconds(x.moe_reduce_s),
                f"no dispatch (the tokens are on every GPU); outputs summed over {x.ep} GPUs "
                f"in each of {x.moe_layers} MoE layers, over "
                f"{link if x.crosses_node else 'the TP link'}; per step")
    else:
        gather = f" + TP all-gather {fmt.seconds(x.moe_reduce_s)}" if x.tp > 1 else ""
        comm = ("all-to-all", fmt.seconds(x.comm_s),
                f"dispatch + combine {fmt.seconds(x.all_to_all_s)} a step (each of "
                f"{x.moe_layers} MoE layers' {fmt.seconds(x.all_to_all_s / x.moe_layers)}) "
                f"over {link}{gather}")
    cost = x.headline(batch, output_tokens, price).cost_usd_per_million_output_tokens
    src = x.imbalance_source or {}
    given = "--expert-imbalance" if src.get("from") == "--expert-imbalance" else \
        f"default, estimated from {src.get('url', '?')}"
    console.print(_section(title, [
        ("TTFT", fmt.seconds(x.ttft_s), "each group prefills its own sequences; the "
                                         "experts at the most loaded GPU's tokens"),
        ("TPOT", fmt.seconds(x.tpot_s),
         f"own batch {fmt.seconds(x.dense_s)} + experts {fmt.seconds(x.experts_s)} + "
         f"{comm[0]} {fmt.seconds(x.comm_s)}" + _ep_host_text(x)),
        ("decode throughput", f"{fmt.per_s(batch / x.tpot_s)} tok/s", "batch / TPOT"),
        ("expert load", f"{x.imbalance:.2f}x", f"most loaded GPU {fmt.sig(x.pairs_max)} "
                                               f"token-experts, mean {fmt.sig(x.pairs_mean)}"),
        ("expert imbalance", f"{x.imbalance_factor:.2f}x",
         f"max / mean asked ({given}); uniform routing the floor"),
        comm,
        ("memory per GPU", fmt.gib(x.total_bytes),
         f"weights {fmt.gib(x.weights_bytes)}, KV {fmt.gib(x.kv_cache_bytes)}"),
        ("fits", fits, ""),
        ("per 1M output tokens", fmt.usd(cost), f"{x.gpus} GPUs"),
    ]))
