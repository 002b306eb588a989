"""Print the measured all-reduce tables that hardware_db's ``allreduce_measured`` blocks hold.

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic
    python benchmarks/aiconfigurator_allreduce.py /tmp/aic/aiconfigurator_core-0.12.0-*.whl

NVIDIA's aiconfigurator ships, for each GPU system and engine release, the latency of the
engine's own tensor-parallel all-reduce timed on that GPU (``custom_allreduce_perf.parquet``:
bf16, 2 / 4 / 8 GPUs of one server, messages of 128 to 512 Mi elements; vLLM and SGLang each
timed replayed from a CUDA graph and launched eagerly, TensorRT-LLM once). This script reads
those tables out of the ``aiconfigurator-core`` wheel and prints them as YAML in hardware_db's
units: message sizes in bytes (2 bytes an element), latencies in microseconds. It is how the
blocks were made; the YAML, not the wheel, is what llmplan reads (CI has no wheel).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.aiconfigurator_moe import leave, wheel_table  # noqa: E402
from benchmarks.gpu_kernels import OneLineParser  # noqa: E402

WHEEL = "aiconfigurator-core 0.12.0"
PYPI = "https://pypi.org/project/aiconfigurator-core/0.12.0/"
# llmplan GPU -> aiconfigurator system folder
SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-sxm-80gb": "a100_sxm",
           "l40s": "l40s", "b200": "b200_sxm"}
# llmplan engine family -> (aiconfigurator backend folder, release) per system
RELEASES = {
    # the B200 was first timed with vLLM 0.19
    "vllm": {"h100_sxm": "0.14.0", "h200_sxm": "0.14.0", "a100_sxm": "0.14.0", "l40s": "0.14.0",
             "b200_sxm": "0.19.0"},
    "sglang": {"h100_sxm": "0.5.14", "h200_sxm": "0.5.14", "a100_sxm": "0.5.10", "l40s": "0.5.14",
               "b200_sxm": "0.5.14"},
    "trtllm": {"h100_sxm": "1.2.0rc5", "h200_sxm": "1.2.0rc5", "a100_sxm": "1.0.0",
               "l40s": "1.0.0", "b200_sxm": "1.2.0rc5"},
}
NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
READ_ON = "2026-11-27"  # the wheel states no date of its own
NOTES = {
    "vllm": "vLLM's tensor_model_parallel_all_reduce in bf16 (its custom all-reduce kernel for "
            "small messages, NCCL or symmetric memory beyond), timed by NVIDIA aiconfigurator. "
            "graph_us: replayed inside a CUDA graph (decode steps); eager_us: launched from the "
            "host (prefill and mixed steps). Every vLLM profile uses it: the custom all-reduce "
            "has been vLLM's small-message path since 0.4, and the same source's 0.19 and 0.24 "
            "timings on H100 lie within 25% of 0.14's",
    "sglang": "SGLang's tensor-parallel all-reduce in bf16 (its custom all-reduce, NCCL beyond), "
              "timed by NVIDIA aiconfigurator. graph_us: replayed inside a CUDA graph (decode "
              "steps); eager_us: launched from the host (prefill steps). Every SGLang release "
              "the profile covers uses it",
    "trtllm": "TensorRT-LLM's AllReduce op in bf16 as it runs inside the engine, timed by NVIDIA "
              "aiconfigurator: one timing, graph or not. Every release the profile covers uses "
              "it (the earlier releases' AllReduce plugin is the same custom all-reduce)",
}


def table(whl: zipfile.ZipFile, system: str, family: str):
    release = RELEASES[family][system]
    path = (f"aiconfigurator_core/systems/data/{system}/comm/{family}/{release}/"
            "custom_allreduce_perf.parquet")
    d = wheel_table(whl, path)
    d = d[(d.op_name == "all_reduce") & (d.allreduce_dtype == "bfloat16")]
    modes = {}
    for src, rows in d.groupby("kernel_source"):
        mode = "eager" if "eager" in src else "graph"
        modes[mode] = rows.pivot_table(index="message_size", columns="num_gpus",
                                       values="latency")
    return path, release, d.device.iloc[0], modes


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", help="the aiconfigurator-core wheel")
    ap.add_argument("--gpu", choices=sorted(SYSTEMS), action="append")
    a = ap.parse_args(argv)
    gpus = a.gpu or sorted(SYSTEMS)
    # every table read before anything is printed: a wheel that cannot be read is one line
    try:
        with zipfile.ZipFile(a.wheel) as whl:
            tables = {(gpu, family): table(whl, SYSTEMS[gpu], family)
                      for gpu in gpus for family in RELEASES}
    except (OSError, zipfile.BadZipFile, KeyError) as err:
        print(f"aiconfigurator_allreduce.py: {a.wheel}: cannot read it: {err}", file=sys.stderr)
        return 2
    for gpu in gpus:
        print(f"# {gpu}\nallreduce_measured:")
        for family in RELEASES:
            path, release, device, modes = tables[(gpu, family)]
            sizes = modes["graph"].index.tolist()
            print(f"  {family}:")
            print(f"    engine_version: {NAMES[family]} {release}")
            print(f"    device: {device}")
            print(f"    source: {PYPI}")
            print(f"    path: {path}")
            print(f"    date: '{READ_ON}'")
            print(f"    note: \"read {READ_ON} from {WHEEL}. {NOTES[family]}\"")
            print(f"    message_bytes: [{', '.join(str(2 * s) for s in sizes)}]")
            for mode in ("graph", "eager"):
                if mode not in modes:
                    continue
                print(f"    {mode}_us:")
                m = modes[mode]
                for n in m.columns:
                    us = [f"{v * 1e3:.1f}" for v in m[n].reindex(sizes)]
                    print(f"      {int(n)}: [{', '.join(us)}]")
    return 0


if __name__ == "__main__":
    leave(main)
