"""A3C baseline: the rollout's data layout, the workers, and end-to-end Hogwild runs (the shared
optimizer itself: tests/learning/test_hogwild.py)."""

from __future__ import annotations

import copy
import json
import signal
import sys
import time
import uuid
from multiprocessing import resource_tracker
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from leakcheck import (
    kill_marked,
    leaked_shm,
    popen_marked,
    processes_with_marker,
    read_events,
    read_metrics,
    shm_entries,
    wait_for_log,
)
from omegaconf import OmegaConf

from impala_gpu.algos import a3c
from impala_gpu.cli import CONF_DIR
from impala_gpu.config import Config
from impala_gpu.envs import env_spec, make_vector_env
from impala_gpu.learning.hogwild import make_shared_optimizer
from impala_gpu.models import build_model

REPO = Path(CONF_DIR).parent

# Small CartPole runs: Adam with mean-reduced losses learns fast at this size.
CARTPOLE = (
    "~recipe",  # the schema's defaults, not the recipe env=cartpole brings
    "algo=a3c",
    "env=cartpole",
    "model=mlp",
    "model.hidden_size=128",
    "device=cpu",
    "precision=fp32",  # these tests drive the workers directly: no auto to resolve
    "num_actors=2",
    "envs_per_actor=4",
    "unroll_length=20",
    "algo.optimizer=adam",
    "algo.learning_rate=1e-3",
    "algo.lr_schedule=constant",
    "algo.reduction=mean",
    "wandb.mode=disabled",
    "progress=false",
)


def make_cfg(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=[*CARTPOLE, *overrides]))
    assert isinstance(cfg, Config)
    return cfg


@pytest.fixture
def no_leaks(monkeypatch):
    """Children spawned inside the test carry a marker in their environment; afterwards none
    may be alive and no /dev/shm entry may remain."""
    resource_tracker.ensure_running()  # long-lived by design: start it before the marker
    marker = uuid.uuid4().hex
    monkeypatch.setenv("IMPALA_TEST_MARKER", marker)
    before = shm_entries()
    yield
    assert processes_with_marker(marker) == [], "a worker process outlived the run"
    assert leaked_shm(before, in_process=True) == set(), "a /dev/shm segment outlived the run"


def initial_weights(cfg: Config) -> dict[str, torch.Tensor]:
    """The shared model's weights before training (train seeds torch with cfg.seed, then
    builds it)."""
    spec = env_spec(cfg.env)
    torch.manual_seed(cfg.seed)
    return build_model(spec.obs_shape, spec.num_actions, cfg.model).state_dict()


# -- in-process units -----------------------------------------------------------------------------


@pytest.mark.parametrize("use_lstm", [False, True])
def test_rollout_is_on_policy_and_carries_over(use_lstm):
    cfg = make_cfg("envs_per_actor=3", "unroll_length=8", f"model.use_lstm={use_lstm}")
    spec = env_spec(cfg.env)
    torch.manual_seed(0)
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    env = make_vector_env(cfg.env, cfg.envs_per_actor)
    try:
        rollout = a3c.Rollout(env, cfg, spec, seed=1)
        ends = []
        for i in range(12):  # ~100 steps: some CartPole episodes end in here
            prev_last = {k: getattr(rollout.batch, k)[-1].clone() for k in ("obs", "first")}
            batch, episodes = rollout.collect(model)
            ends += episodes
            # Each unroll's step 0 is the previous one's step T (T+1 observations per unroll).
            if i > 0:
                assert torch.equal(batch.obs[0], prev_last["obs"])
                assert torch.equal(batch.first[0], prev_last["first"])
            # first[t] follows the previous step's end flags (NEXT_STEP autoreset).
            ended = batch.terminated[:-1] | batch.truncated[:-1]
            assert torch.equal(batch.first[1:], ended)
            # On-policy: the recorded logits are what the model computes on the whole unroll
            # from the recorded core state (so impala_loss's rho is 1 everywhere). Step T is
            # the bootstrap observation, acted on at the next unroll's step 0.
            with torch.no_grad():
                out = model(batch.obs, batch.first, batch.core_state)
            torch.testing.assert_close(out.logits[:-1], batch.logits[:-1], rtol=1e-5, atol=1e-5)
            model.policy_head.weight.data.add_(0.01)  # new weights every unroll, as in A3C
    finally:
        env.close()
    assert ends and all(length > 0 and ret == length for ret, length in ends)


def test_cuda_and_a_foreign_checkpoint_are_rejected(monkeypatch, tmp_path):
    monkeypatch.setattr(a3c, "resolve_device", lambda _: torch.device("cuda"))
    with pytest.raises(ValueError, match="Hogwild on CPU.*device=cpu"):
        a3c.train(make_cfg("device=cuda"), tmp_path)
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match="no checkpoint in run dir"):
        a3c.train(make_cfg(f"resume={tmp_path}", "device=cpu"), tmp_path)
    impala_like = tmp_path / "checkpoints" / "ckpt_000000000100.pt"
    impala_like.parent.mkdir()
    torch.save({"model": {}, "version": 3, "frames": 100}, impala_like)
    with pytest.raises(ValueError, match="not an A3C checkpoint.*Fix:"):
        a3c.train(make_cfg(f"resume={tmp_path}", "device=cpu"), tmp_path)


