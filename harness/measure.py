"""`llmplan measure`: time real decode and prefill steps of a model's shape across batch and
context, compare each point with the planner's prediction, and write JSON Lines as it goes.

Each point is one (weights, batch, context): a decode step at that context (one new token per
sequence attending to ``context`` cached tokens) and the prefill of batch x context prompt
tokens (TTFT). Points run batch by batch with context ascending, so an out-of-memory error at
one context skips the larger contexts of that batch. A line is appended, flushed and fsynced as
each point completes: an interrupt, an OOM or a crash loses nothing already measured, and
``--resume`` skips the points a file already holds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.bench import (
    NOISY_REPEAT,
    NOISY_SPREAD,
    busy_hint,
    drift,
    spread_reason,
    timing_spread,
)
from harness.calibrate import HARNESS_VERSION
from harness.device import DeviceInfo, Telemetry, now_iso
from planner.core.errors import first_line
from planner.core.memory import kv_cache_bytes, weight_bytes
from planner.core.ops import decode_ops, prefill_ops
from planner.core.roofline import Ceilings, ceilings, mbu, mfu, step_time
from planner.core.specs import (
    GIB,
    Calibration,
    DType,
    HardwareSpec,
    Interconnect,
    ModelSpec,
    Options,
    Precision,
)

PREFILL_CHUNK_TOKENS = 8192  # prefill runs in slices of at most this many tokens

STATUSES = ("ok", "noisy", "skipped", "oom", "error")


@dataclass
class Plan:
    model: ModelSpec
    layers: int  # layers actually built and timed
    weights: list[str]
    kv_cache: str
    batches: list[int]
    contexts: list[int]
    max_memory_bytes: float
    out: Path
    resume: bool = False
    budget_s: float = 0.5
    flush_l2: bool = True
    attention_backend: str = "auto"
    mode: str = "eager"  # or "compiled": torch.compile of the layer (dense models)
    max_spread: float = NOISY_SPREAD  # a point past either is recorded "noisy" (``noise``)
    max_drift: float = NOISY_REPEAT
    argv: list[str] = field(default_factory=list)

    @property
    def measured_model(self) -> ModelSpec:
        """The model as built: ``layers`` of the real shape (``--layers``)."""
        if self.layers == self.model.num_layers:
            return self.model
        return self.model.model_copy(update={"num_layers": self.layers})


def point_key(rec: dict) -> tuple:
    c = rec["config"]
    return (c["model"], c["layers"], c["weights"], c["kv_cache"], c["batch"], c["context"])


_OK_NUMBERS = (("measured", "tpot_s", "median_s"), ("measured", "tpot_s", "p10_s"),
               ("measured", "tpot_s", "p90_s"), ("measured", "ttft_s"),
               ("prediction", "calibrated", "tpot_s"), ("prediction", "calibrated", "ttft_s"),
               ("error", "calibrated", "tpot_frac"), ("error", "calibrated", "ttft_frac"))


def _resumable(rec: object) -> str | None:
    """Why a record cannot be carried into a resumed run (None when it can)."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    cfg = rec.get("config")
    ints = ("batch", "context")
    if (not isinstance(cfg, dict)
            or not all(isinstance(cfg.get(k), str) for k in ("model", "weights", "kv_cache"))
            or not all(type(cfg.get(k)) is int for k in ints)
            or not (cfg.get("layers") is None or type(cfg.get("layers")) is int)
            or "layers" not in cfg):
        return ("config: model, layers, weights, kv_cache, batch and context missing or of "
                "the wrong type")
    if rec.get("status") not in STATUSES:
        return f"status: {rec.get('status')!r} is not one of {', '.join(STATUSES)}"
    if rec["status"] not in ("ok", "noisy"):
        return None
    paths = list(_OK_NUMBERS)
    if isinstance(rec.get("error"), dict) and "datasheet" in rec["error"]:
        paths.append(("error", "datasheet", "tpot_frac"))
    mbu = rec.get("utilisation", {}).get("calibrated", {}) if isinstance(
        rec.get("utilisation"), dict) else None
    if not isinstance(mbu, dict) or ("mbu" in mbu and mbu["mbu"] is not None
                                     and not _finite_number(mbu["mbu"])):
        return "utilisation.calibrated.mbu: not a number"
    for path in paths:
        node: object = rec
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if not _finite_number(node):
            return f"{'.'.join(path)}: not a finite number"
    return _non_finite(rec)


