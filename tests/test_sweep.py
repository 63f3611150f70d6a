"""Hydra multirun sweeps: every point gets its own run dir, failures are reported, W&B runs
are grouped by sweep."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from leakcheck import schema_defaults

from impala_gpu.config import Config, EnvCfg, WandbCfg
from impala_gpu.reporting import logger as logger_mod
from impala_gpu.sweep import DONE_FILE, failed_points, finished_point, record_failure

REPO = Path(__file__).resolve().parent.parent

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
    """A point that passes the up-front check (``cli.CheckConfig``) but fails later is
    recorded and the sweep goes on: a2c raises batch_size to num_actors x envs_per_actor = 8,
    so its num_slots=12 is short (it needs 16) where impala's is exactly enough."""
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "impala_gpu",
            "-m",
            "algo=impala,a2c",
            "num_slots=0,12",
            *TINY,
            *schema_defaults(TINY),
            "envs_per_actor=4",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),  # this checkout, not an installed copy
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    points = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert len(points) == 4
    bad = [p for p in points if "a2c" in p.name and "num_slots=12" in p.name]
    for p in points:
        if p in bad:
            assert "num_slots=12" in (p / "error.txt").read_text()
            assert not (p / "config.yaml").exists()  # it failed before writing anything
        else:
            assert (p / "metrics.jsonl").read_text().strip() and (p / "config.yaml").exists()
            assert not (p / "error.txt").exists()
    assert len(bad) == 1 and "1 sweep point(s) failed" in proc.stderr
    assert "FAILED: ConfigError" in proc.stderr


def _sweep(sweep_dir: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "impala_gpu", "-m", *schema_defaults(args), *args, *TINY]
    return subprocess.run(
        [*cmd, f"hydra.sweep.dir={sweep_dir}"],
        cwd=sweep_dir.parent,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_rerunning_a_sweep_skips_finished_points_and_picks_up_unfinished_ones(tmp_path):
    sweep_dir = tmp_path / "sweep"
    first = _sweep(sweep_dir, "seed=0,1,2")
    assert first.returncode == 0, first.stderr[-3000:]
    done, resumable, restart = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert finished_point(done)["last"]["frames"] >= 2000
    kept = (done / "metrics.jsonl").read_text()
    # As if the session ended inside the last two points: one left a checkpoint, one did not.
    (resumable / DONE_FILE).unlink()
    (restart / DONE_FILE).unlink()
    shutil.rmtree(restart / "checkpoints")
    partial = (restart / "metrics.jsonl").read_text().splitlines()[0] + "\n"
    (restart / "metrics.jsonl").write_text(partial)

    second = _sweep(sweep_dir, "seed=0,1,2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"already finished in {done} ({DONE_FILE}); skipped" in second.stderr
    assert (done / "metrics.jsonl").read_text() == kept
    assert "did not finish; resuming it from its last checkpoint" in second.stderr
    assert "resumed from" in second.stdout + second.stderr
    assert finished_point(resumable) is not None
    assert "did not finish; starting again" in second.stderr
    assert (restart / "metrics.jsonl.interrupted").read_text() == partial
    assert finished_point(restart)["last"]["frames"] >= 2000


def test_failed_points_reads_error_files(tmp_path):
    try:
        raise ValueError("boom")
    except ValueError as e:
        record_failure(tmp_path / "3_algo=a3c", "algo=a3c", e)
    (tmp_path / "0_algo=impala").mkdir()
    assert failed_points(tmp_path) == [("3_algo=a3c", "ValueError: boom")]


def test_wandb_gets_name_group_and_job_type_from_the_sweep(tmp_path, monkeypatch):
    import wandb

    seen = {}

    class FakeRun:
        id, offline, url = "x", True, None

        def log(self, *a, **k): ...
        def define_metric(self, *a, **k): ...
        def finish(self): ...

    def fake_init(**kwargs):
        seen.update(kwargs)
        return FakeRun()

    monkeypatch.setattr(wandb, "init", fake_init)
    cfg = Config(env=EnvCfg(id="CartPole-v1"), seed=1, wandb=WandbCfg(mode="offline"))
    cfg.algo.name = "a2c"
    # cli._sweep_info's dict: the sweep dir's name is a time of day, its parent the date.
    sweep = {"group": "14-02-11", "name": "algo=a2c,seed=1", "date": "2026-12-03"}
    with logger_mod.MetricsLogger(tmp_path, cfg, sweep):
        pass
    assert seen["group"] == "a2c-cartpole-2026-12-03" and seen["job_type"] == "a2c"
    assert seen["name"] == "a2c-cartpole-s1-algo=a2c" and seen["mode"] == "offline"
    assert Path(seen["dir"]) == tmp_path and seen["reinit"] == "finish_previous"
