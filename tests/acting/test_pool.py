"""Fault injection: actors killed (SIGKILL), crashed (SIGSEGV) or hung (SIGSTOP) mid-run are
detected, logged with their cause and replaced; slots are reclaimed; nothing leaks; a crash
loop stops the run with a clear error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

import pytest
from leakcheck import (
    cli_command,
    kill_marked,
    leaked_shm,
    popen_marked,
    processes_with_marker,
    shm_entries,
)

from impala_gpu.acting.children import actor_pids

pytestmark = pytest.mark.slow


def events(run_dir):
    path = run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def ready_actors(run_dir) -> set[int]:
    return {e["actor"] for e in events(run_dir) if e["event"] == "actor_ready"}


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def run_with_faults(tmp_path, inject, *overrides, expect_rc=0):
    """Start a CartPole run, call ``inject(proc, run_dir)`` once it trains, wait for the end,
    and check nothing leaked. Returns (run_dir, stderr)."""
    run_dir = tmp_path / "run"
    shm_before = shm_entries()
    cmd = cli_command(run_dir, "experiment=cartpole_impala", "log_interval_s=0.5", *overrides)
    proc, marker = popen_marked(cmd, tmp_path)
    try:
        # Every actor has sent an unroll, so a fault hits a working actor, not one still
        # starting up (those get STARTUP_GRACE_S: a SIGSTOP then would not count as a hang).
        wait_for(
            lambda: len(ready_actors(run_dir)) == 2 or proc.poll() is not None,
            120,
            "both actors' first unrolls",
        )
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        inject(proc, run_dir)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            kill_marked(proc, marker)
    assert proc.returncode == expect_rc, err[-3000:]
    assert processes_with_marker(marker) == [], "a child process outlived the run"
    assert leaked_shm(shm_before) == set()
    return run_dir, err


def kill_one(sig, wait_replaced=True):
    def inject(proc, run_dir):
        wait_for(lambda: actor_pids(proc.pid), 60, "a live actor to inject the fault into")
        victim = actor_pids(proc.pid)[0]
        os.kill(victim, sig)
        if wait_replaced:
            wait_for(
                lambda: any(e["event"] == "actor_replaced" for e in events(run_dir)),
                60,
                "the replacement",
            )
            wait_for(
                lambda: len(actor_pids(proc.pid)) == 2 and victim not in actor_pids(proc.pid),
                60,
                "two live actors again",
            )

    return inject


@pytest.mark.parametrize("sig,cause", [(signal.SIGKILL, "SIGKILL"), (signal.SIGSEGV, "SIGSEGV")])
def test_dead_actor_is_replaced_and_training_completes(tmp_path, sig, cause):
    run_dir, err = run_with_faults(tmp_path, kill_one(sig), "total_frames=150000")
    replaced = [e for e in events(run_dir) if e["event"] == "actor_replaced"]
    assert len(replaced) == 1 and cause in replaced[0]["cause"], (replaced, err[-4000:])
    assert replaced[0]["slots_reclaimed"] > 0
    logged = events(run_dir)
    after = logged[[e["event"] for e in logged].index("actor_replaced") :]
    assert any(e["event"] == "actor_ready" for e in after), "the replacement never ran"
    assert cause in err
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["frames"] >= 150_000 and metrics[-1]["actor_restarts"] == 1


def test_hung_actor_is_caught_by_the_heartbeat(tmp_path):
    run_dir, _ = run_with_faults(
        tmp_path, kill_one(signal.SIGSTOP), "total_frames=150000", "actor_timeout_s=3"
    )
    replaced = [e for e in events(run_dir) if e["event"] == "actor_replaced"]
    assert len(replaced) == 1 and "no heartbeat" in replaced[0]["cause"]


def test_crash_loop_stops_the_run_with_a_clear_error(tmp_path):
    def inject(proc, run_dir):
        for _ in range(2):
            wait_for(
                lambda: len(actor_pids(proc.pid)) == 2 or proc.poll() is not None,
                60,
                "two live actors",
            )
            if proc.poll() is not None:
                return
            os.kill(actor_pids(proc.pid)[0], signal.SIGKILL)
            time.sleep(1.0)

    _, err = run_with_faults(
        tmp_path, inject, "total_frames=2000000", "max_actor_restarts=1", expect_rc=1
    )
    assert "crash-looping" in err and "max_actor_restarts=1" in err


def test_learner_exception_tears_everything_down_and_keeps_a_checkpoint(tmp_path):
    run_dir = tmp_path / "nan"
    marker = uuid.uuid4().hex
    shm_before = shm_entries()
    # lr=1e30 blows the weights up within a few updates; every later update is non-finite.
    proc = subprocess.run(
        cli_command(
            run_dir,
            "experiment=cartpole_impala",
            "algo.learning_rate=1e30",
            "algo.optimizer=rmsprop",
            "algo.grad_norm_clip=0",
            "max_nonfinite_updates=3",
            "total_frames=2000000",
        ),
        cwd=tmp_path,
        env={**os.environ, "IMPALA_TEST_MARKER": marker},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "consecutive updates had a non-finite" in proc.stderr
    assert processes_with_marker(marker) == [] and leaked_shm(shm_before) == set()
    assert list((run_dir / "checkpoints").glob("ckpt_*.pt")), "the last good state was not saved"


def test_missing_resume_checkpoint_fails_before_starting(tmp_path):
    proc = subprocess.run(
        cli_command(tmp_path / "x", f"resume={tmp_path / 'nowhere'}"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "no such file" in proc.stderr and "Fix:" in proc.stderr


def test_an_exception_in_the_env_reaches_the_learner_as_the_cause():
    """The actor sends its traceback before dying, so the learner can log why."""
    import torch
    import torch.multiprocessing as mp

    from impala_gpu.acting.actor import NUM_ACTOR_COUNTERS, ActorHandles, actor_main
    from impala_gpu.channels.params import ParamStore
    from impala_gpu.channels.ring import RingSpec, TrajectoryRing
    from impala_gpu.config import Config, EnvCfg
    from impala_gpu.envs import env_spec

    ctx = mp.get_context("spawn")
    cfg = Config(env=EnvCfg(id="CartPole-v1", vector_backend="gymnasium"), num_actors=1)
    spec = env_spec(cfg.env)
    ring = TrajectoryRing(RingSpec(4, 3, spec.obs_shape, torch.float32, spec.num_actions), 1, ctx)
    handles = ActorHandles(
        ring=ring,
        params=ParamStore(8),
        messages=ctx.Queue(),
        counters=torch.zeros(1, NUM_ACTOR_COUNTERS, dtype=torch.int64),
        stop=ctx.Event(),
    )
    broken = Config(
        env=EnvCfg(id="CartPole-v1", vector_backend="ale"), num_actors=1, envs_per_actor=2
    )
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(ValueError, match="vector_backend=ale needs an Atari env"):
            actor_main(0, broken, spec, handles, seed=1)
    finally:
        signal.signal(signal.SIGINT, previous)
        ring.close()
    kind, actor, text = handles.messages.get(timeout=5)
    assert (kind, actor) == ("error", 0) and "vector_backend=ale" in text
