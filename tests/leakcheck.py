"""Shared by the end-to-end tests: run the CLI, and check that no child process and no
/dev/shm segment outlives a run."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def shm_inodes_mapped_by(pids) -> set[int]:
    """Inodes of the /dev/shm files these processes map. (glibc's sem_open maps a temporary
    file and then links it under the semaphore's name, so only the inode identifies it.)"""
    dev = os.stat("/dev/shm").st_dev
    inodes = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) > 5 and fields[5].startswith("/dev/shm/"):
                        major, minor = (int(x, 16) for x in fields[3].split(":"))
                        if os.makedev(major, minor) == dev:
                            inodes.add(int(fields[4]))
        except OSError:
            continue
    return inodes


def leaked_shm(before: set[str], in_process: bool = False) -> set[str]:
    """Segments created since ``before`` that persist (multiprocessing's semaphores live in
    /dev/shm until their objects are collected, and for an instant while created).

    Other runs share this machine's /dev/shm: when the run was in this process, only what this
    process still maps is ours; otherwise skip what other live processes map."""
    gc.collect()
    new = shm_entries() - before
    if new:
        time.sleep(1.0)
        new &= shm_entries()
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    mapped = shm_inodes_mapped_by([os.getpid()] if in_process else pids)
    inode = {}
    for name in new:
        try:
            inode[name] = os.stat(f"/dev/shm/{name}").st_ino
        except OSError:  # unlinked meanwhile
            continue
    if in_process:
        return {n for n, i in inode.items() if i in mapped}
    return {n for n, i in inode.items() if i not in mapped}


def processes_with_marker(marker: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def kill_marked(proc: subprocess.Popen, marker: str) -> None:
    """SIGKILL ``proc`` and every process carrying ``marker``, then reap ``proc``. Killing the
    parent alone is not enough: an orphaned actor that is stopped (SIGSTOP) or wedged never
    notices its parent died, and it holds the stdout/stderr pipes open, so a plain
    ``communicate()`` would wait for EOF forever (a hung suite with idle spawned children)."""
    for pid in [proc.pid, *processes_with_marker(marker)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate(timeout=30)


def schema_defaults(overrides: tuple[str, ...] | list[str]) -> list[str]:
    """``~recipe`` unless ``overrides`` pick a preset or a recipe: a test states its whole
    config, on the schema's defaults, not on the recipe its env group brings (conf/recipe/)."""
    picks = any(o.lstrip("+~").startswith(("experiment", "recipe")) for o in overrides)
    return [] if picks else ["~recipe"]


def cli_command(run_dir: Path, *overrides: str, schema: bool = True) -> list[str]:
    """The CLI with W&B disabled unless an override sets wandb.mode (later overrides win); on
    the schema's defaults, or with ``schema=False`` on the default command's recipes."""
    base = [sys.executable, "-m", "impala_gpu", f"run_dir={run_dir}", "progress=false"]
    chosen = schema_defaults(overrides) if schema else []
    return [*base, *chosen, "wandb.mode=disabled", *overrides]


def popen_marked(cmd: list[str], cwd: Path) -> tuple[subprocess.Popen, str]:
    """Start ``cmd`` with a fresh IMPALA_TEST_MARKER in its environment (its children inherit
    it, so ``processes_with_marker`` finds them); stdout and stderr are piped as text."""
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**os.environ, "IMPALA_TEST_MARKER": marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    return proc, marker


def _default_sigint() -> None:
    """A job started in the background by a non-interactive shell (``nohup pytest &``, some CI
    runners) inherits SIGINT as ignored, and Python then installs no KeyboardInterrupt handler:
    the Ctrl-C tests would time out. The child gets SIGINT's default back, as in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_log(proc: subprocess.Popen, path: Path, ready, timeout: float, what: str) -> None:
    """Poll until ``path`` exists and ``ready(its text)``; fail with the process's stderr if it
    exits first, or with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and ready(path.read_text())):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def run_cli(
    run_dir: Path, *overrides: str, timeout: float = 240, schema: bool = True
) -> subprocess.CompletedProcess:
    """Run training (``cli_command``); afterwards assert no child process and no /dev/shm
    segment survives."""
    marker = uuid.uuid4().hex
    shm_before = shm_entries()
    proc = subprocess.run(
        cli_command(run_dir, *overrides, schema=schema),
        cwd=run_dir.parent,
        env={**os.environ, "IMPALA_TEST_MARKER": marker},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert processes_with_marker(marker) == [], "a child process outlived the run"
    leaked = leaked_shm(shm_before)
    assert leaked == set(), f"/dev/shm segments outlived the run: {leaked}"
    return proc


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert lines, "metrics.jsonl is empty"
    return [json.loads(line) for line in lines]


def read_events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def run_cartpole_and_check_it_learns(
    tmp_path: Path, *overrides: str, frames: int = 100_000
) -> Path:
    """A ``frames``-frame CartPole IMPALA run (fp32) with ``overrides``: it must end clean
    (``run_cli``) and get past random play (return > 22). Returns its run folder. At 60K
    frames two learners or two shards with normalised advantages ended at 21-44 on a quiet
    box, too near the bar; at 100K, 37-54."""
    run_dir = tmp_path / "run"
    run_cli(
        run_dir,
        "experiment=cartpole_impala",
        *overrides,
        "precision=fp32",
        f"total_frames={frames}",
        "log_interval_s=1",
    )
    metrics = read_metrics(run_dir)
    assert metrics[-1]["frames"] >= frames
    ret = metrics[-1]["episode_return"]
    assert ret > 22, f"no learning at all with {' '.join(overrides)}: return {ret}"
    return run_dir


def report_when_orphaned(path: str) -> None:
    """A child whose parent exits during its start-up: writes to ``path`` whether it noticed."""
    from impala_gpu.acting.rollout import parent_alive

    deadline = time.monotonic() + 60
    while parent_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    Path(path).write_text("still waiting" if parent_alive() else "noticed")
