#!/usr/bin/env bash
# Create .venv and install impala_gpu with its dev extra. Idempotent; safe to rerun.
# torch goes in first, pinned, so pip never resolves "torch>=2.3" to a multi-GB build by itself.
# GPU users: TORCH_SPEC="torch==2.13.0" from PyPI is a CUDA build on Linux; set it as you need.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".[dev,box2d,minatar,ray]"
# tcmalloc: the CLI preloads it when present (impala_gpu/speed.py); 1.17x end to end on a CPU
# learner here. Best effort: installed only as root with apt-get; IMPALA_GPU_NO_APT=1 skips it.
if ! .venv/bin/python -c "import sys; from impala_gpu.speed import find_tcmalloc; sys.exit(find_tcmalloc() is None)"; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ -z "${IMPALA_GPU_NO_APT:-}" ]; then
        timeout 180 apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 \
            || echo "setup.sh: could not apt-get install libtcmalloc-minimal4 (optional)" >&2
    else
        echo "setup.sh: optional speed-up: install tcmalloc (apt-get install libtcmalloc-minimal4)" >&2
    fi
fi
