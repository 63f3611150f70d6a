#!/usr/bin/env bash
# Create .venv-sf (repo root) with Sample Factory 2.1.1 for benchmarks/peer.py. Idempotent.
# Kept apart from .venv: SF 2.1.1 needs gymnasium<1.0 and numpy<2, impala_gpu needs gymnasium>=1.0.
#
# Pins and why:
#   torch==2.13.0      first, alone, so pip never resolves SF's "torch<3" to a CUDA build; here the
#                      local wheel is 2.13.0+cpu (GPU users: set TORCH_SPEC, as in scripts/setup.sh)
#   gymnasium==0.29.1  the last release SF's "gymnasium<1.0" allows
#   ale-py==0.9.1      0.9 is the first series with the ROMs inside the wheel (0.9.1 checked here
#                      with gymnasium 0.29.1); gymnasium 0.29's own [atari,accept-rom-license]
#                      extras (shimmy + ale-py 0.8 + AutoROM) download the ROMs at install time,
#                      which fails offline. 0.9 has no gymnasium entry point: the envs are
#                      registered by `import ale_py` (done by peer.py's SF launcher).
#   numpy<2            SF 2.1.1 requires it
#   opencv-python<4.12 4.12+ requires numpy>=2
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${TORCH_SPEC:-torch==2.13.0}
[ -x .venv-sf/bin/python ] || "$PY" -m venv .venv-sf
.venv-sf/bin/python -m pip install -q --upgrade pip
.venv-sf/bin/python -m pip install -q "$TORCH"
.venv-sf/bin/python -m pip install -q "$TORCH" sample-factory==2.1.1 gymnasium==0.29.1 \
    ale-py==0.9.1 "numpy<2" "opencv-python<4.12"
.venv-sf/bin/python - <<'EOF'
from importlib.metadata import version

import ale_py, gymnasium as gym, torch
env = gym.make("PongNoFrameskip-v4")
env.reset(seed=0)
env.close()
print(f"sample-factory {version('sample-factory')}, torch {torch.__version__} "
      f"(cuda {torch.version.cuda}), gymnasium {gym.__version__}, ale-py {ale_py.__version__}: ok")
EOF
