#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (the device tool's `run`; cwd = the repo root,
# $OUT comes back). Before it, here: `bash scripts/gpu_wheels.sh` (wheels the image lacks,
# into .whl/), then run with carry [".whl"]:
#
#   bash scripts/gpu_check.sh
#
# Stages, each under its own timeout and all inside one overall budget (GPU_CHECK_BUDGET
# seconds, default 460: under 8 minutes), each run even when an earlier one failed:
#   1. install .whl/*.whl into /tmp/site; machine, driver, torch and CUDA facts -> env.txt
#   2. pytest tests/learning/test_cuda.py tests/test_speed.py tests/rl/test_vtrace.py -> tests.log
#   3. benchmarks/gpu.py, stage by stage (synthetic, ring, e2e) -> gpu.log, gpu.json
# summary.txt has one line per stage: exit code, seconds, limit. Exit code: 0 only when every
# stage passed.
#
# Here, on a CPU box (python3 here may lack torch; tests limited to tests/learning/test_cuda.py):
#   OUT=/tmp/gpucheck GPU_CHECK_DEVICE=cpu PY=.venv/bin/python bash scripts/gpu_check.sh
#
# Knobs: PY (python, default python3), GPU_CHECK_DEVICE (cuda | cpu; cpu implies --smoke),
# GPU_CHECK_SMOKE=1, SKIP_WHEELS=1, GPU_CHECK_TESTS (test files), GPU_CHECK_BENCH_ARGS (extra
# gpu.py flags), GPU_CHECK_BUDGET (seconds).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
PY=${PY:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
BUDGET=${GPU_CHECK_BUDGET:-460}
export PYTHONUNBUFFERED=1
if [ "$DEVICE" = cpu ]; then
    SMOKE=${GPU_CHECK_SMOKE:-1}
    TESTS=${GPU_CHECK_TESTS:-tests/learning/test_cuda.py}
else
    SMOKE=${GPU_CHECK_SMOKE:-}
    TESTS=${GPU_CHECK_TESTS:-tests/learning/test_cuda.py tests/test_speed.py tests/rl/test_vtrace.py}
fi
BENCH=(benchmarks/gpu.py --device "$DEVICE" --out "$OUT")
[ -n "$SMOKE" ] && BENCH+=(--smoke)
# shellcheck disable=SC2206
BENCH+=(${GPU_CHECK_BENCH_ARGS:-})
FAILED=0
: >"$OUT/summary.txt"

note() { echo "gpu_check: $*" | tee -a "$OUT/summary.txt"; }

# run_stage NAME LIMIT LOG CMD...: CMD under `timeout` (its whole process group, actors and
# feeders too), capped by what is left of the budget; output appended to $OUT/LOG.
run_stage() {
    local name=$1 limit=$2 log=$3 left t0 rc
    shift 3
    left=$((BUDGET - SECONDS - 5))
    if [ "$left" -lt 20 ]; then
        note "$name skipped: budget spent (${SECONDS}s of ${BUDGET}s)"
        FAILED=1
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    t0=$SECONDS
    echo "=== $name (limit ${limit}s)" >>"$OUT/$log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$OUT/$log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && name="$name TIMED OUT"
    note "$name rc=$rc $((SECONDS - t0))s (limit ${limit}s)"
    [ "$rc" -eq 0 ] || FAILED=1
}

# --- 1. wheels and the environment -----------------------------------------------------------
# The wheels are for CPython 3.12 (the image's python3): another python skips them.
if [ -z "${SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null &&
    "$PY" -c "import sys; sys.exit(sys.version_info[:2] == (3, 12))"; then
    note "$PY is not CPython 3.12: .whl/ not installed (SKIP_WHEELS=1 to silence)"
    SKIP_WHEELS=1
fi
if [ -z "${SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
    if ! timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl; then
        note "pip install of .whl failed; unzipping the wheels into /tmp/site instead"
        timeout 60 "$PY" -c "import glob, zipfile
for w in glob.glob('.whl/*.whl'):
    zipfile.ZipFile(w).extractall('/tmp/site')" || FAILED=1
    fi
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
{
    echo "date: $(date -u +%FT%TZ)  git: $(git rev-parse --short HEAD 2>/dev/null)"
    echo "uname: $(uname -a)"
    echo "nproc: $(nproc)"
    lscpu 2>/dev/null | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|Flags" |
        cut -c1-300
    free -g 2>/dev/null
    df -h /dev/shm /tmp 2>/dev/null
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
            --format=csv
    else
        echo "nvidia-smi: not found"
    fi
    echo "PY=$PY PYTHONPATH=$PYTHONPATH"
    timeout 90 "$PY" - <<'EOF'
import importlib.metadata as md, os, sys
import torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"cc {p.major}.{p.minor}", f"{p.total_memory / 2**30:.0f} GiB",
          f"{p.multi_processor_count} SMs")
    print("cudnn", torch.backends.cudnn.version(), "cudnn.allow_tf32",
          torch.backends.cudnn.allow_tf32, "matmul.allow_tf32",
          torch.backends.cuda.matmul.allow_tf32)
for name in ("numpy", "gymnasium", "ale-py", "hydra-core", "omegaconf", "antlr4-python3-runtime",
             "opencv-python-headless", "rich", "PyYAML", "wandb", "pytest"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
import ale_py, gymnasium, hydra, omegaconf  # noqa: F401,E401
import impala_gpu.cli  # noqa: F401
from impala_gpu.speed import find_tcmalloc
print("imports ok; tcmalloc:", find_tcmalloc(), "; cpu_count", os.cpu_count())
EOF
    echo "env python rc=$?"
} >"$OUT/env.txt" 2>&1
grep -q "imports ok" "$OUT/env.txt" || { note "environment check failed (see env.txt)"; FAILED=1; }
note "env $(grep -E '^(torch|device) ' "$OUT/env.txt" | tr '\n' ' ')"

# --- 2. tests --------------------------------------------------------------------------------
# shellcheck disable=SC2086
run_stage tests 140 tests.log "$PY" -m pytest -v -p no:cacheprovider --durations=8 $TESTS

# --- 3. the benchmark, a stage at a time (gpu.json is rewritten after every measurement) ----
run_stage "gpu synthetic" 60 gpu.log "$PY" "${BENCH[@]}" --stages synthetic
run_stage "gpu ring" 70 gpu.log "$PY" "${BENCH[@]}" --stages ring --append
run_stage "gpu e2e" 175 gpu.log "$PY" "${BENCH[@]}" --stages e2e --append

{
    tail -n 1 "$OUT/tests.log" 2>/dev/null
    grep -hE "^gpu (synthetic|ring|e2e) summary:" "$OUT/gpu.log" 2>/dev/null
} >>"$OUT/summary.txt"
note "done in ${SECONDS}s; $([ "$FAILED" = 0 ] && echo 'every stage passed' || echo 'SOME STAGE FAILED')"
exit "$FAILED"
