"""`llmplan compare`: real servers' benchmark results against the simulated prediction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.options import (
    DEFAULT_ENGINE,
    EngineOpt,
    GpuOpt,
    GroupSizeOpt,
    JsonOpt,
    KVOption,
    ModelOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    TpOpt,
    WeightsOption,
    extensible_kv,
    json_out,
    output_path,
    positive,
    resolve_precision,
    stderr,
    stdout,
    with_kv_pool,
)
from planner.core.errors import LlmplanError, UsageError

FilesArg = Annotated[list[Path], typer.Argument(
    help="Result files: vLLM `bench serve` JSON, SGLang `bench_serving` JSONL, guidellm "
         "report JSON, genai-perf profile export JSON, or `llmplan measure` JSONL.")]
MAX_FILE_BYTES = 200 * 1024 * 1024  # planner.io.boundary.RESULT_BYTES


def read_result_file(path: Path):
    """The runs of one result file, whatever its format."""
    from planner.evidence.formats import PRINTED_MARK, read_printed, read_runs
    from planner.io import boundary, catalog

    text = catalog.read_text(path, what="result file", max_bytes=MAX_FILE_BYTES)
    if PRINTED_MARK in text and not text.lstrip().startswith(("{", "[")):
        return read_printed(text, str(path))
    boundary.check_json_depth(text, str(path))
    try:
        data = boundary.loads_json(text, str(path), checked=True)
    except (json.JSONDecodeError, RecursionError):
        data = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = boundary.loads_json(line, f"{path}:{i}", checked=True)
            except (json.JSONDecodeError, RecursionError):
                raise LlmplanError(f"{path}:{i}: neither a JSON document nor JSON Lines"
                                   ) from None
            data.append(obj)
    except ValueError as err:  # a number of 5,000 digits
        raise LlmplanError(f"{path}: {err}") from None
    return _without_noisy(read_runs(data, str(path)), data, path)


def _without_noisy(runs: list, data, path: Path) -> list:
    """The runs of a file less the `llmplan measure` points recorded as noisy (timed on a
    busy machine: harness.measure.noise), which compare and calibrate leave out, saying so."""
    if not isinstance(data, list):
        return runs
    noisy = {f"{path}:{i}" for i, o in enumerate(data, 1)
             if isinstance(o, dict) and o.get("status") == "noisy"}
    kept = [r for r in runs if r.source not in noisy]
    if len(kept) == len(runs):
        return runs
    if not kept:
        raise LlmplanError(f"{path}: all {len(noisy)} measured points are noisy (timed on a "
                           "busy machine); measure them again on a quiet one")
    stderr.print(f"warning: {path}: {len(runs) - len(kept)} noisy point(s) left out (timed on "
                 "a busy machine)", markup=False, highlight=False, soft_wrap=True)
    return kept


def server_overrides(command: str | None, base: Path | None = None) -> dict:
    """What a server command (vLLM's, SGLang's or trtllm-serve's flag names) sets, keyed by
    our option (planner/cli/flags.py, the table the CLI's vLLM names come from too); a
    trtllm-serve options file it names is read from ``base``."""
    from planner.cli.flags import server_flags

    return server_flags(command, base)


# vLLM V0's multi-step scheduling, refused for an engine without it
MULTI_STEP_FLAGS = ("--num-scheduler-steps", "--multi-step-stream-outputs")
# our scheduler options a server command sets, and the Engine field each is
ENGINE_FIELDS = {"--max-num-seqs": "max_num_seqs",
                 "--max-num-batched-tokens": "max_num_batched_tokens",
                 "--block-size": "block_size", "--chunked-prefill": "chunked_prefill",
                 "--prefix-cache": "prefix_caching", "--mixed-batches": "mixed_batches",
                 "--api-server-count": "api_servers", "--async-scheduling": "async_scheduling",
                 "--cuda-graph-max-bs": "graph_max_bs", "--max-model-len": "max_model_len",
                 "--num-scheduler-steps": "scheduler_steps",
                 "--max-prefill-tokens": "max_prefill_tokens",
                 "--batch-wait-timeout-iters": "batch_wait_iters",
                 "--batch-wait-max-tokens-ratio": "batch_wait_tokens_ratio",
                 "--multi-step-stream-outputs": "multi_step_stream",
                 "--capacity-policy": "capacity_policy",
                 "--hybrid-kv-cache": "hybrid_kv_cache",
                 "--prefill-graphs": "prefill_graphs",
                 "--prefill-graph-max-tokens": "prefill_graph_max_tokens"}


def _agree(ours: str, theirs, given, what: str) -> None:
    if theirs is not None and given is not None and _plain(given) != theirs:
        raise LlmplanError(f"the server command's {ours} {theirs} and the run's {what} "
                           f"{_plain(given)} disagree")


def _plain(v):
    return getattr(v, "value", v)


def served_setup(model: str, gpu: str, spec, tp: int, weights, kv_cache,
                 group_size: int | None = None, quantized_layers="all",
                 server: dict | None = None, checkpoint: tuple[str, dict] | None = None):
    """The deployment a served run was measured on (``planner.layouts.deployment``), ready
    for prediction: the engine's scheduler budget is the prefill chunk. ``server``: what its
    server command set (``server_overrides``): the scheduler's limits, chunking, CUDA graphs
    (--enforce-eager), vLLM's --performance-mode, the memory fraction, weights in host
    memory, pipeline stages; its TP, weights and KV cache must be the run's. ``weights``
    None: the server command's --quantization, else the checkpoint's quantization_config,
    else bf16. ``checkpoint``: (where it was named, its quantization_config) where the
    server loaded a quantized release of ``model``, whose weights must be the run's.
    ``quantized_layers`` None: the layers the resolved weights cover as the model ships them
    (``planner.evidence.validate.quantized_layers_of``), as a published run measured them."""
    from dataclasses import replace

    from planner.core.specs import GIB, Options
    from planner.io import catalog
    from planner.layouts.deployment import Deployment, Layout
    from planner.serving.config import check_scheduler_steps

    s = dict(server or {})
    positive("--tp", tp)
    positive("--group-size", group_size)
    _agree("--tp", s.get("--tp"), tp, "TP")
    _agree("--quantization", s.get("--weights"), weights, "weights")
    weights = weights if weights is not None else s.get("--weights")
    kv_cache = kv_cache if kv_cache is not None or s.get("--kv-cache") is None else \
        s["--kv-cache"]
    _agree("--kv-cache-dtype", s.get("--kv-cache"), kv_cache, "KV cache")
    m = catalog.load_model(model)
    if checkpoint is not None:
        m, weights = _with_checkpoint(m, weights, *checkpoint)
    if quantized_layers is None:
        from planner.evidence.validate import quantized_layers_of

        quantized_layers = quantized_layers_of(weights, m)
    hw = catalog.load_hardware(gpu)
    tensorrt = s.get("--trtllm-backend") == "tensorrt"
    if tensorrt and spec.name == "trtllm":
        # trtllm-serve --backend tensorrt: a built TensorRT engine, the profile of that path
        # (its kernels' figures, not the PyTorch backend's tables')
        spec = catalog.load_engine_spec("trtllm-engine")
    q8 = spec.fp8_quant_kernels
    if tensorrt and q8 is not None and q8.since is not None:
        # a built TensorRT engine's fp8 GEMMs take their input quantized by the kernel
        # before: no PyTorch-backend quantization kernels nor their pass, as at_version
        # drops them before their release
        spec = spec.model_copy(update={"fp8_quant_kernels": None})
    eng = spec.model().for_gpu(hw.memory_bytes, hw.name, hw.architecture, hw.vendor)
    for flag, said in (("--max-model-len", "--max-model-len"),
                       ("--num-scheduler-steps", "--num-scheduler-steps"),
                       ("--prefill-graph-max-tokens", "--piecewise-cuda-graph-max-tokens")):
        if s.get(flag, 1) < 1:
            raise LlmplanError(f"the server command's {said} {s[flag]}: must be positive")
    check_scheduler_steps(eng, s.get("--num-scheduler-steps", 1))
    # vLLM's --performance-mode changes the defaults; the limits the command gives stand
    eng = eng.in_mode(s.get("--performance-mode"))
    eng = replace(eng, **{f: s[o] for o, f in ENGINE_FIELDS.items() if o in s})
    if s.get("--enforce-eager"):
        eng = replace(eng, cuda_graphs=False)
    if "--prefill-graphs" in s.get("--enforced", ()):
        # --enforce-piecewise-cuda-graph: past the MoE runner's rule too (ServerArgs)
        eng = replace(eng, prefill_graphs_moe_off=())
    if "--cuda-graph-sizes" in s:  # a trtllm-serve options file's cuda_graph_config
        sizes = s["--cuda-graph-sizes"]
        eng = replace(eng, graph_rule=(sizes, (), sizes[-1], None, ()),
                      graph_padding=s["--cuda-graph-padding"])
    if tensorrt:
        # trtllm-serve --backend tensorrt: a built TensorRT engine, whose decode steps the
        # profile's fit priced at every batch size (no PyTorch-backend capture sizes) and
        # with its host work in series (no PyTorch-backend overlap scheduler); its fp8
        # kernels were dropped above; nor its executor's batch waiting
        eng = replace(eng, graph_rule=None, async_scheduling=False, batch_wait_iters=None,
                      batch_wait_tokens_ratio=None)
    prec, source = resolve_precision(m, weights, kv_cache, group_size,
                                     quantized_layers=quantized_layers)
    dtype = s.get("--dtype")
    if dtype is not None and dtype != prec.half_dtype.value:
        raise LlmplanError(f"the server command's --dtype {dtype} and the run's 16-bit type "
                           f"{prec.half_dtype.value} disagree")
    opts = with_kv_pool(Options(prefill_chunk_tokens=eng.max_num_batched_tokens,
                                memory_utilization_frac=s.get("--memory-utilization"),
                                memory_utilization_basis=s.get("--memory-basis"),
                                cpu_offload_bytes=s.get("--cpu-offload-gb", 0.0) * GIB),
                        s.get("--kv-cache-memory-bytes"), s.get("--kv-cache-tokens"))
    eng = extensible_kv(eng, s.get("--extensible-kv-cache"), opts, hw)
    return Deployment.build(m, hw, engine=eng, precision=prec,
                            layout=Layout(tp=tp, pp=s.get("--pp", 1), ep=s.get("--ep", 1)),
                            options=opts,
                            weights_source=source)


def _with_checkpoint(m, weights, where: str, config: dict):
    """``m`` as the quantized release a server loaded ships it (its quantization_config read
    as a config.json's), and the weights to ask of it: None, the checkpoint's own, which must
    be the run's ``weights``."""
    from planner.io.quant_config import FIELD, model_checkpoint_quant

    q = model_checkpoint_quant({FIELD: config}, where, m)
    if q is None or q.problem is not None:
        raise LlmplanError(q.problem if q is not None else
                           f"{where}: quantization_config: null")
    if weights is not None and _plain(weights) != _plain(q.weights):
        raise LlmplanError(f"{where}: the checkpoint stores {_plain(q.weights)} weights and "
                           f"the run says {_plain(weights)}")
    return m.model_copy(update={"quantization": q}), None


def server_setup(model: str, gpu: str, engine: str, tp: int, weights, kv_cache, group_size: int,
           quantized_layers=QuantizedLayers.all):
    from planner.io import catalog

    spec = catalog.load_engine_spec(engine)
    return served_setup(model, gpu, spec, tp, weights, kv_cache, group_size,
                        quantized_layers), spec


StrictOpt = Annotated[bool, typer.Option(
    "--strict", help="A result file that states another model, TP, weights or KV-cache type "
    "than -m / --tp / --weights / --kv-cache, or a run whose measured MBU is above 100%, is "
    "an error (exit 2) instead of a warning.")]


CachedFromOpt = Annotated[Optional[list[Path]], typer.Option(
    "--cached-from", metavar="FILE",
    help="The result file of a run sent to the same server before these, with the same seed "
         "(a sweep over lengths or client counts: SGLang's random dataset begins prompt i of "
         "every run alike): request i's first min(its length, that run's request i) tokens "
         "are replayed from the prefix cache; a run of fewer requests warms only those. "
         "Repeatable; every file must list each request's input length.")]
CachedPrefixOpt = Annotated[Optional[int], typer.Option(
    "--cached-prefix-tokens", metavar="TOKENS", min=1, max=10_000_000,
    help="The first TOKENS of every prompt were in the server's prefix cache when the runs "
         "began: a run repeated on one server with the same seed (vLLM's random dataset "
         "sends the same prompts again) finds its prompts computed, all but the last token "
         "where TOKENS is the whole prompt. For files that list no per-request lengths; not "
         "with --cached-from or --sweep, which give each request its own.")]
SweepOpt = Annotated[bool, typer.Option(
    "--sweep", help="The runs, in the order given (files, then a file's runs), were sent one "
    "after another to one server with the same seed: each finds in the prefix cache the "
    "beginnings the runs before it sent (as --cached-from names them).")]


SeedOpt = Annotated[Optional[int], typer.Option(
    "--seed", metavar="N", min=0, max=2**32 - 1,
    help="The client's random seed (SGLang's bench_serving --seed; its default is 1): a run "
         "of SGLang's random dataset whose file gives only totals is replayed with each "
         "request's lengths drawn again from it, which must add up to the file's totals.")]


LengthsFromOpt = Annotated[Optional[Path], typer.Option(
    "--lengths-from", metavar="FILE",
    help="The result file of a run that sent the same requests (the same dataset file, seed "
         "and prompt count) and lists each request's lengths (vLLM's bench serve "
         "--save-detailed, SGLang's --output-details): each file given that lists none is "
         "replayed with them, checked against its totals (not the --cached-from files).")]
DatasetNameOpt = Annotated[Optional[str], typer.Option(
    "--dataset-name", metavar="DATASET",
    help="The dataset a file that lists no per-request lengths and names no dataset was "
         "drawn from (vLLM's bench serve does not record it): sharegpt replays its requests "
         "at lengths of ShareGPT's distribution at the file's means (planner/data/lengths), "
         "not every one at the mean. An SGLang line that names ShareGPT is shaped so "
         "without it. Not with --lengths-from, --sweep or --cached-from (a cached beginning "
         "needs each request's own length).")]


def shape_lengths(run, dataset: str | None):
    """A run that publishes only mean lengths, of a dataset whose length distribution is
    kept (planner/data/lengths: ShareGPT's), replayed with lengths of that shape at the run's
    means, not every request at the mean: the longest requests set an all-at-once run's
    duration."""
    from dataclasses import replace

    from planner.evidence.compare import MAX_SIM_REQUESTS
    from planner.io import catalog
    from planner.serving.traffic import shaped_lengths

    if run.input_lens or not dataset or dataset not in catalog.length_names() or \
            run.mean_input_tokens <= 0 or run.mean_output_tokens <= 0:
        return run
    # no more than are simulated (compare_run replays the first MAX_SIM_REQUESTS)
    n = min(run.num_prompts or run.completed, MAX_SIM_REQUESTS)
    lens = shaped_lengths(catalog.load_lengths(dataset), n, mean_prompt=run.mean_input_tokens,
                          mean_output=run.mean_output_tokens)
    return replace(run, input_lens=tuple(p for p, _ in lens),
                   output_lens=tuple(o for _, o in lens),
                   notes=run.notes + (f"lengths: {dataset}'s distribution at the run's means",))


def _lengths_of(runs: list, seed: int | None, lengths_from: Path | None,
                dataset: str | None) -> tuple[list, int]:
    """``runs`` with each request's lengths where a file gives only totals: drawn again from
    ``seed``, taken from ``lengths_from``'s run, or (``dataset`` not None) shaped like the
    dataset the file names, else ``dataset``; and how many were drawn again or taken."""
    from planner.evidence.redraw import copied_all, redrawn_all

    n = 0
    if seed is not None:
        runs, n = redrawn_all(runs, seed, "--seed")
    if lengths_from is not None:
        try:
            twin = read_result_file(lengths_from)
        except LlmplanError as err:
            raise LlmplanError(f"--lengths-from: {err}") from None
        runs, k = copied_all(runs, twin, str(lengths_from), "--lengths-from")
        n += k
    if dataset is None:
        return runs, n
    return [shape_lengths(r, r.dataset or dataset) for r in runs], n


def warm_runs(runs: list, cached_from: list[Path] | None, sweep: bool,
              seed: int | None = None, lengths_from: Path | None = None,
              dataset: str | None = None, cached_prefix: int | None = None) -> list:
    """``runs`` as replayed: where a file gives totals only, each request's lengths drawn
    again with ``seed`` (``planner.evidence.redraw``), taken from ``lengths_from``'s run of
    the same requests, or shaped like the dataset the file (else ``dataset``) names; after
    the runs of ``cached_from`` (and, with ``sweep``, after the ones before each in ``runs``)
    on the same server, each request's cached beginning
    (``planner.evidence.compare.warmed_by``); or, with ``cached_prefix``, the first that many
    tokens of every prompt cached."""
    from dataclasses import replace

    from planner.evidence.compare import warmed_by

    if cached_prefix is not None:
        if sweep or cached_from:
            raise UsageError("--cached-prefix-tokens with --cached-from or --sweep: those "
                             "give each request its own cached beginning; give one")
        runs = [replace(r, cached_prefix_tokens=cached_prefix) for r in runs]

    if dataset is not None:
        from planner.io import catalog

        if dataset not in catalog.length_names():
            raise UsageError(f"--dataset-name: '{dataset[:80]}' is not a dataset whose "
                             "length distribution is kept "
                             f"({', '.join(catalog.length_names())})")
        if lengths_from is not None or sweep or cached_from:
            raise UsageError("--dataset-name with --lengths-from, --sweep or --cached-from: "
                             "those take each request's own lengths, not a distribution's; "
                             "give one")
    if seed is not None and lengths_from is not None:
        raise UsageError("--seed and --lengths-from both given: the lengths come from one "
                         "or the other; give one")
    before = [(str(f), read_result_file(f)) for f in cached_from or ()]
    # the files given take --lengths-from's lengths (the same requests) or are shaped like
    # their dataset (a length distribution at their means), but not where a run warms the
    # prefix cache for another or finds its beginnings there (--sweep, --cached-from): a
    # cached beginning needs each request's own length. The earlier runs' files are
    # neither: they sent other lengths
    warming = bool(sweep or cached_from)
    given = runs
    runs, n = _lengths_of(runs, seed, lengths_from, None if warming else dataset or "")
    # runs --dataset-name shaped: changed, and naming no dataset of their own
    if dataset is not None and not any(a is not b and not a.dataset
                                       for a, b in zip(given, runs, strict=True)):
        raise UsageError("--dataset-name: every run given lists its own per-request lengths "
                         "or names its dataset: nothing to shape")
    drawn = [(name, *_lengths_of(rs, seed, None, None)) for name, rs in before]
    before = [(name, rs) for name, rs, _ in drawn]
    n += sum(k for *_, k in drawn)
    if seed is not None and not n:
        raise UsageError("--seed: no run given is of SGLang's random dataset without "
                         "per-request lengths (its result line names the dataset and its "
                         "lengths; a printed block does not): nothing to draw again")
    if lengths_from is not None and not n:
        raise UsageError(f"--lengths-from: every run given lists its own per-request "
                         f"lengths: nothing to take from {lengths_from}")
    out = []
    for r in runs:
        out.append(warmed_by(r, before, r.source) if before else r)
        if sweep:
            before = [*before, (r.source, [r])]
    return out


def _at_the_mean(run) -> tuple[str, ...]:
    """A note where the run is replayed with every request at its file's mean lengths (the
    file lists none, and nothing gave them), naming what would give each request's."""
    if run.input_lens or run.batch is not None:
        return ()
    return (f"lengths: every request at the file's means ({run.mean_input_tokens:,.0f} + "
            f"{run.mean_output_tokens:,.0f} tokens; it lists none): exact for fixed lengths; "
            "where they varied, --lengths-from FILE, --dataset-name sharegpt or --seed N "
            "replays each request's (docs/servers.md)",)


def _squash(name: str) -> str:
    """A model name's letters and digits, lower case, without its organisation or folder:
    "meta-llama/Llama-3.1-8B-Instruct" -> "llama318binstruct"."""
    return "".join(ch for ch in name.rstrip("/").split("/")[-1].lower() if ch.isalnum())


def _model_names(m) -> set[str]:
    """Names the model goes by: its own, its display name, the repository of its source URL
    (huggingface.co/ORG/REPO/...) and a config.json's folder."""
    names = {m.name, m.display_name or ""}
    src = m.source or ""
    if "huggingface.co/" in src:
        parts = src.split("huggingface.co/", 1)[1].split("/")
        names.add(parts[1] if len(parts) > 1 else parts[0])
    elif src.endswith(".json"):
        names.add(Path(src).parent.name)
    return {_squash(n) for n in names if n and _squash(n)}


def same_model(model_id: str, m) -> bool:
    """Whether a result's model id names the model (one name within the other, so an
    -Instruct or -AWQ variant of Llama-3.1-8B is it and Llama-3.1-70B is not)."""
    theirs = _squash(model_id)
    return not theirs or any(n in theirs or theirs in n for n in _model_names(m))


def _their_weights(run) -> str | None:
    """The run's weights in llmplan's names, where the file states them."""
    from planner.cli.flags import QUANTIZATIONS

    if run.server_weights is not None:
        return run.server_weights
    q = run.server_quantization
    return QUANTIZATIONS.get(q.lower()) if q else None


def disagreements(run, s) -> list[str]:
    """What the run's file states about its deployment that the prediction's does not
    share: the model id, TP, the weights (a server's --quantization, llmplan measure's
    weights), the KV-cache type and, with 16-bit weights, their type, and the engine where
    the file carries an SGLang server's server_info. Only fields the file has are
    compared."""
    from planner.cli.flags import DTYPES, KV_CACHE_DTYPES

    p, by = s.precision, run.stated_by
    out = []
    if run.model_id and not same_model(run.model_id, s.model):
        out.append(f"{run.source}: the run served '{run.model_id[:80]}', not {s.model.name} "
                   "(-m)")
    if run.server_tp is not None and run.server_tp != s.tp:
        out.append(f"{run.source}: its {by} says TP {run.server_tp}; the prediction uses "
                   f"--tp {s.tp}")
    w = _their_weights(run)
    gptq8 = w == "int4" and p.weights.value == "int8" and "gptq" in (
        run.server_quantization or "").lower()  # GPTQ is 4- or 8-bit
    if w is not None and w != p.weights.value and not gptq8:
        said = run.server_weights or f"--quantization {run.server_quantization}"
        out.append(f"{run.source}: its {by} says weights {said} ({w}); the prediction uses "
                   f"{p.weights.value} ({s.weights_source})")
    kv = run.server_kv_cache
    kv = KV_CACHE_DTYPES.get(kv.lower(), kv) if kv else None
    if kv is not None and kv != p.kv_cache.value:
        out.append(f"{run.source}: its {by} says KV cache {run.server_kv_cache}; the "
                   f"prediction uses {p.kv_cache.value}")
    d = DTYPES.get((run.server_dtype or "").lower())
    if d is not None and p.weights.value in ("bf16", "fp16") and d != p.weights.value:
        out.append(f"{run.source}: its {by} says dtype {run.server_dtype}; the prediction "
                   f"uses {p.weights.value} weights")
    if by == "server_info" and not s.engine.name.startswith("sglang"):
        # only SGLang's server answers bench_serving's /get_server_info
        out.append(f"{run.source}: its server_info is an SGLang server's; the prediction "
                   f"uses the {s.engine.name} profile (--engine sglang)")
    return out


def impossible_mbu(run, s) -> str | None:
    """A run whose decode steps would read the weights and KV cache faster than the GPUs'
    datasheet bandwidth: the deployment given is not the one measured."""
    from planner.evidence.compare import utilization

    _, bw, mbu, _, _ = utilization(run, s)
    if mbu is None or mbu <= 1:
        return None
    peak = s.hardware.memory_bandwidth_bytes_per_s * s.tp
    return (f"{run.source}: measured MBU {mbu:.0%} is impossible: reading the weights and KV "
            f"cache once per decode step in the measured TPOT needs {bw / 1e9:,.0f} GB/s, "
            f"above the {peak / 1e9:,.0f} GB/s of {s.tp} x {s.hardware.name}; the deployment "
            f"given is probably wrong (weights {s.precision.weights.value} ("
            f"{s.weights_source}): the server's are smaller? --tp {s.tp}: it ran on more "
            "GPUs?)")


def check_runs(runs, s, strict: bool) -> None:
    """Warn on stderr, one line each, where a result file and the deployment given disagree
    or a measured MBU is impossible; with ``strict`` the first is an error (exit 2)."""
    problems = [t for r in runs for t in disagreements(r, s)]
    problems += [t for r in runs if (t := impossible_mbu(r, s)) is not None]
    if strict and problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise LlmplanError(f"--strict: {problems[0]}{more}")
    for t in problems:
        stderr.print(f"warning: {t}", markup=False, highlight=False, soft_wrap=True)


def read_result_files(files: list[Path]):
    runs = []
    for f in files:
        runs += read_result_file(f)
    return runs


def fmt_metric(metric: str, v: float | None) -> str:
    from planner.io import fmt

    if v is None:
        return "-"
    return fmt.seconds(v) if metric.endswith("_s") else fmt.sig(v, 4)


def fmt_error(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


SHORT = {"request_throughput": "req/s", "output_throughput": "out tok/s",
         "total_token_throughput": "tok/s"}


def compare(
    files: FilesArg,
    model: ModelOpt,
    gpu: GpuOpt,
    tp: TpOpt = 1,
    engine: EngineOpt = DEFAULT_ENGINE,
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
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="PNG of predicted vs measured, one point per run and figure.",
        metavar="PNG")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Measured serving runs against llmplan's prediction for the same traffic (the
    simulator's, and the steady-state estimate at the concurrency the server held), with the
    signed error and the measured MBU and MFU."""
    from planner.evidence.compare import compare_run
    from planner.io import fmt
    from planner.io.render import plain, table

    output_path(plot, "--plot", ".png")
    s, _ = server_setup(model, gpu, engine, tp, weights, kv_cache, group_size, quantized_layers)
    runs = read_result_files(files)
    runs = warm_runs(runs, cached_from, sweep, seed, lengths_from, dataset_name, cached_prefix)
    check_runs(runs, s, strict)
    comps = [compare_run(r, s) for r in runs]
    if plot is not None:
        from planner.io.report import plot_served

        plot_served(comps, plot, title=f"{s.model.label} on {tp} x {s.hardware.display_name}, "
                                       f"engine {s.engine.name}: predicted vs measured")
        stderr.print(f"wrote {plot}")
    payload = {"model": s.model.name, "gpu": s.hardware.name, "tp": tp,
               "engine": s.engine.name, "weights": s.precision.weights.value,
               "weights_source": s.weights_source,
               "quantized_layers": s.precision.quantized_layers,
               "runs": [c.as_dict() for c in comps]}
    if as_json:
        json_out(payload)
        return
    from planner.io.gate import gate

    gate(payload, "compare's tables")  # the figures the tables show
    stdout.print(f"[bold]{plain(s.model.label)}[/] on {tp} x {plain(s.hardware.display_name)}, "
                 f"engine {plain(s.engine.name)}, weights {s.precision.weights.value} "
                 f"({s.weights_source})")
    for c in comps:
        r = c.run
        util = (f"MBU {fmt.pct(c.mbu)} ({c.achieved_bandwidth_bytes_per_s / 1e9:,.0f} GB/s at "
                f"{c.concurrency:,.1f} decoding)" if c.mbu is not None else "MBU -")
        if c.mbu_impossible:
            util = ("MBU [red]impossible[/] (above 100% of the datasheet bandwidth: the "
                    "deployment given is probably wrong)")
        util += f", MFU {fmt.pct(c.mfu)}" if c.mfu is not None else ", MFU -"
        rows = [[SHORT.get(m.metric, m.metric.removesuffix("_s")),
                 fmt_metric(m.metric, m.measured), fmt_metric(m.metric, m.simulated),
                 fmt_error(m.error), fmt_metric(m.metric, m.steady), fmt_error(m.steady_error)]
                for m in c.rows]
        stdout.print(f"\n[bold]{plain(r.source)}[/]: {plain(r.label)} ({r.tool}); {r.traffic}, "
                     f"{r.completed:,} requests of {r.mean_input_tokens:,.0f} + "
                     f"{r.mean_output_tokens:,.0f} tokens")
        stdout.print(f"  measured {util}")
        stdout.print(table(None, ["figure", "measured", "simulated", "error", "steady\nstate",
                                  "error"], rows, left=1, compact=True))
        for n in r.notes + c.notes + _at_the_mean(r):
            stdout.print(f"  [dim]{plain(n)}[/]")
