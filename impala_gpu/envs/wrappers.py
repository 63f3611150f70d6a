"""Atari wrappers shared by both vector backends: ale-py's reset, and lives (LifeLoss)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class AleReset(gym.Wrapper):
    """ale-py's vector-env reset, on a frameskip=1 ALE env: after ``reset_game``, FIRE for one
    frame (``fire`` and the game has FIRE), then ``U{0..noop_max-1}`` no-op frames minus that
    FIRE frame, drawn from the env's seeded ``np_random``. Rewards of these frames are dropped,
    as in ale-py."""

    def __init__(self, env: gym.Env, noop_max: int, fire: bool):
        super().__init__(env)
        self.noop_max = noop_max
        meanings = env.unwrapped.get_action_meanings()
        self.fire_action = meanings.index("FIRE") if fire and "FIRE" in meanings else None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        fire = self.fire_action is not None
        noops = int(self.env.unwrapped.np_random.integers(0, max(self.noop_max, 1))) - int(fire)
        actions = ([self.fire_action] if fire else []) + [0] * noops
        for action in actions:
            obs, _, terminated, truncated, step_info = self.env.step(action)
            info.update(step_info)
            if terminated or truncated:  # game over during the no-ops
                obs, info = self.env.reset()
        return obs, info


class LifeLoss(gym.vector.VectorWrapper):
    """Lives over whole games, the same on both backends (their sub-envs end only at game over
    or truncation). Every step's info gets ``life_loss``: this step lost a life and the game
    goes on.

    ``terminate``: such a step also says ``terminated=True`` (episodic life: the learner sees
    the end of a training episode, discount 0, and masks the step out of it). The game is not
    reset: the next step is real play from the same emulator state, with its real reward, and
    starts the next training episode. Only game over or truncation resets the game (NEXT_STEP
    autoreset, reward 0, as before).

    ``fire_action``: replaces the agent's action on the step after each life loss (FIRE, which
    relaunches the ball in Breakout), like ale-py's FIRE on reset. Set it only where that step
    is not trained on: with ``terminate`` (the step leaves a terminal observation, so the loss
    masks it and the replaced action never counts) or in evaluation of such a policy.
    """

    def __init__(self, env: gym.vector.VectorEnv, terminate: bool, fire_action: int | None):
        super().__init__(env)
        self.terminate, self.fire_action = terminate, fire_action
        self._lives = np.zeros(env.num_envs, dtype=np.int64)
        self._fire = np.zeros(env.num_envs, dtype=bool)

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._lives = np.asarray(info["lives"], dtype=np.int64).copy()
        self._fire[:] = False
        info["life_loss"] = np.zeros(self.num_envs, dtype=bool)
        return obs, info

    def step(self, actions):
        actions = np.asarray(actions)
        if self._fire.any():
            actions = np.where(self._fire, self.fire_action, actions).astype(actions.dtype)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        lives = np.asarray(info["lives"], dtype=np.int64)
        # A reset step (after game over or truncation) only ever raises the lives.
        life_loss = (lives < self._lives) & ~terminated & ~truncated
        self._lives = lives.copy()
        if self.fire_action is not None:
            self._fire = life_loss
        if self.terminate:
            terminated = terminated | life_loss
        info["life_loss"] = life_loss
        return obs, reward, terminated, truncated, info


def _fire_action(env: gym.vector.VectorEnv) -> int | None:
    """Index of FIRE in the env's action set, or None if the game has no FIRE."""
    base = env.unwrapped
    if isinstance(base, gym.vector.SyncVectorEnv):
        meanings = base.envs[0].unwrapped.get_action_meanings()
        return meanings.index("FIRE") if "FIRE" in meanings else None
    from ale_py import Action

    actions = list(base.ale.get_action_set())
    return actions.index(Action.FIRE) if Action.FIRE in actions else None
