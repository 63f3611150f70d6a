"""A3C (Mnih et al. 2016): Hogwild CPU workers, each its own actor and learner.

The whole loop, top to bottom: ``train`` puts one model and its optimizer statistics in shared
memory and starts ``cfg.num_actors`` workers. Each worker repeatedly copies the shared weights
into its local model, rolls out ``unroll_length`` steps of its own envs with them, computes the
n-step actor-critic loss on that (on-policy) rollout, and applies its gradient to the shared
model without a lock. The main process only watches: it gathers the workers' reports and logs
the same metrics IMPALA logs, so the two baselines compare field by field, network health
included (worker 0 measures dead units and logit spread on its own rollout each log interval;
every worker reports per-layer gradient norms).

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
from impala_gpu.acting.rollout import EnvStepper, acting_process, parent_alive, sample_action
from impala_gpu.algos.impala import save_weights, solved, warn_health
from impala_gpu.channels.ring import numpy_to_torch_dtype
from impala_gpu.config import AlgoCfg, Config, to_container
from impala_gpu.envs import EnvSpec, derive_seeds, env_spec
from impala_gpu.learning.learner import (
    STAT_NAMES,
    Batch,
    NonfiniteGuard,
    lr_factor,
    make_optimizer,
    train_step,
)
from impala_gpu.learning.optim import RMSpropTF
from impala_gpu.models import CoreState, Policy, build_model
from impala_gpu.reporting import health
from impala_gpu.reporting.checkpoint import (
    Checkpointer,
    CheckpointPolicy,
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
from impala_gpu.validate import ConfigError, resolve_device, validate_config

# Columns of the shared per-worker counters [num_actors + 1, NUM_COUNTERS]. Each worker writes
# only its own row, so the unlocked ``+=`` never races; the global count is the column sum. The
# last row holds what a resumed run had done before (no worker writes it). DONE: the worker has
# left its loop and will not touch the shared model again.
STEPS, UPDATES, DONE = range(3)
NUM_COUNTERS = 3

# A worker's report after each update: (worker_id, stats [len(STAT_NAMES) + layers] float32 (the
# train_step stats, then each layer's gradient norm), policy lag, finished episodes
# [(raw return, length), ...], network health (``health.measure``) or None when not measured).
Report = tuple[int, np.ndarray, int, list[tuple[float, int]], dict[str, float] | None]


@dataclass
class WorkerHandles:
    """What the main process hands each worker (all picklable to spawn children)."""

    counters: Tensor  # [num_actors, NUM_COUNTERS] int64, shared
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
    validate_config(cfg)
    spec = env_spec(cfg.env)
    torch.manual_seed(cfg.seed)
    shared_model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    shared_model.share_memory()
    optimizer = make_shared_optimizer(shared_model, cfg.algo)
    counters = torch.zeros(cfg.num_actors + 1, NUM_COUNTERS, dtype=torch.int64).share_memory_()
    grad_names = health.grad_groups(shared_model)[0] if cfg.health.enabled else []
    tele = Telemetry(STAT_NAMES + tuple(grad_names), cuda=False)
    resumed = restore(cfg.resume, shared_model, optimizer, counters, tele) if cfg.resume else {}
    if resumed:
        truncate_lines(Path(run_dir) / "metrics.jsonl", resumed["metrics_lines"])

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
    logger = MetricsLogger(run_dir, cfg, sweep, resume_id=resumed.get("wandb_id"))
    ck = cfg.checkpoint
    checkpointer = Checkpointer(
        run_dir,
        CheckpointPolicy(ck.every_frames, ck.every_minutes, ck.keep_last),
        frames=resumed.get("frames", 0),
    )
    checkpointer.best_return = resumed.get("best_return", float("-inf"))
    start = time.perf_counter() - resumed.get("elapsed_s", 0.0)

    def save(stopped: bool, interrupted: bool = False) -> None:
        """A checkpoint now (and, once the workers have stopped, the final weights and the
        end-of-run summary)."""
        state = checkpoint_state(cfg, spec, shared_model, optimizer, counters, tele, start)
        state.update(resumes=resumed.get("resumes", -1) + 1, wandb_id=logger.wandb_id)
        state["metrics_lines"] = count_lines(logger.path)
        path = checkpointer.save(state, state["frames"], tele.mean_return())
        if stopped:
            save_weights(shared_model, Path(run_dir) / "model.pt")
            elapsed = state["elapsed_s"]
            best = checkpointer.best_return
            print_summary(logger, tele, state["frames"], elapsed, path, best, interrupted)

    try:
        try:
            # Inside the handler: a Ctrl-C while the workers spawn must also stop them and save.
            for p in workers:
                p.start()
            last = monitor(cfg, spec, handles, workers, logger, tele, checkpointer, save, start)
        except KeyboardInterrupt:
            print("interrupted: stopping workers, saving a checkpoint", file=sys.stderr, flush=True)
            # Stop the workers first: they must not write the weights while we copy them.
            stop_workers(workers, handles)
            save(stopped=True, interrupted=True)  # Ctrl-C keeps the work done so far
            raise
        stop_workers(workers, handles)
        save(stopped=True)
        return last
    finally:
        stop_workers(workers, handles)
        logger.close()
        handles.reports.close()


# -- checkpoints ---------------------------------------------------------------------------------


def checkpoint_state(
    cfg: Config,
    spec: EnvSpec,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    counters: Tensor,
    tele: Telemetry,
    start: float,
) -> dict[str, Any]:
    """What ``restore`` needs to continue: weights, shared optimizer state, counters, the
    episode record. Copied now: the workers may go on writing the shared tensors meanwhile."""
    totals = counters.sum(0)
    return {
        "model": _cloned(model.state_dict()),
        "optimizer": _cloned(optimizer.state_dict()),
        "agent_steps": int(totals[STEPS]),
        "version": int(totals[UPDATES]),
        "frames": int(totals[STEPS]) * spec.frames_per_step,
        "elapsed_s": time.perf_counter() - start,
        "rng": rng_state(),
        "config": to_container(cfg),
        **tele.episode_record(),
    }


def _cloned(obj: Any) -> Any:
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _cloned(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cloned(v) for v in obj]
    return obj


def restore(
    resume: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    counters: Tensor,
    tele: Telemetry,
) -> dict[str, Any]:
    """Load an A3C checkpoint: the weights into the shared model, the optimizer statistics
    into the shared buffers (in place, so they stay shared), the earlier work into the last
    row of ``counters``, the episode record into ``tele``. Returns the checkpoint."""
    path, ckpt = load_checkpoint(resume, set_aside=True)
    if "agent_steps" not in ckpt:
        raise ConfigError(
            f"{path} is not an A3C checkpoint (it has no worker counters). Fix: resume it "
            "with the algo that wrote it (the run's config.yaml names it)."
        )
    try:
        model.load_state_dict(ckpt["model"])  # copies into the shared storage
    except RuntimeError as e:
        raise ConfigError(
            f"checkpoint {path} holds a different model than this config builds: "
            f"{str(e).splitlines()[0]} Fix: resume with the config the run was trained with."
        ) from e
    load_shared_optimizer_state(optimizer, ckpt["optimizer"])
    set_rng_state(ckpt["rng"])
    counters[-1, STEPS], counters[-1, UPDATES] = ckpt["agent_steps"], ckpt["version"]
    tele.load_episode_record(ckpt)
    at = f"{ckpt['frames']:,} frames (update {ckpt['version']})"
    print(f"impala_gpu: resumed from {path} at {at}")
    return ckpt


def load_shared_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """``optimizer.load_state_dict`` that keeps its state tensors: each saved buffer is copied
    into the shared one the workers hold, so they go on reading the same memory."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(saved["state"]) != len(params):
        raise ConfigError(
            f"the checkpoint's optimizer has state for {len(saved['state'])} parameters, this "
            f"model has {len(params)}. Fix: resume with the config the run was trained with."
        )
    for i, p in enumerate(params):
        for name, value in saved["state"][i].items():
            optimizer.state[p][name].copy_(value)
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        group.update({k: v for k, v in saved_group.items() if k != "params"})


