"""The command line's resume: which config and which run dir a resumed run continues with."""

from __future__ import annotations

import shutil

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
