#!/usr/bin/env bash
# Download, HERE (where PyPI is reachable), the Python 3.12 x86-64 wheels that the GPU machine's
# image lacks, into .whl/ in the repo root. scripts/gpu_check.sh installs them there with
# `pip install --no-index --target /tmp/site .whl/*.whl` (the repo itself travels as the
# working tree and goes on PYTHONPATH, so impala_gpu is not among them).
#
#   bash scripts/gpu_wheels.sh          # then run the device check with carry [".whl"]
#
# Versions are those of .venv (the ones the tests pass with here), read at run time.
# The image already has torch, numpy, rich, pyyaml, packaging, pytest, opencv-python-headless,
# pandas, matplotlib, cloudpickle, typing-extensions. wandb is not carried: impala_gpu imports
# it only when wandb.mode is not "disabled", and the benchmarks and tests disable it.
# antlr4-python3-runtime (hydra's parser) is published as an sdist only: it is pure Python, so
# a wheel is built here from it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_PY=${VENV_PY:-.venv/bin/python}
DEST=.whl
PACKAGES=(gymnasium ale-py hydra-core omegaconf antlr4-python3-runtime farama-notifications)

version_of() {
    "$VENV_PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"
}

mkdir -p "$DEST"
grep -qxF "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >>.git/info/exclude

for name in "${PACKAGES[@]}"; do
    version=$(version_of "$name")
    if "$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$DEST" "$name==$version" 2>/dev/null; then
        echo "gpu_wheels: $name==$version"
    else  # no wheel on PyPI: build one from the sdist (pure-Python packages only)
        "$VENV_PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$name==$version"
        echo "gpu_wheels: $name==$version (wheel built here from the sdist)"
    fi
done

# One version of each package: a stale second wheel would stop the whole install there.
"$VENV_PY" - "$DEST" <<'EOF'
import collections, pathlib, sys
names = collections.Counter(
    p.name.split("-")[0].lower().replace("_", "-") for p in pathlib.Path(sys.argv[1]).glob("*.whl")
)
dup = [n for n, c in names.items() if c > 1]
sys.exit(f"gpu_wheels: more than one wheel of {dup} in {sys.argv[1]}: remove the old ones" if dup else 0)
EOF
ls -l "$DEST"
du -sh "$DEST"
