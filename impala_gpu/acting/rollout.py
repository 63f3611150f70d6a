"""Env stepping, action sampling and recording an unroll, shared by IMPALA's actors (local and
Ray) and A3C's workers."""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor

from impala_gpu.config import Config
from impala_gpu.envs import EnvSpec, derive_seeds, make_vector_env, reset_vector_env
from impala_gpu.models import CoreState, Policy
from impala_gpu.speed.precision import autocast


class EnvStepper:
    """A vector env and the per-env state the ring's layout needs (``channels/ring.py``): the
    current observation, the reward received on arriving there, its terminated/truncated
    flags, whether it starts an episode; plus each env's raw return and length so far.

    Every env autoresets on the NEXT step (gymnasium's NEXT_STEP mode): the step after a
    game's final observation returns the next game's first one, with reward 0. With
    ``env.episodic_life`` a lost life is ``terminated`` too, but the game goes on: the next step
    is real play (its reward counts) that starts the next training episode (``first``).
    Returns are reported per game, not per life.
    """

    def __init__(self, env, cfg: Config, spec: EnvSpec, seed: int):
        E = cfg.envs_per_actor
        self.env, self.clip_rewards = env, cfg.env.clip_rewards
        obs_np, _ = reset_vector_env(env, derive_seeds(seed, E, salt=1))
        self.obs = torch.from_numpy(obs_np)
        self.reward = torch.zeros(E)
        self.terminated = torch.zeros(E, dtype=torch.bool)
        self.truncated = torch.zeros(E, dtype=torch.bool)
        self.first = torch.ones(E, dtype=torch.bool)
        self.game_over = np.zeros(E, dtype=bool)  # the last step ended the game: next is a reset
        self.ep_return = np.zeros(E)
        self.ep_length = np.zeros(E, dtype=np.int64)

    def step(self, action: Tensor) -> list[tuple[float, int]]:
        """One step of every env. Returns the games that ended: (raw return, length)."""
        obs_np, rew_np, term_np, trunc_np, info = self.env.step(action.numpy())
        self.first = self.terminated | self.truncated
        reset_step = self.game_over  # a reset step's reward belongs to no game
        self.obs = torch.from_numpy(obs_np)
        terminated = np.asarray(term_np, dtype=bool)
        truncated = np.asarray(trunc_np, dtype=bool)
        self.terminated, self.truncated = torch.from_numpy(terminated), torch.from_numpy(truncated)
        raw = np.asarray(rew_np, dtype=np.float64)
        # The learner sees clipped rewards; reported returns stay the game's real score.
        self.reward = torch.from_numpy(
            np.clip(raw, -1.0, 1.0) if self.clip_rewards else raw
        ).float()
        live = ~reset_step
        self.ep_return[live] += raw[live]
        self.ep_length[live] += 1
        # A life loss (episodic life) ends the training episode, not the game.
        life_loss = np.asarray(info.get("life_loss", np.zeros(len(raw), dtype=bool)), dtype=bool)
        self.game_over = truncated | (terminated & ~life_loss)
        ended = self.game_over
        games = [(float(self.ep_return[j]), int(self.ep_length[j])) for j in np.flatnonzero(ended)]
        self.ep_return[ended] = 0.0
        self.ep_length[ended] = 0
        return games


@torch.no_grad()
def policy_step(
    model: Policy, obs: Tensor, first: Tensor, core: CoreState, precision: str
) -> tuple[Tensor, Tensor, CoreState]:
    """Act once at each of ``E`` observations ``obs [E, ...]`` (``first [E]``: each starts an
    episode). Returns the sampled actions ``[E]``, the fp32 logits they came from ``[E, A]``
    and the core state after the step (fp32: the LSTM core runs outside autocast)."""
    with autocast("cpu", precision):
        out = model(obs.unsqueeze(0), first.unsqueeze(0), core)
    logits = out.logits[0].float()
    action = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)
    return action, logits, out.core_state


def sample_action(
    model: Policy, envs: EnvStepper, core: CoreState, precision: str
) -> tuple[Tensor, Tensor, CoreState]:
    """``policy_step`` at every env's current observation."""
    return policy_step(model, envs.obs, envs.first, core, precision)


def record_unroll(
    fields: dict[str, Tensor], idx, envs: EnvStepper, act, core: CoreState, T: int
) -> tuple[CoreState, list[tuple[float, int]]]:
    """Act and step ``T`` times from the envs' current observation, writing step ``t`` of env
    ``e`` into ``fields[name][idx[e], t]`` (the ring's layout, ``channels/ring.py``; ``idx`` is
    ring slots, or ``slice(None)`` for a buffer of its own ``[E, T+1, ...]``, which may be the
    transposed view of a time-major one, as A3C's rollout passes). ``act(core)``
    returns (actions [E], logits [E, A], next core). Returns the core state before o_T (the
    next unroll's starting state) and the games that ended.

    The bootstrap observation o_T is not acted on here: its action is drawn at step 0 of the
    next unroll, after any weight load, so every action comes from the version the unroll is
    stamped with (exact lag, deterministic bounded lag) at T policy steps per unroll. a_T and
    its logits are never read (the learner takes [:-1])."""
    games: list[tuple[float, int]] = []
    for t in range(T + 1):
        fields["obs"][idx, t] = envs.obs
        fields["reward"][idx, t] = envs.reward
        fields["terminated"][idx, t] = envs.terminated
        fields["truncated"][idx, t] = envs.truncated
        fields["first"][idx, t] = envs.first
        if t == T:
            break
        action, logits, next_core = act(core)
        fields["action"][idx, t] = action
        fields["logits"][idx, t] = logits
        games += envs.step(action)
        core = next_core
    return core, games


def stamp_unroll(
    fields: dict[str, Tensor], idx, version: int, actor_id: int, unroll: int, core: CoreState
) -> None:
    """Per-unroll fields: who acted, with which weights, and the core state before step 0."""
    n = len(fields["version"][idx])
    fields["version"][idx] = version
    fields["actor"][idx] = actor_id
    fields["unroll"][idx] = unroll
    fields["env_index"][idx] = torch.arange(n)
    if core:
        fields["core_h"][idx] = core[0]
        fields["core_c"][idx] = core[1]


def parent_alive() -> bool:
    """Whether the process that started this one still runs (True outside multiprocessing).

    Read from the pipe multiprocessing keeps to the parent, which reads EOF once the parent is
    gone, not from ``os.getppid()``: if the parent died while this process was starting, that
    already reads as init's pid, and a child comparing against it would wait forever."""
    parent = mp.parent_process()
    return parent is None or parent.is_alive()


@contextmanager
def acting_process(cfg: Config, seed: int) -> Iterator[object]:
    """The start of every acting child process (IMPALA actor, A3C worker): Ctrl-C is left to
    the parent, which coordinates shutdown; one torch thread (the processes are the
    parallelism); a seeded RNG. Yields the process's vector env, and closes it on the way out.
    The child's loops poll ``parent_alive`` so that it stops when its parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    env = make_vector_env(cfg.env, cfg.envs_per_actor, num_threads=1)
    try:
        yield env
    finally:
        env.close()
