"""IMPALA: asynchronous CPU actors, a shared-memory trajectory ring, a V-trace learner.

The whole loop, top to bottom: ``train`` builds the ring, the parameter store and the actors,
then runs ``learn`` until ``total_frames``; every exit path stops and joins the actors.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from impala_gpu import health
from impala_gpu.actor import IDLE_NS, STEPS, ActorHandles
from impala_gpu.checkpoint import (
    Checkpointer,
    CheckpointPolicy,
    atomic_torch_save,
    count_lines,
    resolve_checkpoint,
    rng_state,
    set_rng_state,
    truncate_lines,
)
from impala_gpu.config import Config, to_container
from impala_gpu.envs import env_spec
from impala_gpu.health import HealthWatch
from impala_gpu.learner import (
    STAT_NAMES,
    Batcher,
    make_lr_scheduler,
    make_optimizer,
    train_step,
)
from impala_gpu.logger import MetricsLogger
from impala_gpu.models import build_model
from impala_gpu.params import ParamStore
from impala_gpu.progress import Progress
from impala_gpu.ring import RingSpec, SlotManager, TrajectoryRing, numpy_to_torch_dtype
from impala_gpu.speed import allocator, compile_model, default_learner_threads
from impala_gpu.supervisor import ActorPool
from impala_gpu.telemetry import Telemetry
from impala_gpu.tuning import diagnose
from impala_gpu.validate import ConfigError, resolve_device, resolve_num_slots, validate_config


def train(cfg: Config, run_dir: str | Path, sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train with IMPALA (or resume, when ``cfg.resume`` names a checkpoint). Returns the last
    logged metrics."""
    validate_config(cfg)
    device = resolve_device(cfg.device)
    spec = env_spec(cfg.env)
    run_dir = Path(run_dir)
    torch.manual_seed(cfg.seed)
    threads = cfg.learner_threads or default_learner_threads(
        device.type, cfg.precision, os.cpu_count() or 1, cfg.num_actors
    )
    torch.set_num_threads(threads)

    model = build_model(spec.obs_shape, spec.num_actions, cfg.model).to(device)
    optimizer = make_optimizer(model, cfg.algo)
    compile_model(model, cfg.compile)
    frames_per_update = cfg.batch_size * cfg.unroll_length * spec.frames_per_step
    scheduler = make_lr_scheduler(optimizer, cfg, frames_per_update)
    grad_names, grad_groups = health.grad_groups(model) if cfg.health.enabled else ([], None)
    tele = Telemetry(STAT_NAMES + tuple(grad_names), device.type == "cuda")
    st = LoopState()
    resumed = restore(cfg.resume, model, optimizer, scheduler, st, tele) if cfg.resume else {}
    if resumed:
        truncate_lines(run_dir / "metrics.jsonl", resumed["metrics_lines"])

    ctx = mp.get_context(cfg.start_method)
    ring = TrajectoryRing(
        RingSpec(
            num_slots=resolve_num_slots(cfg),
            unroll_length=cfg.unroll_length,
            obs_shape=spec.obs_shape,
            obs_dtype=numpy_to_torch_dtype(spec.obs_dtype),
            num_actions=spec.num_actions,
            lstm_size=cfg.model.lstm_size if cfg.model.use_lstm else 0,
        ),
        cfg.num_actors,
        ctx,
    )
    slots = SlotManager(ring)
    bounded = cfg.bounded_lag is not None
    params = ParamStore.for_model(model, history=(cfg.bounded_lag + 2) if bounded else 1)
    params.publish(model, version=st.version)
    handles = ActorHandles.create(ctx, ring, params, cfg.num_actors, start_version=st.version)
    logger = MetricsLogger(run_dir, cfg, sweep, resume_id=resumed.get("wandb_id"))
    checkpointer = Checkpointer(
        run_dir,
        CheckpointPolicy(
            cfg.checkpoint.every_frames, cfg.checkpoint.every_minutes, cfg.checkpoint.keep_last
        ),
        frames=st.frames,
    )
    checkpointer.best_return = resumed.get("best_return", float("-inf"))

    def on_event(event: dict) -> None:
        logger.event({**event, "frames": st.frames, "updates": st.version})
        if event["event"] == "actor_replaced":
            print(
                f"impala_gpu: actor-{event['actor']} {event['cause']}; replaced "
                f"(restart {event['restart']}, {event['slots_reclaimed']} slots reclaimed)",
                file=sys.stderr,
                flush=True,
            )

    setup = {
        "event": "start",
        "device": str(device),
        "learner_threads": threads,
        "precision": cfg.precision,
        "compile": cfg.compile,
        "allocator": allocator(),
        "actors": cfg.num_actors,
        "envs_per_actor": cfg.envs_per_actor,
    }
    logger.event(setup)
    print(
        f"impala_gpu: learner on {device} ({threads} threads, {cfg.precision}"
        f"{', compiled' if cfg.compile else ''}, {allocator()} malloc); {cfg.num_actors} actors "
        f"x {cfg.envs_per_actor} envs, T={cfg.unroll_length}, B={cfg.batch_size}",
        file=sys.stderr,
        flush=True,
    )

    # A resumed run must not replay the trajectories it already learned from (salt).
    pool = ActorPool(ctx, cfg, spec, handles, slots, st.resumes, tele, on_event)

    def save_checkpoint() -> Path:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "version": st.version,
            "frames": st.frames,
            "elapsed_s": time.perf_counter() - st.start,
            "resumes": st.resumes,
            "rng": rng_state(),
            "config": to_container(cfg),
            "metrics_lines": count_lines(logger.path),
            "wandb_id": logger.wandb_id,
            "episode_returns": list(tele.episode_returns),
            "episode_lengths": list(tele.episode_lengths),
            "episodes": tele.episodes,
            "lag_counts": tele.lag_counts,
        }
        mean_return = float(np.mean(tele.episode_returns)) if tele.episode_returns else None
        return checkpointer.save(state, st.frames, mean_return)

    batcher = None
    try:
        pool.start()
        batcher = Batcher(
            ring,
            slots,
            cfg.batch_size,
            device,
            learner_version=lambda: st.version,
            max_policy_lag=cfg.max_policy_lag,
            ordered_unrolls_per_batch=cfg.batch_size // cfg.envs_per_actor if bounded else 0,
            envs_per_actor=cfg.envs_per_actor,
        )
        batcher.start()
        loop = Loop(
            cfg,
            model,
            optimizer,
            scheduler,
            tele,
            st,
            batcher,
            params,
            handles,
            pool,
            logger,
            checkpointer,
            save_checkpoint,
            spec.frames_per_step,
            grad_groups,
            HealthWatch.from_config(cfg.health),
        )
        try:
            last = learn(loop)
        except KeyboardInterrupt:
            save_checkpoint()  # Ctrl-C / SIGTERM keeps the work done so far
            save_weights(model, run_dir / "model.pt")
            raise
        save_checkpoint()
        save_weights(model, run_dir / "model.pt")
        return last
    finally:
        handles.stop.set()
        if batcher is not None:
            batcher.stop()
        pool.join()
        logger.close()
        handles.episodes.cancel_join_thread()
        ring.close()


