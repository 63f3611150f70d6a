"""IMPALA: asynchronous CPU actors, a shared-memory trajectory ring, a V-trace learner.

Top to bottom: ``train`` builds the learner (``build_learner``: model, optimizer, schedule),
the data path (``DataPath.build``: ring, parameter store, actors, batcher) and the reporting
(``Reporter.build``: telemetry, metrics, checkpoints, health warnings); then ``learn`` repeats
get a batch, ``update``, publish, log and checkpoint until ``total_frames``. Every exit path
saves a checkpoint and closes the data path: no actor process or shared memory is left behind.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from impala_gpu.acting.actor import IDLE_NS, STEPS, ActorHandles
from impala_gpu.acting.pool import ActorPool
from impala_gpu.calibration import measured_alternatives
from impala_gpu.channels.params import ParamStore
from impala_gpu.channels.ring import SlotManager, TrajectoryRing, ring_spec
from impala_gpu.config import Config, fresh_batch_size, to_container
from impala_gpu.envs import EnvSpec, env_spec
from impala_gpu.learning import distributed
from impala_gpu.learning.batcher import Batch, Batcher
from impala_gpu.learning.learner import (
    STAT_NAMES,
    Learner,
    LearnerState,
    build_learner,
    sgd_steps,
)
from impala_gpu.reporting import health
from impala_gpu.reporting.checkpoint import (
    Checkpointer,
    CheckpointPolicy,
    atomic_torch_save,
    count_lines,
    load_checkpoint,
    rng_state,
    set_rng_state,
    truncate_lines,
)
from impala_gpu.reporting.health import HealthWatch
from impala_gpu.reporting.logger import MetricsLogger
from impala_gpu.reporting.progress import Progress
from impala_gpu.reporting.summary import print_summary
from impala_gpu.reporting.telemetry import Telemetry
from impala_gpu.reporting.tuning import diagnose
from impala_gpu.speed import allocator, learner_threads
from impala_gpu.validate import ConfigError, resolve_device, resolve_num_slots, validate_config


def train(cfg: Config, run_dir: str | Path, sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train with IMPALA (or resume, when ``cfg.resume`` names a checkpoint). Returns the last
    logged metrics."""
    rdv = distributed.rendezvous(cfg)
    if rdv is not None and not rdv.leader:
        distributed.follower_main(rdv, cfg)  # a torchrun rank > 0: trains on its shares only
        return {}
    validate_config(cfg)
    device = resolve_device(cfg.device)
    if rdv is not None:
        device = distributed.learner_device(device, rdv.rank)
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
    torch.set_num_threads(threads)
    learner = build_learner(cfg, spec, device)
    tele = Telemetry(STAT_NAMES + tuple(learner.grad_names), device.type == "cuda")
    resumed = {}
    if cfg.resume:
        resumed = restore(
            cfg.resume, learner.model, learner.optimizer, learner.scheduler, learner.state, tele
        )
        truncate_lines(run_dir / "metrics.jsonl", resumed["metrics_lines"])
    reporter = Reporter.build(cfg, run_dir, sweep, tele, learner.state, resumed)
    data = None
    try:
        if rdv is not None:
            learner.parallel = distributed.DataParallel(rdv, cfg, spec, learner, device)
        data = DataPath.build(cfg, spec, device, learner, reporter)
        reporter.announce_start(cfg, device, threads)
        data.start()
        try:
            last = learn(cfg, learner, data, reporter, spec.frames_per_step)
        except KeyboardInterrupt:
            path = save_checkpoint(cfg, learner, reporter)  # Ctrl-C / SIGTERM keeps the work
            save_weights(learner.model, run_dir / "model.pt")
            reporter.summarize(path, interrupted=True)
            raise
        path = save_checkpoint(cfg, learner, reporter)
        save_weights(learner.model, run_dir / "model.pt")
        reporter.summarize(path)
        return last
    finally:
        if data is not None:
            data.close()
        if learner.parallel is not None:
            learner.parallel.close()
        reporter.logger.close()


