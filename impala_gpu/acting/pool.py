"""Actor supervision: start the actor processes, notice when one dies or hangs, say why, take
back its ring slots and start a replacement with a fresh seed.

Death is seen through the process's exit code (a signal shows as SIGKILL, SIGSEGV, ...; an
exception inside the actor also arrives as its traceback); a hang through a heartbeat the
actor beats whenever it loops or waits. Too many restarts stop the run with a clear error.
"""

from __future__ import annotations

import queue
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from impala_gpu import interrupts
from impala_gpu.acting.actor import ACTOR_HEARTBEAT_NS, ACTOR_UNROLLS, ActorHandles, actor_main
from impala_gpu.channels.ring import SlotManager
from impala_gpu.config import Config
from impala_gpu.envs import EnvSpec, derive_seeds
from impala_gpu.telemetry.window import Telemetry

STARTUP_GRACE_S = 120.0  # the least silence that counts as hung before an actor's first beat


class Pool(Protocol):
    """What the learner's data path needs of an actor pool: ``ActorPool`` (local processes) or
    ``ray_pool.RayActorPool`` (``runtime=ray``)."""

    restarts: int  # actors replaced so far
    unrolls_dropped: int  # unrolls lost with replaced actors (a local pool reclaims its slots)

    def start(self) -> None: ...

    def check(self, min_interval_s: float = 0.25) -> None:
        """Replace dead or hung actors; cheap enough to call every loop turn."""

    def drain(self) -> None:
        """Hand the actors' finished episodes to telemetry."""

    def join(self, timeout: float = 10.0) -> None:
        """Stop every actor (after ``handles.stop``) and collect its last messages."""


@dataclass
class PoolSetup:
    """What either pool is given by the learner."""

    cfg: Config
    spec: EnvSpec
    handles: ActorHandles
    slots: SlotManager
    seed_salt: int  # the run's resume count: a resumed run's actors must not replay the first's
    tele: Telemetry  # receives the episodes
    on_event: Callable[[dict], None]  # logs an event line (actor ready, replaced)


def stop_processes(
    procs: Sequence[BaseProcess | None], drain: Callable[[], None], timeout: float = 10.0
) -> None:
    """Join every started process in ``procs``, calling ``drain`` while waiting; terminate, then
    kill, any still alive after ``timeout`` s. Idempotent. Draining matters: a child does not
    exit until its queues' buffered items are in the pipe, so a parent that stops reading while
    it joins can wait on an idle child for good."""
    started = [p for p in procs if p is not None and p.pid is not None]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in started if p.is_alive()]
        if not alive:
            break
        drain()
        alive[0].join(timeout=0.05)
    for p in started:
        if p.is_alive():
            p.terminate()
            p.join(timeout=2)
        if p.is_alive():
            p.kill()
        p.join(timeout=2)
    drain()


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def check_restart_budget(cfg: Config, actor: int, cause: str, restarts: int) -> None:
    """Stop the run once replacements pass ``max_actor_restarts``: a crash loop."""
    if restarts > cfg.max_actor_restarts:
        raise RuntimeError(
            f"actor-{actor} {cause}: that is restart {restarts}, over max_actor_restarts="
            f"{cfg.max_actor_restarts}; the actors are crash-looping, stopping the run. "
            "Fix: see the causes in events.jsonl; raise max_actor_restarts if they are rare."
        )


def replacement_seed(cfg: Config, seed_salt: int, restarts: int) -> int:
    """A fresh seed for the ``restarts``-th replacement: it must not replay its predecessor's
    trajectories (nor, after a resume, the first life's)."""
    return derive_seeds(cfg.seed, 1, salt=10_000 + seed_salt * 1_000 + restarts)[0]


