"""Vectorized sweeps: the same formulas as ``estimate``, over numpy arrays of a whole grid.

Categorical axes (model, GPU, weight and KV precision, TP) are looped over. The numeric axes
(batch, prompt and output tokens) are passed to ``planner.core.estimate.assemble`` as broadcastable
arrays of shapes (nb, 1, 1), (1, np, 1) and (1, 1, no): every quantity is computed on the axes
it depends on (prefill never sees the output axis) and broadcast to the grid at the end.
Configurations that do not fit are kept (``fits`` false); those a GPU cannot run (bf16 on a T4,
a TP that does not divide the heads) are kept with ``supported`` false and the reason in
``note``.

Imports numpy (and pandas / pyarrow where a frame or a CSV is asked for): only ``sweep``,
``report`` and ``plan`` use this module.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from planner.core.engine import IDEAL, Engine
from planner.core.errors import LlmplanError, UsageError
from planner.core.estimate import assemble, prepare, resolve_price
from planner.core.ops import check_runs_on
from planner.core.specs import (
    DEFAULT_GROUP_SIZE,
    Calibration,
    DType,
    HardwareSpec,
    ModelSpec,
    Options,
    Precision,
)
from planner.layouts.deployment import Layout
from planner.layouts.figures import layout_figures

MAX_LIST = 1_000_000


def parse_int_list(text: str, name: str) -> list[int]:
    """"1,2,4..256" -> [1, 2, 4, 8, ..., 256].

    ``a..b`` doubles from a up to b; ``a..b+s`` steps by s. Values must be positive; a list
    of more than ``MAX_LIST`` values is refused.
    """
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            if ".." in part:
                lo_s, hi_s = part.split("..", 1)
                step = None
                if "+" in hi_s:
                    hi_s, step_s = hi_s.split("+", 1)
                    step = int(step_s)
                lo, hi = int(lo_s), int(hi_s)
                if lo <= 0 or hi < lo or (step is not None and step <= 0):
                    raise ValueError
                if step is None:
                    v = lo
                    while v <= hi:
                        out.append(v)
                        v *= 2
                else:
                    if (hi - lo) // step + 1 + len(out) > MAX_LIST:
                        raise UsageError(f"{name}: '{part}' has {(hi - lo) // step + 1:,} "
                                         f"values; at most {MAX_LIST:,}")
                    out.extend(range(lo, hi + 1, step))
            else:
                v = int(part)
                if v <= 0:
                    raise ValueError
                out.append(v)
        except ValueError:
            raise UsageError(f"{name}: '{part}' is not a positive integer, a doubling range "
                             "a..b or a stepped range a..b+s") from None
    if not out:
        raise UsageError(f"{name}: no value given")
    if max(out) > 10**9:
        raise UsageError(f"{name}: {max(out):,} is beyond 1,000,000,000")
    return sorted(set(out))


def parse_str_list(text: str) -> list[str]:
    return [p.strip() for p in str(text).split(",") if p.strip()]


@dataclass(frozen=True)
class Grid:
    models: Sequence[ModelSpec]
    gpus: Sequence[HardwareSpec]
    batches: Sequence[int] = (1,)
    prompt_tokens: Sequence[int] = (512,)
    output_tokens: Sequence[int] = (128,)
    weights: Sequence[DType] = (DType.bf16,)
    kv_cache: Sequence[DType | None] = (None,)  # None: the weights' 16-bit type
    tps: Sequence[int] = (1,)
    pps: Sequence[int] = (1,)  # pipeline stages, each of tp GPUs
    eps: Sequence[int] = (1,)  # expert-parallel GPUs (MoE; a multiple of tp, pp 1)
    group_size: int = DEFAULT_GROUP_SIZE
    options: Options = field(default_factory=Options)
    engine: Engine = IDEAL
    compute: DType | None = None  # None: the matmul type follows the weights
    quantized_layers: str = "all"  # or "experts" (a MoE model's routed experts), "mlp"
    # the weights were not asked for: the 16-bit type is left to the engine (``Precision.auto``)
    auto_dtype: bool = False
    # the weights are a model's checkpoint as it ships: where a model's quantization_config
    # stores the weight type, its own scales (block-scaled fp8, group sizes) (``grid_precision``)
    released: bool = False

    @property
    def size(self) -> int:
        return (len(self.models) * len(self.gpus) * len(self.batches) * len(self.prompt_tokens)
                * len(self.output_tokens) * len(self.weights) * len(self.kv_cache)
                * len(self.tps) * len(self.pps) * len(self.eps))


def grid_precision(m: ModelSpec, weights, kv_cache=None, group_size: int = DEFAULT_GROUP_SIZE,
                   compute=None, quantized_layers: str = "all", *, auto: bool = False,
                   released: bool = False) -> Precision:
    """The precision of a searched configuration: with ``released``, where the model's
    checkpoint stores ``weights`` (its quantization_config), the checkpoint's own (its
    scales: fp8 in blocks, int4 groups and zero points), ``compute`` and ``kv_cache`` over it,
    as ``estimate`` takes a checkpoint without --weights; otherwise
    ``ModelSpec.precision_of``."""
    q = m.quantization
    if released and q is not None and q.problem is None and q.weights == DType(weights):
        return q.shipped(kv_cache, compute=compute, quantized_layers=quantized_layers,
                         auto=auto)
    return m.precision_of(weights, kv_cache, group_size, compute, quantized_layers, auto=auto)


@dataclass
class Chunk:
    """Rows of one categorical group: per-row columns as flat arrays, per-group constants as
    plain values (written once per row only when the chunk is materialized)."""

    n: int
    constants: dict
    arrays: dict[str, np.ndarray]
    order: list[str] = field(default_factory=list)  # column order, as in `estimate --json`

    def column(self, name: str) -> np.ndarray:
        if name in self.arrays:
            return self.arrays[name]
        v = self.constants.get(name)
        return np.full(self.n, v, dtype=object if v is None or isinstance(v, str) else None)

    @property
    def names(self) -> list[str]:
        rest = [k for k in [*self.constants, *self.arrays] if k not in self.order]
        return [k for k in self.order if k in self.constants or k in self.arrays] + rest


def _slices(nb: int, np_: int, no: int, chunk_rows: int) -> Iterator[tuple[slice, slice]]:
    kp = max(1, min(np_, chunk_rows // max(no, 1)))
    kb = max(1, chunk_rows // (kp * no)) if kp == np_ else 1
    for b0 in range(0, nb, kb):
        for p0 in range(0, np_, kp):
            yield slice(b0, b0 + kb), slice(p0, p0 + kp)


def iter_sweep(g: Grid, *, calibration: Calibration | None = None,
               price_usd_per_gpu_hour: float | None = None,
               chunk_rows: int = 200_000) -> Iterator[Chunk]:
    """Yield the sweep as chunks of at most about ``chunk_rows`` rows, ordered by model, GPU,
    weights, KV precision, TP, PP, EP, then batch, prompt and output tokens.

    A layout with pipeline stages or expert parallelism (``pp`` or ``ep`` above 1) gets the
    figures of ``planner.layouts.pipeline`` / ``planner.layouts.expert`` on the same arrays:
    timing, the largest memory of any of its GPUs, whether every GPU fits, and cost over all
    its GPUs."""
    B = np.asarray(sorted(g.batches), dtype=np.float64)
    P = np.asarray(sorted(g.prompt_tokens), dtype=np.float64)
    O = np.asarray(sorted(g.output_tokens), dtype=np.float64)  # noqa: E741
    for m, hw, w, kv, tp, pp, ep in itertools.product(g.models, g.gpus, g.weights, g.kv_cache,
                                                      g.tps, g.pps, g.eps):
        prec = grid_precision(m, w, kv, g.group_size, g.compute, g.quantized_layers,
                              auto=g.auto_dtype, released=g.released)
        base = {"model": m.name, "gpu": hw.name, "tp": tp, "pp": pp, "ep": ep,
                "num_gpus": pp * max(tp, ep), "weights": prec.weights.value,
                "quantized_layers": prec.quantized_layers,
                "kv_cache": prec.kv_cache.value, "engine": g.engine.name}
        try:
            Layout(tp, pp, ep).check(m)
            check_runs_on(m, hw)
            if g.quantized_layers == "experts" and m.moe is None:
                raise UsageError(f"{m.name} has no routed experts to quantize alone")
            prep = prepare(hw, prec, calibration, g.options, g.engine)
            prec, notes = prep.precision, list(prep.notes)
            # as it runs: an engine's fallback type (bf16 served in fp16 on a T4)
            base.update(weights=prec.weights.value, kv_cache=prec.kv_cache.value)
        except LlmplanError as err:
            prec, notes = None, [str(err)]
        price, _ = resolve_price(hw, price_usd_per_gpu_hour)
        for bs, ps in _slices(B.size, P.size, O.size, chunk_rows):
            b, p, o = B[bs].reshape(-1, 1, 1), P[ps].reshape(1, -1, 1), O.reshape(1, 1, -1)
            shape = (b.shape[0], p.shape[1], o.shape[2])
            n = shape[0] * shape[1] * shape[2]
            flat = {"batch": b, "prompt_tokens": p, "output_tokens": o}
            if prec is None:
                yield Chunk(n, {**base, "compute": None, "supported": False, "fits": False,
                                "note": notes[0]},
                            {k: np.broadcast_to(v, shape).ravel() for k, v in flat.items()},
                            [*base, "compute", *flat, "fits", "supported", "note"])
                continue
            if pp > 1 or ep > 1:
                cols = _layout_columns(m, hw, prep, g.options, tp, pp, ep, b, p, o, price)
                arrays = {k: np.broadcast_to(v, shape).ravel() for k, v in cols.items()}
                consts = {**base, "compute": prec.compute_dtype.value,
                          "price_usd_per_gpu_hour": price, "supported": True,
                          "note": "; ".join(notes)}
                yield Chunk(n, consts, arrays, [*base, "compute", *cols,
                                                "price_usd_per_gpu_hour", "supported", "note"])
                continue
            est = assemble(m, hw, prep, g.options, tp=tp, batch=b, prompt_tokens=p,
                           output_tokens=o, price_usd_per_gpu_hour=price, notes=notes)
            cols = est.columns()
            compute_bound = cols.pop("compute_bound")
            consts = {**base, "compute": prec.compute_dtype.value}
            arrays: dict[str, np.ndarray] = {}
            for k, v in cols.items():
                if isinstance(v, np.ndarray):
                    arrays[k] = np.broadcast_to(v, shape).ravel()
                else:
                    consts[k] = v
            arrays["bound"] = np.broadcast_to(compute_bound, shape).ravel()
            consts["supported"] = True
            consts["note"] = "; ".join(notes)
            yield Chunk(n, consts, arrays, [*base, "compute", *cols, "bound", "supported", "note"])


def _layout_columns(m: ModelSpec, hw: HardwareSpec, prep, o: Options, tp: int, pp: int,
                    ep: int, b, p, out, price: float | None) -> dict:
    """A pipeline or expert-parallel layout's figures over the grid's arrays."""
    f = layout_figures(m, hw, prep, o, tp=tp, pp=pp, ep=ep, batch=b, prompt_tokens=p,
                       output_tokens=out, price_usd_per_gpu_hour=price)
    cols = {"batch": b, "prompt_tokens": p, "output_tokens": out, **f.columns()}
    if cols["cost_usd_per_million_output_tokens"] is None:
        cols["cost_usd_per_million_output_tokens"] = np.nan
    return cols


_INT_COLUMNS = ("batch", "prompt_tokens", "output_tokens", "max_batch", "usable_optimal_batch")


def _order(chunks: list[Chunk]) -> list[str]:
    names: list[str] = []
    full = next((c for c in chunks if c.constants.get("supported")), chunks[0])
    for c in [full, *chunks]:
        for k in c.names:
            if k not in names:
                names.append(k)
    return names


def to_frame(chunks: Iterator[Chunk] | list[Chunk]):
    """Materialize chunks as one pandas DataFrame."""
    import pandas as pd

    chunks = list(chunks)
    if not chunks:
        return pd.DataFrame()
    names = _order(chunks)
    have = [set(c.names) for c in chunks]  # each chunk's columns, listed once
    data = {}
    for k in names:
        parts = []
        for c, cols in zip(chunks, have, strict=True):
            part = c.column(k) if k in cols else np.full(c.n, None if k == "bound" else np.nan)
            if k == "bound" and part.dtype == bool:
                part = np.where(part, "compute", "memory").astype(object)
            parts.append(part)
        col = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if k in _INT_COLUMNS and col.dtype.kind == "f":
            ints = _exact_ints(col)
            col = col if ints is None else ints
        data[k] = col
    return pd.DataFrame(data)


def sweep(g: Grid, **kwargs):
    """The whole sweep as one pandas DataFrame (see ``iter_sweep``)."""
    return to_frame(iter_sweep(g, **kwargs))


# a float64 at or above 2^63 is past int64's reach (9.22e18: a prefill of 100,000 tokens for
# 300 sequences of DeepSeek-V3 counts 9.6e18 FLOPs)
_INT64_LIMIT = 2.0 ** 63


def _exact_ints(a: np.ndarray) -> np.ndarray | None:
    """Whole-number floats as int64, or None where any is not finite or is past int64's
    reach (a cast would wrap it to -2^63: such a column stays as floats)."""
    with np.errstate(invalid="ignore"):
        ok = bool(np.all(np.abs(a) < _INT64_LIMIT))  # False for NaN and infinities too
    return a.astype(np.int64) if ok else None


def _decimal_ints(a: np.ndarray):
    """Whole-number floats as a pyarrow decimal128(38, 0) array, which the CSV writer prints
    as exact integer digits, as it prints int64: for a count column with a value past
    int64's reach (a value that is not finite, a missing figure, left empty). Built from its
    16-byte little-endian buffer (``_arrow_array``'s reason); rare, so a Python loop."""
    import pyarrow as pa

    finite = np.isfinite(a)
    data = bytearray(16 * len(a))
    for i in np.flatnonzero(finite).tolist():
        data[16 * i:16 * i + 16] = int(a[i]).to_bytes(16, "little", signed=True)
    valid = None if finite.all() else pa.py_buffer(np.packbits(finite, bitorder="little"))
    return pa.Array.from_buffers(pa.decimal128(38, 0), len(a), [valid, pa.py_buffer(data)])


def _is_count(name: str) -> bool:
    """Columns of byte and FLOP counts (and batch sizes): written as exact integers."""
    if name in _INT_COLUMNS or name in ("params", "active_params"):
        return True
    return ("bytes" in name or "flops" in name) and not any(
        x in name for x in ("per_s", "per_param", "per_byte", "frac"))


def _csv_value(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _arrow_array(a):
    """A pyarrow array over a 1-D numpy array's own buffer, or over a list of Python values
    (str, int or float, one type). Built from buffers rather than by ``pyarrow.array``,
    whose first call imports pandas where it is installed (to tell a Series from an array):
    about 0.25 s of a sweep's 3 s start that the CSV never needs."""
    import pyarrow as pa

    if isinstance(a, list):
        if all(isinstance(v, str) for v in a):
            data = [v.encode() for v in a]
            offsets = np.zeros(len(data) + 1, dtype=np.int32)
            np.cumsum([len(b) for b in data], out=offsets[1:])
            return pa.Array.from_buffers(pa.string(), len(data),
                                         [None, pa.py_buffer(offsets),
                                          pa.py_buffer(b"".join(data))])
        a = np.asarray(a)
    a = np.ascontiguousarray(a)
    if a.dtype == np.bool_:  # Arrow packs booleans a bit each
        return pa.Array.from_buffers(pa.bool_(), len(a),
                                     [None, pa.py_buffer(np.packbits(a, bitorder="little"))])
    if a.dtype.kind not in "iuf":
        return pa.array(a)
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(a)])


