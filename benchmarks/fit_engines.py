"""Fit engine-profile parameters to published rows, and show in-sample and held-out error.

    python benchmarks/fit_engines.py gpt-fast            # fit, print, change nothing
    python benchmarks/fit_engines.py gpt-fast --write    # also write values and fitted_on

Each engine's plan below names the parameters fitted and the rows they are fitted on; every
other row of the validation datasets stays held out, and `llmplan validate` reports the two
apart (a row is in-sample when a parameter's ``fitted_on`` names it). The split is by model or
by configuration family, never row by row at random, so a held-out row is a genuinely new
case: another model size, precision or parallelism than the fit saw.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.evidence.fit import fit  # noqa: E402
from planner.evidence.validate import compare, summarize  # noqa: E402
from planner.io import catalog  # noqa: E402

# engine -> (parameters, {source id: row-id regex of the fit rows})
PLANS: dict[str, tuple[list[str], dict[str, str]]] = {
    # Llama-2 rows (7B and 70B, bf16 / int8 / int4, TP 1-8) fit; Llama-3.1, Mixtral and the
    # blog's rows are held out.
    "gpt-fast": (["gemm_bandwidth_frac", "kernel_gap_us", "quantized.int8.bandwidth_frac",
                  "quantized.int4.bandwidth_frac", "allreduce_latency_us"],
                 {"gpt-fast-readme": r"^llama-2-"}),
    # TensorRT-LLM 0.8 and 0.9 rows of Llama-2-7B (every GPU, fp8 and fp16, throughput and
    # TTFT) fit; the other models of those releases and every row of 0.5 and 0.6.1 are held
    # out.
    "trtllm-engine": (["overlap_frac", "gemm_compute_frac", "attention_bandwidth_frac",
                "quantized.fp8.compute_frac", "prefill_step_overhead_us", "step_overhead_us"],
               {"trtllm-v0.8.0": r"-llama-2-7b-", "trtllm-v0.9.0": r"-llama-2-7b-"}),
    # vLLM 0.6.3 rows of Qwen2.5-7B and -32B (bf16, GPTQ int8 / int4, AWQ; prompts of 1 to
    # 129,024 tokens) fit; the 0.5B, 1.5B, 3B, 14B and 72B rows and vLLM's CI rows are held out.
    "vllm-v0": (["step_overhead_us", "kernel_gap_us", "gemm_bandwidth_frac",
              "attention_bandwidth_frac", "quantized.int8.bandwidth_frac",
              "quantized.int4.bandwidth_frac"],
             {"qwen2.5-speed-benchmark": r"^vllm-(7b|32b)-"}),
    # transformers 4.46 rows of Qwen2.5-7B and -32B fit; the other sizes and the eager row of
    # the gpt-fast blog are held out.
    "hf-eager": (["host_launch_us", "step_overhead_us", "attention_bandwidth_frac",
                  "quantized.int8.bandwidth_frac", "quantized.int4.bandwidth_frac"],
                 {"qwen2.5-speed-benchmark": r"^hf-(7b|32b)-"}),
}


def _select(datasets, rows: dict[str, str]):
    out = []
    for ds in datasets:
        pat = rows.get(ds.source.id)
        if pat is None:
            continue
        keep = [r for r in ds.rows if re.search(pat, r.id)]
        if keep:
            out.append(ds.model_copy(update={"rows": keep}))
    return out


FITTED = "fitted by benchmarks/fit_engines.py to the rows in fitted_on; before the fit: "


def _mark_fitted(text: str) -> str:
    """Prefix the note of every fitted parameter (one with fitted_on) with how it was set."""
    out = []
    block_fitted = False
    for line in text.splitlines(keepends=True):
        if not line.startswith(" "):
            block_fitted = False
        if line.startswith("  fitted_on:"):
            block_fitted = True
        if block_fitted and line.startswith('  note: "') and FITTED not in line:
            line = line.replace('  note: "', '  note: "' + FITTED, 1)
        if "fitted_on: [" in line and '{value:' in line and FITTED not in line:
            line = line.replace('note: "', 'note: "' + FITTED, 1)
        out.append(line)
    return "".join(out)


def _write(path: Path, values: dict[str, float], rows: tuple[str, ...]) -> None:
    """Rewrite the ``value`` and ``fitted_on`` of each parameter in the YAML text, keeping
    its comments and layout, and say in each fitted note how it was set."""
    path.write_text(_mark_fitted(with_values(path, values, rows)))


def with_values(path: Path, values: dict[str, float], rows) -> str:
    """The YAML text of ``path`` with each parameter's ``value`` and ``fitted_on`` replaced
    (and its ``estimated: true`` dropped: a fitted value is no longer a guess)."""
    text = path.read_text()
    quoted = "[" + ", ".join(f'"{r}"' for r in rows) + "]"
    for name, v in values.items():
        parts = name.split(".")
        if parts[0] == "quantized":
            # flow style:   <path>: {value: X, ...}  inside quantized.<q>
            pat = re.compile(rf"(^  {parts[1]}:\n(?:    .*\n)*?    {parts[2]}: \{{)value: "
                             rf"[^,]+,(?: fitted_on: \[[^\]]*\],)?", re.M)
            text, n = pat.subn(rf"\g<1>value: {v:g}, fitted_on: {quoted},", text, count=1)
            # a fitted value is no longer a guess
            text = re.sub(rf"(^    {parts[2]}: \{{value: {re.escape(f'{v:g}')}, .*?), estimated: "
                          r"true", r"\1", text, count=1, flags=re.M)
        else:
            block = re.compile(rf"(^{name}:\n  value: )[^\n]+\n(  fitted_on: [^\n]*\n)?", re.M)
            text, n = block.subn(rf"\g<1>{v:g}\n  fitted_on: {quoted}\n", text, count=1)
            # a fitted value is no longer a guess
            text = re.sub(rf"(^{name}:\n(?:  (?!estimated:).*\n)*?)  estimated: true\n", r"\1",
                          text, count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"{path}: could not find parameter {name} to write")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=sorted(PLANS))
    ap.add_argument("--write", action="store_true", help="write the fitted values")
    args = ap.parse_args()
    params, rows = PLANS[args.engine]
    # the rows this engine predicts (its fit rows and its held-out rows)
    datasets = []
    for ds in catalog.load_datasets():
        mine = [r for r in ds.rows if (r.engine or ds.source.engine) == args.engine]
        if mine:
            datasets.append(ds.model_copy(update={"rows": mine}))
    spec = catalog.load_engine_spec(args.engine)
    names = {r.model for d in datasets for r in d.rows}, {r.gpu for d in datasets for r in d.rows}
    models = {m: catalog.load_model(m) for m in names[0]}
    gpus = {g: catalog.load_hardware(g) for g in names[1]}
    res = fit(spec, params, _select(datasets, rows), models=models, gpus=gpus)
    print(f"{args.engine}: {len(params)} parameters fitted on {len(res.rows)} rows "
          f"({res.n} figures); rms log error {res.before_rms_log_error:.3f} -> "
          f"{res.after_rms_log_error:.3f}")
    from planner.evidence.fit import bounds_of

    for p, v in res.values.items():
        lo, hi = bounds_of(p)
        at = " (AT ITS BOUND: compensating for something the model lacks)" \
            if v <= lo * 1.001 or v >= hi * 0.999 else ""
        print(f"  {p}: {v:g}{at}")
    comps = [c for ds in datasets
             for c in compare(ds, models=models, gpus=gpus, engines={args.engine: res.engine})]
    for s in summarize(comps, by_source=False):
        print(f"  {s.phase} {s.split}: n={s.n} median |error| {s.median_abs_error:.1%}, "
              f"p90 {s.p90_abs_error:.1%}")
    if args.write:
        path = ROOT / "engines_db" / f"{args.engine}.yaml"
        _write(path, res.values, res.rows)
        catalog.load_engine_spec(str(path))  # still valid
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