class ActorPool:
    """The actors as local processes (``Pool``)."""

    def __init__(self, ctx, setup: PoolSetup):
        self.ctx, cfg = ctx, setup.cfg
        self.cfg, self.spec, self.handles, self.slots = cfg, setup.spec, setup.handles, setup.slots
        self.tele, self.on_event, self.seed_salt = setup.tele, setup.on_event, setup.seed_salt
        self.procs: list[Any] = [None] * cfg.num_actors
        self.spawned_ns = [0] * cfg.num_actors
        self.restarts = 0
        self.unrolls_dropped = 0  # a dead process's slots are reclaimed, not dropped
        self.errors: dict[int, str] = {}
        self.pending_ready: dict[int, tuple[float, int]] = {}  # actor -> (spawn time, unrolls)
        self.last_check = 0.0

    def start(self) -> None:
        seeds = derive_seeds(self.cfg.seed, self.cfg.num_actors, salt=self.seed_salt)
        for i, seed in enumerate(seeds):
            self._spawn(i, seed)

    def _spawn(self, i: int, seed: int) -> None:
        self.handles.counters[i, ACTOR_HEARTBEAT_NS] = 0  # 0: not started; actor_main beats first
        self.spawned_ns[i] = time.time_ns()
        p = self.ctx.Process(
            target=actor_main,
            args=(i, self.cfg, self.spec, self.handles, seed),
            name=f"actor-{i}",
            daemon=True,
        )
        with interrupts.deferred():  # a child whose start-up data was cut short dies loudly
            p.start()
            self.procs[i] = p
        # Its first unroll logs actor_ready (and how long the start-up took).
        self.pending_ready[i] = (time.monotonic(), int(self.handles.counters[i, ACTOR_UNROLLS]))

    def drain(self) -> None:
        """Route actor messages: episode stats to telemetry, errors kept as causes of death."""
        while True:
            try:
                kind, actor, payload = self.handles.messages.get_nowait()
            except queue.Empty:
                return
            if kind == "episodes":
                self.tele.add_episodes(payload)
            elif kind == "error":
                self.errors[actor] = payload

    def check(self, min_interval_s: float = 0.25) -> None:
        """Replace dead or hung actors (rate-limited: cheap enough for every loop turn)."""
        now = time.monotonic()
        if now - self.last_check < min_interval_s:
            return
        self.last_check = now
        wall_ns = time.time_ns()
        for i, p in enumerate(self.procs):
            if (
                i in self.pending_ready
                and int(self.handles.counters[i, ACTOR_UNROLLS]) > self.pending_ready[i][1]
            ):
                spawned, _ = self.pending_ready.pop(i)
                self.on_event({"event": "actor_ready", "actor": i, "since_spawn_s": now - spawned})
            silent_s, timeout_s = self._silence(i, wall_ns)
            if p.exitcode is not None:
                self.drain()
                cause = describe_exit(p.exitcode)
                if i in self.errors:
                    cause += ": " + self.errors.pop(i).strip().splitlines()[-1]
                self._replace(i, cause, p.exitcode)
            elif silent_s > timeout_s:
                p.kill()
                p.join(timeout=5)
                self._replace(i, f"no heartbeat for {silent_s:.0f} s (hung); killed", p.exitcode)

    def _silence(self, i: int, wall_ns: int) -> tuple[float, float]:
        """Seconds actor ``i`` has been silent, and the silence that means it hangs. Before its
        first beat the process is still spawning and importing (seconds on a busy box), so it
        gets STARTUP_GRACE_S at least: a short ``actor_timeout_s`` can't crash-loop it."""
        beat_ns = int(self.handles.counters[i, ACTOR_HEARTBEAT_NS])
        if beat_ns > 0:
            return (wall_ns - beat_ns) / 1e9, self.cfg.actor_timeout_s
        silent_s = (wall_ns - self.spawned_ns[i]) / 1e9
        return silent_s, max(self.cfg.actor_timeout_s, STARTUP_GRACE_S)

    def _replace(self, i: int, cause: str, exitcode: int | None) -> None:
        t0 = time.monotonic()
        if self.cfg.bounded_lag is not None:
            raise RuntimeError(
                f"actor-{i} {cause}. bounded_lag runs are deterministic by construction and "
                "can't survive a restart. Fix: rerun, or drop bounded_lag for fault tolerance."
            )
        self.restarts += 1
        check_restart_budget(self.cfg, i, cause, self.restarts)
        reclaimed = self.slots.reclaim(i, self.ctx.Queue(), self.ctx.Queue())
        seed = replacement_seed(self.cfg, self.seed_salt, self.restarts)
        self._spawn(i, seed)
        self.on_event(
            {
                "event": "actor_replaced",
                "actor": i,
                "cause": cause,
                "exitcode": exitcode,
                "slots_reclaimed": reclaimed,
                "restart": self.restarts,
                "new_pid": self.procs[i].pid,
                "replace_s": time.monotonic() - t0,
            }
        )

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the actors to leave (after ``handles.stop``), draining their messages. An
        actor that has not written its first unroll is stopped at once: it is still importing
        or building its envs (minutes for a large ``envs_per_actor``) and would notice
        ``stop`` only after that; it has no work to finish and has put nothing on a queue."""
        for i, (_, unrolls) in self.pending_ready.items():
            p = self.procs[i]
            if p is not None and p.is_alive():
                if int(self.handles.counters[i, ACTOR_UNROLLS]) == unrolls:
                    p.terminate()
        stop_processes(self.procs, self.drain, timeout)