def _arrow_table(chunk: Chunk, names: list[str]):
    import pyarrow as pa

    cols = []
    zeros = None
    for k in names:
        if k == "bound" and k in chunk.arrays:  # the compute-bound flag, as two words
            idx = _arrow_array(chunk.arrays[k].astype(np.int8))
            cols.append(pa.DictionaryArray.from_arrays(idx, _arrow_array(["memory", "compute"])))
        elif k in chunk.arrays:
            a = chunk.arrays[k]
            if _is_count(k) and a.dtype.kind == "f":
                a = np.rint(a)  # counts: exact integers
                ints = _exact_ints(a)
                # past int64's reach (or a missing figure): exact all the same, as decimals
                cols.append(_arrow_array(ints) if ints is not None else _decimal_ints(a))
                continue
            if a.dtype == np.float64:
                a = a.astype(np.float32)  # 7 significant digits: the CSV's precision
            cols.append(_arrow_array(a))
        elif isinstance(chunk.constants.get(k), bool):
            # a per-group flag (supported): a boolean as the per-row ones (fits) are, unquoted
            if zeros is None:
                zeros = _arrow_array(np.zeros(chunk.n, dtype=np.int8))
            cols.append(pa.DictionaryArray.from_arrays(zeros, _arrow_array([chunk.constants[k]])))
        elif isinstance(chunk.constants.get(k), (int, float)):
            # a per-group number: typed (unquoted), and exact where it is a count
            v = chunk.constants[k]
            if zeros is None:
                zeros = _arrow_array(np.zeros(chunk.n, dtype=np.int8))
            value = _arrow_array(np.array([round(v)], np.int64)) if _is_count(k) else \
                _arrow_array(np.array([v], np.float32))
            cols.append(pa.DictionaryArray.from_arrays(zeros, value))
        else:
            # a per-group constant: formatted once, written as a one-entry dictionary
            if zeros is None:
                zeros = _arrow_array(np.zeros(chunk.n, dtype=np.int8))
            v = chunk.constants.get(k) if k in chunk.constants else None
            cols.append(pa.DictionaryArray.from_arrays(zeros, _arrow_array([_csv_value(v)])))
    return pa.table(cols, names=names)


