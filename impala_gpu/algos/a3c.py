"""A3C (Mnih et al. 2016): Hogwild CPU workers, each its own actor and learner.

The whole loop, top to bottom: ``train`` puts one model and its optimizer statistics in shared
memory (``learning.hogwild``) and starts ``cfg.num_actors`` workers. Each worker repeatedly
copies the shared weights into its local model, rolls out ``unroll_length`` steps of its own
envs with them, computes the n-step actor-critic loss on that (on-policy) rollout, and applies
its gradient to the shared model without a lock. The main process only watches: it gathers the
workers' reports and logs the same metrics IMPALA logs, through the same run scaffolding
(``lifecycle.run``), so the two baselines compare field by field, network health included
(worker 0 measures dead units and logit spread on its own rollout each log interval; every
worker reports per-layer gradient norms).

Config keys of the central learner (batch_size, num_slots, publish_interval, max_policy_lag,
bounded_lag, refresh_every, learner_threads) do not apply here and are ignored. Checkpoints
(``checkpoint.*``) hold the shared model, the shared optimizer statistics and the counters; they
are taken while the workers run (Hogwild: no update is half-applied to a float, but parameters
may come from neighbouring updates), and the last one after the workers stop, also on Ctrl-C.
``resume`` continues from one.
"""

from __future__ import annotations

import dataclasses
import queue
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import Tensor, nn

from impala_gpu.acting.pool import describe_exit, stop_processes
from impala_gpu.acting.rollout import (
    EnvStepper,
    acting_process,
    parent_alive,
    record_unroll,
    sample_action,
)
from impala_gpu.channels.ring import STEP_FIELDS, numpy_to_torch_dtype
from impala_gpu.config import Config, ConfigError, resolve_device
from impala_gpu.envs import EnvSpec, derive_seeds, env_spec
from impala_gpu.learning.hogwild import (
    HogwildStep,
    cloned,
    load_shared_optimizer_state,
    make_shared_optimizer,
)
from impala_gpu.learning.learner import STAT_NAMES, Batch, Learner, NonfiniteGuard
from impala_gpu.learning.optim import lr_factor
from impala_gpu.lifecycle.run import Resume, Run, StopRule
from impala_gpu.models import CoreState, Policy, build_model
from impala_gpu.telemetry import health
from impala_gpu.telemetry.window import Telemetry
from impala_gpu.validate import require_resolved

# Columns of the shared per-worker counters [num_actors + 1, NUM_WORKER_COUNTERS] (IMPALA's
# actors keep their own layout, ``acting.actor.ACTOR_*``). Each worker writes only its own row,
# so the unlocked ``+=`` never races; the global count is the column sum. The last row holds
# what a resumed run had done before (no worker writes it). WORKER_DONE: the worker has left
# its loop and will not touch the shared model again.
WORKER_STEPS, WORKER_UPDATES, WORKER_DONE = range(3)
NUM_WORKER_COUNTERS = 3

# A worker's report after each update: (worker_id, stats [len(STAT_NAMES) + layers] float32 (the
# Learner.update's stats, then each layer's gradient norm), policy lag, finished episodes
# [(raw return, length), ...], network health (``health.measure``) or None when not measured).
Report = tuple[int, np.ndarray, int, list[tuple[float, int]], dict[str, float] | None]


def worker_steps_per_update(cfg: Config) -> int:
    """Agent steps in one worker's update: a T-step unroll of each of its ``envs_per_actor``
    envs (A3C has no central batch: ``batch_size`` does not apply)."""
    return cfg.unroll_length * cfg.envs_per_actor


@dataclass
class WorkerHandles:
    """What the main process hands each worker (all picklable to spawn children)."""

    counters: Tensor  # [num_actors + 1, NUM_WORKER_COUNTERS] int64, shared
    reports: Any  # mp.Queue of Report
    stop: Any  # mp.Event


