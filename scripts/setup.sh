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
.venv/bin/python -m pip install -q -e ".[dev]"
