"""``runtime=ray``: the actor pool with Ray actors, on this box or on any Ray cluster.

The learning side does not change. Each Ray actor (``RolloutWorker``) steps its envs with a
local copy of the policy and returns whole unrolls in the ring's own layout (``channels/ring``:
``[E, T+1, ...]`` per field, plus the per-unroll stamps). A feeder thread in the learner's
process keeps ``ray.inflight_per_actor`` unroll requests queued per actor, takes each unroll
out of Ray's object store and copies it into ring slots that it acquires *as that actor*, so
the batcher, the policy-lag accounting and the slot bookkeeping see exactly what local actors
produce. Weights go out once per publish the feeder sees: one ``ray.put`` of the flat weights,
whose reference (and version) rides along with every request; an actor fetches it only when
its version is ``refresh_every`` behind.

Supervision mirrors ``ActorPool``: an actor that dies (its requests raise), raises (a task
error), or returns nothing for ``actor_timeout_s`` (hung or unreachable; before its first
unroll the start-up grace applies) is killed and replaced with a fresh seed. Its in-flight
unrolls are dropped and counted (``unrolls_dropped``), and the replacement is logged to the
console and ``events.jsonl`` like a local one.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from impala_gpu.acting.actor import ACTOR_HEARTBEAT_NS, ACTOR_IDLE_NS, ACTOR_STEPS, ACTOR_UNROLLS
from impala_gpu.acting.pool import (
    STARTUP_GRACE_S,
    PoolSetup,
    check_restart_budget,
    replacement_seed,
)
from impala_gpu.acting.rollout import EnvStepper, record_unroll, sample_action, stamp_unroll
from impala_gpu.channels.params import flat_parameters, load_flat_into
from impala_gpu.channels.ring import RingSpec, ring_spec
from impala_gpu.config import Config
from impala_gpu.envs import EnvSpec, derive_seeds, make_vector_env
from impala_gpu.models import build_model


def unroll_spec(cfg: Config, spec: EnvSpec) -> RingSpec:
    """The layout of one actor's unroll: a ring of ``E`` slots, one per env."""
    return ring_spec(cfg, spec, num_slots=cfg.envs_per_actor)


class RolloutWorker:
    """What runs inside one Ray actor: the local actor's loop, one unroll per call."""

    def __init__(self, cfg: Config, spec: EnvSpec, actor_id: int, seed: int):
        import ray

        torch.set_num_threads(1)  # the actors are the parallelism
        torch.manual_seed(seed)
        self.cfg, self.actor_id = cfg, actor_id
        self.env = make_vector_env(cfg.env, cfg.envs_per_actor, num_threads=1)
        self.envs = EnvStepper(self.env, cfg, spec, seed)
        self.model = build_model(spec.obs_shape, spec.num_actions, cfg.model).eval()
        self.flat = flat_parameters(self.model).detach().clone()
        self.core = self.model.initial_state(cfg.envs_per_actor)
        self.buffer = {
            name: torch.zeros(shape, dtype=dtype)
            for name, (shape, dtype) in unroll_spec(cfg, spec).field_shapes().items()
        }
        self.version: int | None = None
        self.n_unroll = 0
        self.last_end_ns: int | None = None
        self.node_ip = ray.util.get_node_ip_address()

    def unroll(self, weights: list, version: int) -> tuple[dict, list, int, str]:
        """Act for one unroll with the newest weights we hold (fetched from ``weights[0]``,
        an object reference, when ``version`` is ``refresh_every`` ahead of ours). Returns
        the unroll's fields as numpy arrays, the games that ended, the ns this actor sat idle
        since its last unroll, and its node's address."""
        import ray

        start_ns = time.perf_counter_ns()
        idle_ns = 0 if self.last_end_ns is None else start_ns - self.last_end_ns
        if self.version is None or version - self.version >= self.cfg.refresh_every:
            self.flat.numpy()[:] = ray.get(weights[0])  # read-only, zero-copy: copy it out
            load_flat_into(self.model, self.flat)
            self.version = version

        def act(core):
            return sample_action(self.model, self.envs, core, self.cfg.precision)

        everyone = slice(None)
        stamp_unroll(self.buffer, everyone, self.version, self.actor_id, self.n_unroll, self.core)
        self.core, games = record_unroll(
            self.buffer, everyone, self.envs, act, self.core, self.cfg.unroll_length
        )
        self.n_unroll += 1
        self.last_end_ns = time.perf_counter_ns()
        # Ray copies the result into its object store on return: the buffer can be reused.
        return {k: v.numpy() for k, v in self.buffer.items()}, games, idle_ns, self.node_ip