def train(cfg: Config, run_dir: str | Path, sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train with A3C. Returns the last logged metrics."""
    # A3C is Hogwild on CPU by definition: auto means cpu here (so a sweep over algos works on
    # a GPU box); only an explicit cuda request is an error.
    if cfg.device != "auto" and resolve_device(cfg.device).type != "cpu":
        raise ConfigError(
            f"device={cfg.device}, but A3C is Hogwild on CPU: every worker updates one shared "
            "CPU model without a lock. Fix: device=cpu (or auto)."
        )
    require_resolved(cfg)  # the rest is the caller's to check: the CLI's validate_config
    spec = env_spec(cfg.env)
    torch.manual_seed(cfg.seed)
    shared_model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    shared_model.share_memory()
    optimizer = make_shared_optimizer(shared_model, cfg.algo)
    counters = torch.zeros(cfg.num_actors + 1, NUM_WORKER_COUNTERS, dtype=torch.int64)
    counters.share_memory_()
    grad_names = health.grad_groups(shared_model)[0] if cfg.health.enabled else []
    tele = Telemetry(STAT_NAMES + tuple(grad_names), cuda=False)
    resume = Resume.read(cfg.resume) if cfg.resume else None
    if resume is not None:
        restore(resume, shared_model, optimizer, counters)

    ctx = mp.get_context(cfg.start_method)
    handles = WorkerHandles(counters=counters, reports=ctx.Queue(), stop=ctx.Event())
    seeds = derive_seeds(cfg.seed, cfg.num_actors)
    workers = [
        ctx.Process(
            target=worker_main,
            args=(i, cfg, spec, shared_model, optimizer, handles, seeds[i]),
            name=f"a3c-worker-{i}",
            daemon=True,
        )
        for i in range(cfg.num_actors)
    ]
    run = Run.open(cfg, run_dir, sweep, tele, resume)

    def save() -> Path:
        """A checkpoint now, of the shared state as the workers leave it (copied first)."""
        totals = counters.sum(0)
        steps = int(totals[WORKER_STEPS])
        run.progress.version = int(totals[WORKER_UPDATES])
        run.progress.frames = steps * spec.frames_per_step
        model, opt = cloned(shared_model.state_dict()), cloned(optimizer.state_dict())
        return run.save_checkpoint({"model": model, "optimizer": opt, "agent_steps": steps})

    try:
        try:
            # Inside the handler: a Ctrl-C while the workers spawn must also stop them and save.
            for p in workers:
                p.start()
            last = monitor(cfg, spec, handles, workers, run, save)
        except KeyboardInterrupt:
            print("interrupted: stopping workers, saving a checkpoint", file=sys.stderr, flush=True)
            # Stop the workers first: they must not write the weights while we copy them.
            stop_workers(workers, handles)
            run.end(save(), shared_model, interrupted=True)  # Ctrl-C keeps the work done
            raise
        stop_workers(workers, handles)
        run.end(save(), shared_model)
        return last
    finally:
        stop_workers(workers, handles)
        run.close()
        handles.reports.close()


def restore(
    resume: Resume, model: nn.Module, optimizer: torch.optim.Optimizer, counters: Tensor
) -> None:
    """Continue from an A3C checkpoint: the weights into the shared model, the optimizer
    statistics into the shared buffers (in place, so they stay shared), the earlier work into
    the last row of ``counters``. (``Run.open`` restores the rest.)"""
    if "agent_steps" not in resume.state:
        raise ConfigError(
            f"{resume.path} is not an A3C checkpoint (it has no worker counters). Fix: resume it "
            "with the algo that wrote it (the run's config.yaml names it)."
        )
    resume.load(model)  # copies into the shared storage
    load_shared_optimizer_state(optimizer, resume.state["optimizer"])
    counters[-1, WORKER_STEPS] = resume.state["agent_steps"]
    counters[-1, WORKER_UPDATES] = resume.state["version"]


# -- worker -------------------------------------------------------------------------------------


def worker_main(
    worker_id: int,
    cfg: Config,
    spec: EnvSpec,
    shared_model: Policy,
    optimizer: torch.optim.Optimizer,
    handles: WorkerHandles,
    seed: int,
) -> None:
    """Process entry point. Returns at ``total_frames``, on ``handles.stop``, or when the main
    process goes away."""
    try:
        with acting_process(cfg, seed) as env:
            model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
            rollout = Rollout(env, cfg, spec, seed)
            hogwild = HogwildStep(model, shared_model, optimizer)
            _work(worker_id, cfg, spec.frames_per_step, rollout, hogwild, handles)
    finally:
        handles.counters[worker_id, WORKER_DONE] = 1


def _work(
    worker_id: int,
    cfg: Config,
    frames_per_step: int,
    rollout: Rollout,
    hogwild: HogwildStep,
    handles: WorkerHandles,
) -> None:
    """Copy the shared weights, roll out T steps, step the shared model; until told to stop."""
    model = hogwild.local
    grad_groups = health.grad_groups(model)[1] if cfg.health.enabled else None
    # A3C's loss is on-policy n-step returns: V-trace with the importance weights dropped.
    algo = dataclasses.replace(cfg.algo, correction="none")
    # The step goes to the shared model (HogwildStep), whose input statistics are its own.
    learner = Learner(
        model, hogwild, algo, cfg.precision, grad_groups=grad_groups, absorbs_input_stats=False
    )  # type: ignore[arg-type]
    steps_per_update = worker_steps_per_update(cfg)
    counters = handles.counters
    # One worker measures health: the weights are shared, and one sample per log line is what
    # IMPALA's learner takes too.
    measures_health = cfg.health.enabled and worker_id == 0
    last_health = float("-inf")
    while not handles.stop.is_set() and parent_alive():
        frames = int(counters[:, WORKER_STEPS].sum()) * frames_per_step
        if frames >= cfg.total_frames:
            return
        hogwild.pull()
        seen = int(counters[:, WORKER_UPDATES].sum())
        batch, episodes = rollout.collect(model)
        for group in hogwild.optimizer.param_groups:
            group["lr"] = cfg.algo.learning_rate * lr_factor(cfg, frames)
        stats = learner.update(batch).numpy()
        # The data is on-policy, so the ratios are 1 (up to float noise, which would make the
        # "rho > 1" fractions meaningless): report the exact values.
        stats[_CLIPPED_RHO], stats[_CLIPPED_PG_RHO], stats[_MEAN_RHO] = 0.0, 0.0, 1.0
        stats[_ABS_LOG_RHO], stats[_KL] = 0.0, 0.0
        # A3C's staleness: other workers' updates to the shared model since our weight copy.
        lag = int(counters[:, WORKER_UPDATES].sum()) - seen
        counters[worker_id, WORKER_STEPS] += steps_per_update
        counters[worker_id, WORKER_UPDATES] += 1
        measured = None
        if measures_health and time.perf_counter() - last_health >= cfg.log_interval_s:
            # On the weights that acted this rollout (the local copy; the update went to the
            # shared model).
            measured = health.measure(
                model, batch.obs, batch.first, batch.core_state, cfg.health.max_states
            )
            last_health = time.perf_counter()
        handles.reports.put((worker_id, stats, lag, episodes, measured))


_CLIPPED_RHO = STAT_NAMES.index("clipped_rho_fraction")
_CLIPPED_PG_RHO = STAT_NAMES.index("clipped_pg_rho_fraction")
_MEAN_RHO = STAT_NAMES.index("mean_rho")
_ABS_LOG_RHO = STAT_NAMES.index("mean_abs_log_rho")
_KL = STAT_NAMES.index("kl_behavior_target")


class Rollout:
    """A worker's vector env plus what carries over between unrolls.

    ``collect`` returns a time-major ``learner.Batch`` with the ring's layout: step fields
    ``[T+1, E, ...]`` whose step 0 is the previous unroll's step T (the actor's convention,
    see ``impala_gpu/channels/ring.py``), and ``core_state`` the LSTM state before step 0.
    """

    def __init__(self, env, cfg: Config, spec: EnvSpec, seed: int):
        E, T = cfg.envs_per_actor, cfg.unroll_length
        self.env, self.cfg = env, cfg
        self.envs = EnvStepper(env, cfg, spec, seed)
        self.core: CoreState | None = None  # the model's initial state, on the first collect
        # One reused buffer: the update is done with it before the next collect.
        self.batch = Batch(
            obs=torch.empty(T + 1, E, *spec.obs_shape, dtype=numpy_to_torch_dtype(spec.obs_dtype)),
            reward=torch.empty(T + 1, E),
            terminated=torch.empty(T + 1, E, dtype=torch.bool),
            truncated=torch.empty(T + 1, E, dtype=torch.bool),
            first=torch.empty(T + 1, E, dtype=torch.bool),
            action=torch.zeros(T + 1, E, dtype=torch.int64),
            logits=torch.zeros(T + 1, E, spec.num_actions),
        )
        # The actors' recorder writes [env, step]: hand it env-major views of the same memory.
        self.fields = {name: getattr(self.batch, name).transpose(0, 1) for name in STEP_FIELDS}

    @torch.no_grad()
    def collect(self, model: Policy) -> tuple[Batch, list[tuple[float, int]]]:
        """Act with ``model`` for T env steps (``rollout.record_unroll``, as the actors do).
        Returns the batch and the episodes that ended (raw return, length)."""
        if self.core is None:
            self.core = model.initial_state(self.envs.obs.shape[0])
        self.batch.core_state = self.core

        def act(core: CoreState):
            return sample_action(model, self.envs, core, self.cfg.precision)

        # The carried observation (the last unroll's bootstrap o_T) is acted on at step 0, with
        # the new weights: every recorded logit is the current policy's.
        T = self.cfg.unroll_length
        self.core, episodes = record_unroll(self.fields, slice(None), self.envs, act, self.core, T)
        return self.batch, episodes


# -- main process -------------------------------------------------------------------------------


def monitor(
    cfg: Config,
    spec: EnvSpec,
    handles: WorkerHandles,
    workers: list[BaseProcess],
    run: Run,
    save: Callable[[], Path],
) -> dict[str, Any]:
    """Gather reports, log and checkpoint (``save``) until the stop rule ends the run; then
    signal stop, gather the last reports and log the final line. Returns the last logged
    metrics. ``run.tele`` may hold a resumed run's episodes."""
    tele, bar = run.tele, run.progress_bar()
    steps_per_update = worker_steps_per_update(cfg)
    now = time.perf_counter()
    stop = StopRule(cfg, bar, start=now)
    before = handles.counters[-1]  # a resumed run's earlier work: its updates were reported then
    last_log, prev_steps = now, int(before[WORKER_STEPS])
    received = int(before[WORKER_UPDATES])
    guard = NonfiniteGuard(cfg.max_nonfinite_updates)

    def on_report(r: Report) -> None:
        nonlocal received
        received += 1
        _, stats, lag, episodes, measured = r
        if measured is not None:
            tele.health.update(measured)
        if guard.tripped(stats):  # skipped updates: the shared weights are intact
            raise guard.error()
        tele.add_update(
            stats, np.array([lag]), steps_per_update * spec.frames_per_step, steps_per_update
        )
        tele.add_episodes(episodes)

    try:
        while True:
            _drain(handles.reports, on_report, timeout=0.1)
            frames = int(handles.counters[:, WORKER_STEPS].sum()) * spec.frames_per_step
            now = time.perf_counter()
            done = stop.done(frames, tele, now)
            if done:  # the final line includes the last updates' reports
                handles.stop.set()
                _await_last_reports(workers, handles, on_report, lambda: received)
            if done or now - last_log >= cfg.log_interval_s:
                m, hist = tele.flush()
                m.update(_counter_metrics(cfg, spec, handles.counters, prev_steps, m["window_s"]))
                m.update(elapsed_s=run.progress.elapsed_s(), time=time.time())
                m.update(tele.health)
                run.warn_health(m)
                run.write(m, hist)
                bar.update(m["frames"], m)
                last_log, prev_steps = now, m["agent_steps"]
            _check_workers(workers)  # also at the end: a crash is no clean finish
            if done:
                return m
            if run.checkpointer.due(frames):
                save()
    finally:
        bar.close()


