#!/usr/bin/env bash
# The one prepared script for a lent GPU (the device tool's `run`: cwd is the repo root, $OUT
# comes back). A GPU is lent rarely and for 15 minutes all told, start-up included, so the whole
# check fits in GPU_CHECK_BUDGET seconds (default 360) and a rerun fits too. Before it, here:
# `bash scripts/gpu_wheels.sh` (the wheels that machine's image lacks, into .whl/), then run
# with carry [".whl"]:
#
#   bash scripts/gpu_check.sh                                   # on the GPU
#   OUT=/tmp/g PY=.venv/bin/python bash scripts/gpu_check.sh --dry-run   # any CPU, < 2 minutes
#
# Stages, in order, each under its own timeout (cut to what the budget leaves once the later
# stages' floors are set aside), each run even when an earlier one failed:
#   1. preflight: .whl installed into /tmp/site; driver, torch, CUDA, device, /dev/shm -> env.txt
#   2. tests: the CUDA tests and any test file with a CUDA sync-debug test -> tests.log
#   3-6. cartpole, learner, ring, e2e: benchmarks/gpu.py --stages NAME -> gpu.log, gpu.json
# verdict.txt: one line per threshold (name, value, threshold, PASS/FAIL; gpu.py writes those
# of stages 1 and 3-6) and one per stage (exit code, seconds, limit); the last line is overall.
# Exit code: 0 only when no line FAILs (a crashed or timed-out stage FAILs its line).
# --dry-run: the CPU at tiny sizes (seconds a stage): the CUDA tests are collected and skip,
# CartPole passes when it ran and logged, speed thresholds are reported but not judged
# (DRY-RUN). It shows the script works before a GPU is there.
#
# Knobs: PY (python, default python3), SKIP_WHEELS=1, GPU_CHECK_BUDGET (seconds),
# GPU_CHECK_BENCH_ARGS (more gpu.py flags for stages 3-6, e.g. --actors 8).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
DRY=
case "${1:-}" in
    --dry-run) DRY=1 ;;
    "") ;;
    *) echo "usage: bash scripts/gpu_check.sh [--dry-run]" >&2 && exit 2 ;;
esac
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
rm -f "$OUT"/{verdict.txt,env.txt,tests.log,gpu.log,gpu.json}
PY=${PY:-python3}
BUDGET=${GPU_CHECK_BUDGET:-360}
export PYTHONUNBUFFERED=1
BENCH=(-m benchmarks.gpu --out "$OUT" --verdict "$OUT/verdict.txt")
# shellcheck disable=SC2206
BENCH+=(${DRY:+--dry-run} ${GPU_CHECK_BENCH_ARGS:-})
FAILED=0

# verdict NAME VALUE THRESHOLD RESULT: a line in gpu.py's columns (benchmarks/gpu.py verdict_line)
verdict() {
    printf '%-34s %14s %16s  %s\n' "$@" | tee -a "$OUT/verdict.txt"
    [ "$4" = FAIL ] && FAILED=1
    return 0
}

# Seconds kept for the stages after each one: a hung stage cannot starve the later ones.
declare -A FLOOR_AFTER=([preflight]=185 [tests]=145 [cartpole]=105 [learner]=80 [ring]=60 [e2e]=0)

# run_stage NAME CAP LOG CMD...: CMD under `timeout` (its whole process group: the CLI's actors
# and the feeders too) for CAP seconds or what the budget leaves (less the 5 s that a TERM'd
# stage may take to die); output appended to $OUT/LOG.
run_stage() {
    local name=$1 limit=$2 log=$3 left t0 rc
    shift 3
    left=$((BUDGET - SECONDS - ${FLOOR_AFTER[$name]} - 5))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        verdict "stage.$name" "skipped" "budget ${BUDGET}s" FAIL
        return
    fi
    t0=$SECONDS
    echo "=== $name (limit ${limit}s)" >>"$OUT/$log"
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$OUT/$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        verdict "stage.$name" "timeout" "${limit}s" FAIL
    else
        verdict "stage.$name" "rc=$rc $((SECONDS - t0))s" "rc 0 in ${limit}s" \
            "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)"
    fi
}

echo "# gpu_check $([ -n "$DRY" ] && echo 'DRY RUN (cpu, tiny sizes; speed not judged)' ||
    echo 'on the GPU') $(date -u +%FT%TZ) git $(git rev-parse --short HEAD 2>/dev/null)" \
    >"$OUT/verdict.txt"