def _non_finite(node: object, path: str = "") -> str | None:
    """Where a record holds a NaN or an infinity (a resumed point's every number is summed
    up or printed: one hidden under a key the checks above do not name, such as
    error.calibrated_harness_kernels.tpot_frac, would reach the summary)."""
    if isinstance(node, float) and not math.isfinite(node):
        return f"{path.lstrip('.')}: not a finite number"
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for k, v in items:
        why = _non_finite(v, f"{path}.{k}")
        if why:
            return why
    return None


def _finite_number(x: object) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return abs(x) < 1e300 if isinstance(x, int) else math.isfinite(x)


def load_done(path: Path) -> dict[tuple, dict]:
    """Points already in ``path``. A torn last line (a crash mid-write) is ignored; any other
    line that is not a whole `llmplan measure` record is an error naming the line, since
    resuming would carry it into the results."""
    from planner.core.errors import SpecError
    from planner.io import boundary

    done: dict[tuple, dict] = {}
    if not path.exists():  # a pipe or a folder there exists: read_text refuses it
        return done
    text = boundary.read_text(path, what="results file", max_bytes=boundary.RESULT_BYTES)
    boundary.check_json_depth(text, str(path))
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = boundary.loads_json(line, f"{path}:{i}", checked=True)
        except (json.JSONDecodeError, RecursionError, ValueError):
            if i == len(lines):
                continue
            raise SpecError(f"{path}: line {i}: not JSON; cannot resume from it") from None
        why = _resumable(rec)
        if why is not None:
            raise SpecError(f"{path}: line {i}: {why}; cannot resume from it")
        done[point_key(rec)] = rec
    return done


