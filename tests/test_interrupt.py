"""Ctrl-C and SIGTERM never hang, whatever the run is doing: a run stopped while calibrating
(``auto``), while handing out a large ring's slots, or while its actors start up is gone within
10 s, leaves no child process and no /dev/shm segment, and its last line claims a checkpoint
only if one was saved.

Before: a SIGINT while ``envs_per_actor`` was large hung for good in exit's join of the ring's
queue threads, after printing ``checkpoint saved`` though none existed."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from leakcheck import cli_command, kill_marked, leaked_shm, processes_with_marker, shm_entries

REPO = Path(__file__).resolve().parent.parent
GONE_WITHIN_S = 10.0


class Cli:
    """The CLI in a subprocess (this checkout's code), its stderr read line by line."""

    def __init__(self, tmp_path: Path, *overrides: str):
        self.run_dir = tmp_path / "run"
        self.marker = uuid.uuid4().hex
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "IMPALA_TEST_MARKER": self.marker,
            "IMPALA_GPU_CACHE_DIR": str(tmp_path / "cache"),  # auto measures afresh
        }
        self.proc = subprocess.Popen(
            cli_command(self.run_dir, *overrides),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # As in a terminal: a background test job would inherit SIGINT ignored.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, text: str, too_late: str = "", timeout: float = 180) -> None:
        """Read stderr up to a line with ``text``; fail on a ``too_late`` line first."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if too_late and any(too_late in line for line in self.lines):
                self.kill()
                pytest.fail(f"{too_late!r} came before {text!r}:\n{''.join(self.lines)}")
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {text!r} line within {timeout} s:\n{''.join(self.lines)}")
            if line is None:
                pytest.fail(f"exited before a {text!r} line:\n{''.join(self.lines)}")
            self.lines.append(line)

    def children(self) -> list[int]:
        return [p for p in processes_with_marker(self.marker) if p != self.proc.pid]

    def stop(self, sig: int) -> float:
        """Send ``sig``; seconds until the process is gone (the test fails past 10 s)."""
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=GONE_WITHIN_S)
        except subprocess.TimeoutExpired:
            kill_marked(self.proc, self.marker)
            pytest.fail(f"still running {GONE_WITHIN_S:g} s after {signal.Signals(sig).name}")
        return time.monotonic() - t0

    def output(self) -> str:
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return "".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            kill_marked(self.proc, self.marker)


def _assert_clean_end(cli: Cli, sig: int, shm_before: set[str]) -> str:
    err = cli.output()
    assert cli.proc.returncode == (143 if sig == signal.SIGTERM else 130), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    deadline = time.monotonic() + 5  # the resource tracker leaves once its pipe closes
    while cli.children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cli.children() == [], "a child process outlived the run"
    assert leaked_shm(shm_before) == set()
    last = err.strip().splitlines()[-1]
    checkpoints = sorted(cli.run_dir.glob("checkpoints/*.pt"))
    if "checkpoint saved" in last:  # only when it is true
        assert checkpoints and str(checkpoints[-1]) in last, last
    else:
        assert not checkpoints and "stopped before saving a checkpoint" in last, last
    return err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_calibrating_ends_the_run_at_once(tmp_path, sig):
    shm_before = shm_entries()
    cli = Cli(tmp_path, "experiment=cartpole_impala", "precision=auto", "log_interval_s=1000")
    try:
        cli.wait_for("impala_gpu: auto: measuring", too_late="impala_gpu: auto (")
        cli.stop(sig)
    finally:
        cli.kill()
    err = _assert_clean_end(cli, sig, shm_before)
    assert "auto (" not in err, "the signal came after the calibration: this tests nothing"
    assert "checkpoint saved" not in err
    assert not cli.run_dir.exists(), "a run stopped before it began leaves no run dir"


def _threads_writing_a_pipe(pid: int) -> int:
    """Threads of ``pid`` asleep in a pipe write (the kernel's wait channel): a queue's feeder
    thread whose pipe is full."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            n += "pipe" in (task / "wchan").read_text()
        except OSError:
            continue
    return n


@pytest.mark.slow
def test_a_signal_while_a_large_ring_is_handed_out_ends_the_run_at_once(tmp_path):
    """A ring of 16K slots (1024 envs per actor, the most one may step): seconds of start-up.
    The signal comes once the free queues' pipes are full, before any actor reads them: the
    state that hung (exit joined their feeder threads, blocked for good on the full pipes)."""
    shm_before = shm_entries()
    cli = Cli(
        tmp_path,
        "experiment=cartpole_impala",
        "precision=fp32",
        "envs_per_actor=1024",
        "num_slots=16384",
        "log_interval_s=1000",
    )
    try:
        cli.wait_for("impala_gpu: run dir", too_late="impala_gpu: learner on")
        deadline = time.monotonic() + 120
        while _threads_writing_a_pipe(cli.proc.pid) < 2:  # both actors' free queues are full
            assert cli.proc.poll() is None and time.monotonic() < deadline, "".join(cli.lines)
            time.sleep(0.1)
        cli.stop(signal.SIGINT)
    finally:
        cli.kill()
    err = _assert_clean_end(cli, signal.SIGINT, shm_before)
    assert "learner on" not in err, "the signal came after the start-up: this tests nothing"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_actors_start_up_ends_the_run_at_once(tmp_path, sig):
    shm_before = shm_entries()
    cli = Cli(tmp_path, "experiment=cartpole_impala", "precision=fp32", "log_interval_s=1000")
    try:
        cli.wait_for("impala_gpu: learner on")
        deadline = time.monotonic() + 10
        while len(cli.children()) < 2 and time.monotonic() < deadline:  # tracker + an actor
            time.sleep(0.05)
        cli.stop(sig)
    finally:
        cli.kill()
    _assert_clean_end(cli, sig, shm_before)
    assert not (cli.run_dir / "metrics.jsonl").read_text(), "stopped after training began"