@dataclass
class DataPath:
    """Actors -> ring -> batcher, and weights back through the parameter store."""

    ring: TrajectoryRing
    slots: SlotManager
    params: ParamStore
    handles: ActorHandles
    pool: ActorPool  # or acting.ray_pool.RayActorPool (runtime=ray): the same interface
    batcher: Batcher

    @classmethod
    def build(
        cls, cfg: Config, spec: EnvSpec, device: torch.device, learner: Learner, reporter: Reporter
    ) -> DataPath:
        state = learner.state
        ctx = mp.get_context(cfg.start_method)
        ring = TrajectoryRing(
            ring_spec(cfg, spec, num_slots=resolve_num_slots(cfg)),
            cfg.num_actors,
            ctx,
        )
        slots = SlotManager(ring)
        bounded = cfg.bounded_lag is not None
        params = ParamStore.for_model(
            learner.model, history=(cfg.bounded_lag + 2) if bounded else 1
        )
        params.publish(learner.model, version=state.version)
        handles = ActorHandles.create(ctx, ring, params, cfg.num_actors, state.version)
        # A resumed run must not replay the trajectories it already learned from (salt).
        pool_cls = ActorPool
        if cfg.runtime == "ray":
            from impala_gpu.acting.ray_pool import RayActorPool as pool_cls
        pool = pool_cls(
            ctx, cfg, spec, handles, slots, state.resumes, reporter.tele, reporter.on_event
        )
        fresh = fresh_batch_size(cfg)  # the rest of each batch is replayed
        batcher = Batcher(
            ring,
            slots,
            cfg.batch_size,
            device,
            learner_version=lambda: state.version,
            max_policy_lag=cfg.max_policy_lag,
            ordered_unrolls_per_batch=fresh // cfg.envs_per_actor if bounded else 0,
            envs_per_actor=cfg.envs_per_actor,
            fresh_batch_size=fresh,
            replay_capacity=cfg.replay.capacity,
            seed=cfg.seed,
        )
        return cls(ring, slots, params, handles, pool, batcher)

    def start(self) -> None:
        self.pool.start()
        self.batcher.start()

    def close(self) -> None:
        """Stop the actors and the batcher and free the ring. Idempotent; on every exit path."""
        self.handles.stop.set()
        if self.batcher.is_alive():
            self.batcher.stop()
        self.pool.join()
        self.handles.episodes.cancel_join_thread()
        self.ring.close()


@dataclass
class Reporter:
    """Where the run reports: telemetry, the metrics and events files (and W&B), checkpoints,
    network-health warnings."""

    tele: Telemetry
    logger: MetricsLogger
    checkpointer: Checkpointer
    health_watch: HealthWatch
    state: LearnerState

    @classmethod
    def build(
        cls,
        cfg: Config,
        run_dir: Path,
        sweep: dict[str, Any] | None,
        tele: Telemetry,
        state: LearnerState,
        resumed: dict,
    ) -> Reporter:
        logger = MetricsLogger(run_dir, cfg, sweep, resume_id=resumed.get("wandb_id"))
        ck = cfg.checkpoint
        checkpointer = Checkpointer(
            run_dir,
            CheckpointPolicy(ck.every_frames, ck.every_minutes, ck.keep_last),
            frames=state.frames,
        )
        checkpointer.best_return = resumed.get("best_return", float("-inf"))
        return cls(tele, logger, checkpointer, HealthWatch.from_config(cfg.health), state)

    def on_event(self, event: dict) -> None:
        """An actor-pool event: into events.jsonl, and replacements onto the console."""
        self.logger.event({**event, "frames": self.state.frames, "updates": self.state.version})
        if event["event"] == "actor_replaced":
            lost = (
                f"{event['unrolls_dropped']} in-flight unrolls dropped"
                if "unrolls_dropped" in event
                else f"{event['slots_reclaimed']} slots reclaimed"
            )
            n, cause = event["restart"], event["cause"]
            _say(f"actor-{event['actor']} {cause}; replaced (restart {n}, {lost})")

    def announce_start(self, cfg: Config, device: torch.device, threads: int) -> None:
        self.logger.event(
            {
                "event": "start",
                "device": str(device),
                "learner_threads": threads,
                "precision": cfg.precision,
                "compile": cfg.compile,
                "allocator": allocator(),
                "actors": cfg.num_actors,
                "envs_per_actor": cfg.envs_per_actor,
                "runtime": cfg.runtime,
            }
        )
        _say(
            f"learner on {device} ({threads} threads, {cfg.precision}"
            f"{', compiled' if cfg.compile else ''}, {allocator()} malloc); {cfg.num_actors} "
            f"actors x {cfg.envs_per_actor} envs, T={cfg.unroll_length}, B={cfg.batch_size}"
        )

    def warn_health(self, m: dict[str, Any]) -> None:
        warn_health(self.health_watch, self.logger, m, self.state.version)

    def summarize(self, checkpoint: Path, interrupted: bool = False) -> None:
        """The end-of-run summary (``reporting.summary``), after the final checkpoint."""
        state = self.state
        print_summary(
            self.logger,
            self.tele,
            state.frames,
            time.perf_counter() - state.start,
            checkpoint,
            self.checkpointer.best_return,
            interrupted,
        )


