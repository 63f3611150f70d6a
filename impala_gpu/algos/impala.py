"""IMPALA: asynchronous CPU actors, a shared-memory trajectory ring, a V-trace learner.

Top to bottom: ``train`` builds the learner (``build_learner``: model, optimizer, schedule, a
resumed run's state), the reporting (``lifecycle.run.Run``: metrics, checkpoints, health
warnings, the stop rule) and the data path (``DataPath.build``: ring, parameter store, actors,
batcher); then ``learn`` repeats get a batch, ``update``, publish, log and checkpoint until
the stop rule ends the run. Every exit path saves a checkpoint and closes the data path: no
actor process or shared memory is left behind.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import Tensor

from impala_gpu.acting.actor import ACTOR_IDLE_NS, ACTOR_STEPS, ActorHandles
from impala_gpu.acting.pool import ActorPool, Pool, PoolSetup
from impala_gpu.calibration import cpu_model, measured_alternatives
from impala_gpu.calibration.hint import diagnose
from impala_gpu.channels.params import ParamStore
from impala_gpu.channels.publisher import ParamPublisher
from impala_gpu.channels.ring import SlotManager, TrajectoryRing, ring_spec
from impala_gpu.config import (
    Config,
    frames_per_update,
    fresh_batch_size,
    resolve_device,
    resolve_num_slots,
    steps_per_update,
)
from impala_gpu.envs import EnvSpec, env_spec
from impala_gpu.learning import distributed
from impala_gpu.learning.batcher import Batch, Batcher
from impala_gpu.learning.learner import STAT_NAMES, Learner, build_learner
from impala_gpu.lifecycle.run import Resume, Run, StopRule, say
from impala_gpu.speed.tcmalloc import allocator
from impala_gpu.speed.threads import learner_threads
from impala_gpu.telemetry import health
from impala_gpu.telemetry.window import Telemetry
from impala_gpu.validate import require_resolved


def train(cfg: Config, run_dir: str | Path, sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train with IMPALA (or resume, when ``cfg.resume`` names a checkpoint). Returns the last
    logged metrics."""
    rdv = distributed.rendezvous(cfg)
    if rdv is not None and not rdv.leader:
        distributed.follower_main(rdv, cfg)  # a torchrun rank > 0: trains on its shares only
        return {}
    require_resolved(cfg)  # the rest is the caller's to check: the CLI's validate_config
    device = resolve_device(cfg.device)
    if rdv is not None:
        device = distributed.learner_device(device, rdv.rank)
    distributed.use_device(device)  # timers and telemetry read the current CUDA device
    spec = env_spec(cfg.env)
    run_dir = Path(run_dir)
    torch.manual_seed(cfg.seed)
    threads = learner_threads(
        device.type,
        cfg.precision,
        os.cpu_count() or 1,
        cfg.num_actors,
        cfg.learner_threads,
        rdv.world if rdv else 1,
    )
    if cfg.learner_shards > 1:
        threads = 1  # per shard: learning.shards
    torch.set_num_threads(threads)
    resume = Resume.read(cfg.resume) if cfg.resume else None
    parallel = None
    if rdv is not None:  # learners > 1: DDP over the ranks, rank 0 scatters each batch
        parallel = functools.partial(distributed.DataParallel, rdv, cfg, spec, device)
    learner = build_learner(cfg, spec, device, resume.load if resume else None, parallel)
    run = data = None
    try:
        tele = Telemetry(STAT_NAMES + tuple(learner.grad_names), device.type == "cuda")
        run = Run.open(cfg, run_dir, sweep, tele, resume)
        data = DataPath.build(cfg, spec, device, learner, run)
        announce_start(run, cfg, device, threads)
        data.start()
        try:
            last = learn(cfg, learner, data, run, spec.frames_per_step)
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM keeps the work
            run.end(
                run.save_checkpoint(learner.checkpoint_state()), learner.model, interrupted=True
            )
            raise
        run.end(run.save_checkpoint(learner.checkpoint_state()), learner.model)
        return last
    finally:
        if data is not None:
            data.close()
        learner.close()
        if run is not None:
            run.close()


