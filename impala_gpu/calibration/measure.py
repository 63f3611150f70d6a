"""The micro-benchmarks ``auto`` predicts from, each on synthetic data in a fresh model: a
learner update, one actor's policy step, a vector-env step; and ``OtherLoad``, which says
whether anything else used the cores meanwhile."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import torch


def _median_time(fn, min_reps: int, min_s: float, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def synthetic_batch(spec, T: int, B: int, model, device: torch.device):
    from impala_gpu.learning.batcher import Batch

    g = torch.Generator().manual_seed(0)
    shape = (T + 1, B)
    if spec.obs_dtype == np.uint8:
        obs = torch.randint(0, 256, (*shape, *spec.obs_shape), generator=g, dtype=torch.uint8)
    else:
        obs = torch.randn((*shape, *spec.obs_shape), generator=g)
    batch = Batch(
        obs=obs,
        reward=torch.randn(shape, generator=g),
        terminated=torch.rand(shape, generator=g) < 0.01,
        truncated=torch.zeros(shape, dtype=torch.bool),
        first=torch.zeros(shape, dtype=torch.bool),
        action=torch.randint(0, spec.num_actions, shape, generator=g),
        logits=torch.randn((*shape, spec.num_actions), generator=g),
        core_state=model.initial_state(B),
    )
    return Batch(**{f.name: _to(getattr(batch, f.name), device) for f in dataclasses.fields(Batch)})


def _to(x, device):
    return tuple(t.to(device) for t in x) if isinstance(x, tuple) else x.to(device)


class _threads:
    def __init__(self, n: int):
        self.n, self.saved = n, torch.get_num_threads()

    def __enter__(self):
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


def time_learner_step(cfg, spec, device, precision: str, threads: int, B: int) -> float:
    """Seconds per update at ``[T, B]`` on synthetic data (fresh model and optimizer). With
    ``cfg.learner_shards`` > 1 the update is split over that many one-thread shards, as in a
    run, and ``threads`` is not used."""
    from impala_gpu.learning.learner import Learner
    from impala_gpu.learning.optim import make_optimizer
    from impala_gpu.learning.shards import ShardThreads
    from impala_gpu.models import build_model
    from impala_gpu.speed.compile import compile_model

    model = build_model(spec.obs_shape, spec.num_actions, cfg.model).to(device)
    optimizer = make_optimizer(model, cfg.algo)
    compile_model(model, cfg.compile)
    batch = synthetic_batch(spec, cfg.unroll_length, B, model, device)
    shards = ShardThreads(cfg.learner_shards) if cfg.learner_shards > 1 else None

    learner = Learner(model, optimizer, cfg.algo, precision, shards=shards)

    def update() -> None:
        learner.update(batch)[0].item()  # waits for the device

    try:
        with _threads(1 if shards is not None else threads):
            return _median_time(update, min_reps=3, min_s=0.3, warmup=2 if cfg.compile else 1)
    finally:
        if shards is not None:
            shards.close()


def time_policy_step(cfg, spec, precision: str, E: int) -> float:
    """Seconds for one actor's policy step over ``E`` envs (CPU, one thread)."""
    from impala_gpu.acting.rollout import policy_step
    from impala_gpu.models import build_model

    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    model.eval()
    batch = synthetic_batch(spec, 0, E, model, torch.device("cpu"))
    core = model.initial_state(E)
    with _threads(1):
        return _median_time(
            lambda: policy_step(model, batch.obs[0], batch.first[0], core, precision),
            min_reps=5,
            min_s=0.1,
        )


def time_env_step(cfg, E: int = 16, seconds: float = 0.3) -> float:
    """Seconds per env step of the raw vector env (random actions, one thread)."""
    from impala_gpu.envs import derive_seeds, make_vector_env, reset_vector_env

    env = make_vector_env(cfg.env, E, num_threads=1)
    try:
        reset_vector_env(env, derive_seeds(cfg.seed, E))
        rng = np.random.default_rng(0)
        n = int(env.single_action_space.n)
        for _ in range(5):
            env.step(rng.integers(0, n, E))
        steps, start = 0, time.perf_counter()
        while steps < 20 or time.perf_counter() - start < seconds:
            env.step(rng.integers(0, n, E))
            steps += 1
        return (time.perf_counter() - start) / (steps * E)
    finally:
        env.close()


# ----------------------------------------------------------------------------- other load


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not on this platform
        return 0.0


def busy_cpu_s(stat: str | None = None) -> float | None:
    """Seconds all this machine's CPUs have been busy since boot (``/proc/stat``'s first line:
    everything but idle and iowait, steal included, since a VM's stolen time is time this
    measurement did not get), or None where there is no ``/proc/stat``."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return None
    fields = stat.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    ticks = [int(x) for x in fields[1:9]]
    idle = sum(ticks[3:5])
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()  # this process and the children it has waited for (a trial's actors)
    return t.user + t.system + t.children_user + t.children_system


class OtherLoad:
    """``with OtherLoad() as load: ...``; then ``load.share``: the share of all cores that
    other processes used while the block ran (0: a quiet machine, 1: every core busy).

    CPU time, not the load average: a load average trails by a minute, so it misses a job
    that starts mid-measurement and blames one that just stopped."""

    share: float = 0.0

    def __enter__(self) -> OtherLoad:
        self._start = (time.perf_counter(), busy_cpu_s(), _own_cpu_s())
        return self

    def __exit__(self, *exc: object) -> None:
        wall0, busy0, own0 = self._start
        wall, busy, cores = time.perf_counter() - wall0, busy_cpu_s(), os.cpu_count() or 1
        if busy is None or busy0 is None:  # no /proc/stat: the load beyond this process
            self.share = min(1.0, max(0.0, (_load_average() - 1.0) / cores))
            return
        others = busy - busy0 - (_own_cpu_s() - own0)
        self.share = min(1.0, max(0.0, others / max(wall * cores, 1e-9)))