def _counter_metrics(
    cfg: Config, spec: EnvSpec, counters: Tensor, prev_steps: int, window_s: float
) -> dict[str, Any]:
    c = counters.numpy().copy()
    steps = int(c[:, WORKER_STEPS].sum())
    frames = steps * spec.frames_per_step
    return dict(
        frames=frames,
        agent_steps=steps,
        updates=int(c[:, WORKER_UPDATES].sum()),
        worker_updates=c[:-1, WORKER_UPDATES].tolist(),  # per worker (the last row: resumed work)
        actor_steps=steps,
        actor_steps_per_s=(steps - prev_steps) / max(window_s, 1e-9),
        # No central learner: its busy/wait/overhead split does not exist (null in JSON).
        learner_busy=float("nan"),
        learner_wait=float("nan"),
        learner_overhead=float("nan"),
        lr=cfg.algo.learning_rate * lr_factor(cfg, frames),
    )


def _drain(reports, on_report: Callable[[Report], None] | None, timeout: float) -> None:
    """Hand every queued report to ``on_report``, waiting up to ``timeout`` for the first."""
    block = timeout > 0
    while True:
        try:
            r = reports.get(timeout=timeout) if block else reports.get_nowait()
        except queue.Empty:
            return
        block = False
        if on_report is not None:
            on_report(r)