@dataclass
class DataPath:
    """Actors -> ring -> batcher, and weights back through the parameter store."""

    ring: TrajectoryRing
    slots: SlotManager
    params: ParamStore
    handles: ActorHandles
    pool: Pool  # acting.pool.ActorPool, or acting.ray_pool.RayActorPool (runtime=ray)
    batcher: Batcher
    publisher: ParamPublisher  # the per-update publishes, written into ``params`` by a thread

    @classmethod
    def build(
        cls, cfg: Config, spec: EnvSpec, device: torch.device, learner: Learner, run: Run
    ) -> DataPath:
        ctx = mp.get_context(cfg.start_method)
        ring = TrajectoryRing(
            ring_spec(cfg, spec, num_slots=resolve_num_slots(cfg)),
            cfg.num_actors,
            ctx,
        )
        try:
            return cls._build(cfg, spec, device, learner, run, ctx, ring)
        except BaseException:
            # A Ctrl-C here (handing out a large ring's slots takes seconds): the free queues
            # hold more than their pipes take, with no actor to read them, and exit would wait
            # on their feeder threads for good. close() cancels that wait.
            ring.close()
            raise

    @classmethod
    def _build(
        cls,
        cfg: Config,
        spec: EnvSpec,
        device: torch.device,
        learner: Learner,
        run: Run,
        ctx: mp.context.BaseContext,
        ring: TrajectoryRing,
    ) -> DataPath:
        progress = run.progress
        slots = SlotManager(ring)
        bounded = cfg.bounded_lag is not None
        params = ParamStore.for_model(
            learner.model, history=(cfg.bounded_lag + 2) if bounded else 1
        )
        params.publish(learner.model, version=progress.version)  # synchronous: actors start from it
        handles = ActorHandles.create(ctx, ring, params, cfg.num_actors, progress.version)
        # A resumed run must not replay the trajectories it already learned from (salt).
        setup = PoolSetup(cfg, spec, handles, slots, progress.resumes, run.tele, run.on_event)
        if cfg.runtime == "ray":
            from impala_gpu.acting.ray_pool import RayActorPool

            pool: Pool = RayActorPool(setup)
        else:
            pool = ActorPool(ctx, setup)
        fresh = fresh_batch_size(cfg)  # the rest of each batch is replayed
        batcher = Batcher(
            ring,
            slots,
            cfg.batch_size,
            device,
            learner_version=lambda: progress.version,
            max_policy_lag=cfg.max_policy_lag,
            ordered_unrolls_per_batch=fresh // cfg.envs_per_actor if bounded else 0,
            envs_per_actor=cfg.envs_per_actor,
            fresh_batch_size=fresh,
            replay_capacity=cfg.replay.capacity,
            seed=cfg.seed,
        )
        publisher = ParamPublisher(params, device)  # bounded lag (history > 1): every version
        return cls(ring, slots, params, handles, pool, batcher, publisher)

    def start(self) -> None:
        self.pool.start()
        self.batcher.start()

    def close(self) -> None:
        """Stop the actors and the batcher, free the ring, write the last published weights and
        join the publisher thread (re-raising its error). Idempotent; on every exit path."""
        self.handles.stop.set()
        try:
            if self.batcher.is_alive():
                self.batcher.stop()
            self.pool.join()
            self.handles.messages.cancel_join_thread()
            self.ring.close()
        finally:  # last, and whatever happened above: no publisher thread outlives the run
            self.publisher.close()


def announce_start(run: Run, cfg: Config, device: torch.device, threads: int) -> None:
    run.logger.event(
        {
            "event": "start",
            "device": str(device),
            "learner_threads": threads,
            "learner_shards": cfg.learner_shards,
            "precision": cfg.precision,
            "compile": cfg.compile,
            "allocator": allocator(),
            "actors": cfg.num_actors,
            "envs_per_actor": cfg.envs_per_actor,
            "runtime": cfg.runtime,
            "cpu_model": cpu_model(),  # every figure a run gives is this CPU's
        }
    )
    say(
        f"learner on {device} ({_threads_text(cfg, threads)}, {cfg.precision}"
        f"{', compiled' if cfg.compile else ''}, {allocator()} malloc); {cfg.num_actors} "
        f"actors x {cfg.envs_per_actor} envs, T={cfg.unroll_length}, B={cfg.batch_size}"
    )


