"""tcmalloc for the CLI's process and its actors: the command restarts itself with the library
preloaded when it is installed (``IMPALA_GPU_TCMALLOC=0`` turns that off, a path picks the
library), and the run's log says which allocator it ran with."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

TCMALLOC_ENV = "IMPALA_GPU_TCMALLOC"  # "0" turns the re-exec off; a path picks the library
_TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
_TCMALLOC_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
)


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