def repair_tail(path: Path) -> str | None:
    """Make ``path`` end at a whole line before appending to it. Every record is written as
    one line with its newline, so bytes after the last newline are a write cut short by a
    kill: a complete JSON record there gets its newline back, a fragment is cut off (its
    point is measured again). Returns what was done, or None when nothing was needed."""
    if not path.exists():
        return None
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        whole = isinstance(json.loads(tail), dict)
    except (ValueError, RecursionError):
        whole = False
    with path.open("r+b") as f:
        if whole:
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
        else:
            f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return "newline added after the last record" if whole else \
        f"cut a torn last line of {len(tail)} bytes"


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def sole_writer(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock (``fcntl.flock``) on ``<path>.lock`` for the block, so
    two `llmplan measure` runs never write one results file: the second is refused in one
    line naming the file and the holder's pid, before it calibrates, truncates or appends.
    The lock file holds the pid and is removed when the block ends; the kernel drops the
    lock of a killed holder, so a stale file never blocks a later run. Where ``fcntl`` is
    missing (Windows) nothing is locked."""
    from planner.core.errors import LlmplanError

    try:
        import fcntl
    except ImportError:
        yield
        return
    lock = lock_path(path)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise LlmplanError(f"--out: {path} is being written by another `llmplan measure`"
                               f"{who}; wait for it to finish or choose another --out "
                               f"(lock {lock})") from None
        try:  # the file locked must still be the one at the path: a holder that finished
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino  # removes it
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        try:
            os.unlink(lock)  # while still held: no one can lock this file after it is gone
        except FileNotFoundError:
            pass
        os.close(fd)


def append(path: Path, rec: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(rec, default=float) + "\n")
        f.flush()
        os.fsync(f.fileno())


def cpu_hardware(info: DeviceInfo, cal: Calibration) -> HardwareSpec:
    """A hardware spec for a processor, from its calibration (no datasheet is used)."""
    return HardwareSpec(
        name="cpu", display_name=info.name, vendor="cpu", source="measured by llmplan measure",
        memory_gib=info.memory_bytes / GIB, memory_bandwidth_gb_per_s=cal.memory_bandwidth_gb_per_s,
        peak_tflops=dict(cal.matmul_tflops),
        interconnect=Interconnect(kind="none", bandwidth_gb_per_s=1.0))


def predict(model: ModelSpec, prec: Precision, c: Ceilings, *, batch: int,
            context: int) -> dict:
    """The planner's TPOT and TTFT for exactly what is timed (planner.core.ops, roofline)."""
    o = Options()  # the calibration's per-kernel cost is already in the ceilings
    dec = step_time(decode_ops(model, prec, batch=batch, context_tokens=context), c, options=o)
    pre = step_time(prefill_ops(model, prec, batch=batch, prompt_tokens=context), c, options=o)
    peak = c.peak(prec.compute_dtype)
    return {"tpot_s": dec.time_s, "ttft_s": pre.time_s, "decode_kernels": dec.kernels,
            "decode_weight_kv_bytes": dec.weight_and_kv_bytes, "decode_flops": dec.flops,
            "prefill_flops": pre.flops, "bound": dec.bound,
            "mbu": mbu(dec.weight_and_kv_bytes, dec.time_s, c.bandwidth_bytes_per_s),
            "mfu": mfu(dec.flops, dec.time_s, peak), "ceilings": c.source,
            "kernel_overhead_s": c.kernel_overhead_s}


def point_memory_bytes(model: ModelSpec, prec: Precision, *, batch: int, context: int) -> float:
    """What the harness allocates for a point: weights, a KV cache of batch x context tokens,
    and the activations of one prefill slice (planner.core.memory's terms)."""
    from planner.core.memory import activation_bytes

    slice_b = max(1, PREFILL_CHUNK_TOKENS // context)
    return (weight_bytes(model, prec) + kv_cache_bytes(model, prec, batch=batch, seq_len=context)
            + activation_bytes(model, prec, batch=min(batch, slice_b), prompt_tokens=context))


def noise(measured: dict, *, max_spread: float = NOISY_SPREAD,
          max_drift: float = NOISY_REPEAT) -> str | None:
    """Why a point's timings cannot be trusted (None when they can): a timing whose p90 is
    more than ``max_spread`` times its median, or a decode step whose second timing, seconds
    after the first, differs from it by more than ``max_drift`` times."""
    for name in ("tpot_s", "prefill_slice_s", "tpot_repeat_s"):
        t = measured.get(name)
        spread = timing_spread(t)  # None: a single timing, nothing to judge it by
        if spread is not None and spread > max_spread:
            return (spread_reason(name, spread, t.get("reps", "?"), max_spread)
                    + ": the machine was busy")
    first = (measured.get("tpot_s") or {}).get("median_s")
    again = (measured.get("tpot_repeat_s") or {}).get("median_s")
    ratio = drift(first, again)
    if ratio is not None and ratio > max_drift:
        return (f"decode step {ratio:.1f}x {'slower' if again > first else 'faster'} "
                f"when timed again seconds later (limit {max_drift:g}x): the machine "
                "was busy")
    return None


def _warn_stderr(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def run(plan: Plan, info: DeviceInfo, cal: Calibration, hw: HardwareSpec | None,
        *, progress: Callable[[str], None] | None = None,
        warn: Callable[[str], None] = _warn_stderr) -> list[dict]:
    """Measure every point of ``plan``; returns the records (written as they complete). A
    point whose timings are noisy (``noise``) is recorded with status "noisy" and its reason,
    and ``warn`` is told."""
    import torch

    from harness.bench import is_oom, time_fn
    from harness.decoder import Decoder, UnsupportedConfig

    done = load_done(plan.out) if plan.resume else {}
    if plan.resume:
        repair_tail(plan.out)  # the next record must not be appended to a torn fragment
    if not plan.resume and plan.out.exists():
        plan.out.unlink()
    plan.out.parent.mkdir(parents=True, exist_ok=True)
    model = plan.measured_model
    cal_hw = hw if hw is not None else cpu_hardware(info, cal)
    cal_ceil = ceilings(cal_hw, cal)
    sheet_ceil = ceilings(hw) if hw is not None and info.kind == "cuda" else None
    env = {"device": info.as_dict(), "harness_version": HARNESS_VERSION,
           "torch": str(torch.__version__), "command": plan.argv, "calibration": {
               "memory_bandwidth_gb_per_s": cal.memory_bandwidth_gb_per_s,
               "matmul_tflops": {k.value: v for k, v in cal.matmul_tflops.items()},
               "kernel_overhead_us": cal.kernel_overhead_us,
               **cal.model_dump(include={"matmul_overhead_us", "attention_overhead_us"},
                                exclude_none=True)}}
    records: list[dict] = []
    compile_failed: str | None = None

    def build(weights: str, may_compile: bool) -> Decoder:
        return Decoder(model, layers=plan.layers, batch=1, max_tokens=1, weights=weights,
                       kv_dtype=plan.kv_cache, device=info.kind,
                       attention_backend=plan.attention_backend,
                       compile=may_compile and plan.mode == "compiled")

    def emit(rec: dict) -> None:
        append(plan.out, rec)
        records.append(rec)
        if progress:
            progress(rec["status"])

    for weights in plan.weights:
        # what the decoder stores: int8 per output channel (one scale per row), int4 in
        # groups of 128 with a scale and a zero point each (tinygemm)
        prec = Precision(weights=DType(weights), kv_cache=DType(plan.kv_cache),
                         group_size=128 if weights == "int4" else model.hidden_size,
                         zero_point_bytes=2 if weights == "int4" else 0)
        dec = None
        for batch in plan.batches:
            oom_at = None
            for context in plan.contexts:
                cfg = {"model": plan.model.name, "layers": plan.layers,
                       "model_layers": plan.model.num_layers, "weights": weights,
                       "kv_cache": plan.kv_cache, "batch": batch, "context": context,
                       "prompt_tokens": context, "device": info.kind}
                base = {"time": now_iso(), "env": env, "config": cfg}
                if point_key(base) in done:
                    records.append(done[point_key(base)])
                    if progress:
                        progress("resumed")
                    continue
                need = point_memory_bytes(model, prec, batch=batch, context=context)
                if oom_at is not None:
                    emit({**base, "status": "skipped",
                          "reason": f"out of memory at context {oom_at} for this batch"})
                    continue
                if need > plan.max_memory_bytes:
                    emit({**base, "status": "skipped",
                          "reason": f"predicted {need / GIB:.2f} GiB exceeds the "
                                    f"{plan.max_memory_bytes / GIB:.2f} GiB cap"})
                    continue
                try:
                    if dec is None:
                        dec = build(weights, compile_failed is None)
                    try:
                        rec = _measure_point(dec, plan, info, batch, context, time_fn)
                    except Exception as err:
                        if dec.mode != "compiled" or is_oom(err):
                            raise
                        # torch.compile failed here: measure eagerly from now on, and say so
                        compile_failed = f"{type(err).__name__}: {first_line(err)[:200]}"
                        del dec
                        dec = build(weights, False)
                        rec = _measure_point(dec, plan, info, batch, context, time_fn)
                    rec["measured"]["mode"] = dec.mode
                    if plan.mode == "compiled" and dec.mode != "compiled":
                        rec["measured"]["mode_reason"] = compile_failed or dec.mode_reason
                except UnsupportedConfig as err:
                    emit({**base, "status": "skipped", "reason": str(err)})
                    break
                except Exception as err:  # an OOM is a result; anything else is recorded
                    if not is_oom(err):
                        emit({**base, "status": "error",
                              "reason": f"{type(err).__name__}: {str(err)[:300]}"})
                        continue
                    oom_at = context
                    if dec is not None:
                        dec.free_cache()
                    if info.kind == "cuda":
                        torch.cuda.empty_cache()
                    emit({**base, "status": "oom", "reason": first_line(err)[:300]})
                    continue
                rec = {**base, **rec, "status": "ok"}
                if prec.compute_dtype not in cal_ceil.flops_per_s:
                    emit({**rec, "status": "skipped",
                          "reason": f"the calibration has no {prec.compute_dtype.value} "
                                    "matmul rate to predict this point with"})
                    continue
                _attach_predictions(rec, model, prec, cal_ceil, sheet_ceil, batch, context)
                why = noise(rec["measured"], max_spread=plan.max_spread,
                            max_drift=plan.max_drift)
                if why is not None:
                    rec.update(status="noisy", reason=why)
                    warn(f"{weights} batch {batch} context {context} recorded as noisy, left "
                         f"out of the summary: {why}; {busy_hint()}")
                emit(rec)
        if dec is not None:
            del dec
            if info.kind == "cuda":
                torch.cuda.empty_cache()
    return records


def _reset_peak_memory(kind: str) -> None:
    import torch

    if kind == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    elif os.path.exists("/proc/self/clear_refs"):
        try:  # Linux: writing 5 resets the process's peak RSS (VmHWM)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def _peak_memory(kind: str) -> dict:
    """The peak since the last reset: the caching allocator's on CUDA, the process's peak
    resident set on Linux CPUs (it includes the interpreter and torch: an upper bound)."""
    import torch

    if kind == "cuda":
        torch.cuda.synchronize()
        return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                "method": "torch.cuda.max_memory_allocated / max_memory_reserved"}
    try:
        with open("/proc/self/status") as f:
            hwm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))
        return {"peak_rss_bytes": hwm, "method": "VmHWM (process peak RSS, reset per point)"}
    except (OSError, StopIteration, ValueError):
        return {"method": "unavailable on this OS"}


