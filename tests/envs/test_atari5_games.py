"""The five Atari-5 games start, step and log from the default command, so a broken game id
(or an action set, FIRE or lives handling that crashes on one of them) fails CI.

Not a learning test: one batch of the default recipe per game, made small (4 envs x 64 steps =
256 agent steps, 1,024 frames: the recipe's own 16 envs cost 1.6x the CPU time), fp32 so no
calibration runs. The learning runs and their table are in docs/results/atari5.md.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from leakcheck import processes_with_marker

from impala_gpu.analysis.atari5 import ATARI5_ENV_IDS
from impala_gpu.calibration import cpu_model
from impala_gpu.envs import validate_env_id

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FRAMES = 1024  # one batch (4 trajectories of 64 steps): the least that makes a metrics line
SMALL = ["envs_per_actor=4", "unroll_length=64", "batch_size=4"]


def minimal_actions(env_id: str) -> int:
    """The game's own (minimal) action count, as ale-py reports it."""
    validate_env_id(env_id)  # registers ale-py's ids with gymnasium
    env = gym.make(env_id)
    try:
        return int(env.action_space.n)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ATARI5_ENV_IDS)
def test_the_default_command_starts_steps_and_logs(env_id: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    marker = uuid.uuid4().hex
    # What a user types (no ~experiment): the default recipe on this game, one small batch.
    cmd = [sys.executable, "-m", "impala_gpu", f"env.id={env_id}", f"total_frames={FRAMES}",
           "target_return=null", "wandb.mode=disabled", f"run_dir={run_dir}", "progress=false",
           "precision=fp32", "tensorboard=false", *SMALL]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "IMPALA_TEST_MARKER": marker}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert processes_with_marker(marker) == [], "a child process outlived the run"

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["env"]["id"] == env_id
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = lines[-1]
    assert last["frames"] >= FRAMES and last["agent_steps"] >= FRAMES // 4
    assert last["updates"] >= 1 and math.isfinite(last["total_loss"])
    # A fresh policy is near uniform, so its entropy is about ln(actions): this checks the
    # network has the game's own action count (a wrong action set would show here).
    n = minimal_actions(env_id)
    assert 0.5 * math.log(n) < last["entropy"] <= math.log(n) + 1e-4, (n, last["entropy"])
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    start = next(e for e in events if e.get("event") == "start")
    assert start["cpu_model"] == cpu_model()  # the report's CPU column reads it
