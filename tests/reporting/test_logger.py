"""The metrics sinks: dashboard prefixes, W&B run names, TensorBoard event files."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from impala_gpu.config import Config, EnvCfg, WandbCfg
from impala_gpu.reporting.checkpoint import truncate_lines
from impala_gpu.reporting.logger import MetricsLogger, metric_group, run_names, short_env


@pytest.mark.parametrize(
    "key, name",
    [
        ("episode_return", "charts/episode_return"),
        ("episode_length", "charts/episode_length"),
        ("episodes", "charts/episodes"),
        ("frames_per_s", "charts/frames_per_s"),
        ("total_loss", "losses/total_loss"),
        ("pg_loss", "losses/pg_loss"),
        ("entropy", "losses/entropy"),
        ("kl_behavior_target", "losses/kl_behavior_target"),
        ("mean_rho", "losses/mean_rho"),
        ("clipped_pg_rho_fraction", "losses/clipped_pg_rho_fraction"),
        ("dead/torso.0", "health/dead/torso.0"),
        ("logit_spread", "health/logit_spread"),
        ("grad_norm", "health/grad_norm"),
        ("grad_norm/heads", "health/grad_norm/heads"),
        ("learner_busy", "perf/learner_busy"),
        ("actor_idle", "perf/actor_idle"),
        ("ring_occupancy", "perf/ring_occupancy"),
        ("policy_lag_p95", "perf/policy_lag_p95"),
        ("updates_per_s", "perf/updates_per_s"),
        ("approx_kl", "losses/approx_kl"),
        ("throughput", "perf/throughput"),  # "rho" inside a word is no rho statistic
        ("gpu_busy", "perf/gpu_busy"),
        ("frames", "frames"),  # the x-axis is no panel
    ],
)
def test_metric_group_puts_each_key_in_its_section(key, name):
    assert metric_group(key) == name


@pytest.mark.parametrize(
    "env_id, short",
    [
        ("ALE/Pong-v5", "pong"),
        ("CartPole-v1", "cartpole"),
        ("MinAtar/Breakout-v1", "minatar_breakout"),
        ("LunarLander-v3", "lunarlander"),
    ],
)
def test_short_env(env_id, short):
    assert short_env(env_id) == short


def _cfg(**wandb) -> Config:
    cfg = Config(env=EnvCfg(id="CartPole-v1"), seed=2, wandb=WandbCfg(**wandb))
    return dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, name="a3c"))


def test_run_names_single_run_without_experiment():
    names = run_names(_cfg(), {}, {"env": "cartpole"}, today="2026-12-04")
    assert (names.name, names.group, names.job_type) == ("a3c-cartpole-s2", None, "a3c")
    # No Hydra (a notebook): the env's short id stands in for its group choice.
    assert run_names(_cfg(), {}, {}, today="2026-12-04").name == "a3c-cartpole-s2"


def test_run_names_experiment_sweep_groups_by_the_sweep_date():
    sweep = {"group": "18-40-00", "name": "compare_cell=a3c,seed=2", "date": "2026-12-03"}
    choices = {"experiment": "compare_cartpole", "env": "cartpole"}
    names = run_names(_cfg(), sweep, choices, today="2026-12-04")
    assert names.name == "compare_cartpole-cartpole-s2-compare_cell=a3c"
    assert names.group == "compare_cartpole-2026-12-03"  # the day it started, not the time
    assert names.job_type == "a3c"


def test_run_names_sweep_without_experiment_and_explicit_overrides():
    sweep = {"name": "seed=2", "date": "2026-12-03"}
    names = run_names(_cfg(), sweep, {"env": "cartpole"}, today="2026-12-04")
    assert (names.name, names.group) == ("a3c-cartpole-s2", "a3c-cartpole-2026-12-03")
    mine = run_names(_cfg(group="g", job_type="j"), sweep, {}, today="2026-12-04")
    assert (mine.group, mine.job_type) == ("g", "j")


def _tb_tags(run_dir) -> list[str]:
    files = list(run_dir.glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    acc = EventAccumulator(str(files[0]))
    acc.Reload()
    return acc


def test_tensorboard_gets_prefixed_scalars_at_frames_and_jsonl_keeps_flat_keys(tmp_path):
    cfg = dataclasses.replace(_cfg(mode="disabled"), tensorboard=True)
    line = {
        "frames": 640,
        "episode_return": 21.5,
        "pg_loss": 0.3,
        "learner_busy": 0.9,
        "dead/torso.0": 0.1,
        "episode_length": float("nan"),
        "worker_updates": [1, 2],
        "ring_occupancy": np.int64(3),
    }
    with MetricsLogger(tmp_path, cfg) as logger:
        logger.log(line, {"policy_lag_hist": [0.0, 1.0, 1.0]})
        assert logger.pointers() == [f"TensorBoard: tensorboard --logdir {tmp_path}"]
    acc = _tb_tags(tmp_path)
    scalars = set(acc.Tags()["scalars"])
    assert {"charts/episode_return", "losses/pg_loss", "perf/learner_busy"} <= scalars
    assert "perf/ring_occupancy" in scalars
    assert "health/dead/torso.0" in scalars and "charts/episode_length" not in scalars  # NaN
    assert acc.Tags()["histograms"] == ["perf/policy_lag_hist"]
    (event,) = acc.Scalars("charts/episode_return")
    assert (event.step, event.value) == (640, 21.5)
    flat = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert flat["episode_return"] == 21.5 and "charts/episode_return" not in flat


def test_close_outlasts_a_lost_wakeup_of_tensorboards_writer_by_one_flush_at_most(
    tmp_path, monkeypatch
):
    """An interrupted run's close() once stalled past 60 s: TensorBoard's writer thread sleeps
    until its next flush and had missed the wake-up for the stop signal. Lose that wake-up on
    purpose: close() must still return within about one flush interval (not 120 s)."""
    from impala_gpu.reporting import logger as logger_module

    cfg = dataclasses.replace(_cfg(mode="disabled"), tensorboard=True)
    logger = MetricsLogger(tmp_path, cfg)
    logger.log({"frames": 640, "episode_return": 1.0}, {})
    byte_queue = logger.tb.file_writer.event_writer._async_writer._byte_queue
    time.sleep(0.5)  # the writer thread has flushed once and sleeps until the next flush
    monkeypatch.setattr(byte_queue.not_empty, "notify", lambda n=1: None)
    start = time.monotonic()
    logger.close()
    assert time.monotonic() - start < logger_module.TB_FLUSH_S + 5
    (event,) = _tb_tags(tmp_path).Scalars("charts/episode_return")
    assert event.step == 640  # and nothing written was lost


def test_tensorboard_off_writes_no_event_file(tmp_path):
    cfg = dataclasses.replace(_cfg(mode="disabled"), tensorboard=False)
    with MetricsLogger(tmp_path, cfg) as logger:
        logger.log({"frames": 1, "episode_return": 1.0})
        assert logger.pointers() == []
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_offline_wandb_points_at_its_sync_command(tmp_path, capfd):
    cfg = dataclasses.replace(_cfg(mode="offline"), tensorboard=False)
    with MetricsLogger(tmp_path, cfg) as logger:
        logger.log({"frames": 10, "episode_return": 1.0})
        (pointer,) = logger.pointers()
        assert logger.wandb_url is None
    offline = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert pointer == f"W&B (offline): wandb sync {offline[0]}"
    assert f"impala_gpu: run dir {tmp_path}" in capfd.readouterr().err


class _OnlineRun:
    """The part of a wandb Run the logger reads, for an online run (no network here)."""

    id, offline, url = "abc123", False, "https://wandb.ai/me/impala_gpu/runs/abc123"

    def __init__(self):
        self.logged: list[dict] = []

    def log(self, data):
        self.logged.append(data)

    def finish(self):
        pass


def test_online_wandb_prints_its_url_and_logs_prefixed_keys_with_frames(
    tmp_path, monkeypatch, capfd
):
    from impala_gpu.reporting import logger as logger_module

    run = _OnlineRun()
    monkeypatch.setattr(logger_module, "_init_wandb", lambda *a: run)
    cfg = dataclasses.replace(_cfg(mode="online"), tensorboard=False)
    with MetricsLogger(tmp_path, cfg) as logger:
        logger.log({"frames": 320, "episode_return": 9.0, "time": 1.7e9})
        assert logger.pointers() == [f"W&B: {run.url}"]
    assert run.logged == [{"frames": 320, "charts/episode_return": 9.0}]
    assert f"impala_gpu: W&B run {run.url}" in capfd.readouterr().err


def test_a_resumed_run_hides_the_first_attempts_points_past_its_checkpoint(tmp_path):
    cfg = dataclasses.replace(_cfg(mode="disabled"), tensorboard=True)
    with MetricsLogger(tmp_path, cfg) as logger:
        for frames in (100, 200, 300):
            logger.log({"frames": frames, "episode_return": 1.0})
    truncate_lines(tmp_path / "metrics.jsonl", 1)  # as a resume from the checkpoint at 100 does
    time.sleep(1.1)  # event file names carry the second they were opened in
    with MetricsLogger(tmp_path, cfg) as logger:
        logger.log({"frames": 200, "episode_return": 2.0})
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    points = [(e.step, e.value) for e in acc.Scalars("charts/episode_return")]
    assert points == [(100, 1.0), (200, 2.0)]
