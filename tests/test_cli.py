"""The command line: which config and which run dir a resumed run continues with, and how
often a command checks its config."""

from __future__ import annotations

import dataclasses
import shutil
import sys

import pytest

from impala_gpu import cli
from impala_gpu.algos import registry
from impala_gpu.cli import resume_config
from impala_gpu.config import Config, to_container
from impala_gpu.reporting.checkpoint import Checkpointer, CheckpointPolicy


def _started_in(run_dir, **cfg_fields) -> None:
    """A run dir holding one checkpoint of a run started with ``run_dir=<run_dir>``."""
    cfg = Config(run_dir=str(run_dir), **cfg_fields)
    policy = CheckpointPolicy(every_frames=100, every_minutes=0, keep_last=2)
    Checkpointer(run_dir, policy).save({"config": to_container(cfg), "frames": 100}, 100, None)


def test_a_moved_run_dir_resumes_where_it_now_lies(tmp_path):
    old, new = tmp_path / "old", tmp_path / "moved"
    _started_in(old, total_frames=1000)
    shutil.move(old, new)
    cfg = resume_config(str(new), ["total_frames=2000"])
    assert cfg.run_dir == str(new)
    assert cfg.total_frames == 2000 and cfg.resume.startswith(str(new))
    assert not old.exists()


def test_an_explicit_run_dir_wins_over_the_checkpoints_own(tmp_path):
    _started_in(tmp_path / "run")
    elsewhere = str(tmp_path / "elsewhere")
    cfg = resume_config(str(tmp_path / "run"), [f"run_dir={elsewhere}"])
    assert cfg.run_dir == elsewhere


def test_one_command_checks_its_config_once(monkeypatch, tmp_path):
    """``validate_config`` runs once on a command's path: in the Hydra callback, before the run
    dir exists. The run takes that verdict, the check after ``auto`` looks only at what auto and
    the algorithm changed (A2C's derived batch here), and the train function checks nothing."""
    checked, trained = [], []
    validate = cli.validate_config

    def counted(cfg, **kw):
        checked.append(cfg)
        validate(cfg, **kw)

    monkeypatch.setattr(cli, "validate_config", counted)
    a2c = registry.ALGORITHMS["a2c"]

    def train(cfg, run_dir, sweep):
        trained.append(cfg)
        return {"episode_return": 1.0}

    monkeypatch.setitem(registry.ALGORITHMS, "a2c", dataclasses.replace(a2c, train=train))
    monkeypatch.setattr(cli.interrupts, "install", lambda: None)  # pytest keeps its Ctrl-C
    args = ["env=cartpole", "algo=a2c", "precision=fp32", "num_actors=2", "envs_per_actor=4"]
    args += [f"run_dir={tmp_path / 'run'}", "wandb.mode=disabled", "progress=false"]
    monkeypatch.setattr(sys, "argv", ["impala_gpu", *args])
    with pytest.raises(SystemExit) as end, pytest.warns(UserWarning, match="a2c updates"):
        cli.main()
    assert end.value.code == 0
    assert len(checked) == 1 and checked[0].batch_size != 8  # the config as given
    [cfg] = trained
    assert cfg.batch_size == 8 and cfg.bounded_lag == 0  # the config A2C runs