def _named(chunks: Iterator[Chunk]) -> Iterator[tuple[list[str], Chunk]]:
    """The chunks with the file's column names; chunks of unsupported groups that come first
    wait until a supported one fixes the full set of columns."""
    pending: list[Chunk] = []
    names: list[str] | None = None
    for chunk in chunks:
        if names is None and not chunk.constants.get("supported"):
            pending.append(chunk)
            continue
        batch = [*pending, chunk] if names is None else [chunk]  # in the grid's order
        names = names or _order(batch)
        for c in batch:
            yield names, c
        pending = []
    if pending:
        names = _order(pending)
        for c in pending:
            yield names, c


class JsonArray:
    """Rows written to ``out`` as one JSON array, one row object a line, a chunk at a time:
    one chunk's rows are in memory at once, so millions of rows print in constant memory.
    Each row has the columns of the first supported group (as ``to_frame`` orders them; null
    where its group has none: an unsupported row's figures, a missing price), then any of
    its own; a column only a later group has is absent from earlier rows. Numbers are written
    as ``json.dumps`` writes them (shortest round-trip digits), column by column."""

    SLICE_ROWS = 8192  # rows formatted at once: a few MB of text

    def __init__(self, out: TextIO):
        self.out, self.rows = out, 0  # "[" waits for the first rows: a sweep refused in its
        # first chunk (planner.io.gate) prints nothing

    def write(self, names: list[str], chunk: Chunk) -> None:
        cols = [*names, *(k for k in chunk.names if k not in names)]
        parts, per_row = [], []
        for k in cols:  # the row template: constants inline, a %s for each per-row column
            key = json.dumps(k)
            if k in chunk.arrays:
                parts.append(f"{key}: %s")
                per_row.append(k)
            else:
                v = chunk.constants.get(k) if k in chunk.constants else None
                parts.append(f"{key}: {_json_value(v)}".replace("%", "%%"))
        template = "{" + ", ".join(parts) + "}"
        for lo in range(0, chunk.n, self.SLICE_ROWS):  # the text of a slice at a time
            hi = min(lo + self.SLICE_ROWS, chunk.n)
            values = [_json_column(k, chunk.arrays[k][lo:hi]) for k in per_row]
            rows = [template % r for r in zip(*values, strict=True)] if values else \
                [template] * (hi - lo)
            self.out.write(("," if self.rows else "[") + "\n" + ",\n".join(rows))
            self.rows += len(rows)

    def close(self) -> int:
        self.out.write("\n]\n" if self.rows else "[]\n")
        return self.rows