def _await_last_reports(
    workers: list[BaseProcess],
    handles: WorkerHandles,
    on_report: Callable[[Report], None],
    received: Callable[[], int],
    timeout: float = 5.0,
) -> None:
    """After ``stop``: wait until every worker has left its loop (or died) and every update it
    counted has been reported. Cheaper than a join, which also waits for interpreter teardown."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        finished = all(
            handles.counters[i, WORKER_DONE] or not p.is_alive() for i, p in enumerate(workers)
        )
        if finished and received() >= int(handles.counters[:, WORKER_UPDATES].sum()):
            return
        _drain(handles.reports, on_report, timeout=0.05)


def _check_workers(workers: list[BaseProcess]) -> None:
    dead = [p for p in workers if p.exitcode not in (None, 0)]
    if dead:
        desc = ", ".join(f"{p.name} {describe_exit(p.exitcode)}" for p in dead)
        raise RuntimeError(f"worker process died: {desc}")


def stop_workers(
    workers: list[BaseProcess],
    handles: WorkerHandles,
    on_report: Callable[[Report], None] | None = None,
    timeout: float = 10.0,
) -> None:
    """Stop and join the workers (idempotent), handing their last reports to ``on_report``."""
    handles.stop.set()
    stop_processes(workers, lambda: _drain(handles.reports, on_report, timeout=0), timeout)