# --- 1. preflight ------------------------------------------------------------------------------
# The wheels are for CPython 3.12 (the GPU image's python3): another python skips them, and a
# dry run needs none.
[ -n "$DRY" ] && SKIP_WHEELS=${SKIP_WHEELS:-1}
if [ -z "${SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null &&
    "$PY" -c "import sys; sys.exit(sys.version_info[:2] == (3, 12))"; then
    echo "gpu_check: $PY is not CPython 3.12: .whl/ not installed (SKIP_WHEELS=1 to silence)"
    SKIP_WHEELS=1
fi
if [ -z "${SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
    if ! timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl; then
        echo "gpu_check: pip install of .whl failed; unzipping the wheels into /tmp/site instead"
        timeout 60 "$PY" -c "import glob, zipfile
for w in glob.glob('.whl/*.whl'):
    zipfile.ZipFile(w).extractall('/tmp/site')" || verdict preflight.wheels unzip ok FAIL
    fi
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
{
    echo "uname: $(uname -a)"
    echo "nproc: $(nproc)"
    lscpu 2>/dev/null | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)"
    free -g 2>/dev/null
    df -h /dev/shm /tmp 2>/dev/null
    if command -v nvidia-smi >/dev/null; then
        timeout 30 nvidia-smi
        timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
            --format=csv
    else
        echo "nvidia-smi: not found"
    fi
    echo "PY=$PY PYTHONPATH=$PYTHONPATH"
    timeout 60 "$PY" - <<'EOF'
import importlib.metadata as md, sys
import torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "cudnn", torch.backends.cudnn.version())
for name in ("numpy", "gymnasium", "ale-py", "hydra-core", "omegaconf", "pytest"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
import ale_py, gymnasium, hydra, omegaconf  # noqa: F401,E401
import impala_gpu.cli  # noqa: F401
print("imports ok")
EOF
} >"$OUT/env.txt" 2>&1
if grep -q "imports ok" "$OUT/env.txt"; then
    verdict preflight.imports ok "all import" PASS
else
    verdict preflight.imports "see env.txt" "all import" FAIL
fi
run_stage preflight 45 env.txt "$PY" "${BENCH[@]}" --stages preflight

# --- 2. the CUDA tests -------------------------------------------------------------------------
mapfile -t SYNC_TESTS < <(grep -rl --include='test_*.py' set_sync_debug_mode tests | sort)
TESTS=(tests/learning/test_cuda.py tests/speed tests/rl/test_vtrace.py "${SYNC_TESTS[@]}")
mapfile -t TESTS < <(printf '%s\n' "${TESTS[@]}" | awk 'NF && !seen[$0]++')
PYTEST=("$PY" -m pytest -p no:cacheprovider -rs --durations=8 -o addopts=)
# A dry run: only the CUDA-marked tests, which skip without a GPU; the rest are collected.
[ -n "$DRY" ] && PYTEST+=(-m cuda -q) || PYTEST+=(-v)
run_stage tests 100 tests.log "${PYTEST[@]}" "${TESTS[@]}"
# On the GPU a skipped CUDA test is one that did not run: no verdict from it.
SKIPPED=$(grep -E "^SKIPPED \[[0-9]+\] tests/learning/test_cuda.py" "$OUT/tests.log" |
    sed -E 's/^SKIPPED \[([0-9]+)\].*/\1/' | awk '{n += $1} END {print n + 0}')
verdict tests.cuda_skipped "$SKIPPED" "== 0" "$([ -n "$DRY" ] && echo DRY-RUN ||
    { [ "$SKIPPED" -eq 0 ] && echo PASS || echo FAIL; })"

# --- 3-6. benchmarks/gpu.py, a stage per process -----------------------------------------------
run_stage cartpole 95 gpu.log "$PY" "${BENCH[@]}" --stages cartpole
run_stage learner 50 gpu.log "$PY" "${BENCH[@]}" --stages learner
run_stage ring 45 gpu.log "$PY" "${BENCH[@]}" --stages ring
run_stage e2e 130 gpu.log "$PY" "${BENCH[@]}" --stages e2e

grep -q " FAIL$" "$OUT/verdict.txt" && FAILED=1
N=$(grep -c " FAIL$" "$OUT/verdict.txt")
verdict overall "failed=$N" "none in ${BUDGET}s" "$([ "$FAILED" = 0 ] && echo PASS || echo FAIL)"
echo "gpu_check: done in ${SECONDS}s -> $OUT/verdict.txt"
exit "$FAILED"