def _threads_text(cfg: Config, threads: int) -> str:
    if cfg.learner_shards > 1:
        return f"{cfg.learner_shards} shard threads"
    return f"{threads} threads"


@dataclass
class LogBook:
    """What one metrics line leaves for the next (this process only; not checkpointed)."""

    run_start: float  # when this process's train loop started
    actor_steps: int = 0  # the actors' step count at the last line
    actor_idle_ns: np.ndarray | None = None  # each actor's idle time at the last line
    logs: int = 0  # metric lines written by this process
    hinted: bool = False  # the tuning hint is given once


HINT_AFTER_S = 20.0  # the tuning hint comes from the first log window after this


def learn(
    cfg: Config, learner: Learner, data: DataPath, run: Run, frames_per_step: int
) -> dict[str, Any]:
    """The train loop: get a batch, update, publish, log, checkpoint, until the stop rule
    (``total_frames``, ``max_seconds``, ``target_return``). Returns the last logged metrics."""
    progress, tele, batcher = run.progress, run.tele, data.batcher
    update_steps, update_frames = steps_per_update(cfg), frames_per_update(cfg, frames_per_step)
    bar = run.progress_bar()
    book = LogBook(run_start=time.perf_counter())
    stop = StopRule(cfg, bar, start=book.run_start)
    last_log, last = book.run_start, {}
    late = LateStats()

    def record(read: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        """One update's stats into the telemetry, once they are on the host."""
        if read is None:
            return
        stats_np, lags, replayed = read
        if learner.nonfinite.tripped(stats_np):
            # The skipped updates never touched the weights: save them, then stop.
            raise learner.nonfinite.error(run.save_checkpoint(learner.checkpoint_state()))
        tele.add_update(stats_np, lags[~replayed], update_frames, update_steps, lags[replayed])

    try:
        while stop.running(progress.frames, time.perf_counter()):
            t0 = time.perf_counter()
            got = batcher.get(timeout=1.0)
            t1 = time.perf_counter()
            tele.window.wait_s += t1 - t0
            data.pool.check()
            if got is None:
                continue
            k, batch = got
            # Decided once, before the step: health is measured on the batch still in hand.
            log_now = _log_due(cfg, stop, progress.frames + update_frames, last_log)
            stats = update(learner, batch, tele)
            if cfg.health.enabled and log_now:
                tele.health = health.measure(
                    learner.model, batch.obs, batch.first, batch.core_state, cfg.health.max_states
                )
            lags = (progress.version - batch.versions).numpy()
            batcher.done(k)
            learner.scheduler.step()
            progress.version += 1
            progress.frames += update_frames
            record(late.swap(stats, lags, batch.replayed.numpy()))
            if progress.version % cfg.publish_interval == 0:
                data.publisher.publish(learner.model, progress.version)  # no device sync

            # Episodes enter the telemetry here only, so the line a target_return stop logs
            # shows the same last-100 mean the stop was judged on.
            data.pool.drain()
            now = time.perf_counter()
            done = stop.done(progress.frames, tele, now)
            if log_now or done:
                record(late.drain())
                last = log_metrics(cfg, learner, data, run, book, frames_per_step, final=done)
                bar.update(progress.frames, last)
                last_log = now
            if done:
                break
            if run.checkpointer.due(progress.frames):
                run.save_checkpoint(learner.checkpoint_state())
    except KeyboardInterrupt:
        bar.note("interrupted: saving a checkpoint, stopping actors, freeing shared memory")
        raise
    finally:
        bar.close()
    return last


def update(learner: Learner, batch: Batch, tele: Telemetry) -> Tensor:
    """``learner.update`` on ``batch``, timed for the busy fraction (on CUDA, also with
    events); its stats stay on the device (``LateStats`` reads them)."""
    t1 = time.perf_counter()
    timer = _GpuTimer() if batch.obs.is_cuda else None
    stats = learner.update(batch)
    if timer is not None:
        tele.window.gpu_events.append(timer.stop())
    tele.window.busy_s += time.perf_counter() - t1
    return stats


@dataclass
class LateStats:
    """An update's stats read one update late: by the time the train loop has queued update
    n, update n-1 has (nearly) finished, so reading its stats does not stall the device."""

    pending: tuple[Tensor, np.ndarray, np.ndarray] | None = None  # stats, fresh/replayed lags

    def swap(
        self, stats: Tensor, lags: np.ndarray, replayed: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Hold this update's stats; return the previous update's, on the host."""
        previous = self.drain()
        self.pending = (stats, lags, replayed)
        return previous

    def drain(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The held update's stats on the host (None if none is held)."""
        if self.pending is None:
            return None
        stats, lags, replayed = self.pending
        self.pending = None
        return stats.cpu().numpy(), lags, replayed


def _log_due(cfg: Config, stop: StopRule, frames_after: int, last_log: float) -> bool:
    """Whether the update in progress (which brings the run to ``frames_after``) ends with a
    metrics line: the log interval is up, or it is the last update."""
    now = time.perf_counter()
    return now - last_log >= cfg.log_interval_s or not stop.running(frames_after, now)


class _GpuTimer:
    """CUDA events around one train step: the GPU's own busy time, read at log time."""

    def __init__(self):
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.begin.record()

    def stop(self):
        self.end.record()
        return self.begin, self.end


def log_metrics(
    cfg: Config,
    learner: Learner,
    data: DataPath,
    run: Run,
    book: LogBook,
    frames_per_step: int,
    final: bool = False,
) -> dict[str, Any]:
    """One metrics line: the telemetry window, the actors' counters, the ring, health."""
    progress, tele = run.progress, run.tele
    window_s = max(time.perf_counter() - tele.window.start, 1e-9)
    m, hist = tele.flush()
    counters = data.handles.counters.numpy().copy()
    actor_steps = int(counters[:, ACTOR_STEPS].sum())
    idle_ns = counters[:, ACTOR_IDLE_NS].astype(np.float64)
    idle_prev = book.actor_idle_ns if book.actor_idle_ns is not None else np.zeros_like(idle_ns)
    batcher = data.batcher
    m.update(
        frames=progress.frames,
        agent_steps=progress.frames // frames_per_step,
        updates=progress.version,
        elapsed_s=progress.elapsed_s(),
        actor_steps=actor_steps,
        actor_steps_per_s=(actor_steps - book.actor_steps) / window_s,
        actor_idle=float(np.mean(idle_ns - idle_prev) / 1e9 / window_s),
        ring_occupancy=batcher.ring.occupancy(),
        dropped_stale=batcher.dropped_stale,
        actor_restarts=data.pool.restarts,
        unrolls_dropped=data.pool.unrolls_dropped,
        stale_slots_dropped=batcher.slots.stale_dropped,
        batcher_gather_s=batcher.gather_s,
        lr=learner.optimizer.param_groups[0]["lr"],
        time=time.time(),
    )
    m.update(tele.health)
    run.warn_health(m)
    book.actor_steps, book.actor_idle_ns = actor_steps, idle_ns
    book.logs += 1
    # Once: from the first window after start-up and warm-up, or the last one of a short run.
    warm = book.logs >= 2 and time.perf_counter() - book.run_start >= HINT_AFTER_S
    if not book.hinted and (warm or final):
        book.hinted = True
        cores, device = os.cpu_count() or 1, batcher.device.type
        alternatives = measured_alternatives(cfg, batcher.device)
        hint = diagnose(m, cfg, cores, device, allocator(), alternatives)
        run.logger.event(hint.as_event())
        say(hint.describe())
    run.write(m, hist)
    return m
