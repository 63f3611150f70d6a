"""IMPALA: asynchronous CPU actors, a shared-memory trajectory ring, a V-trace learner.

The whole loop, top to bottom: ``train`` builds the ring, the parameter store and the actors,
then runs ``learn`` until ``total_frames``; every exit path stops and joins the actors.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from impala_gpu.actor import IDLE_NS, NUM_COUNTERS, STEPS, ActorHandles, actor_main
from impala_gpu.config import Config
from impala_gpu.envs import derive_seeds, env_spec
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
from impala_gpu.ring import RingSpec, TrajectoryRing, numpy_to_torch_dtype
from impala_gpu.telemetry import Telemetry
from impala_gpu.validate import resolve_device, resolve_num_slots, validate_config


def train(cfg: Config, run_dir: str | Path, sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train with IMPALA. Returns the last logged metrics."""
    validate_config(cfg)
    device = resolve_device(cfg.device)
    spec = env_spec(cfg.env)
    torch.manual_seed(cfg.seed)
    # A CPU learner is the bottleneck on small boxes: it gets every core and shares them with
    # the actors (measured faster than cores - actors here). A CUDA learner needs few threads.
    threads = cfg.learner_threads or (2 if device.type == "cuda" else (os.cpu_count() or 1))
    torch.set_num_threads(threads)

    model = build_model(spec.obs_shape, spec.num_actions, cfg.model).to(device)
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
        ctx,
    )
    bounded = cfg.bounded_lag is not None
    params = ParamStore.for_model(model, history=(cfg.bounded_lag + 2) if bounded else 1)
    params.publish(model, version=0)
    handles = ActorHandles(
        ring=ring,
        params=params,
        counters=torch.zeros(cfg.num_actors, NUM_COUNTERS, dtype=torch.int64).share_memory_(),
        episodes=ctx.Queue(),
        stop=ctx.Event(),
    )
    seeds = derive_seeds(cfg.seed, cfg.num_actors)
    actors = [
        ctx.Process(
            target=actor_main,
            args=(i, cfg, spec, handles, seeds[i]),
            name=f"actor-{i}",
            daemon=True,
        )
        for i in range(cfg.num_actors)
    ]
    logger = MetricsLogger(run_dir, cfg, sweep)
    batcher = None
    try:
        for p in actors:
            p.start()
        batcher = Batcher(
            ring,
            cfg.batch_size,
            device,
            learner_version=lambda: version,
            max_policy_lag=cfg.max_policy_lag,
            ordered_unrolls_per_batch=cfg.batch_size // cfg.envs_per_actor if bounded else 0,
            envs_per_actor=cfg.envs_per_actor,
        )
        version = 0
        batcher.start()
        try:
            last = learn(cfg, model, spec.frames_per_step, batcher, params, handles, actors, logger)
        except KeyboardInterrupt:
            save_weights(model, Path(run_dir) / "model.pt")  # Ctrl-C keeps the work done so far
            raise
        save_weights(model, Path(run_dir) / "model.pt")
        return last
    finally:
        handles.stop.set()
        if batcher is not None:
            batcher.stop()
        _join_actors(actors)
        logger.close()
        handles.episodes.cancel_join_thread()
        ring.close()


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """Atomic write (temp file, then rename): a crash never leaves a half-written file."""
    tmp = path.with_suffix(".tmp")
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, tmp)
    os.replace(tmp, path)


@dataclass
class _Progress:
    """Counters the train loop carries between updates and log lines."""

    start: float = field(default_factory=time.perf_counter)
    version: int = 0
    frames: int = 0
    actor_steps: int = 0
    actor_idle_ns: np.ndarray | None = None


