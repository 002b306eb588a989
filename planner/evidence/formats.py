"""Benchmark result files in their tools' own formats, read into ``ServedRun``s.

Each format is recognised by keys only it writes (see ``detect``); each reader takes the
parsed JSON (or JSON Lines) and the file's name, and raises ``FormatError`` with one line
naming the file, the field and the problem. Where each tool's schema comes from:

- vLLM ``vllm bench serve --save-result`` (vllm/benchmarks/serve.py; earlier
  benchmarks/benchmark_serving.py): one JSON object; latency statistics in milliseconds as
  ``{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms``, throughputs per second, ``request_rate``
  a number or the string "inf", ``max_concurrency`` null or a number; with --save-detailed
  also per-request ``input_lens`` and ``output_lens``.
- SGLang ``python -m sglang.bench_serving --output-file`` (python/sglang/bench_serving.py):
  JSON Lines, one object per run appended; the same ``_ms`` statistics but end-to-end latency
  as ``{mean,median,std,p99}_e2e_latency_ms``; ``request_rate`` a number or Infinity; with
  --output-details also per-request ``input_lens`` and ``output_lens``.
- guidellm ``guidellm benchmark --output-path X.json`` and genai-perf's
  ``profile_export_genai_perf.json``: see their readers.
- ``llmplan measure`` JSON Lines: one object per measured static batch.

Pure: the caller reads the file.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

from planner.core.errors import LlmplanError
from planner.evidence.runs import LATENCIES, METRIC_KEYS, THROUGHPUTS, RandomLengths, ServedRun

EXPECTED = ("a vLLM `bench serve` result JSON, SGLang `bench_serving` JSONL, a guidellm "
            "benchmark report, a genai-perf profile export, or `llmplan measure` JSONL")


class FormatError(LlmplanError):
    pass


DAY_MS = 86_400_000.0


def _limit(key: str) -> float:
    """The largest value a field can sensibly hold (a typo beyond it is refused, as the CLI's
    bounds refuse one): a day for a time in ms, a billion per second for a rate, 1e12 for a
    count."""
    if key.endswith("_ms"):
        return DAY_MS
    if key.endswith(("_s", "latency", "duration")):
        return DAY_MS / 1e3
    if "throughput" in key or key.endswith(("rate", "per_second")):
        return 1e9
    return 1e12


def _num(obj: dict, key: str, where: str, *, required: bool = False,
         allow_inf: bool = False) -> float | None:
    """A finite number in [0, its limit] (or inf where allowed, as a number or "inf")."""
    v = obj.get(key)
    if v is None:
        if required:
            raise FormatError(f"{where}: {key}: missing")
        return None
    if isinstance(v, str) and allow_inf and v.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise FormatError(f"{where}: {key}: expected a number, got {v!r:.40}")
    try:
        v = float(v)
    except OverflowError:
        raise FormatError(f"{where}: {key}: a {len(str(v))}-digit number is out of range"
                          ) from None
    if math.isnan(v) or v < 0 or (math.isinf(v) and not allow_inf):
        raise FormatError(f"{where}: {key}: expected a finite number >= 0, got {v}")
    if math.isfinite(v) and v > _limit(key):
        raise FormatError(f"{where}: {key}: {v:g} is above the limit of {_limit(key):g}")
    return v


def _int(obj: dict, key: str, where: str, *, required: bool = False) -> int | None:
    v = _num(obj, key, where, required=required)
    if v is None:
        return None
    if v != int(v) or v > 1e12:
        raise FormatError(f"{where}: {key}: expected a whole number, got {v:g}")
    return int(v)


def _lens(obj: dict, key: str, where: str) -> tuple[int, ...] | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 1e8 for x in v):
        raise FormatError(f"{where}: {key}: expected a list of token counts")
    return tuple(v)


def _ms_stats(obj: dict, where: str, names: dict[str, str]) -> dict[str, float]:
    """``{stat}_{name}_ms`` fields (vLLM / SGLang) as ``{stat}_{metric}_s``; p90 and p99
    where written."""
    out: dict[str, float] = {}
    for metric, name in names.items():
        for stat in ("mean", "median", "p90", "p99"):
            v = _num(obj, f"{stat}_{name}_ms", where)
            if v is not None:
                out[f"{stat}_{metric}_s"] = v / 1e3
    return out


def _throughputs(obj: dict, where: str) -> dict[str, float]:
    out = {}
    for k in THROUGHPUTS:
        v = _num(obj, k, where)
        if v is not None:
            out[k] = v
    return out


def _means(obj: dict, where: str, completed: int) -> tuple[float, float]:
    """Mean prompt and output tokens per completed request."""
    if not completed:
        raise FormatError(f"{where}: completed: no request completed")
    # SGLang's refactored benchmark writes total_input / total_output
    alt = {k: k.removesuffix("_tokens") for k in ("total_input_tokens", "total_output_tokens")}
    inp, out = (_num(obj, k, where) if k in obj else _num(obj, alt[k], where, required=True)
                for k in alt)
    if inp is None or out is None:
        raise FormatError(f"{where}: total_input_tokens / total_output_tokens: missing")
    return inp / completed, out / completed


def _text(obj: dict, key: str) -> str | None:
    v = obj.get(key)
    return v[:200] if isinstance(v, str) and v else None


def _whole(v) -> int | None:
    """A TP size as a tool writes it: a number, or text of digits (vLLM's --metadata)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().isdigit() and len(v.strip()) < 7:
        return int(v)
    return None


def _stated(obj: dict, stated_by: str, *, tp_keys: tuple[str, ...], quant_key: str,
            kv_key: str, dtype_key: str) -> dict:
    """The deployment fields a result states (ServedRun.server_*); only those present."""
    tp = next((_whole(obj[k]) for k in tp_keys if k in obj), None)
    d = {"server_tp": tp, "server_quantization": _text(obj, quant_key),
         "server_kv_cache": _text(obj, kv_key), "server_dtype": _text(obj, dtype_key)}
    return {**d, "stated_by": stated_by if any(v is not None for v in d.values()) else None}


def _chat_backend(name) -> bool:
    """Whether a benchmark client's backend called the chat-completions API (vLLM's
    openai-chat; SGLang's sglang-oai-chat, vllm-chat, ...), which wraps each prompt in the
    model's chat template on the server."""
    return isinstance(name, str) and name.endswith("-chat")


def read_vllm(obj: dict, where: str) -> list[ServedRun]:
    completed = _int(obj, "completed", where, required=True)
    mean_in, mean_out = _means(obj, where, completed)
    rate = _num(obj, "request_rate", where, allow_inf=True)
    mc = _int(obj, "max_concurrency", where)
    metrics = {**_ms_stats(obj, where, {m: m for m in LATENCIES}), **_throughputs(obj, where)}
    label = obj.get("label") or obj.get("backend") or obj.get("endpoint_type") or "vllm"
    rate_txt = "inf" if rate is None or math.isinf(rate) else f"{rate:g}"
    return [ServedRun(
        source=where, tool="vllm-bench-serve",
        label=f"{label} rate={rate_txt}" + (f" conc={mc}" if mc else ""),
        request_rate=math.inf if rate is None else rate, max_concurrency=mc,
        num_prompts=_int(obj, "num_prompts", where) or completed, completed=completed,
        mean_input_tokens=mean_in, mean_output_tokens=mean_out, metrics=metrics,
        burstiness=min(_num(obj, "burstiness", where, allow_inf=True) or 1.0, 1e6),
        duration_s=_num(obj, "duration", where),
        input_lens=_lens(obj, "input_lens", where), output_lens=_lens(obj, "output_lens", where),
        model_id=obj.get("model_id") if isinstance(obj.get("model_id"), str) else None,
        chat=_chat_backend(obj.get("backend")) or _chat_backend(obj.get("endpoint_type")),
        # `vllm bench serve --metadata tp=1 ...` writes its keys into the result
        **_stated(obj, "--metadata", tp_keys=("tp", "tensor_parallel_size", "tp_size"),
                  quant_key="quantization", kv_key="kv_cache_dtype", dtype_key="dtype"))]


def read_sglang(objs: list[dict], where: str) -> list[ServedRun]:
    runs = []
    for i, obj in enumerate(objs, 1):
        w = f"{where}:{i}"
        completed = _int(obj, "completed", w, required=True)
        mean_in, mean_out = _means(obj, w, completed)
        rate = _num(obj, "request_rate", w, allow_inf=True)
        mc = _int(obj, "max_concurrency", w)
        metrics = {**_ms_stats(obj, w, {"ttft": "ttft", "tpot": "tpot", "itl": "itl",
                                        "e2el": "e2e_latency"}), **_throughputs(obj, w)}
        total = _num(obj, "total_throughput", w)  # SGLang's name for total tokens/s
        if total is not None:
            metrics.setdefault("total_token_throughput", total)
        rate_txt = "inf" if rate is None or math.isinf(rate) else f"{rate:g}"
        info = obj.get("server_info") if isinstance(obj.get("server_info"), dict) else {}
        runs.append(ServedRun(
            source=w, tool="sglang-bench-serving",
            label=f"{obj.get('backend') or 'sglang'} rate={rate_txt}"
                  + (f" conc={mc}" if mc else ""),
            request_rate=math.inf if rate is None else rate, max_concurrency=mc,
            num_prompts=_int(obj, "num_prompts", w) or completed, completed=completed,
            mean_input_tokens=mean_in, mean_output_tokens=mean_out, metrics=metrics,
            duration_s=_num(obj, "duration", w),
            input_lens=_lens(obj, "input_lens", w), output_lens=_lens(obj, "output_lens", w),
            dataset=_text(obj, "dataset_name"), random_lengths=_random_lengths(obj, w),
            model_id=_text(info, "model_path") or _text(info, "served_model_name"),
            chat=_chat_backend(obj.get("backend")),
            **_stated(info, "server_info", tp_keys=("tp_size",), quant_key="quantization",
                      kv_key="kv_cache_dtype", dtype_key="dtype")))
    return runs


def _random_lengths(obj: dict, where: str) -> RandomLengths | None:
    """SGLang's random dataset's nominal lengths and range ratio, where the run drew from it."""
    if obj.get("dataset_name") != "random":
        return None
    inp, out = _int(obj, "random_input_len", where), _int(obj, "random_output_len", where)
    ratio = _num(obj, "random_range_ratio", where)
    if inp is None or out is None or ratio is None:
        return None
    if not inp or ratio > 1:
        raise FormatError(f"{where}: random_input_len {inp}, random_range_ratio {ratio:g}: "
                          "expected a length of at least 1 and a ratio in [0, 1]")
    return RandomLengths(inp, out, ratio)


def read_measure(objs: list[dict], where: str) -> list[ServedRun]:
    """``llmplan measure`` points: a static batch's decode step (TPOT) and its prefill."""
    runs = []
    for i, obj in enumerate(objs, 1):
        w = f"{where}:{i}"
        cfg, meas = obj.get("config"), obj.get("measured")
        if not isinstance(cfg, dict) or not isinstance(meas, dict):
            continue  # a skipped point or an error record
        if cfg.get("layers") != cfg.get("model_layers"):
            continue  # a slice of the model (--layers): not a whole decode step
        batch = _int(cfg, "batch", w, required=True)
        ctx = _int(cfg, "context", w, required=True)
        tp = meas.get("tpot_s")
        metrics = {}
        if isinstance(tp, dict) and _num(tp, "median_s", w):
            metrics["median_tpot_s"] = _num(tp, "median_s", w)
        ttft = _num(meas, "ttft_s", w)
        if ttft:
            metrics["median_ttft_s"] = ttft
        if not metrics or not batch or not ctx:
            continue
        runs.append(ServedRun(
            source=w, tool="llmplan-measure", label=f"batch={batch} ctx={ctx}",
            request_rate=math.inf, max_concurrency=None, num_prompts=batch, completed=batch,
            mean_input_tokens=float(ctx), mean_output_tokens=1.0, metrics=metrics,
            batch=batch, model_id=cfg.get("model") if isinstance(cfg.get("model"), str)
            else None, server_weights=_text(cfg, "weights"), server_kv_cache=_text(cfg, "kv_cache"),
            stated_by="config" if _text(cfg, "weights") or _text(cfg, "kv_cache") else None))
    return runs


# keys only vLLM's result file writes: a benchmark_serving.py fork that adds dataset_name
# (as some do, beside server_args) is still vLLM's format, with its per-request lengths
_VLLM_ONLY = ("mean_e2el_ms", "median_e2el_ms", "input_lens", "burstiness", "tokenizer_id")


def _sglang_like(o: dict) -> bool:
    if "mean_e2e_latency_ms" in o or "median_e2e_latency_ms" in o:
        return True
    return "dataset_name" in o and not any(k in o for k in _VLLM_ONLY)


def detect(data: Any) -> str | None:
    """The format of a parsed file: a dict (JSON) or a list of dicts (JSON Lines: SGLang's
    appended runs, vLLM's --append-result, llmplan measure)."""
    if isinstance(data, dict):
        if "benchmarks" in data and isinstance(data["benchmarks"], list):
            return "guidellm"
        if "input_config" in data and ("request_throughput" in data
                                       or "time_to_first_token" in data):
            return "genai-perf"
        if "completed" in data and _sglang_like(data):
            return "sglang-bench-serving"
        if "completed" in data and ("mean_ttft_ms" in data or "request_throughput" in data):
            return "vllm-bench-serve"
        return None
    if isinstance(data, list) and data and all(isinstance(o, dict) for o in data):
        first = data[0]
        if "config" in first and "measured" in first and "env" in first:
            return "llmplan-measure"
        if "completed" in first and _sglang_like(first):
            return "sglang-bench-serving"
        if "completed" in first and "mean_ttft_ms" in first:
            return "vllm-bench-serve"
    return None


def read_runs(data: Any, where: str) -> list[ServedRun]:
    fmt = detect(data)
    if fmt is None:
        raise FormatError(f"{where}: not a known benchmark result: expected {EXPECTED}")
    if fmt == "vllm-bench-serve":
        runs = [r for i, o in enumerate(data if isinstance(data, list) else [data], 1)
                for r in read_vllm(o, f"{where}:{i}" if isinstance(data, list) else where)]
    elif fmt == "sglang-bench-serving":
        runs = read_sglang(data if isinstance(data, list) else [data], where)
    elif fmt == "llmplan-measure":
        runs = read_measure(data, where)
    elif fmt == "guidellm":
        runs = read_guidellm(data, where)
    else:
        runs = read_genai_perf(data, where)
    if not runs:
        raise FormatError(f"{where}: {fmt}: no completed run with a measured figure")
    for r in runs:
        if not r.metrics:
            raise FormatError(f"{r.source}: {fmt}: no latency or throughput figure "
                              f"({', '.join(METRIC_KEYS[:3])}, ...)")
    return runs


GUIDELLM_METRICS = {"ttft": ("time_to_first_token_ms", 1e-3),
                    "tpot": ("time_per_output_token_ms", 1e-3),
                    "itl": ("inter_token_latency_ms", 1e-3),
                    "e2el": ("request_latency", 1.0)}  # request_latency is in seconds
REGULAR_BURSTINESS = 1000.0  # gamma gaps with a 3% spread: guidellm's constant rate


def _dist(metrics: dict, key: str, where: str) -> dict | None:
    """guidellm's statistics of the successful requests for one metric."""
    v = metrics.get(key)
    if v is None:
        return None
    if not isinstance(v, dict) or not isinstance(v.get("successful"), dict):
        raise FormatError(f"{where}: metrics.{key}.successful: expected a mapping of statistics")
    return v["successful"]


def read_guidellm(data: dict, where: str) -> list[ServedRun]:
    """guidellm's benchmark report (``guidellm benchmark --output-path X.json``, guidellm
    0.4 and later: src/guidellm/benchmark/schemas): ``benchmarks[i]`` each with
    ``config.strategy`` (type_ synchronous, concurrent, throughput, constant or poisson, and
    its streams / rate / max_concurrency), ``duration`` in seconds and ``metrics.<name>.
    successful`` statistics (mean, median, percentiles.p90 / p99, count, total_sum) of
    time_to_first_token_ms, time_per_output_token_ms, inter_token_latency_ms (milliseconds),
    request_latency (seconds), prompt_token_count and output_token_count."""
    runs = []
    for i, b in enumerate(data["benchmarks"]):
        w = f"{where}: benchmarks[{i}]"
        if not isinstance(b, dict) or not isinstance(b.get("metrics"), dict):
            raise FormatError(f"{w}: metrics: missing")
        cfg = b.get("config") if isinstance(b.get("config"), dict) else {}
        strat = cfg.get("strategy") if isinstance(cfg.get("strategy"), dict) else {}
        kind = strat.get("type_")
        m = b["metrics"]
        totals = m.get("request_totals") if isinstance(m.get("request_totals"), dict) else {}
        completed = _int(totals, "successful", f"{w}: metrics.request_totals")
        prompt = _dist(m, "prompt_token_count", w)
        out = _dist(m, "output_token_count", w)
        if prompt is None or out is None:
            raise FormatError(f"{w}: metrics.prompt_token_count / output_token_count: missing")
        if not completed:
            completed = _int(out, "count", f"{w}: metrics.output_token_count") or 0
        if not completed:
            continue  # nothing finished in this benchmark
        duration = _num(b, "duration", w, required=True)
        if not duration:
            raise FormatError(f"{w}: duration: must be positive")
        rate, mc, burst = math.inf, None, 1.0
        if kind == "synchronous":
            mc = 1
        elif kind == "concurrent":
            mc = _int(strat, "streams", f"{w}: config.strategy", required=True)
        elif kind in ("constant", "poisson"):
            rate = _num(strat, "rate", f"{w}: config.strategy", required=True)
            burst = 1.0 if kind == "poisson" else REGULAR_BURSTINESS
        elif kind == "throughput":
            mc = _int(strat, "max_concurrency", f"{w}: config.strategy")
        else:
            raise FormatError(f"{w}: config.strategy.type_: '{kind}' is not one of "
                              "synchronous, concurrent, throughput, constant, poisson")
        metrics: dict[str, float] = {}
        for name, (key, scale) in GUIDELLM_METRICS.items():
            d = _dist(m, key, w)
            if d is None or not d.get("count"):
                continue
            pct = d.get("percentiles") if isinstance(d.get("percentiles"), dict) else {}
            for stat, v in (("mean", d.get("mean")), ("median", d.get("median")),
                            ("p90", pct.get("p90")), ("p99", pct.get("p99"))):
                if v is not None:
                    unit_key = key if key.endswith("_ms") else f"{key}_s"
                    metrics[f"{stat}_{name}_s"] = _num({unit_key: v}, unit_key,
                                                       f"{w}: metrics.{key}") * scale
        out_total = _num(out, "total_sum", f"{w}: metrics.output_token_count") or 0.0
        in_total = _num(prompt, "total_sum", f"{w}: metrics.prompt_token_count") or 0.0
        metrics.update(request_throughput=completed / duration,
                       output_throughput=out_total / duration,
                       total_token_throughput=(in_total + out_total) / duration)
        label = kind + (f" {rate:g}/s" if math.isfinite(rate) else "") + \
            (f" x{mc}" if mc and kind == "concurrent" else "")
        backend = cfg.get("backend") if isinstance(cfg.get("backend"), dict) else {}
        runs.append(ServedRun(
            source=f"{where}#{i}", tool="guidellm", label=label, request_rate=rate,
            max_concurrency=mc, num_prompts=_int(totals, "total", w) or completed,
            completed=completed, mean_input_tokens=_num(prompt, "mean", w, required=True),
            mean_output_tokens=_num(out, "mean", w, required=True), metrics=metrics,
            burstiness=burst, duration_s=duration,
            model_id=backend.get("model") if isinstance(backend.get("model"), str) else None))
    return runs


GENAI_METRICS = {"ttft": "time_to_first_token", "tpot": "inter_token_latency",
                 "e2el": "request_latency"}


def read_genai_perf(data: dict, where: str) -> list[ServedRun]:
    """genai-perf's ``profile_export_genai_perf.json`` (triton-inference-server/perf_analyzer,
    genai-perf/genai_perf/export_data/json_exporter.py) and AIPerf's ``profile_export_aiperf
    .json`` (the same metric objects): one object per metric with ``unit`` and ``avg``, and for
    per-request metrics ``p50``, ``p90``, ``p99``; times in ms. Its ``inter_token_latency`` is
    per request (latency - TTFT) / (output tokens - 1): a TPOT. The traffic is
    ``input_config.perf_analyzer.stimulus`` (``concurrency`` or ``request_rate``), in AIPerf
    ``input_config.loadgen``, in genai-perf before its config files the flat
    ``input_config.concurrency`` / ``request_rate``."""
    def stat(key: str, field: str) -> float | None:
        obj = data.get(key)
        if obj is None:
            return None
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: {key}: expected an object with unit and avg")
        v = _num(obj, field, f"{where}: {key}")
        if v is None:
            return None
        unit = obj.get("unit", "ms")
        if key in GENAI_METRICS.values():
            if unit not in ("ms", "s"):
                raise FormatError(f"{where}: {key}.unit: expected ms or s, got {unit!r:.20}")
            v = v / 1e3 if unit == "ms" else v
            if v > DAY_MS / 1e3:
                raise FormatError(f"{where}: {key}.{field}: {v:g} s is longer than a day")
        return v

    cfg = data.get("input_config") if isinstance(data.get("input_config"), dict) else {}
    stim: dict = {}
    for block in (cfg.get("perf_analyzer"), cfg.get("loadgen")):
        if isinstance(block, dict):
            stim = block.get("stimulus") if isinstance(block.get("stimulus"), dict) else block
            break
    conc = _int(stim, "concurrency", f"{where}: input_config") if stim else None
    if conc is None:
        conc = _int(cfg, "concurrency", f"{where}: input_config")
    rate = (_num(stim, "request_rate", f"{where}: input_config", allow_inf=True) if stim
            else None) or _num(cfg, "request_rate", f"{where}: input_config", allow_inf=True)
    rps = stat("request_throughput", "avg")
    count = stat("request_count", "avg")
    mean_in, mean_out = stat("input_sequence_length", "avg"), stat("output_sequence_length",
                                                                   "avg")
    if not rps or not mean_in or not mean_out:
        raise FormatError(f"{where}: request_throughput, input_sequence_length and "
                          "output_sequence_length (avg) are needed")
    completed = int(count) if count else None
    metrics: dict[str, float] = {}
    for name, key in GENAI_METRICS.items():
        for st, field in (("mean", "avg"), ("median", "p50"), ("p90", "p90"), ("p99", "p99")):
            v = stat(key, field)
            if v is not None:
                metrics[f"{st}_{name}_s"] = v
    metrics["request_throughput"] = rps
    out_tps = stat("output_token_throughput", "avg")
    metrics["output_throughput"] = out_tps if out_tps else rps * mean_out
    metrics["total_token_throughput"] = rps * (mean_in + mean_out)
    names = cfg.get("model_names") or cfg.get("model") or (
        cfg.get("endpoint", {}).get("model_names") if isinstance(cfg.get("endpoint"), dict)
        else None)
    model_id = names[0] if isinstance(names, list) and names and isinstance(names[0], str) \
        else None
    if conc:
        label, rate_v, mc, burst = f"concurrency {conc}", math.inf, conc, 1.0
    elif rate:
        # perf_analyzer's request rate is constant unless --request-distribution poisson
        label, rate_v, mc, burst = f"rate {rate:g}/s", rate, None, REGULAR_BURSTINESS
    else:
        raise FormatError(f"{where}: input_config: neither a concurrency nor a request rate")
    completed = completed or max(1, round(rps * 60))
    return [ServedRun(
        source=where, tool="genai-perf", label=label, request_rate=rate_v, max_concurrency=mc,
        num_prompts=completed, completed=completed, mean_input_tokens=mean_in,
        mean_output_tokens=mean_out, metrics=metrics, burstiness=burst,
        duration_s=completed / rps, model_id=model_id)]


# The block `vllm bench serve` (and benchmark_serving.py) and SGLang's bench_serving print at
# the end of a run, as users paste it into issues and posts: "Label: value" lines between
# "==== Serving Benchmark Result ====" and a closing rule.
PRINTED_MARK = "Serving Benchmark Result"
_PRINTED_KEYS = {
    "successful requests": "completed",
    "benchmark duration (s)": "duration",
    "total input tokens": "total_input_tokens",
    "total generated tokens": "total_output_tokens",
    "request throughput (req/s)": "request_throughput",
    "output token throughput (tok/s)": "output_throughput",
    "total token throughput (tok/s)": "total_token_throughput",
    "request rate configured (rps)": "request_rate",
    "traffic request rate": "request_rate",
    "maximum request concurrency": "max_concurrency",
    "max request concurrency": "max_concurrency",
}
_PRINTED_STAT = re.compile(r"^(mean|median|p\d+(?:\.\d+)?) (ttft|tpot|itl|e2el|e2e latency) "
                           r"\(ms\)$")


def read_printed(text: str, where: str) -> list[ServedRun]:
    """The runs of a printed result block (one per block; a text may hold several). Its
    request rate is the configured one when the block prints it (recent vLLM, SGLang); an
    older block's traffic must come from the command that produced it (a served manifest's
    ``traffic``)."""
    blocks = text.split(PRINTED_MARK)[1:]
    if not blocks:
        raise FormatError(f"{where}: no '{PRINTED_MARK}' block")
    runs = []
    for i, block in enumerate(blocks, 1):
        w = f"{where}:{i}" if len(blocks) > 1 else where
        obj: dict[str, Any] = {}
        sglang = False
        for line in block.splitlines():
            label, sep, value = line.partition(":")
            if not sep:
                continue
            label, value = label.strip().lower(), value.strip()
            m = _PRINTED_STAT.match(label)
            if m:
                stat, what = m.group(1), m.group(2)
                sglang |= what == "e2e latency"
                key = f"{stat}_{'e2e_latency' if what == 'e2e latency' else what}_ms"
            elif label in _PRINTED_KEYS:
                key = _PRINTED_KEYS[label]
            else:
                sglang |= label in ("backend", "traffic request rate")
                continue
            if value.lower() in ("inf", "infinity"):
                obj[key] = math.inf
                continue
            try:
                obj[key] = float(value.replace(",", ""))
            except ValueError:
                if value.lower() in ("not set", "none", "n/a", ""):
                    continue  # a limit the run did not set
                raise FormatError(f"{w}: '{label}': not a number: {value[:40]!r}") from None
        for k in ("completed", "max_concurrency", "total_input_tokens", "total_output_tokens"):
            if k in obj and math.isfinite(obj[k]):
                obj[k] = int(obj[k])
        if "completed" not in obj:
            raise FormatError(f"{w}: the block has no 'Successful requests' line")
        # one block is one run: named by its place in the text, not as a JSON Lines line
        runs += [replace(r, source=w) for r in read_sglang([obj], w)] if sglang else \
            read_vllm(obj, w)
    return [replace(r, tool=r.tool + " (printed)") for r in runs]