def restore(resume: str, model, optimizer, scheduler, st: LoopState, tele: Telemetry) -> dict:
    """Load a checkpoint into the learner's objects; returns the checkpoint dict."""
    path = resolve_checkpoint(resume)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
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
    st.version, st.frames = ckpt["version"], ckpt["frames"]
    st.start = time.perf_counter() - ckpt["elapsed_s"]
    st.resumes = ckpt["resumes"] + 1
    tele.episode_returns.extend(ckpt["episode_returns"])
    tele.episode_lengths.extend(ckpt["episode_lengths"])
    tele.episodes = ckpt["episodes"]
    tele.lag_counts = np.asarray(ckpt["lag_counts"], dtype=np.int64)
    print(f"impala_gpu: resumed from {path} at {st.frames:,} frames (update {st.version})")
    return ckpt


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Final weights alone (state_dict on CPU), written atomically."""
    atomic_torch_save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)


@dataclass
class LoopState:
    """Counters the train loop carries between updates, log lines and checkpoints."""

    start: float = field(default_factory=time.perf_counter)
    version: int = 0
    frames: int = 0
    resumes: int = 0
    nonfinite_streak: int = 0
    actor_steps: int = 0
    actor_idle_ns: np.ndarray | None = None
    logs: int = 0  # metric lines written by this process
    run_start: float = 0.0  # when this process's train loop started
    hinted: bool = False
    health: dict[str, float] = field(default_factory=dict)  # last network-health measurement


@dataclass
class Loop:
    """Everything ``learn`` works with, built by ``train``."""

    cfg: Config
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    tele: Telemetry
    st: LoopState
    batcher: Batcher
    params: ParamStore
    handles: ActorHandles
    pool: ActorPool
    logger: MetricsLogger
    checkpointer: Checkpointer
    save_checkpoint: Any
    frames_per_step: int
    grad_groups: list | None  # parameters per named layer (health.grad_groups), or None
    health_watch: HealthWatch


HINT_AFTER_S = 20.0  # the tuning hint comes from the first log window after this


def learn(L: Loop) -> dict[str, Any]:
    """The train loop: wait for a batch, update, publish, log, checkpoint. Stops at
    ``total_frames`` (or ``max_seconds``)."""
    cfg, st, tele, batcher = L.cfg, L.st, L.tele, L.batcher
    steps_per_update = cfg.batch_size * cfg.unroll_length
    frames_per_update = steps_per_update * L.frames_per_step
    bar = Progress(cfg.total_frames, enabled=cfg.progress)
    run_start = st.run_start = time.perf_counter()
    deadline = run_start + cfg.max_seconds if cfg.max_seconds > 0 else float("inf")
    last_log, last = run_start, {}
    try:
        while st.frames < cfg.total_frames and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            got = batcher.get(timeout=1.0)
            t1 = time.perf_counter()
            tele.window.wait_s += t1 - t0
            L.pool.check()
            if got is None:
                continue
            k, batch = got
            log_now = _log_due(L, last_log, deadline, frames_per_update)
            timer = _GpuTimer() if batcher.cuda else None
            stats = train_step(L.model, L.optimizer, batch, cfg.algo, cfg.precision, L.grad_groups)
            if timer is not None:
                tele.window.gpu_events.append(timer.stop())
            stats_np = stats.cpu().numpy()  # the one host-device sync per update
            tele.window.busy_s += time.perf_counter() - t1
            lags = (st.version - batch.versions).numpy()
            if cfg.health.enabled and log_now:  # on the batch still in hand
                st.health = health.measure(
                    L.model, batch.obs, batch.first, batch.core_state, cfg.health.max_states
                )
            batcher.done(k)
            _guard_nonfinite(L, stats_np)
            L.scheduler.step()
            st.version += 1
            st.frames += frames_per_update
            tele.add_update(stats_np, lags, frames_per_update, steps_per_update)
            if st.version % cfg.publish_interval == 0:
                L.params.publish(L.model, st.version)

            now = time.perf_counter()
            done = st.frames >= cfg.total_frames or now >= deadline or solved(cfg, tele, bar)
            if log_now or done:
                last = _log(L, final=done)
                bar.update(st.frames, last)
                last_log = now
            if done:
                break
            if L.checkpointer.due(st.frames):
                L.save_checkpoint()
    except KeyboardInterrupt:
        bar.note("interrupted: saving a checkpoint, stopping actors, freeing shared memory")
        raise
    finally:
        bar.close()
    return last


def solved(cfg: Config, tele: Telemetry, bar: Progress) -> bool:
    """``target_return`` reached: the run ends as if at ``total_frames``."""
    if not tele.reached(cfg.target_return):
        return False
    bar.note(f"target_return={cfg.target_return:g} reached (mean of the last 100 episodes)")
    return True


def _log_due(L: Loop, last_log: float, deadline: float, frames_per_update: int) -> bool:
    """Whether the update in progress ends with a metrics line: decided once, before the step,
    so the health measurement and the line it belongs to always go together."""
    now = time.perf_counter()
    last_update = L.st.frames + frames_per_update >= L.cfg.total_frames or now >= deadline
    return now - last_log >= L.cfg.log_interval_s or last_update


def _guard_nonfinite(L: Loop, stats_np: np.ndarray) -> None:
    """Skipped NaN/inf updates are counted; too many in a row stop the run (weights intact)."""
    if stats_np[STAT_NAMES.index("nonfinite")] == 0:
        L.st.nonfinite_streak = 0
        return
    L.st.nonfinite_streak += 1
    if L.st.nonfinite_streak >= L.cfg.max_nonfinite_updates:
        path = L.save_checkpoint()  # the skipped updates never touched the weights
        raise FloatingPointError(
            f"{L.st.nonfinite_streak} consecutive updates had a non-finite loss or gradient "
            f"(skipped, last good state saved to {path}). Fix: lower algo.learning_rate, check "
            "rewards/observations for NaN, or raise max_nonfinite_updates."
        )


class _GpuTimer:
    """CUDA events around one train step: the GPU's own busy time, read at log time."""

    def __init__(self):
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.begin.record()

    def stop(self):
        self.end.record()
        return self.begin, self.end