def connect(cfg: Config) -> bool:
    """Join the cluster at ``ray.address``, or start Ray here (object store capped). Returns
    whether this call started or joined Ray (and so ``ray.shutdown`` belongs to the run)."""
    import ray

    if ray.is_initialized():
        return False  # the caller's own Ray session: theirs to shut down
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if cfg.ray.node_ip_address:
        kwargs["_node_ip_address"] = cfg.ray.node_ip_address
    if cfg.ray.address:
        _probe(cfg.ray.address)
        try:
            ray.init(address=cfg.ray.address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise RuntimeError(
                f"runtime=ray could not join the Ray cluster at ray.address={cfg.ray.address!r}: "
                f"{str(e).strip().splitlines()[0]} Fix: check the address with `ray status` on "
                "the head; export the head's RAY_AUTH_MODE (token) here too; or ray.address=null "
                "to start Ray on this machine."
            ) from e
    else:
        cpus = max(os.cpu_count() or 1, math.ceil(cfg.num_actors * cfg.ray.num_cpus_per_actor))
        # "local": a Ray of its own even when another one already runs on this machine (Ray
        # would join that one, and refuses num_cpus when it does).
        memory = cfg.ray.object_store_mb << 20
        ray.init(address="local", num_cpus=cpus, object_store_memory=memory, **kwargs)
    return True


def _probe(address: str, timeout_s: float = 10.0) -> None:
    """Fail at once on a head nobody answers at (``ray.init`` would retry for minutes)."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", "ray://...": Ray resolves those itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RuntimeError(
            f"runtime=ray: nothing answers at ray.address={address!r} ({e}). Fix: start the head "
            "(`ray start --head --port=...`) or correct the address; ray.address=null starts "
            "Ray on this machine."
        ) from None


@dataclass
class ActorSeat:
    """One of the pool's ``num_actors`` positions (actor id ``i``): the Ray actor that holds it
    now and that actor's requests. A replacement takes over the seat (and its ring queues)."""

    handle: Any = None
    generation: int = 0  # bumped on every replacement: the old actor's results are dropped
    spawned: float = 0.0  # monotonic time of the current actor's creation
    ready: bool = False  # the current actor has landed an unroll
    node_ip: str = ""
    inflight: dict = field(default_factory=dict)  # ObjectRef -> monotonic submit time


class RayActorPool:
    """The actors as Ray actors feeding the learner's local ring (``pool.Pool``)."""

    def __init__(self, setup: PoolSetup):
        cfg, handles = setup.cfg, setup.handles
        self.cfg, self.spec, self.handles, self.slots = cfg, setup.spec, handles, setup.slots
        self.tele, self.on_event, self.seed_salt = setup.tele, setup.on_event, setup.seed_salt
        self.actors = [ActorSeat() for _ in range(cfg.num_actors)]
        self.lock = threading.Lock()
        self.restarts = 0
        self.unrolls_dropped = 0
        self.failures: queue.Queue = queue.Queue()  # (actor, generation, cause), feeder -> main
        self.notices: queue.Queue = queue.Queue()  # events the feeder saw, logged by the main
        self.games: queue.Queue = queue.Queue()
        self.stop_event = threading.Event()
        self.feeder: threading.Thread | None = None
        self.owns_ray = False
        self.weights: tuple[int, Any] | None = None  # (version, ObjectRef of the flat weights)
        self.flat = torch.empty(handles.params.flat.shape[1])
        self.last_check = 0.0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        import ray

        self.owns_ray = connect(self.cfg)
        self.remote_cls = ray.remote(num_cpus=self.cfg.ray.num_cpus_per_actor, max_restarts=0)(
            RolloutWorker
        )
        seeds = derive_seeds(self.cfg.seed, self.cfg.num_actors, salt=self.seed_salt)
        for i, seed in enumerate(seeds):
            self._spawn(i, seed)
        self.feeder = threading.Thread(target=self._feed, name="ray-feeder", daemon=True)
        self.feeder.start()

    def _spawn(self, i: int, seed: int) -> None:
        seat = self.actors[i]
        seat.handle = self.remote_cls.options(scheduling_strategy="SPREAD").remote(
            self.cfg, self.spec, i, seed
        )
        seat.spawned, seat.ready, seat.node_ip = time.monotonic(), False, ""
        self.handles.counters[i, ACTOR_HEARTBEAT_NS] = 0

    def join(self, timeout: float = 10.0) -> None:
        """Stop the feeder and every actor; leave Ray (shutting it down if we started it)."""
        import ray

        self.stop_event.set()
        if self.feeder is not None:
            self.feeder.join(timeout=timeout)
        if not ray.is_initialized():
            return
        for seat in self.actors:
            if seat.handle is not None:
                ray.kill(seat.handle, no_restart=True)
                seat.handle = None
        if self.owns_ray:
            ray.shutdown()
            self.owns_ray = False
        self.drain()

    # -- main thread -----------------------------------------------------------------------
    def drain(self) -> None:
        """Episode stats to telemetry."""
        while True:
            try:
                self.tele.add_episodes(self.games.get_nowait())
            except queue.Empty:
                return

    def check(self, min_interval_s: float = 0.25) -> None:
        """Replace dead, failing or silent actors (rate-limited; called every loop turn)."""
        now = time.monotonic()
        if now - self.last_check < min_interval_s:
            return
        self.last_check = now
        while True:
            try:
                self.on_event(self.notices.get_nowait())
            except queue.Empty:
                break
        while True:
            try:
                i, generation, cause = self.failures.get_nowait()
            except queue.Empty:
                break
            if generation == self.actors[i].generation:
                self._replace(i, cause)
        for i, seat in enumerate(self.actors):
            silent_s, timeout_s = self._silence(seat, now)
            if silent_s > timeout_s:
                self._replace(i, f"no unroll for {silent_s:.0f} s (hung or unreachable); killed")

    def _silence(self, seat: ActorSeat, now: float) -> tuple[float, float]:
        """How long the actor's oldest request has waited, and the wait that means it hangs."""
        with self.lock:
            oldest = min(seat.inflight.values(), default=now)
        if seat.ready:
            return now - oldest, self.cfg.actor_timeout_s
        return now - seat.spawned, max(self.cfg.actor_timeout_s, STARTUP_GRACE_S)

    def _replace(self, i: int, cause: str) -> None:
        import ray

        t0 = time.monotonic()
        self.restarts += 1
        check_restart_budget(self.cfg, i, cause, self.restarts)
        seat = self.actors[i]
        old = seat.handle
        with self.lock:
            dropped = len(seat.inflight)
            seat.inflight.clear()
            seat.generation += 1
            self.unrolls_dropped += dropped
            self._spawn(i, replacement_seed(self.cfg, self.seed_salt, self.restarts))
        ray.kill(old, no_restart=True)
        self.on_event(
            {
                "event": "actor_replaced",
                "actor": i,
                "cause": cause,
                "exitcode": None,
                "slots_reclaimed": 0,
                "unrolls_dropped": dropped,
                "restart": self.restarts,
                "runtime": "ray",
                "replace_s": time.monotonic() - t0,
            }
        )

    # -- feeder thread ---------------------------------------------------------------------
    def _feed(self) -> None:
        import ray

        while not self.stop_event.is_set():
            self._refresh_weights()
            self._submit()
            with self.lock:
                owners = {
                    ref: (i, seat.generation)
                    for i, seat in enumerate(self.actors)
                    for ref in seat.inflight
                }
            if not owners:
                time.sleep(0.05)
                continue
            ready, _ = ray.wait(list(owners), num_returns=1, timeout=0.2)
            for ref in ready:
                i, generation = owners[ref]
                with self.lock:
                    current = self.actors[i].inflight.pop(ref, None) is not None
                if not current:
                    continue  # the actor was replaced meanwhile: counted as dropped there
                try:
                    arrays, games, idle_ns, node_ip = ray.get(ref)
                except ray.exceptions.RayError as e:
                    self.failures.put((i, generation, describe_ray_error(e)))
                    continue
                self._land(i, generation, arrays, games, idle_ns, node_ip)

    def _refresh_weights(self) -> None:
        """One ``ray.put`` per version published since we last looked."""
        import ray

        params = self.handles.params
        if self.weights is not None and params.version == self.weights[0]:
            return
        version = params.try_read(self.flat)
        if version is not None:
            self.weights = (version, ray.put(self.flat.numpy()))

    def _submit(self) -> None:
        if self.weights is None:
            return
        version, ref = self.weights
        with self.lock:
            for seat in self.actors:
                while len(seat.inflight) < self.cfg.ray.inflight_per_actor:
                    # The reference inside a list: Ray passes it as is, not the weights.
                    seat.inflight[seat.handle.unroll.remote([ref], version)] = time.monotonic()

    def _land(self, i: int, generation: int, arrays, games, idle_ns: int, node_ip: str) -> None:
        """Copy one unroll into ring slots held as actor ``i`` and hand them to the learner."""
        ring, counters = self.handles.ring, self.handles.counters
        E = self.cfg.envs_per_actor
        items, wait_start = [], time.perf_counter_ns()
        while len(items) < E:
            item = ring.acquire(i, timeout=0.2)
            if item is not None:
                items.append(item)
            elif self.stop_event.is_set():
                return
        idx = [s for s, _ in items]
        for name, value in arrays.items():
            ring.fields[name].numpy()[idx] = value  # Ray's arrays are read-only views
        for item in items:
            ring.commit(i, item)
        counters[i, ACTOR_IDLE_NS] += idle_ns + time.perf_counter_ns() - wait_start
        counters[i, ACTOR_STEPS] += self.cfg.unroll_length * E
        counters[i, ACTOR_UNROLLS] += 1
        counters[i, ACTOR_HEARTBEAT_NS] = time.time_ns()
        if games:
            self.games.put(games)
        seat = self.actors[i]
        if not seat.ready and generation == seat.generation:
            seat.ready, seat.node_ip = True, node_ip
            self.notices.put(
                {
                    "event": "actor_ready",
                    "actor": i,
                    "node": node_ip,
                    "runtime": "ray",
                    "since_spawn_s": time.monotonic() - seat.spawned,
                }
            )


def describe_ray_error(e: Exception) -> str:
    """A one-line cause of death: the dead actor's reason, or a task's last traceback line."""
    import ray

    if isinstance(e, ray.exceptions.RayTaskError):
        return "raised: " + str(e).strip().splitlines()[-1]
    if isinstance(e, ray.exceptions.ActorDiedError | ray.exceptions.ActorUnavailableError):
        return f"died ({type(e).__name__}: {str(e).strip().splitlines()[0]})"
    return f"failed ({type(e).__name__}: {str(e).strip().splitlines()[0]})"