# -- processes ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_workers_update_the_shared_optimizer_state(no_leaks):
    """Spawned workers step an optimizer created here: its statistics change in this process."""
    cfg = make_cfg("algo.optimizer=rmsprop", "envs_per_actor=2", "unroll_length=10")
    cfg.total_frames = 2000
    spec = env_spec(cfg.env)
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    model.share_memory()
    before = copy.deepcopy(model.state_dict())
    optimizer = make_shared_optimizer(model, cfg.algo)
    ctx = mp.get_context("spawn")
    h = a3c.WorkerHandles(
        counters=torch.zeros(2, a3c.NUM_WORKER_COUNTERS, dtype=torch.int64).share_memory_(),
        reports=ctx.Queue(),
        stop=ctx.Event(),
    )
    workers = [
        ctx.Process(target=a3c.worker_main, args=(i, cfg, spec, model, optimizer, h, i))
        for i in range(2)
    ]
    reports = []
    try:
        for p in workers:
            p.start()
        deadline = time.monotonic() + 60
        while not all(h.counters[:, a3c.WORKER_DONE]) and time.monotonic() < deadline:
            a3c._drain(h.reports, reports.append, timeout=0.1)
    finally:
        a3c.stop_workers(workers, h, reports.append)
        h.reports.close()
    assert all(p.exitcode == 0 for p in workers)
    updates = h.counters[:, a3c.WORKER_UPDATES]
    assert (updates > 0).all(), updates  # both workers stepped
    assert len(reports) == int(updates.sum())
    assert int(h.counters[:, a3c.WORKER_STEPS].sum()) >= cfg.total_frames
    for p in model.parameters():
        state = optimizer.state[p]
        # Hogwild: concurrent "step += 1" may (rarely) lose an increment, never invent one.
        assert 0 < state["step"].item() <= updates.sum()
        assert state["square_avg"].abs().sum() > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_cartpole_learns_with_two_workers(tmp_path, no_leaks):
    cfg = make_cfg("total_frames=60000", "log_interval_s=1")
    init = initial_weights(cfg)
    last = a3c.train(cfg, tmp_path)
    metrics = read_metrics(tmp_path)
    assert metrics[-1]["frames"] == last["frames"] and metrics[-1]["time"] == last["time"]
    assert last["frames"] >= 60_000 and last["frames"] == last["agent_steps"]
    # A random policy averages ~22 on CartPole-v1.
    assert last["episode_return"] > 60, [m["episode_return"] for m in metrics]
    missing = IMPALA_FIELDS - set(last)
    assert not missing, f"metrics.jsonl lacks {sorted(missing)}"
    assert metrics[-1]["learner_busy"] is None  # no central learner: null, not a made-up number
    assert last["clipped_rho_fraction"] == 0 and last["mean_rho"] == 1
    # Every worker contributed updates, and saw the others' updates land meanwhile.
    assert len(last["worker_updates"]) == 2 and min(last["worker_updates"]) > 0
    assert sum(last["worker_updates"]) == last["updates"]
    assert max(m.get("policy_lag_max") or 0 for m in metrics) > 0
    # Network health, as IMPALA logs it: logit spread on worker 0's rollouts (and dead units,
    # which this tanh MLP has none of), every layer's gradient norm from all workers' updates.
    learning = [m for m in metrics if m["updates"] > 0]  # the first lines: workers starting
    assert all("logit_spread" in m for m in learning[1:]), "health missing from lines"
    assert last["logit_spread"] > 0.05  # a policy that learned looks at its input
    assert {"grad_norm/fc1", "grad_norm/fc2", "grad_norm/policy", "grad_norm/value"} <= set(last)
    assert all(last[f"grad_norm/{k}"] > 0 for k in ("fc1", "policy", "value"))
    lag_hist = json.loads((tmp_path / "lag_hist.json").read_text())
    assert sum(lag_hist["counts"]) == last["updates"]  # one lag sample per update
    weights = torch.load(tmp_path / "model.pt")
    assert weights.keys() == init.keys()
    assert all(not torch.equal(weights[k], init[k]) for k in init)


def test_health_warnings_are_recorded_and_printed(tmp_path, no_leaks, capfd):
    # A bar no policy clears, judged from the first update: every run must warn, once.
    cfg = make_cfg(
        "total_frames=6000", "log_interval_s=0.5", "health.min_logit_spread=1e9",
        "health.warmup_updates=0",
    )  # fmt: skip
    a3c.train(cfg, tmp_path)
    warned = [e for e in read_events(tmp_path) if e["event"] == "health_warning"]
    assert len(warned) == 1 and "the policy barely depends on its input" in warned[0]["message"]
    assert warned[0]["frames"] > 0
    assert "impala_gpu: warning: the policy barely depends on its input" in capfd.readouterr().err