def _warn_health(L: Loop, m: dict[str, Any]) -> None:
    for text in L.health_watch.check(m, L.st.version):
        L.logger.event({"event": "health_warning", "message": text, "frames": L.st.frames})
        print(f"impala_gpu: warning: {text}", file=sys.stderr, flush=True)


def _log(L: Loop, final: bool = False) -> dict[str, Any]:
    st, tele = L.st, L.tele
    L.pool.drain()
    window_s = max(time.perf_counter() - tele.window.start, 1e-9)
    m, hist = tele.flush()
    counters = L.handles.counters.numpy().copy()
    actor_steps = int(counters[:, STEPS].sum())
    idle_ns = counters[:, IDLE_NS].astype(np.float64)
    idle_prev = st.actor_idle_ns if st.actor_idle_ns is not None else np.zeros_like(idle_ns)
    m.update(
        frames=st.frames,
        agent_steps=st.frames // L.frames_per_step,
        updates=st.version,
        elapsed_s=time.perf_counter() - st.start,
        actor_steps=actor_steps,
        actor_steps_per_s=(actor_steps - st.actor_steps) / window_s,
        actor_idle=float(np.mean(idle_ns - idle_prev) / 1e9 / window_s),
        ring_occupancy=L.batcher.ring.occupancy(),
        dropped_stale=L.batcher.dropped_stale,
        actor_restarts=L.pool.restarts,
        stale_slots_dropped=L.batcher.slots.stale_dropped,
        batcher_gather_s=L.batcher.gather_s,
        lr=L.optimizer.param_groups[0]["lr"],
        time=time.time(),
    )
    m.update(st.health)
    _warn_health(L, m)
    st.actor_steps, st.actor_idle_ns = actor_steps, idle_ns
    st.logs += 1
    # Once: from the first window after start-up and warm-up, or the last one of a short run.
    warm = st.logs >= 2 and time.perf_counter() - st.run_start >= HINT_AFTER_S
    if not st.hinted and (warm or final):
        st.hinted = True
        cores, device = os.cpu_count() or 1, L.batcher.device.type
        hint = diagnose(m, L.cfg, cores, device, allocator(), conv=L.model.is_image)
        L.logger.event(hint.as_event())
        print(f"impala_gpu: {hint.describe()}", file=sys.stderr, flush=True)
    L.logger.log(m, hist)
    L.logger.write_json("lag_hist.json", tele.lag_histogram())
    return m
