"""A run dir belongs to one run: a second run into a dir in use, or into one holding a finished
or killed run, is refused in one line and changes nothing there; a resume writes into the run it
continues and makes no new dir; a killed run's dir is not locked forever.

Before: two runs started at once into one ``run_dir`` both trained, interleaving metrics.jsonl
and TensorBoard files; a later short run replaced ``best.pt``; every ``resume=`` left an empty
extra run dir under ``runs/``."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from leakcheck import cli_command, read_events, read_metrics

from impala_gpu.lifecycle.rundir import (
    RunDirInUse,
    RunDirTaken,
    _fresh_name,
    claim_run_dir,
    release_all,
)

REPO = Path(__file__).resolve().parents[2]
SHORT = ("experiment=cartpole_impala", "precision=fp32", "log_interval_s=0.5")


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),  # this checkout's code, from any cwd
        "IMPALA_GPU_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_MODE": "disabled",
    }


def _popen(tmp_path: Path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _train(tmp_path: Path, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_command(run_dir, *SHORT, *overrides),
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _snapshot(run_dir: Path) -> dict[str, str]:
    """Every file of the run (Hydra's log aside, which each command appends to) by digest."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != "cli.log"
    }


def _refusal(proc: subprocess.CompletedProcess | tuple[int, str]) -> str:
    """The one line a refused run prints: exit 1, no traceback."""
    code, err = (proc.returncode, proc.stderr) if not isinstance(proc, tuple) else proc
    assert code == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.slow
def test_two_runs_started_at_once_into_one_dir_one_trains_the_other_is_refused(tmp_path):
    run_dir = tmp_path / "shared"
    cmd = cli_command(run_dir, *SHORT, "total_frames=8000")
    procs = [_popen(tmp_path, cmd) for _ in range(2)]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    ok = [err for code, err in results if code == 0]
    refused = [(code, err) for code, err in results if code != 0]
    assert len(ok) == 1 and len(refused) == 1, results
    line = _refusal(refused[0])
    assert line.startswith(f"impala_gpu: RunDirInUse: run_dir={run_dir} is in use by another")
    assert "Fix: another run_dir=" in line
    # One run's files only: one start event, one TensorBoard file, frames counted once.
    assert [e["event"] for e in read_events(run_dir)].count("start") == 1
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    frames = [m["frames"] for m in read_metrics(run_dir)]
    assert frames == sorted(set(frames))


@pytest.mark.slow
def test_a_finished_run_is_never_overwritten_and_a_resume_makes_no_new_dir(tmp_path):
    run_dir = tmp_path / "first"
    first = _train(tmp_path, run_dir, "total_frames=6000")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (run_dir / "checkpoints" / "best.pt").is_file()
    before = _snapshot(run_dir)

    again = _train(tmp_path, run_dir, "total_frames=3000")  # the short run that replaced best.pt
    line = _refusal(again)
    assert f"run_dir={run_dir}: the dir already holds another run's files (metrics.jsonl" in line
    assert f"Fix: resume={run_dir} to continue that run, or another run_dir=." in line
    assert _snapshot(run_dir) == before, "a refused run changed the first run's files"

    resumed = subprocess.run(
        [sys.executable, "-m", "impala_gpu", f"resume={run_dir}", "total_frames=9000"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (tmp_path / "runs").exists(), "the resume made a run dir of its own"
    assert read_metrics(run_dir)[-1]["frames"] >= 9000
    # Hydra's files of the resume lie beside the first command's, which stay.
    first_overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "total_frames=6000" in first_overrides
    assert "resume=" in (run_dir / ".hydra" / "resume-1" / "overrides.yaml").read_text()


def _hold_lock(path: Path) -> subprocess.Popen:
    """Another process that holds ``path``'s claim until killed."""
    code = (
        "import sys, time; from impala_gpu.lifecycle.rundir import claim_run_dir; "
        "claim_run_dir(sys.argv[1]); print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_dir_in_use_is_refused_naming_its_holder_until_that_process_dies(tmp_path):
    run_dir = tmp_path / "run"
    holder = _hold_lock(run_dir)
    try:
        with pytest.raises(RunDirInUse, match=f"in use by another run \\(pid {holder.pid}\\)"):
            claim_run_dir(run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)  # a killed run: the kernel drops its lock
        holder.wait()
    claim_run_dir(run_dir).release()


def test_a_dir_holding_a_run_is_refused_unless_resumed_and_hydra_files_are_no_run(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "cli.log").write_text("")
    claim_run_dir(run_dir).release()  # Hydra's files of a run that never started: free
    (run_dir / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunDirTaken, match="holds no checkpoint to resume"):
        claim_run_dir(run_dir)
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "ckpt_000000001000.pt").write_bytes(b"")
    with pytest.raises(RunDirTaken, match=f"Fix: resume={run_dir} to continue"):
        claim_run_dir(run_dir)
    claim_run_dir(run_dir, resuming=run_dir).release()


def test_a_default_dir_in_use_gets_a_fresh_name(tmp_path):
    """Two runs started within the same second share the dated default name: the second
    writes next to it (a name the user did not choose, so nothing expects it there)."""
    taken = tmp_path / "12-00-00_impala_cartpole"
    holder = _hold_lock(taken)
    try:
        assert _fresh_name(taken) == tmp_path / "12-00-00_impala_cartpole_2"
    finally:
        holder.kill()
        holder.wait()
        release_all()


def test_a_claim_is_held_while_the_run_lasts_and_is_reentrant(tmp_path):
    run_dir = tmp_path / "run"
    claim = claim_run_dir(run_dir)
    try:
        assert claim_run_dir(run_dir) is claim  # the callback's claim, then run()'s
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from impala_gpu.lifecycle.rundir import claim_run_dir; "
                "claim_run_dir(sys.argv[1])",
                str(run_dir),
            ],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
        )
        assert probe.returncode != 0 and "RunDirInUse" in probe.stderr
    finally:
        claim.release()
    start = time.monotonic()
    claim_run_dir(run_dir).release()
    assert time.monotonic() - start < 1
