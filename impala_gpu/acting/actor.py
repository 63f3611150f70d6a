"""Actor process: step a batch of envs with a local CPU copy of the policy, write unrolls into
the ring in their final dtype and layout, stamp each with the policy version that produced it.
"""

from __future__ import annotations

import queue
import time
import traceback
from dataclasses import dataclass

import torch
from torch import Tensor

from impala_gpu.acting.rollout import (
    EnvStepper,
    acting_process,
    parent_alive,
    record_unroll,
    sample_action,
    stamp_unroll,
)
from impala_gpu.channels.params import ParamStore, flat_parameters, load_flat_into
from impala_gpu.channels.ring import TrajectoryRing
from impala_gpu.config import Config, fresh_batch_size
from impala_gpu.envs import EnvSpec
from impala_gpu.models import build_model

# Columns of the shared per-actor counters tensor [num_actors, NUM_ACTOR_COUNTERS] (A3C's
# workers keep their own layout, ``algos.a3c.WORKER_*``).
ACTOR_STEPS, ACTOR_IDLE_NS, ACTOR_UNROLLS, ACTOR_HEARTBEAT_NS = range(4)
NUM_ACTOR_COUNTERS = 4


@dataclass
class ActorHandles:
    """What the learner hands each actor process (all picklable to spawn children)."""

    ring: TrajectoryRing
    params: ParamStore
    counters: Tensor  # [num_actors, NUM_ACTOR_COUNTERS] int64, shared
    messages: object  # mp.Queue of ("episodes", actor, [(return, length)]) | ("error", actor, tb)
    stop: object  # mp.Event
    start_version: int = 0  # the learner's version when these actors started (resume)

    @classmethod
    def create(
        cls, ctx, ring: TrajectoryRing, params: ParamStore, num_actors: int, start_version: int = 0
    ) -> ActorHandles:
        counters = torch.zeros(num_actors, NUM_ACTOR_COUNTERS, dtype=torch.int64).share_memory_()
        return cls(ring, params, counters, ctx.Queue(), ctx.Event(), start_version)


def bounded_lag_version(global_unroll: int, envs_per_actor: int, batch_size: int, k: int) -> int:
    """The exact policy version an unroll uses in bounded-lag mode.

    Batches take unrolls in global round-robin order (actor 0's n-th, actor 1's n-th, ...), so
    unroll ``g`` lands in update ``g * E // B``. Acting with version ``update - k`` makes every
    sample's lag exactly k (less at the start) and the whole run deterministic.
    """
    update = global_unroll * envs_per_actor // batch_size
    return max(0, update - k)


def actor_main(actor_id: int, cfg: Config, spec: EnvSpec, handles: ActorHandles, seed: int) -> None:
    """Process entry point. Returns when ``handles.stop`` is set or the learner goes away."""
    handles.counters[actor_id, ACTOR_HEARTBEAT_NS] = time.time_ns()
    try:
        with acting_process(cfg, seed) as env:
            _run(
                actor_id,
                cfg,
                spec,
                handles,
                seed,
                env,
                should_stop=lambda: _should_stop(handles, actor_id),
            )
    except Exception:
        # Tell the learner why, then die: it logs the cause and starts a replacement.
        handles.messages.put(("error", actor_id, traceback.format_exc()))
        time.sleep(0.2)  # let the queue's feeder thread flush before the process exits
        raise


def _should_stop(handles: ActorHandles, actor_id: int) -> bool:
    """Polled wherever the actor loops or waits; so it also beats the heartbeat (waiting for a
    slot or a version is not hanging)."""
    handles.counters[actor_id, ACTOR_HEARTBEAT_NS] = time.time_ns()
    return handles.stop.is_set() or not parent_alive()


def _run(
    actor_id, cfg: Config, spec: EnvSpec, handles: ActorHandles, seed: int, env, should_stop
) -> None:
    E, T = cfg.envs_per_actor, cfg.unroll_length
    ring, counters = handles.ring, handles.counters
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    model.eval()
    flat = flat_parameters(model).detach().clone()
    local_version = handles.params.read(flat, should_stop=should_stop)
    if local_version is None:
        return
    load_flat_into(model, flat)

    envs = EnvStepper(env, cfg, spec, seed)
    core = model.initial_state(E)
    bounded = cfg.bounded_lag is not None
    n_unroll = 0

    def act(core_state):
        return sample_action(model, envs, core_state, cfg.precision)

    while not should_stop():
        items = _acquire_slots(ring, counters, actor_id, E, should_stop)
        if items is None:
            return  # the learner takes back what we hold
        idx = torch.tensor([slot for slot, _ in items])

        global_unroll = n_unroll * cfg.num_actors + actor_id if bounded else n_unroll
        # Bounded lag acts with one exact version; otherwise with the newest one (re-read on
        # every retry: under history=1 a version can be overwritten before we get to copy it).
        want = (
            handles.start_version
            + bounded_lag_version(global_unroll, E, fresh_batch_size(cfg), cfg.bounded_lag)
            if bounded
            else None
        )
        # refresh_every=K > 1 keeps acting with old weights until the learner is K updates
        # ahead: policy lag injected on purpose (the V-trace ablation).
        stale = handles.params.version - local_version >= cfg.refresh_every
        if (want != local_version) if bounded else stale:
            got = handles.params.read(flat, version=want, should_stop=should_stop)
            if got is None:  # told to stop while waiting
                return
            load_flat_into(model, flat)
            local_version = got

        stamp_unroll(ring.fields, idx, local_version, actor_id, global_unroll, core)
        core, game_overs = record_unroll(ring.fields, idx, envs, act, core, T)
        for item in items:
            ring.commit(actor_id, item)
        n_unroll += 1
        _report(handles, actor_id, T * E, game_overs)


def _acquire_slots(ring: TrajectoryRing, counters: Tensor, actor_id: int, n: int, should_stop):
    """``n`` free slots from the ring (their wait counts as idle), or None when told to stop."""
    items = []
    t_idle = time.perf_counter_ns()
    while len(items) < n:
        item = ring.acquire(actor_id, timeout=0.2)
        if item is not None:
            items.append(item)
        elif should_stop():
            return None
    counters[actor_id, ACTOR_IDLE_NS] += time.perf_counter_ns() - t_idle
    return items


def _report(handles: ActorHandles, actor_id: int, steps: int, game_overs: list) -> None:
    counters = handles.counters
    counters[actor_id, ACTOR_STEPS] += steps
    counters[actor_id, ACTOR_UNROLLS] += 1
    counters[actor_id, ACTOR_HEARTBEAT_NS] = time.time_ns()
    if game_overs:
        try:
            handles.messages.put_nowait(("episodes", actor_id, game_overs))
        except queue.Full:
            pass