class _quiet_stderr:
    """fd 2 sent to /dev/null for a moment: the profiler's C++ side logs there."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)


def count_kernels(fn, kind: str) -> dict:
    """What one call of ``fn`` really pays a per-kernel cost for: the device kernels it
    launches on CUDA (torch.profiler), the operators that compute on the CPU (aten
    operators seen by a dispatch mode, views left out: they launch nothing)."""
    import torch

    if kind == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU,
                                                  ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        n = sum(1 for e in prof.events() if getattr(e, "device_type", None) is not None
                and e.device_type.name == "CUDA")
        return {"kernels": n, "method": "torch.profiler CUDA kernels"}
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return {"kernels": Count.n, "method": "aten operators, views excluded (dispatch mode)"}


def _measure_point(dec, plan: Plan, info: DeviceInfo, batch: int, context: int,
                   time_fn) -> dict:
    import torch

    dev = info.kind
    _reset_peak_memory(dev)
    dec.alloc_cache(batch, context)
    vocab = dec.model.vocab_size
    with torch.inference_mode(), Telemetry(info) as tel:
        tok = torch.randint(0, vocab, (batch, 1), device=dev)
        # small working sets fit in L2: flush it between replays so weights come from HBM
        small = dec.weight_bytes + dec.kv_bytes(batch, context) < 4 * (50 << 20)
        tpot = time_fn(lambda: dec.decode_step(tok, context - 1), kind=dev,
                       budget_s=plan.budget_s, flush_l2=plan.flush_l2 and small)
        slice_b = min(batch, max(1, PREFILL_CHUNK_TOKENS // context))
        prompt = torch.randint(0, vocab, (slice_b, context), device=dev)
        pre = time_fn(lambda: dec.prefill(prompt), kind=dev, budget_s=plan.budget_s,
                      use_graph=False)
        # the decode step again, seconds after the first timing: a load that came or went
        # in between shows as two medians that disagree (``noise``)
        again = time_fn(lambda: dec.decode_step(tok, context - 1), kind=dev,
                        budget_s=plan.budget_s / 2, flush_l2=plan.flush_l2 and small)
        memory = _peak_memory(dev)
        kernels = count_kernels(lambda: dec.decode_step(tok, context - 1), dev)
    slices = -(-batch // slice_b)  # equal slices; the last may be partial
    ttft = pre.median_s * batch / slice_b
    memory.update({"weights_bytes": dec.param_bytes,
                   "kv_cache_bytes": dec.kv_bytes(batch, context)})
    return {
        "measured": {"tpot_s": tpot.as_dict(), "tpot_repeat_s": again.as_dict(),
                     "prefill_slice_s": pre.as_dict(),
                     "ttft_s": ttft, "prefill_slices": slices, "prefill_slice_batch": slice_b,
                     "attention_backend": dec.backend, "decode_kernels": kernels["kernels"],
                     "decode_kernels_method": kernels["method"], "memory": memory},
        "telemetry": tel.summary(),
    }


def _attach_predictions(rec: dict, model: ModelSpec, prec: Precision, cal_ceil: Ceilings,
                        sheet_ceil: Ceilings | None, batch: int, context: int) -> None:
    tpot = rec["measured"]["tpot_s"]["median_s"]
    ttft = rec["measured"]["ttft_s"]
    preds, util, errors = {}, {}, {}
    for name, c in (("calibrated", cal_ceil), ("datasheet", sheet_ceil)):
        if c is None:
            preds[name] = None
            continue
        p = predict(model, prec, c, batch=batch, context=context)
        preds[name] = p
        peak = c.peak(prec.compute_dtype)
        util[name] = {"mbu": mbu(p["decode_weight_kv_bytes"], tpot, c.bandwidth_bytes_per_s),
                      "mfu": mfu(p["decode_flops"], tpot, peak),
                      "prefill_mfu": mfu(p["prefill_flops"], ttft, peak)}
        errors[name] = {"tpot_frac": p["tpot_s"] / tpot - 1, "ttft_frac": p["ttft_s"] / ttft - 1}
    ref = preds["calibrated"]
    # The same prediction with the harness's own kernel count (profiled) in place of the
    # planner's: what is left of the error is not the harness launching more kernels.
    k_meas = rec["measured"].get("decode_kernels")
    if k_meas and ref.get("kernel_overhead_s"):
        adj = ref["tpot_s"] + (k_meas - ref["decode_kernels"]) * ref["kernel_overhead_s"]
        preds["calibrated_harness_kernels"] = {"tpot_s": adj, "decode_kernels": k_meas}
        errors["calibrated_harness_kernels"] = {"tpot_frac": adj / tpot - 1}
    rec["memory"] = {"predicted_bytes": point_memory_bytes(model, prec, batch=batch,
                                                           context=context),
                     "predicted_weights_bytes": weight_bytes(model, prec),
                     "predicted_kv_cache_bytes": kv_cache_bytes(model, prec, batch=batch,
                                                                seq_len=context)}
    rec["achieved"] = {
        "bandwidth_bytes_per_s": ref["decode_weight_kv_bytes"] / tpot,
        "decode_flops_per_s": ref["decode_flops"] / tpot,
        "prefill_flops_per_s": ref["prefill_flops"] / ttft,
        "decode_throughput_tokens_per_s": batch / tpot,
    }
    rec["utilisation"] = util
    rec["prediction"] = preds
    rec["error"] = errors


def summarize(records: list[dict]) -> dict:
    """Median and worst absolute relative error of TPOT and TTFT, per ceiling source, over
    the points measured cleanly (status ok: a noisy point is counted, not averaged in)."""
    import statistics

    out: dict = {}
    ok = [r for r in records if r.get("status") == "ok"]
    for src in ("calibrated", "calibrated_harness_kernels", "datasheet"):
        for what in ("tpot_frac", "ttft_frac"):
            errs = [abs(r["error"][src][what]) for r in ok
                    if what in (r.get("error", {}).get(src) or {})]
            if errs:
                out[f"{src}_{what}"] = {"median_abs": statistics.median(errs),
                                        "worst_abs": max(errs), "points": len(errs)}
    out["points"] = {s: sum(1 for r in records if r.get("status") == s)
                     for s in STATUSES}
    return out


def write_prometheus(records: list[dict], path: str | Path) -> None:
    """The measured figures in the Prometheus text format (node-exporter textfile style)."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    reg = CollectorRegistry()
    labels = ["device", "model", "precision", "batch", "context"]
    g = {
        "ttft": Gauge("llmplan_ttft_seconds", "Measured time to first token (prefill).",
                      labels, registry=reg),
        "tpot": Gauge("llmplan_tpot_seconds", "Measured time per output token (median).",
                      labels, registry=reg),
        "thr": Gauge("llmplan_decode_throughput_tokens_per_second",
                     "Decode throughput, batch / TPOT.", labels, registry=reg),
        "bw": Gauge("llmplan_achieved_bandwidth_bytes_per_second",
                    "Weight and KV bytes per decode step / TPOT.", labels, registry=reg),
        "mbu": Gauge("llmplan_mbu_ratio", "Model bandwidth utilisation (calibrated ceiling).",
                     labels, registry=reg),
        "mfu": Gauge("llmplan_mfu_ratio", "Model FLOPs utilisation of decode (calibrated).",
                     labels, registry=reg),
        "err": Gauge("llmplan_tpot_prediction_error_ratio",
                     "Predicted / measured TPOT - 1 (calibrated ceilings).", labels,
                     registry=reg),
    }
    for r in records:
        if r.get("status") != "ok":
            continue
        c = r["config"]
        dev = r["env"]["device"]
        lv = [dev.get("hardware_db") or dev["name"], c["model"], c["weights"], str(c["batch"]),
              str(c["context"])]
        g["ttft"].labels(*lv).set(r["measured"]["ttft_s"])
        g["tpot"].labels(*lv).set(r["measured"]["tpot_s"]["median_s"])
        g["thr"].labels(*lv).set(r["achieved"]["decode_throughput_tokens_per_s"])
        g["bw"].labels(*lv).set(r["achieved"]["bandwidth_bytes_per_s"])
        g["mbu"].labels(*lv).set(r["utilisation"]["calibrated"]["mbu"])
        g["mfu"].labels(*lv).set(r["utilisation"]["calibrated"]["mfu"])
        g["err"].labels(*lv).set(r["error"]["calibrated"]["tpot_frac"])
    write_to_textfile(str(path), reg)