def _json_value(v) -> str:
    """One value as JSON: NaN (a missing figure) as null, numpy scalars as numbers."""
    if hasattr(v, "item") and not isinstance(v, str):
        v = v.item()
    if isinstance(v, float) and v != v:
        return "null"
    return json.dumps(v)


def _json_column(name: str, a: np.ndarray) -> list[str]:
    """A per-row column as JSON texts, as ``to_frame`` types it: the compute-bound flag as
    two words, a count column of whole numbers as integers, NaN as null."""
    if name == "bound" and a.dtype == bool:
        return np.where(a, '"compute"', '"memory"').tolist()
    if a.dtype == bool:
        return np.where(a, "true", "false").tolist()
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        ints = _exact_ints(a) if name in _INT_COLUMNS else None
        if ints is not None:
            return ints.astype(str).tolist()
        text = list(map(repr, a.tolist()))  # the shortest round-trip digits, as json.dumps
        for i in np.flatnonzero(nan).tolist():
            text[i] = "null"
        return text
    if a.dtype.kind in "iu":
        return a.astype(str).tolist()
    return [_json_value(v) for v in a.tolist()]


def write_json(chunks: Iterator[Chunk], out: TextIO) -> int:
    """Stream chunks to ``out`` as they are computed (``JsonArray``); returns the rows."""
    arr = JsonArray(out)
    for names, c in _named(chunks):
        arr.write(names, c)
    return arr.close()


