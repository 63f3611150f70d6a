"""Hydra multirun sweeps: every point gets its own run dir, failures are reported, W&B runs
are grouped by sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from impala_gpu.config import Config, EnvCfg, WandbCfg
from impala_gpu.reporting import logger as logger_mod
from impala_gpu.sweep import DONE_FILE, failed_points, finished_point, record_failure

TINY = [
    "env=cartpole",
    "model=mlp",
    "total_frames=2000",
    "num_actors=2",
    "envs_per_actor=2",
    "batch_size=4",
    "unroll_length=10",
    "wandb.mode=disabled",
    "progress=false",
]


@pytest.mark.slow
def test_sweep_runs_every_point_and_reports_the_failed_one(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "impala_gpu",
            "-m",
            "algo=impala,a2c",
            "num_slots=0,3",
            *TINY,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    points = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert len(points) == 4
    ok = [p for p in points if "num_slots=0" in p.name]
    bad = [p for p in points if "num_slots=3" in p.name]
    for p in ok:
        assert (p / "metrics.jsonl").read_text().strip() and (p / "config.yaml").exists()
        assert not (p / "error.txt").exists()
    # impala rejects num_slots=3 up front; a2c raises batch_size to 4 and needs 8 too.
    for p in bad:
        assert "num_slots=3" in (p / "error.txt").read_text()
    assert "2 sweep point(s) failed" in proc.stderr
    assert "FAILED: ConfigError" in proc.stderr


def _sweep(sweep_dir: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "impala_gpu", "-m", *args, *TINY]
    return subprocess.run(
        [*cmd, f"hydra.sweep.dir={sweep_dir}"],
        cwd=sweep_dir.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_rerunning_a_sweep_skips_finished_points_and_redoes_unfinished_ones(tmp_path):
    sweep_dir = tmp_path / "sweep"
    first = _sweep(sweep_dir, "seed=0,1")
    assert first.returncode == 0, first.stderr[-3000:]
    done, undone = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert finished_point(done)["last"]["frames"] >= 2000
    kept = (done / "metrics.jsonl").read_text()
    # As if the session ended inside the second point: no done.json, a partial metrics file.
    (undone / DONE_FILE).unlink()
    partial = (undone / "metrics.jsonl").read_text().splitlines()[0]
    (undone / "metrics.jsonl").write_text(partial + "\n")

    second = _sweep(sweep_dir, "seed=0,1")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"already finished in {done} ({DONE_FILE}); skipped" in second.stderr
    assert (done / "metrics.jsonl").read_text() == kept
    assert (undone / "metrics.jsonl.interrupted").read_text() == partial + "\n"
    redone = (undone / "metrics.jsonl").read_text().splitlines()
    assert len(redone) >= 1 and finished_point(undone) is not None


def test_failed_points_reads_error_files(tmp_path):
    try:
        raise ValueError("boom")
    except ValueError as e:
        record_failure(tmp_path / "3_algo=a3c", "algo=a3c", e)
    (tmp_path / "0_algo=impala").mkdir()
    assert failed_points(tmp_path) == [("3_algo=a3c", "ValueError: boom")]


def test_wandb_gets_group_and_job_type_from_the_sweep(tmp_path, monkeypatch):
    import wandb

    seen = {}

    class FakeRun:
        def log(self, *a, **k): ...
        def finish(self): ...

    def fake_init(**kwargs):
        seen.update(kwargs)
        return FakeRun()

    monkeypatch.setattr(wandb, "init", fake_init)
    cfg = Config(env=EnvCfg(id="CartPole-v1"), wandb=WandbCfg(mode="offline"))
    cfg.algo.name = "a2c"
    sweep = {"group": "14-02-11", "name": "algo=a2c,seed=1"}
    with logger_mod.MetricsLogger(tmp_path, cfg, sweep):
        pass
    assert seen["group"] == "14-02-11" and seen["job_type"] == "a2c"
    assert seen["name"] == "algo=a2c,seed=1" and seen["mode"] == "offline"
    assert Path(seen["dir"]) == tmp_path and seen["reinit"] == "finish_previous"