def learn(cfg, model, frames_per_step, batcher, params, handles, actors, logger) -> dict[str, Any]:
    """The train loop: wait for a batch, update, publish, log. Stops at ``total_frames``
    (or ``max_seconds``)."""
    steps_per_update = cfg.batch_size * cfg.unroll_length
    frames_per_update = steps_per_update * frames_per_step
    optimizer = make_optimizer(model, cfg.algo)
    scheduler = make_lr_scheduler(optimizer, cfg, frames_per_update)
    tele = Telemetry(STAT_NAMES, batcher.cuda)
    bar = Progress(cfg.total_frames, enabled=cfg.progress)
    st = _Progress()
    deadline = st.start + cfg.max_seconds if cfg.max_seconds > 0 else float("inf")
    last_log, last = st.start, {}
    try:
        while st.frames < cfg.total_frames and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            got = batcher.get(timeout=1.0)
            t1 = time.perf_counter()
            tele.window.wait_s += t1 - t0
            if got is None:
                _check_actors(actors)
                continue
            k, batch = got
            timer = _GpuTimer() if batcher.cuda else None
            stats = train_step(model, optimizer, batch, cfg.algo)
            if timer is not None:
                tele.window.gpu_events.append(timer.stop())
            stats_np = stats.cpu().numpy()  # the one host-device sync per update
            tele.window.busy_s += time.perf_counter() - t1
            lags = (st.version - batch.versions).numpy()
            batcher.done(k)
            scheduler.step()
            st.version += 1
            batcher.learner_version = lambda v=st.version: v
            st.frames += frames_per_update
            tele.add_update(stats_np, lags, frames_per_update, steps_per_update)
            if st.version % cfg.publish_interval == 0:
                params.publish(model, st.version)

            now = time.perf_counter()
            if (
                now - last_log >= cfg.log_interval_s
                or st.frames >= cfg.total_frames
                or now >= deadline
            ):
                last = _log(cfg, st, tele, logger, handles, batcher, optimizer)
                bar.update(st.frames, last)
                last_log = now
                _check_actors(actors)
    except KeyboardInterrupt:
        bar.note("interrupted: saving weights, stopping actors, freeing shared memory")
        raise
    finally:
        bar.close()
    return last


class _GpuTimer:
    """CUDA events around one train step: the GPU's own busy time, read at log time."""

    def __init__(self):
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.begin.record()

    def stop(self):
        self.end.record()
        return self.begin, self.end


def _log(cfg, st: _Progress, tele, logger, handles, batcher, optimizer) -> dict[str, Any]:
    _drain_episodes(handles.episodes, tele)
    window_s = max(time.perf_counter() - tele.window.start, 1e-9)
    m, hist = tele.flush()
    counters = handles.counters.numpy().copy()
    actor_steps = int(counters[:, STEPS].sum())
    idle_ns = counters[:, IDLE_NS].astype(np.float64)
    idle_prev = st.actor_idle_ns if st.actor_idle_ns is not None else np.zeros_like(idle_ns)
    m.update(
        frames=st.frames,
        agent_steps=st.version * cfg.batch_size * cfg.unroll_length,
        updates=st.version,
        elapsed_s=time.perf_counter() - st.start,
        actor_steps=actor_steps,
        actor_steps_per_s=(actor_steps - st.actor_steps) / window_s,
        actor_idle=float(np.mean(idle_ns - idle_prev) / 1e9 / window_s),
        ring_occupancy=batcher.ring.occupancy(),
        dropped_stale=batcher.dropped_stale,
        batcher_gather_s=batcher.gather_s,
        lr=optimizer.param_groups[0]["lr"],
        time=time.time(),
    )
    st.actor_steps, st.actor_idle_ns = actor_steps, idle_ns
    logger.log(m, hist)
    logger.write_json("lag_hist.json", tele.lag_histogram())
    return m


def _drain_episodes(episodes, tele: Telemetry) -> None:
    while True:
        try:
            _, eps = episodes.get_nowait()
        except queue.Empty:
            return
        tele.add_episodes(eps)


def _check_actors(actors) -> None:
    dead = [p for p in actors if not p.is_alive()]
    if dead:
        desc = ", ".join(f"{p.name} (exit code {p.exitcode})" for p in dead)
        raise RuntimeError(f"actor process died: {desc}")


def _join_actors(actors, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    for p in actors:
        if p.pid is not None:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
    for p in actors:
        if p.is_alive():
            p.terminate()
            p.join(timeout=2)
        if p.is_alive():
            p.kill()
            p.join(timeout=2)
