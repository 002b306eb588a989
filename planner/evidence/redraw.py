"""The lengths a benchmark client sent for a run whose file gives only totals: drawn again
from the client's seed, or taken from a run of the same requests whose file lists them.

SGLang's ``bench_serving`` writes each request's lengths only with ``--output-details``; an
older result line (0.4) gives the totals alone. Its random dataset draws them with numpy's
global generator, seeded from ``--seed`` (default 1) at the start of each invocation: the
prompt lengths first, then the output lengths, each uniform on [ratio x nominal, nominal]
(the prompt's low end at least 1). From
https://github.com/sgl-project/sglang/blob/v0.4.0/python/sglang/bench_serving.py
(``sample_random_requests``; ``run_benchmark`` seeds ``np.random``). Later releases draw both
through one ``compute_random_lens`` (python/sglang/benchmark/datasets/common.py), whose low
end is at least 1 for the outputs too (``output_floor``). The same seed, count and nominal
lengths give the same lengths, so a redraw is checked against the totals the file reports:
the earlier release's draw is tried first, then the later one's, and a run neither matches
is refused.

vLLM's ``benchmark_serving`` samples ShareGPT with its ``--seed`` (default 0), so two runs
with the same dataset file, tokenizer, seed and prompt count send the same prompts; a summary
file without ``input_lens`` takes them from such a twin whose file keeps them. The same
count and totals are checked; the same order is assumed. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import replace

from planner.core.errors import LlmplanError
from planner.evidence.runs import RandomLengths, ServedRun

# The least output length each SGLang client release draws: 0 before its datasets were split
# out (bench_serving.py's own draw), 1 after (compute_random_lens), in the order tried.
OUTPUT_FLOORS = (0, 1)


def sglang_random_lengths(seed: int, n: int, spec: RandomLengths, output_floor: int = 0
                          ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The prompt and output lengths of ``n`` requests SGLang's random dataset draws with
    ``seed``; ``output_floor``: the release's least output length (``OUTPUT_FLOORS``)."""
    import numpy as np

    rng = np.random.RandomState(seed)  # the legacy generator np.random.seed() resets
    low = max(int(spec.input_len * spec.range_ratio), 1)
    inputs = rng.randint(low, spec.input_len + 1, size=n)
    out_low = max(int(spec.output_len * spec.range_ratio), output_floor)
    outputs = rng.randint(out_low, spec.output_len + 1, size=n)
    return tuple(int(x) for x in inputs), tuple(int(x) for x in outputs)


def _stated_totals(run: ServedRun) -> tuple[int, int]:
    """The prompt and output tokens the run's file reports in all (its means x completed)."""
    return (round(run.mean_input_tokens * run.completed),
            round(run.mean_output_tokens * run.completed))


def _with_lengths(run: ServedRun, inputs: tuple[int, ...], outputs: tuple[int, ...],
                  note: str) -> ServedRun | None:
    """``run`` replayed with these per-request lengths, or None where they are not its
    requests': one pair for each request sent and completed, adding up to its totals."""
    n = run.num_prompts or run.completed
    if not (len(inputs) == len(outputs) == n == run.completed) or \
            (sum(inputs), sum(outputs)) != _stated_totals(run):
        return None
    return replace(run, input_lens=inputs, output_lens=outputs, notes=run.notes + (note,))


def _sums(inputs: tuple[int, ...], outputs: tuple[int, ...]) -> str:
    return (f"{len(inputs):,} requests add up to {sum(inputs):,} prompt / {sum(outputs):,} "
            "output tokens")


def _stated(run: ServedRun) -> str:
    total_in, total_out = _stated_totals(run)
    return (f"{total_in:,} / {total_out:,} for {run.num_prompts or run.completed:,} sent, "
            f"{run.completed:,} completed")


def redrawn(run: ServedRun, seed: int, where: str) -> ServedRun:
    """``run`` with each request's lengths drawn again from the client's ``seed``, where its
    file lists none and SGLang's random dataset is named (by the file, or for a printed
    block by its manifest's traffic); else as it is. The draw must add up to the totals the
    file reports."""
    spec = run.random_lengths  # set for SGLang's clients only (formats, Traffic.apply)
    if run.input_lens or spec is None:
        return run
    n = run.num_prompts or run.completed
    for floor in OUTPUT_FLOORS:
        inputs, outputs = sglang_random_lengths(seed, n, spec, floor)
        out = _with_lengths(run, inputs, outputs, f"lengths: each request's, drawn again "
                            f"from the client's seed {seed} (they add up to the file's totals)")
        if out is not None:
            return out
    inputs, outputs = sglang_random_lengths(seed, n, spec)
    raise LlmplanError(f"{where}: lengths drawn again with seed {seed} for "
                       f"{_sums(inputs, outputs)}, where the file says {_stated(run)}: "
                       "another seed or client release")


def redrawn_all(runs: list[ServedRun], seed: int, where: str) -> tuple[list[ServedRun], int]:
    """``runs``, each as ``redrawn`` gives it (``where``: what the seed came from), and how
    many of them were drawn again."""
    out = [redrawn(r, seed, f"{where}: {r.source}") for r in runs]
    return out, sum(a is not b for a, b in zip(runs, out, strict=True))


def copied_lengths(run: ServedRun, twin: list[ServedRun], name: str, where: str) -> ServedRun:
    """``run`` with each request's lengths taken from ``twin``, the runs of file ``name``: a
    run of the same requests (the same dataset file, seed and prompt count) whose file lists
    them. ``twin`` must hold one run with one length per request, and those lengths must
    add up to the totals ``run``'s file reports; a run that lists its own is left as it is."""
    if run.input_lens:
        return run
    if len(twin) != 1 or not twin[0].input_lens or not twin[0].output_lens:
        raise LlmplanError(f"{where}: {name} must hold one run that lists each request's "
                           "input_lens and output_lens")
    inputs, outputs = twin[0].input_lens, twin[0].output_lens
    if len(inputs) != len(outputs):
        raise LlmplanError(f"{where}: {name} lists {len(inputs):,} input_lens and "
                           f"{len(outputs):,} output_lens; give a file with one of each per "
                           "request")
    out = _with_lengths(run, inputs, outputs, f"lengths: each request's, from {name}, a run "
                        "of the same requests (they add up to this file's totals)")
    if out is None:
        raise LlmplanError(f"{where}: {name}'s {_sums(inputs, outputs)}, where this file "
                           f"says {_stated(run)}: not the same requests")
    return out


def copied_all(runs: list[ServedRun], twin: list[ServedRun], name: str,
               where: str) -> tuple[list[ServedRun], int]:
    """``runs``, each as ``copied_lengths`` gives it from ``twin`` (the runs of file
    ``name``; ``where``: what named the file), and how many of them took its lengths."""
    out = [copied_lengths(r, twin, name, f"{where}: {r.source}") for r in runs]
    return out, sum(a is not b for a, b in zip(runs, out, strict=True))

