"""EnvStepper: the per-step fields the ring gets, and per-game returns under episodic life."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from leakcheck import popen_marked, processes_with_marker

from impala_gpu.acting.rollout import EnvStepper, parent_alive
from impala_gpu.config import Config, EnvCfg
from impala_gpu.envs import env_spec, make_vector_env

REPO = Path(__file__).resolve().parents[2]

BREAKOUT = "ALE/Breakout-v5"


class ScriptedEnv:
    """A one-env vector env that plays a fixed script of (reward, terminated, life_loss)."""

    def __init__(self, script):
        self.script, self.t = script, 0
        self.unwrapped = self

    def reset(self, seed=None, options=None):
        return np.zeros((1, 2), dtype=np.float32), {}

    def step(self, actions):
        reward, term, life_loss = self.script[self.t]
        self.t += 1
        info = {"life_loss": np.array([life_loss])}
        obs = np.full((1, 2), self.t, dtype=np.float32)
        return obs, np.array([reward]), np.array([term]), np.array([False]), info


def test_step_after_a_life_loss_is_real_play():
    # A game of two lives: the step after the life loss scores 5 (real play, not a reset),
    # then game over and the reset step (reward 0 by convention, here 7 to show it is dropped).
    script = [
        (1.0, False, False),
        (2.0, True, True),  # life lost: the training episode ends here...
        (5.0, False, False),  # ...and this real step starts the next one
        (1.0, False, False),
        (3.0, True, False),  # game over
        (7.0, False, False),  # the reset step belongs to no game
        (1.0, False, False),
    ]
    cfg = Config(env=EnvCfg(id="CartPole-v1", clip_rewards=True), envs_per_actor=1)
    envs = EnvStepper(ScriptedEnv(script), cfg, None, seed=0)
    games, rows = [], []
    for _ in script:
        games += envs.step(torch.zeros(1, dtype=torch.int64))
        rows.append((envs.reward.item(), envs.terminated.item(), envs.first.item()))
    assert games == [(12.0, 5)], "one game: every real step's raw reward, the reset step's not"
    assert [r[1] for r in rows] == [False, True, False, False, True, False, False]
    assert [r[2] for r in rows] == [False, False, True, False, False, True, False]
    assert [r[0] for r in rows] == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # the learner's, clipped


@pytest.mark.parametrize("backend", ["ale", "gymnasium"])
def test_breakout_episodic_life_reports_whole_games(backend):
    env_cfg = EnvCfg(id=BREAKOUT, vector_backend=backend, episodic_life=True, clip_rewards=False)
    cfg = Config(env=env_cfg, envs_per_actor=1)
    env = make_vector_env(env_cfg, 1)
    try:
        envs = EnvStepper(env, cfg, env_spec(env_cfg), seed=3)
        gen = torch.Generator().manual_seed(3)  # random play that scores on both backends
        rewards, terms, firsts, lives, games = [], [], [], [], []
        original_step = env.step

        def step(actions):
            out = original_step(actions)
            lives.append(int(out[4]["lives"][0]))
            return out

        env.step = step
        while not games:
            games = envs.step(torch.randint(0, 4, (1,), generator=gen))
            rewards.append(envs.reward.item())
            terms.append(envs.terminated.item())
            firsts.append(envs.first.item())
    finally:
        env.close()
    (ret, length), n = games[0], len(rewards)
    assert len(games) == 1 and length == n, "the first game, reported once, at its end"
    # Lives go 5 -> 0 within the one reported game, a training episode ending at each loss.
    assert lives[0] == 5 and lives[-1] == 0 and np.all(np.diff(lives) <= 0)
    ends = np.flatnonzero(terms)
    assert [lives[t] for t in ends] == [4, 3, 2, 1, 0] and ends[-1] == n - 1
    assert [t + 1 for t in ends[:-1]] == np.flatnonzero(firsts).tolist()
    # The reported return is the game's full score: the sum of its per-step rewards.
    assert ret == sum(rewards) and ret > 0


ORPHANING_SCRIPT = """
import multiprocessing as mp, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from leakcheck import report_when_orphaned
mp.get_context("spawn").Process(target=report_when_orphaned, args=(sys.argv[1],)).start()
os._exit(0)  # before the child has even imported: its os.getppid() will already read 1
"""


@pytest.mark.slow
def test_a_child_orphaned_while_starting_notices_its_parent_is_gone(tmp_path):
    report = tmp_path / "report"
    cmd = [sys.executable, "-c", ORPHANING_SCRIPT, str(report)]
    proc, marker = popen_marked(cmd, REPO)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 120  # the child imports torch on a busy box
    while not report.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in processes_with_marker(marker):
        os.kill(pid, signal.SIGKILL)
    assert report.exists() and report.read_text() == "noticed"


def test_parent_alive_outside_multiprocessing():
    assert parent_alive()  # the test process has no multiprocessing parent to watch