# -- shared optimizer ---------------------------------------------------------------------------

# Per-parameter state tensors torch's own lazy init would create (besides "step").
_STATE_BUFFERS: dict[type, Callable[[dict], list[str]]] = {
    torch.optim.RMSprop: lambda g: (
        ["square_avg"]
        + (["momentum_buffer"] if g["momentum"] > 0 else [])
        + (["grad_avg"] if g["centered"] else [])
    ),
    torch.optim.Adam: lambda g: (
        ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if g["amsgrad"] else [])
    ),
}


def make_shared_optimizer(model: nn.Module, algo: AlgoCfg) -> torch.optim.Optimizer:
    """``make_optimizer``'s RMSprop/Adam with its statistics created now, in shared memory.

    torch creates optimizer state lazily on the first ``step``, which would give each worker a
    private copy. Created here (before the workers are spawned, which pickle the optimizer by
    shared-memory handle) every worker reads and updates the same running averages and the same
    ``step`` count, as in the paper's shared RMSprop. ``model`` must already be shared.
    """
    optimizer = make_optimizer(model, algo)
    if isinstance(optimizer, RMSpropTF):  # its square average starts at 1, not 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                for t in optimizer.init_state(p, group).values():
                    t.share_memory_()
        return optimizer
    buffers = _STATE_BUFFERS[type(optimizer)]
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            # Scalar float "step" on the CPU, like torch's own (non-capturable, non-fused) init.
            state["step"] = torch.zeros(()).share_memory_()
            for name in buffers(group):
                state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state[name].share_memory_()
    return optimizer


