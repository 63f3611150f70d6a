#!/usr/bin/env bash
# Create .venv and install impala_gpu with its dev extra. Idempotent; safe to rerun.
# torch goes in first, pinned, so pip never resolves "torch>=2.3" to a multi-GB build by itself.
# GPU users: TORCH_SPEC="torch==2.13.0" from PyPI is a CUDA build on Linux; set it as you need.
#   bash scripts/setup.sh             the venv, then the optional tcmalloc (below)
#   bash scripts/setup.sh --only-apt  the tcmalloc step alone (the venv must exist)
set -euo pipefail
cd "$(dirname "$0")/.."

# tcmalloc: the CLI preloads it when present (impala_gpu/speed/tcmalloc.py); 1.17x end to end on
# a CPU learner here. Best effort: installed only as root with apt-get; IMPALA_GPU_NO_APT=1 skips it.
install_tcmalloc() {
    local pkg=libtcmalloc-minimal4 limit=${IMPALA_GPU_APT_TIMEOUT_S:-180} log rc
    if .venv/bin/python -c "import sys; from impala_gpu.speed.tcmalloc import find_tcmalloc; sys.exit(find_tcmalloc() is None)"; then
        return 0
    fi
    local why=""
    if [ -n "${IMPALA_GPU_NO_APT:-}" ]; then
        why="IMPALA_GPU_NO_APT is set"
    elif ! command -v apt-get >/dev/null; then
        why="no apt-get here; install gperftools' tcmalloc with this system's package manager"
    elif [ "$(id -u)" != 0 ]; then
        why="not root; as root: apt-get install $pkg"
    fi
    if [ -n "$why" ]; then
        echo "setup.sh: optional speed-up tcmalloc not installed ($why)" >&2
        return 0
    fi
    log=$(mktemp)
    # timeout runs apt-get in a process group of its own, in the background of a terminal: had
    # apt or dpkg touched the terminal (stdin), the kernel would stop it (state T) until the
    # timeout, though the install itself takes seconds. So: no terminal input, no prompts, no pty.
    rc=0
    DEBIAN_FRONTEND=noninteractive timeout "$limit" apt-get install -y -q \
        -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "$pkg" </dev/null >"$log" 2>&1 || rc=$?
    case $rc in
        0) echo "setup.sh: installed $pkg (tcmalloc: the CLI preloads it)" >&2 ;;
        124) echo "setup.sh: apt-get install $pkg timed out after ${limit} s (optional; skipped)" >&2 ;;
        *)
            local last
            last=$(tail -n 1 "$log")
            echo "setup.sh: apt-get install $pkg failed (exit $rc; optional, skipped): ${last:-no output}" >&2
            ;;
    esac
    rm -f "$log"
}

if [ "${1:-}" = "--only-apt" ]; then
    install_tcmalloc
    exit 0
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".[dev,box2d,minatar,ray]"
install_tcmalloc
