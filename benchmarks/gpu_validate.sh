#!/usr/bin/env bash
# The first GPU session, in one resumable script: calibrate the GPU, measure Llama-3.1-8B in
# bf16 (batch 1..256, contexts 512 / 2048 / 8192) and fp8, a 70B shape with --layers, the
# collectives across the local GPUs, the decode step operator by operator
# (benchmarks/gpu_kernels.py, into kernels/breakdown.jsonl), then print
# the measured figures against every engine profile's prediction.
#
#   bash benchmarks/gpu_validate.sh [OUT_DIR]            # on a CUDA box (torch already there)
#   DEVICE=cpu bash benchmarks/gpu_validate.sh /tmp/v    # the same steps, tiny, on a CPU
#
# A short lease: B8 / C8 (8B batches / contexts), FP8_B / FP8_C (the fp8 sweep; default the
# bf16 one), B70 / C70 / L70 (the 70B shape) and STEP_S override the sweep, e.g.
#   B8=1,8,32,128 FP8_C=512,2048 STEP_S=150 bash benchmarks/gpu_validate.sh "$OUT/gv"
#
# Install: the project goes in without touching the machine's torch. With network access,
# `pip install --no-deps -e .` and the dependencies pyproject.toml lists, torch left out; on
# a machine without it, wheels in .whl/ (the llmplan wheel and any missing dependency, e.g.
# pydantic) are installed into /tmp/site. Each measuring step runs under `timeout` (STEP_S,
# default 540 s, under a 10-minute command limit) with --resume: run the script again after
# a step was cut short and it carries on where it stopped. Everything lands in OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-results}/gpu-validate}"
DEVICE="${DEVICE:-cuda}"
STEP_S="${STEP_S:-540}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1

if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "gpu_validate: torch is not installed for $PY; install the build for this machine" >&2
    exit 2
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        .whl/*.whl || exit 2
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
elif ! "$PY" -c "import planner.cli.app, harness.cli" 2>/dev/null; then
    deps=$("$PY" - <<'EOF'
import re
text = open("pyproject.toml").read()
names = re.findall(r'"([A-Za-z0-9_.-]+[<>=!~][^"]*)"', text.split("[project.scripts]")[0])
print(" ".join(n for n in names if not n.startswith(("torch", "pytest", "hypothesis", "ruff"))))
EOF
)
    "$PY" -m pip install -q --no-deps -e . && "$PY" -m pip install -q $deps || exit 2
fi
LLMPLAN=("$PY" -m planner)
"${LLMPLAN[@]}" --version || exit 2
"${LLMPLAN[@]}" measure --help >/dev/null 2>&1 || {  # an entry point: the package must be installed
    echo "gpu_validate: 'llmplan measure' is not registered; put the llmplan wheel in .whl" \
        "(pip wheel --no-deps -w .whl .) or install the project" >&2; exit 2; }

if [ "$DEVICE" = cpu ]; then  # the smoke test of this script: same steps, tiny shapes
    M8=tiny-llama-test; B8=1,2,4; C8=32,64; M70=tiny-llama-test; L70=2; B70=1,2; C70=32
    # one fp8 point: a CPU without fp8 arithmetic emulates it, on some at ~50 MFLOP/s (a
    # 64-token prefill of the tiny model then takes half a minute)
    FP8_B=${FP8_B:-1}; FP8_C=${FP8_C:-32}
    CAL_FLAGS=(--quick-calibration); BUDGET=0.02; EXTRA=(--threads 1)
else
    M8=llama-3.1-8b; B8=${B8:-1,2,4,8,16,32,64,128,256}; C8=${C8:-512,2048,8192}
    M70=llama-3.1-70b; L70=${L70:-8}; B70=${B70:-1,8,32,128}; C70=${C70:-2048}
    CAL_FLAGS=(); BUDGET=0.3; EXTRA=()
fi
FP8_B=${FP8_B:-$B8}; FP8_C=${FP8_C:-$C8}
CAL="$OUT_DIR/calibration.yaml"

step() {  # name, then the llmplan arguments; a step cut short is resumed by a rerun
    local name=$1; shift
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout --signal=INT "$STEP_S" "${LLMPLAN[@]}" "$@"
    local rc=$?
    case $rc in
        0) ;;
        1) echo "   $name: no point measured (see the records' reasons)" ;;
        124|130) echo "   $name: stopped after ${STEP_S}s; run the script again to resume" ;;
        *) echo "   $name: exit $rc" ;;
    esac
    return 0
}

if [ ! -s "$CAL" ]; then
    step calibrate measure --calibrate --device "$DEVICE" "${CAL_FLAGS[@]}" \
        --calibration-out "$CAL" "${EXTRA[@]}"
fi
[ -s "$CAL" ] || { echo "gpu_validate: no calibration in $CAL" >&2; exit 2; }
step "$M8 bf16" measure --device "$DEVICE" -m "$M8" -b "$B8" -c "$C8" --weights bf16 \
    --calibration "$CAL" --out "$OUT_DIR/$M8-bf16.jsonl" --resume --budget-s "$BUDGET" \
    --prometheus "$OUT_DIR/$M8-bf16.prom" "${EXTRA[@]}"
step "$M8 fp8" measure --device "$DEVICE" -m "$M8" -b "$FP8_B" -c "$FP8_C" --weights fp8 \
    --calibration "$CAL" --out "$OUT_DIR/$M8-fp8.jsonl" --resume --budget-s "$BUDGET" \
    "${EXTRA[@]}"
step "$M70 x $L70 layers bf16" measure --device "$DEVICE" -m "$M70" --layers "$L70" \
    -b "$B70" -c "$C70" --weights bf16 --calibration "$CAL" \
    --out "$OUT_DIR/$M70-${L70}layers-bf16.jsonl" --resume --budget-s "$BUDGET" "${EXTRA[@]}"
step collectives measure --device "$DEVICE" --collectives --calibration "$CAL" \
    "${CAL_FLAGS[@]}"  # one GPU: recorded as skipped; gloo across 2 processes on a CPU

if [ ! -s "$OUT_DIR/kernels/breakdown.jsonl" ]; then  # where a decode step's time goes
    mkdir -p "$OUT_DIR/kernels"
    if [ "$DEVICE" = cpu ]; then KW=bf16; KB=1,2; KC=32; KP=32; else
        KW=${KERNEL_WEIGHTS:-bf16,fp8,int8,int4}; KB=1,64; KC=512; KP=512,2048; fi
    echo "== kernels ($(date -u +%H:%M:%S))"
    timeout --signal=INT "$STEP_S" "$PY" benchmarks/gpu_kernels.py --device "$DEVICE" -m "$M8" \
        --weights "$KW" -b "$KB" -c "$KC" --prefill "$KP" --calibration "$CAL" \
        --out "$OUT_DIR/kernels/breakdown.jsonl" || echo "   kernels: exit $?"
fi

echo "== measured vs every engine profile"
"$PY" benchmarks/measured_vs_engines.py "$OUT_DIR"/*.jsonl --csv "$OUT_DIR/engines.csv"
"${LLMPLAN[@]}" report -m "$M8" -g "$( [ "$DEVICE" = cpu ] && echo h100-sxm || \
    "$PY" -c "import sys,yaml; print(yaml.safe_load(open(sys.argv[1]))['device'])" "$CAL")" \
    --measured "$OUT_DIR/$M8-bf16.jsonl" --out "$OUT_DIR/report" >/dev/null || true
echo "results in $OUT_DIR"