def write_csv(chunks: Iterator[Chunk], path: str | Path, *, threads: int = 2,
              also=None) -> int:
    """Stream chunks to a CSV file as they are computed; returns the rows written.

    Byte and FLOP counts are written as exact integers, other per-row figures with float32's
    7 significant digits (formatting 17-digit doubles would triple the file and the time).

    pyarrow's C++ writer formats slices of each chunk on ``threads`` threads into memory
    buffers, written to the file in order; the header is written once and each slice appended
    with its own column types (a column can be a per-group constant in one group and per-row in
    another). Falls back to pandas when pyarrow is missing. ``also(names, chunk)`` is called
    with each chunk as it is written (``JsonArray.write``: the same rows as JSON).
    """
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:
        named = list(_named(chunks))
        for names, c in named if also is not None else ():
            also(names, c)
        df = to_frame([c for _, c in named])
        df.to_csv(path, index=False)
        return len(df)
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    no_header = pacsv.WriteOptions(include_header=False)

    def fmt(table) -> bytes:
        buf = pa.BufferOutputStream()
        pacsv.write_csv(table, buf, write_options=no_header)
        return buf.getvalue()

    rows = 0
    with ThreadPoolExecutor(threads) as pool, open(path, "wb") as f:
        inflight: deque = deque()
        header_done = False
        for names, c in _named(chunks):
            if also is not None:
                also(names, c)
            table = _arrow_table(c, names)
            if not header_done:
                f.write((",".join(f'"{n}"' for n in names) + "\n").encode())
                header_done = True
            step = -(-table.num_rows // threads)
            for lo in range(0, table.num_rows, step):
                inflight.append(pool.submit(fmt, table.slice(lo, step)))
            rows += table.num_rows
            while len(inflight) > 2 * threads:
                f.write(inflight.popleft().result())
        while inflight:
            f.write(inflight.popleft().result())
    return rows
