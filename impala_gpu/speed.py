"""The fast paths, each one switch: bf16 autocast, ``torch.compile``, and tcmalloc.

Every one is measured in ``benchmarks/`` and tested against the plain path in
``tests/test_speed.py``. None changes what is computed beyond bf16 rounding.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

PRECISIONS = ("fp32", "bf16")
TCMALLOC_ENV = "IMPALA_GPU_TCMALLOC"  # "0" turns the re-exec off; a path picks the library
_TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
_TCMALLOC_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
)


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {PRECISIONS}.")


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` (CPU or CUDA) for precision="bf16"; nothing for "fp32".

    Only forward passes go inside it: matmuls and convolutions run in bf16, weights, gradients
    and optimizer state stay fp32, and the loss is computed from fp32 casts of the outputs.
    """
    check_precision(precision)
    if precision == "fp32":
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)


def compile_model(model: torch.nn.Module, enabled: bool) -> torch.nn.Module:
    """``torch.compile`` the model's forward in place (``nn.Module.compile``), so parameter
    names, ``state_dict`` keys and checkpoints stay those of the plain model. The first updates
    are slow while it compiles (seconds on CPU)."""
    if enabled:
        model.compile(dynamic=False)
    return model


def default_learner_threads(device_type: str, precision: str, cores: int, num_actors: int) -> int:
    """torch threads for the learner when ``learner_threads=0``.

    A CUDA learner only launches kernels: 2. A CPU learner shares the cores with the actors,
    and on a small box it is the bottleneck. fp32 kernels scale with threads, so an fp32
    learner gets every core; bf16 kernels scale poorly, so a bf16 learner leaves the actors
    their cores. The measurements behind both: docs/performance.md (``learner_threads=0``).
    """
    if device_type == "cuda":
        return 2
    if precision == "bf16":
        return max(1, cores - num_actors)
    return cores


def learner_threads(
    device_type: str, precision: str, cores: int, num_actors: int, fixed: int = 0, ranks: int = 1
) -> int:
    """The torch threads of each learner rank: ``fixed`` (the config's ``learner_threads``) or,
    for 0, ``default_learner_threads``, divided among ``ranks`` data-parallel learners (at
    least 1 each). The one rule: the learner, its other ranks and ``auto``'s timings all take
    their threads from here."""
    threads = fixed or default_learner_threads(device_type, precision, cores, num_actors)
    return max(1, threads // ranks)


def find_tcmalloc() -> str | None:
    """Path of a tcmalloc shared library on this machine, or None (Debian/Ubuntu:
    ``apt-get install libtcmalloc-minimal4``)."""
    override = os.environ.get(TCMALLOC_ENV, "")
    if override and override not in ("0", "1") and Path(override).is_file():
        return override
    for d in _TCMALLOC_DIRS:
        for name in _TCMALLOC_NAMES:
            if Path(d, name).is_file():
                return str(Path(d, name))
    return None


def tcmalloc_active() -> bool:
    return "tcmalloc" in os.environ.get("LD_PRELOAD", "")


def reexec_with_tcmalloc(
    argv: list[str] | None = None, execve: Callable[..., object] = os.execve
) -> None:
    """Restart this process with tcmalloc preloaded, when the library is present and not yet
    loaded. Actor processes inherit the environment, so they get it too.

    glibc's malloc returns the CPU learner's large, short-lived activation buffers to the
    kernel and page-faults them back in on every update; tcmalloc keeps them. Measured in
    ``benchmarks/README.md``. ``IMPALA_GPU_TCMALLOC=0`` turns this off.
    """
    if os.environ.get(TCMALLOC_ENV) == "0" or tcmalloc_active() or sys.platform != "linux":
        return
    lib = find_tcmalloc()
    if lib is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    argv = list(argv if argv is not None else getattr(sys, "orig_argv", [sys.executable]))
    sys.stdout.flush()
    sys.stderr.flush()
    execve(sys.executable, [sys.executable, *argv[1:]], env)


def allocator() -> str:
    """What this process allocates with, for the run's log: "tcmalloc" or "glibc"."""
    return "tcmalloc" if tcmalloc_active() else "glibc"
