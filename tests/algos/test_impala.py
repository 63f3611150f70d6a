"""End to end through the real async path: ``python -m impala_gpu`` in a subprocess."""

from __future__ import annotations

import itertools
import json
import math
import signal
from pathlib import Path

import pytest
import torch
from leakcheck import (
    cli_command,
    kill_marked,
    leaked_shm,
    popen_marked,
    processes_with_marker,
    read_events,
    read_metrics,
    run_cli,
    shm_entries,
    wait_for_log,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


REQUIRED_FIELDS = {
    "frames",
    "agent_steps",
    "updates",
    "frames_per_s",
    "agent_steps_per_s",
    "updates_per_s",
    "learner_busy",
    "learner_wait",
    "learner_overhead",
    "actor_steps_per_s",
    "actor_idle",
    "ring_occupancy",
    "episode_return",
    "episode_length",
    "total_loss",
    "pg_loss",
    "baseline_loss",
    "entropy_loss",
    "entropy",
    "grad_norm",
    "clipped_rho_fraction",
    "clipped_pg_rho_fraction",
    "policy_lag_mean",
    "policy_lag_p95",
    "policy_lag_max",
    "dropped_stale",
    "lr",
}


def test_cartpole_learns_with_two_actors(tmp_path):
    run_dir = tmp_path / "cartpole"
    run_cli(run_dir, "experiment=cartpole_impala", "total_frames=200000", "log_interval_s=2")
    metrics = read_metrics(run_dir)
    last = metrics[-1]
    assert last["frames"] >= 200_000
    # A random policy averages ~22 on CartPole-v1.
    assert last["episode_return"] > 75, [m["episode_return"] for m in metrics]
    assert (run_dir / "config.yaml").exists() and (run_dir / "model.pt").exists()
    for m in metrics:
        total = m["learner_busy"] + m["learner_wait"] + m["learner_overhead"]
        assert total == pytest.approx(1.0, abs=1e-6)
    assert max(m["policy_lag_max"] for m in metrics) > 0, "async actors should show some lag"
    events = read_events(run_dir)
    hints = [e for e in events if e["event"] == "tuning_hint"]
    assert len(hints) == 1 and hints[0]["bound"] in ("actors", "learner", "balanced")


def test_target_return_stops_the_run_early(tmp_path):
    run_dir = tmp_path / "cartpole"
    run_cli(
        run_dir,
        "experiment=cartpole_impala",
        "total_frames=5000000",
        "target_return=40",
        "log_interval_s=1",
    )
    last = read_metrics(run_dir)[-1]
    assert last["frames"] < 5_000_000
    assert last["episode_return"] >= 40 and last["episodes"] >= 100
    assert (run_dir / "model.pt").exists()
    assert list((run_dir / "checkpoints").glob("*.pt")), "the end of a solved run is saved"


def test_pong_smoke_writes_every_metric(tmp_path):
    run_dir = tmp_path / "pong"
    # 5 updates x 8 trajectories x 20 steps = 800 agent steps (3200 frames) of Pong.
    run_cli(
        run_dir,
        "env=pong",
        "num_actors=2",
        "envs_per_actor=4",
        "batch_size=8",
        "unroll_length=20",
        "total_frames=3200",
        "log_interval_s=0.5",
    )
    metrics = read_metrics(run_dir)
    assert metrics[-1]["frames"] == 3200 and metrics[-1]["agent_steps"] == 800
    missing = REQUIRED_FIELDS - set(metrics[-1])
    assert not missing, f"metrics.jsonl lacks {sorted(missing)}"
    assert metrics[-1]["entropy"] > 0.5  # near-uniform over 6 actions at the start


def test_the_default_recipe_runs_end_to_end_on_pong(tmp_path):
    # experiment=pong_impala (what the bare command trains), shrunk: 4 updates of 4 x 16 steps,
    # each used for 4 epochs of 2 minibatches, with ELU, input normalisation and the
    # first-visit anchor, through real actors and the bounded-lag ring.
    run_dir = tmp_path / "recipe"
    run_cli(
        run_dir,
        "experiment=pong_impala",
        "precision=fp32",
        "envs_per_actor=4",
        "batch_size=4",
        "unroll_length=16",
        "algo.minibatches=2",
        "total_frames=1024",
        "log_interval_s=0.5",
    )
    metrics = read_metrics(run_dir)
    assert metrics[-1]["frames"] == 1024 and metrics[-1]["updates"] == 4
    assert 0.5 < metrics[-1]["entropy"] <= math.log(6) + 1e-6
    saved = (run_dir / "config.yaml").read_text()
    assert "activation: elu" in saved and "ppo_reference: first_visit" in saved


# CartPole, 2 actors x 4 envs, B=8 (two whole unrolls per batch), T=10: 80 frames per update.
BOUNDED_CARTPOLE = (
    "env=cartpole",
    # auto re-measures on a busy box (nothing noisy is cached), so two runs could pick two
    # precisions: reproducibility is a property of one fixed setup.
    "precision=fp32",
    "model=mlp",
    "num_actors=2",
    "envs_per_actor=4",
    "batch_size=8",
    "unroll_length=10",
)


def test_bounded_lag_one_is_reproducible(tmp_path):
    args = (
        *BOUNDED_CARTPOLE,
        "total_frames=8000",
        "bounded_lag=1",
        "seed=3",
        "learner_threads=1",
    )
    weights = []
    for name in ("a", "b"):
        run_dir = tmp_path / name
        run_cli(run_dir, *args)
        weights.append(torch.load(run_dir / "model.pt"))
        lags = [m["policy_lag_max"] for m in read_metrics(run_dir)]
        assert max(lags) == 1
    assert weights[0].keys() == weights[1].keys()
    for k in weights[0]:
        assert torch.equal(weights[0][k], weights[1][k]), k


def test_ctrl_c_stops_cleanly_and_keeps_weights(tmp_path):
    run_dir = tmp_path / "interrupted"
    shm_before = shm_entries()
    cmd = cli_command(run_dir, "experiment=cartpole_impala", "log_interval_s=0.5")
    proc, marker = popen_marked(cmd, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    try:
        wait_for_log(proc, metrics, lambda t: t.count("\n") >= 2, 120, "training never logged")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_marked(proc, marker)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err
    assert (run_dir / "model.pt").exists()
    summary = err[err.index("impala_gpu: run interrupted: ") :]  # after the checkpoint is saved
    assert f"checkpoint: {run_dir}/checkpoints/ckpt_" in summary
    assert f"weights: {run_dir}/model.pt" in summary
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert len(lines) >= 2 and lines[-1]["frames"] < 1_000_000
    assert processes_with_marker(marker) == [], "a child process outlived Ctrl-C"
    assert leaked_shm(shm_before) == set()


def test_a_run_is_framed_and_logged_to_wandb_offline_and_tensorboard(tmp_path):
    run_dir = tmp_path / "wb"
    overrides = ("experiment=cartpole_impala", "total_frames=4000", "wandb.mode=offline")
    err = run_cli(run_dir, *overrides, "progress=true", "log_interval_s=0.5").stderr
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
    # Framing: where the run is, progress with elapsed time and ETA, then what it reached.
    assert f"impala_gpu: run dir {run_dir}\n" in err
    assert "ETA " in err and " to 4K frames" in err
    summary = err[err.index("impala_gpu: run finished: ") :]
    assert "mean return (last 100 episodes): final " in summary
    assert f"checkpoint: {run_dir}/checkpoints/ckpt_" in summary
    assert f"weights: {run_dir}/model.pt" in summary
    assert f"W&B (offline): wandb sync {runs[0]}" in summary
    assert f"TensorBoard: tensorboard --logdir {run_dir}" in summary
    (events,) = run_dir.glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("charts/episode_return", "losses/pg_loss", "health/grad_norm", "perf/learner_busy"):
        assert tag in tags, sorted(tags)
    last = read_metrics(run_dir)[-1]
    assert acc.Scalars("charts/frames_per_s")[-1].step == last["frames"]  # x-axis: frames


def test_bounded_lag_32_gives_every_sample_lag_32_after_warm_up(tmp_path):
    run_dir = tmp_path / "lag32"
    run_cli(
        run_dir,
        *BOUNDED_CARTPOLE,
        "total_frames=16000",  # 200 updates: the first 32 act with version 0 (lag < 32)
        "bounded_lag=32",
        "log_interval_s=0.3",
    )
    metrics = read_metrics(run_dir)
    assert max(m["policy_lag_max"] for m in metrics) == 32
    # A window covers the updates after the previous line's: once past update 32, all lag 32.
    late = [cur for prev, cur in itertools.pairwise(metrics) if prev["updates"] >= 33]
    assert late, "no window after the warm-up"
    for m in late:
        assert m["policy_lag_mean"] == 32 and m["policy_lag_max"] == 32, m["updates"]