class HogwildStep:
    """The optimizer ``learner.train_step`` sees: ``zero_grad`` clears the local model's grads,
    ``step`` hands them to the shared model and steps the shared optimizer (no lock: Hogwild).

    Assigning ``shared.grad = local.grad`` only changes this process's view of the shared
    parameters: the gradient itself is never copied or shared.
    """

    def __init__(self, local: nn.Module, shared: nn.Module, optimizer: torch.optim.Optimizer):
        self.pairs = list(zip(local.parameters(), shared.parameters(), strict=True))
        self.optimizer = optimizer
        # Model and optimizer must arrive in one pickle (one Process's args), which keeps the
        # optimizer's params the very objects we set .grad on; else its step would skip them all.
        opt_params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if opt_params != {id(p) for p in shared.parameters()}:
            raise RuntimeError("the shared optimizer does not hold the shared model's parameters")

    def zero_grad(self, set_to_none: bool = True) -> None:
        for local, _ in self.pairs:
            local.grad = None

    def step(self) -> None:
        for local, shared in self.pairs:
            shared.grad = local.grad
        self.optimizer.step()


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
            _work(worker_id, cfg, spec, shared_model, optimizer, handles, seed, env)
    finally:
        handles.counters[worker_id, DONE] = 1


def _work(
    worker_id: int,
    cfg: Config,
    spec: EnvSpec,
    shared_model: Policy,
    optimizer: torch.optim.Optimizer,
    handles: WorkerHandles,
    seed: int,
    env,
) -> None:
    """Copy the shared weights, roll out T steps, step the shared model; until told to stop."""
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    grad_groups = health.grad_groups(model)[1] if cfg.health.enabled else None
    rollout = Rollout(env, cfg, spec, seed)
    hogwild = HogwildStep(model, shared_model, optimizer)
    # A3C's loss is on-policy n-step returns: V-trace with the importance weights dropped.
    algo = dataclasses.replace(cfg.algo, correction="none")
    steps_per_update = cfg.unroll_length * cfg.envs_per_actor
    counters = handles.counters
    # One worker measures health: the weights are shared, and one sample per log line is what
    # IMPALA's learner takes too.
    measures_health = cfg.health.enabled and worker_id == 0
    last_health = float("-inf")
    while not handles.stop.is_set() and parent_alive():
        frames = int(counters[:, STEPS].sum()) * spec.frames_per_step
        if frames >= cfg.total_frames:
            return
        model.load_state_dict(shared_model.state_dict())
        seen = int(counters[:, UPDATES].sum())
        batch, episodes = rollout.collect(model)
        for group in optimizer.param_groups:
            group["lr"] = cfg.algo.learning_rate * lr_factor(cfg, frames)
        stats = train_step(model, hogwild, batch, algo, cfg.precision, grad_groups).numpy()  # type: ignore[arg-type]
        # The data is on-policy, so the ratios are 1 (up to float noise, which would make the
        # "rho > 1" fractions meaningless): report the exact values.
        stats[_CLIPPED_RHO], stats[_CLIPPED_PG_RHO], stats[_MEAN_RHO] = 0.0, 0.0, 1.0
        stats[_ABS_LOG_RHO], stats[_KL] = 0.0, 0.0
        # A3C's staleness: other workers' updates to the shared model since our weight copy.
        lag = int(counters[:, UPDATES].sum()) - seen
        counters[worker_id, STEPS] += steps_per_update
        counters[worker_id, UPDATES] += 1
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
        # One reused buffer: train_step is done with it before the next collect.
        self.batch = Batch(
            obs=torch.empty(T + 1, E, *spec.obs_shape, dtype=numpy_to_torch_dtype(spec.obs_dtype)),
            reward=torch.empty(T + 1, E),
            terminated=torch.empty(T + 1, E, dtype=torch.bool),
            truncated=torch.empty(T + 1, E, dtype=torch.bool),
            first=torch.empty(T + 1, E, dtype=torch.bool),
            action=torch.zeros(T + 1, E, dtype=torch.int64),
            logits=torch.zeros(T + 1, E, spec.num_actions),
        )

    @torch.no_grad()
    def collect(self, model: Policy) -> tuple[Batch, list[tuple[float, int]]]:
        """Act with ``model`` for T env steps. Returns the batch and the episodes that ended
        (raw return, length)."""
        b, episodes = self.batch, []
        if self.core is None:
            self.core = model.initial_state(self.envs.obs.shape[0])
        b.core_state = core = self.core
        # The carried observation (the last unroll's bootstrap o_T) is acted on here, with the
        # new weights: every recorded logit is the current policy's. o_T itself is recorded
        # but not acted on (a_T is never read), so an unroll costs T policy steps.
        T = self.cfg.unroll_length
        for t in range(T + 1):
            self._record(t)
            if t == T:
                break
            action, logits, next_core = sample_action(model, self.envs, core, self.cfg.precision)
            b.action[t], b.logits[t] = action, logits
            episodes += self.envs.step(action)
            core = next_core
        self.core = core  # the state before step T, which is the next unroll's step 0
        return b, episodes

    def _record(self, t: int) -> None:
        """Record what the envs said at step ``t`` of the batch."""
        e, b = self.envs, self.batch
        b.obs[t], b.reward[t], b.first[t] = e.obs, e.reward, e.first
        b.terminated[t], b.truncated[t] = e.terminated, e.truncated