def test_a3c_run_ends_with_the_shared_summary_and_tensorboard(tmp_path, no_leaks, capfd):
    a3c.train(make_cfg("total_frames=4000", "log_interval_s=0.5"), tmp_path)
    err = capfd.readouterr().err
    assert f"impala_gpu: run dir {tmp_path}\n" in err
    summary = err[err.index("impala_gpu: run finished: ") :]
    assert f"weights: {tmp_path}/model.pt" in summary
    assert f"checkpoint: {tmp_path}/checkpoints/ckpt_" in summary
    assert f"TensorBoard: tensorboard --logdir {tmp_path}" in summary
    (events,) = tmp_path.glob("events.out.tfevents.*")
    assert events.stat().st_size > 0


IMPALA_FIELDS = {
    "frames",
    "agent_steps",
    "updates",
    "elapsed_s",
    "frames_per_s",
    "agent_steps_per_s",
    "updates_per_s",
    "actor_steps_per_s",
    "episode_return",
    "episode_length",
    "episodes",
    "total_loss",
    "pg_loss",
    "baseline_loss",
    "entropy_loss",
    "entropy",
    "grad_norm",
    "clipped_rho_fraction",
    "clipped_pg_rho_fraction",
    "mean_rho",
    "policy_lag_mean",
    "policy_lag_p95",
    "policy_lag_max",
    "learner_busy",
    "learner_wait",
    "learner_overhead",
    "lr",
    "time",
}


CTRL_C_SCRIPT = """
import sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from impala_gpu.algos import a3c
from impala_gpu.cli import CONF_DIR
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = OmegaConf.to_object(compose("config", overrides=sys.argv[2:]))
a3c.train(cfg, sys.argv[1])
"""


def logged_an_update(text: str) -> bool:
    """The logger creates metrics.jsonl before its first line: an empty file is not an update."""
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return any(m.get("updates", 0) > 0 for m in lines)


@pytest.mark.slow
def test_ctrl_c_stops_workers_and_keeps_weights(tmp_path):
    shm_before = shm_entries()
    cmd = [sys.executable, "-c", CTRL_C_SCRIPT, str(tmp_path), *CARTPOLE, "log_interval_s=0.5"]
    proc, marker = popen_marked(cmd, REPO)
    try:
        wait_for_log(
            proc,
            tmp_path / "metrics.jsonl",
            logged_an_update,
            120,  # spawning two workers that import torch takes tens of seconds on a busy box
            "training never logged an update",
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_marked(proc, marker)
    assert "KeyboardInterrupt" in err and "interrupted" in err, err[-3000:]
    assert (tmp_path / "model.pt").exists()
    summary = err[err.index("impala_gpu: run interrupted: ") :]  # after the checkpoint is saved
    assert f"weights: {tmp_path}/model.pt" in summary
    assert processes_with_marker(marker) == [], "a worker outlived Ctrl-C"
    assert leaked_shm(shm_before) == set()


@pytest.mark.slow
def test_diverging_run_stops_with_a_clear_error(tmp_path, no_leaks):
    # Adam's step is ~lr whatever the gradient: weights of 1e30 make the loss non-finite.
    cfg = make_cfg("algo.learning_rate=1e30", "max_nonfinite_updates=3", "total_frames=10_000_000")
    with pytest.raises(FloatingPointError, match="3 consecutive updates"):
        a3c.train(cfg, tmp_path)


@pytest.mark.slow
def test_a_resumed_run_continues_from_its_checkpoint(tmp_path, no_leaks):
    first = a3c.train(make_cfg("total_frames=20000", "log_interval_s=1"), tmp_path)
    (ckpt,) = list((tmp_path / "checkpoints").glob("ckpt_*.pt"))
    saved = torch.load(ckpt, weights_only=False)
    assert saved["agent_steps"] == first["agent_steps"] and saved["version"] == first["updates"]
    lines = read_metrics(tmp_path)
    assert saved["metrics_lines"] == len(lines)
    step_before = max(s["step"].item() for s in saved["optimizer"]["state"].values())

    last = a3c.train(make_cfg("total_frames=40000", f"resume={tmp_path}"), tmp_path)
    assert last["frames"] >= 40_000 and last["updates"] > first["updates"]
    metrics = read_metrics(tmp_path)
    assert metrics[: len(lines)] == lines  # the first run's lines are kept, then it goes on
    assert all(m["frames"] >= first["frames"] for m in metrics[len(lines) :])
    assert sum(last["worker_updates"]) == last["updates"] - first["updates"]
    # The clock goes on from the checkpoint's, so wall-clock curves of a resumed run join up.
    assert metrics[len(lines)]["elapsed_s"] > saved["elapsed_s"]
    assert last["elapsed_s"] > first["elapsed_s"]
    again = torch.load(sorted((tmp_path / "checkpoints").glob("ckpt_*.pt"))[-1], weights_only=False)
    # The shared optimizer's statistics went on from the saved ones, not from zero.
    assert max(s["step"].item() for s in again["optimizer"]["state"].values()) > step_before
    assert again["resumes"] == 1 and again["episodes"] > saved["episodes"]
