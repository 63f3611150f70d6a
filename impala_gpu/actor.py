"""Actor process: step a batch of envs with a local CPU copy of the policy, write unrolls into
the ring in their final dtype and layout, stamp each with the policy version that produced it.
"""

from __future__ import annotations

import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from impala_gpu.config import Config
from impala_gpu.envs import EnvSpec, derive_seeds, make_vector_env, reset_vector_env
from impala_gpu.models import build_model
from impala_gpu.params import ParamStore, flat_parameters, load_flat_into
from impala_gpu.ring import TrajectoryRing
from impala_gpu.speed import autocast

# Columns of the shared per-actor counters tensor [num_actors, NUM_COUNTERS].
STEPS, IDLE_NS, UNROLLS, HEARTBEAT_NS = range(4)
NUM_COUNTERS = 4


@dataclass
class ActorHandles:
    """What the learner hands each actor process (all picklable to spawn children)."""

    ring: TrajectoryRing
    params: ParamStore
    counters: Tensor  # [num_actors, NUM_COUNTERS] int64, shared
    episodes: object  # mp.Queue of ("episodes", actor, [(return, length)]) | ("error", actor, tb)
    stop: object  # mp.Event
    start_version: int = 0  # the learner's version when these actors started (resume)

    @classmethod
    def create(
        cls, ctx, ring: TrajectoryRing, params: ParamStore, num_actors: int, start_version: int = 0
    ) -> ActorHandles:
        counters = torch.zeros(num_actors, NUM_COUNTERS, dtype=torch.int64).share_memory_()
        return cls(ring, params, counters, ctx.Queue(), ctx.Event(), start_version)


def bounded_lag_version(global_unroll: int, envs_per_actor: int, batch_size: int, k: int) -> int:
    """The exact policy version an unroll uses in bounded-lag mode.

    Batches take unrolls in global round-robin order (actor 0's n-th, actor 1's n-th, ...), so
    unroll ``g`` lands in update ``g * E // B``. Acting with version ``update - k`` makes every
    sample's lag exactly k (less at the start) and the whole run deterministic.
    """
    update = global_unroll * envs_per_actor // batch_size
    return max(0, update - k)


class EnvStepper:
    """A vector env and the per-env state the ring's layout needs (see ``impala_gpu/ring.py``):
    the current observation, the reward received on arriving there, its terminated/truncated
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


def actor_main(actor_id: int, cfg: Config, spec: EnvSpec, handles: ActorHandles, seed: int) -> None:
    """Process entry point. Returns when ``handles.stop`` is set or the learner goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner coordinates Ctrl-C shutdown
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    parent = os.getppid()
    handles.counters[actor_id, HEARTBEAT_NS] = time.time_ns()
    env = None
    try:
        env = make_vector_env(cfg.env, cfg.envs_per_actor, num_threads=1)
        _run(
            actor_id,
            cfg,
            spec,
            handles,
            seed,
            env,
            should_stop=lambda: _should_stop(handles, parent, actor_id),
        )
    except Exception:
        # Tell the learner why, then die: it logs the cause and starts a replacement.
        handles.episodes.put(("error", actor_id, traceback.format_exc()))
        time.sleep(0.2)  # let the queue's feeder thread flush before the process exits
        raise
    finally:
        if env is not None:
            env.close()


def _should_stop(handles: ActorHandles, parent: int, actor_id: int) -> bool:
    """Polled wherever the actor loops or waits; so it also beats the heartbeat (waiting for a
    slot or a version is not hanging)."""
    handles.counters[actor_id, HEARTBEAT_NS] = time.time_ns()
    return handles.stop.is_set() or os.getppid() != parent


def _run(
    actor_id, cfg: Config, spec: EnvSpec, h: ActorHandles, seed: int, env, should_stop
) -> None:
    E, T = cfg.envs_per_actor, cfg.unroll_length
    ring, counters = h.ring, h.counters
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    model.eval()
    flat = flat_parameters(model).detach().clone()
    local_version = h.params.read(flat, should_stop=should_stop)
    if local_version is None:
        return
    load_flat_into(model, flat)

    envs = EnvStepper(env, cfg, spec, seed)
    core = model.initial_state(E)
    bounded = cfg.bounded_lag is not None
    n_unroll = 0

    def act(core_state):
        with torch.no_grad(), autocast("cpu", cfg.precision):
            out = model(envs.obs.unsqueeze(0), envs.first.unsqueeze(0), core_state)
        logits = out.logits[0].float()
        action = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)
        return action, logits, out.core_state  # fp32: the LSTM core runs outside autocast

    action, logits, next_core = act(core)
    while not should_stop():
        items = []
        t_idle = time.perf_counter_ns()
        while len(items) < E:
            item = ring.acquire(actor_id, timeout=0.2)
            if item is not None:
                items.append(item)
            elif should_stop():
                return  # the learner takes back what we hold
        counters[actor_id, IDLE_NS] += time.perf_counter_ns() - t_idle
        idx = torch.tensor([slot for slot, _ in items])

        g = n_unroll * cfg.num_actors + actor_id if bounded else n_unroll
        # Bounded lag acts with one exact version; otherwise with the newest one (re-read on
        # every retry: under history=1 a version can be overwritten before we get to copy it).
        want = (
            h.start_version + bounded_lag_version(g, E, cfg.batch_size, cfg.bounded_lag)
            if bounded
            else None
        )
        # refresh_every=K > 1 keeps acting with old weights until the learner is K updates
        # ahead: policy lag injected on purpose (the V-trace ablation).
        stale = h.params.version - local_version >= cfg.refresh_every
        if (want != local_version) if bounded else stale:
            got = h.params.read(flat, version=want, should_stop=should_stop)
            if got is None:  # told to stop while waiting
                return
            load_flat_into(model, flat)
            local_version = got
            if bounded and n_unroll > 0:
                # The carried first step must come from the exact version too (determinism).
                action, logits, next_core = act(core)

        ring.version[idx] = local_version
        ring.actor[idx] = actor_id
        ring.unroll[idx] = g
        ring.env_index[idx] = torch.arange(E)
        if core:
            ring.core_h[idx] = core[0]
            ring.core_c[idx] = core[1]

        game_overs: list[tuple[float, int]] = []
        for t in range(T + 1):
            if t > 0:
                game_overs += envs.step(action)
                core = next_core
                action, logits, next_core = act(core)
            ring.obs[idx, t] = envs.obs
            ring.reward[idx, t] = envs.reward
            ring.terminated[idx, t] = envs.terminated
            ring.truncated[idx, t] = envs.truncated
            ring.first[idx, t] = envs.first
            ring.action[idx, t] = action
            ring.logits[idx, t] = logits
        for item in items:
            ring.commit(actor_id, item)
        n_unroll += 1
        counters[actor_id, STEPS] += T * E
        counters[actor_id, UNROLLS] += 1
        counters[actor_id, HEARTBEAT_NS] = time.time_ns()
        if game_overs:
            try:
                h.episodes.put_nowait(("episodes", actor_id, game_overs))
            except queue.Full:
                pass