# -- main process -------------------------------------------------------------------------------


def monitor(
    cfg: Config,
    spec: EnvSpec,
    handles: WorkerHandles,
    workers: list[BaseProcess],
    logger: MetricsLogger,
    tele: Telemetry,
    checkpointer: Checkpointer,
    save: Callable[[bool], None],
    run_start: float,
) -> dict[str, Any]:
    """Gather reports, log and checkpoint until ``total_frames`` (or ``max_seconds``); then
    signal stop, gather the last reports and log the final line. Returns the last logged
    metrics. ``tele`` may hold a resumed run's episodes; ``save(False)`` takes a checkpoint.
    ``run_start``: the clock reading ``elapsed_s`` counts from (earlier for a resumed run)."""
    bar = Progress(cfg.total_frames, enabled=cfg.progress, target_return=cfg.target_return)
    steps_per_update = cfg.unroll_length * cfg.envs_per_actor
    now = time.perf_counter()
    deadline = now + cfg.max_seconds if cfg.max_seconds > 0 else float("inf")
    before = handles.counters[-1]  # a resumed run's earlier work: its updates were reported then
    last_log, prev_steps, received = now, int(before[STEPS]), int(before[UPDATES])
    guard = NonfiniteGuard(cfg.max_nonfinite_updates)
    watch = HealthWatch.from_config(cfg.health)
    latest_health: dict[str, float] = {}

    def on_report(r: Report) -> None:
        nonlocal received
        received += 1
        _, stats, lag, episodes, measured = r
        if measured is not None:
            latest_health.update(measured)
        if guard.tripped(stats):  # skipped updates: the shared weights are intact
            raise guard.error()
        tele.add_update(
            stats, np.array([lag]), steps_per_update * spec.frames_per_step, steps_per_update
        )
        tele.add_episodes(episodes)

    try:
        while True:
            _drain(handles.reports, on_report, timeout=0.1)
            frames = int(handles.counters[:, STEPS].sum()) * spec.frames_per_step
            now = time.perf_counter()
            done = frames >= cfg.total_frames or now >= deadline or solved(cfg, tele, bar)
            if done:  # the final line includes the last updates' reports
                handles.stop.set()
                _await_last_reports(workers, handles, on_report, lambda: received)
            if done or now - last_log >= cfg.log_interval_s:
                m, hist = tele.flush()
                m.update(_counter_metrics(cfg, spec, handles.counters, prev_steps, m["window_s"]))
                m.update(elapsed_s=time.perf_counter() - run_start, time=time.time())
                m.update(latest_health)
                warn_health(watch, logger, m, m["updates"])
                logger.log(m, hist)
                logger.write_json("lag_hist.json", tele.lag_histogram())  # the whole run's lags
                bar.update(m["frames"], m)
                last_log, prev_steps = now, m["agent_steps"]
            _check_workers(workers)  # also at the end: a crash is no clean finish
            if done:
                return m
            if checkpointer.due(frames):
                save(False)
    finally:
        bar.close()


def _counter_metrics(
    cfg: Config, spec: EnvSpec, counters: Tensor, prev_steps: int, window_s: float
) -> dict[str, Any]:
    c = counters.numpy().copy()
    steps = int(c[:, STEPS].sum())
    frames = steps * spec.frames_per_step
    return dict(
        frames=frames,
        agent_steps=steps,
        updates=int(c[:, UPDATES].sum()),
        worker_updates=c[:-1, UPDATES].tolist(),  # per worker (the last row: resumed work)
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
        finished = all(handles.counters[i, DONE] or not p.is_alive() for i, p in enumerate(workers))
        if finished and received() >= int(handles.counters[:, UPDATES].sum()):
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