def warn_health(watch: HealthWatch, logger: MetricsLogger, m: dict[str, Any], updates: int) -> None:
    """Judge one metrics line's health; record and print each new warning."""
    for text in watch.check(m, updates):
        logger.event({"event": "health_warning", "message": text, "frames": m["frames"]})
        _say(f"warning: {text}")


def _say(text: str) -> None:
    print(f"impala_gpu: {text}", file=sys.stderr, flush=True)


def save_checkpoint(cfg: Config, learner: Learner, reporter: Reporter) -> Path:
    state, tele = learner.state, reporter.tele
    checkpoint = {
        "model": learner.model.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "scheduler": learner.scheduler.state_dict(),
        "version": state.version,
        "frames": state.frames,
        "elapsed_s": time.perf_counter() - state.start,
        "resumes": state.resumes,
        "rng": rng_state(),
        "config": to_container(cfg),
        "metrics_lines": count_lines(reporter.logger.path),
        "wandb_id": reporter.logger.wandb_id,
        **tele.episode_record(),
    }
    return reporter.checkpointer.save(checkpoint, state.frames, tele.mean_return())


def restore(resume: str, model, optimizer, scheduler, state: LearnerState, tele: Telemetry) -> dict:
    """Load a checkpoint into the learner's objects; returns the checkpoint dict."""
    path, ckpt = load_checkpoint(resume, set_aside=True)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ConfigError(
            f"checkpoint {path} holds a different model than this config builds "
            f"(model.*/env.* changed?): {str(e).splitlines()[0]} Fix: resume with the config the "
            "run was trained with (omit model/env overrides)."
        ) from e
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    set_rng_state(ckpt["rng"])
    state.version, state.frames = ckpt["version"], ckpt["frames"]
    state.start = time.perf_counter() - ckpt["elapsed_s"]
    state.resumes = ckpt["resumes"] + 1
    tele.load_episode_record(ckpt)
    print(f"impala_gpu: resumed from {path} at {state.frames:,} frames (update {state.version})")
    return ckpt


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Final weights alone (state_dict on CPU), written atomically."""
    atomic_torch_save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)


HINT_AFTER_S = 20.0  # the tuning hint comes from the first log window after this


def learn(
    cfg: Config, learner: Learner, data: DataPath, reporter: Reporter, frames_per_step: int
) -> dict[str, Any]:
    """The train loop: get a batch, update, publish, log, checkpoint. Stops at ``total_frames``,
    ``max_seconds`` or ``target_return``. Returns the last logged metrics."""
    state, tele, batcher = learner.state, reporter.tele, data.batcher
    steps_per_update = fresh_batch_size(cfg) * cfg.unroll_length  # replayed steps are not new
    frames_per_update = steps_per_update * frames_per_step
    bar = Progress(cfg.total_frames, enabled=cfg.progress, target_return=cfg.target_return)
    run_start = state.run_start = time.perf_counter()
    deadline = run_start + cfg.max_seconds if cfg.max_seconds > 0 else float("inf")
    last_log, last = run_start, {}
    try:
        while state.frames < cfg.total_frames and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            got = batcher.get(timeout=1.0)
            t1 = time.perf_counter()
            tele.window.wait_s += t1 - t0
            data.pool.check()
            if got is None:
                continue
            k, batch = got
            # Decided once, before the step: health is measured on the batch still in hand.
            log_now = _log_due(cfg, state, last_log, deadline, frames_per_update)
            stats_np = update(cfg, learner, batch, tele, measure_health=log_now)
            lags = (state.version - batch.versions).numpy()
            replayed = batch.replayed.numpy()
            batcher.done(k)
            if learner.nonfinite.tripped(stats_np):
                # The skipped updates never touched the weights: save them, then stop.
                raise learner.nonfinite.error(save_checkpoint(cfg, learner, reporter))
            learner.scheduler.step()
            state.version += 1
            state.frames += frames_per_update
            tele.add_update(
                stats_np, lags[~replayed], frames_per_update, steps_per_update, lags[replayed]
            )
            if state.version % cfg.publish_interval == 0:
                data.params.publish(learner.model, state.version)

            now = time.perf_counter()
            done = state.frames >= cfg.total_frames or now >= deadline or solved(cfg, tele, bar)
            if log_now or done:
                last = log_metrics(cfg, learner, data, reporter, frames_per_step, final=done)
                bar.update(state.frames, last)
                last_log = now
            if done:
                break
            if reporter.checkpointer.due(state.frames):
                save_checkpoint(cfg, learner, reporter)
    except KeyboardInterrupt:
        bar.note("interrupted: saving a checkpoint, stopping actors, freeing shared memory")
        raise
    finally:
        bar.close()
    return last


def update(
    cfg: Config, learner: Learner, batch: Batch, tele: Telemetry, measure_health: bool
) -> np.ndarray:
    """One train step on ``batch``; returns its stats (STAT_NAMES order, then per-layer grad
    norms). Times the step for the busy fraction (on CUDA, with events)."""
    t1 = time.perf_counter()
    model, share, grad_scale, par = learner.model, batch, 1.0, learner.parallel
    timer = _GpuTimer() if batch.obs.is_cuda else None
    if par is not None:  # learners > 1: this rank trains on its share, DDP averages gradients
        model, (share, grad_scale) = par.model, par.share(batch)
    stats = sgd_steps(
        model, learner.optimizer, share, cfg.algo, cfg.precision, learner.grad_groups, grad_scale
    )
    if par is not None:
        stats = distributed.mean_over_ranks(stats)
    if timer is not None:
        tele.window.gpu_events.append(timer.stop())
    stats_np = stats.cpu().numpy()  # the one host-device sync per update
    tele.window.busy_s += time.perf_counter() - t1
    if cfg.health.enabled and measure_health:
        learner.state.health = health.measure(
            learner.model, batch.obs, batch.first, batch.core_state, cfg.health.max_states
        )
    return stats_np


def solved(cfg: Config, tele: Telemetry, bar: Progress) -> bool:
    """``target_return`` reached: the run ends as if at ``total_frames``."""
    if not tele.reached(cfg.target_return):
        return False
    bar.note(f"target_return={cfg.target_return:g} reached (mean of the last 100 episodes)")
    return True


def _log_due(
    cfg: Config, state: LearnerState, last_log: float, deadline: float, frames_per_update: int
) -> bool:
    """Whether the update in progress ends with a metrics line."""
    now = time.perf_counter()
    last_update = state.frames + frames_per_update >= cfg.total_frames or now >= deadline
    return now - last_log >= cfg.log_interval_s or last_update


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
    reporter: Reporter,
    frames_per_step: int,
    final: bool = False,
) -> dict[str, Any]:
    """One metrics line: the telemetry window, the actors' counters, the ring, health."""
    state, tele = learner.state, reporter.tele
    data.pool.drain()
    window_s = max(time.perf_counter() - tele.window.start, 1e-9)
    m, hist = tele.flush()
    counters = data.handles.counters.numpy().copy()
    actor_steps = int(counters[:, STEPS].sum())
    idle_ns = counters[:, IDLE_NS].astype(np.float64)
    idle_prev = state.actor_idle_ns if state.actor_idle_ns is not None else np.zeros_like(idle_ns)
    batcher = data.batcher
    m.update(
        frames=state.frames,
        agent_steps=state.frames // frames_per_step,
        updates=state.version,
        elapsed_s=time.perf_counter() - state.start,
        actor_steps=actor_steps,
        actor_steps_per_s=(actor_steps - state.actor_steps) / window_s,
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
    m.update(state.health)
    reporter.warn_health(m)
    state.actor_steps, state.actor_idle_ns = actor_steps, idle_ns
    state.logs += 1
    # Once: from the first window after start-up and warm-up, or the last one of a short run.
    warm = state.logs >= 2 and time.perf_counter() - state.run_start >= HINT_AFTER_S
    if not state.hinted and (warm or final):
        state.hinted = True
        cores, device = os.cpu_count() or 1, batcher.device.type
        alternatives = measured_alternatives(cfg, batcher.device)
        hint = diagnose(m, cfg, cores, device, allocator(), alternatives)
        reporter.logger.event(hint.as_event())
        _say(hint.describe())
    reporter.logger.log(m, hist)
    reporter.logger.write_json("lag_hist.json", tele.lag_histogram())
    return m
