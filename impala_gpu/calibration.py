"""``auto`` for ``precision``, ``num_actors`` and ``envs_per_actor``: measured on this machine.

The same project on two 2-core boxes a day apart ran 10-20% faster with bf16 on one and 2.8x
slower on the other, so no fixed default fits. The first run of a workload times, on synthetic
data, what a run spends its time on (a few seconds):

- the learner's update at ``[T, B]`` in each precision, with the threads the run would give it;
- one actor's policy step for its ``E`` envs, one thread;
- the raw vector env, per env step.

From these it predicts each candidate's agent steps per second (``predict``) and picks the
fastest. Where the prediction cannot tell the best candidates apart (within ``TRIAL_MARGIN``:
on a 2-core box it ranked 1 x 32 above 2 x 16, which ran 11% faster), each of them runs for
real for ``auto_trial_s`` seconds and the fastest run wins. Timings and trials are cached per
machine, library versions and workload (``cache_path``), so later runs start at once; but not
when other processes used more than ``NOISY_SHARE`` of the cores meanwhile (``OtherLoad``):
that is measured again, and if still noisy serves one run only. The tuning hint quotes only
the trials' end-to-end figures, never a prediction. An
explicit value always wins; what ``auto`` chose goes into the run's ``config.yaml`` (so a run
repeats exactly) and ``auto.json`` (why).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

AUTO = "auto"
TOTAL_ENVS = 32  # envs in all when both counts are auto (the former default, 2 actors x 16)
CACHE_ENV = "IMPALA_GPU_CACHE_DIR"  # where calibration.json goes (default ~/.cache/impala_gpu)
SIMILAR = 0.03  # candidates this close to the best count as ties: fp32, then fewer processes
TRIAL_MARGIN = 0.10  # predictions this close to the best are tried end to end (the model's miss)
MAX_TRIALS = 3
# Other processes took more than this share of all cores while auto measured: the timings are
# noise (on a busy box they predicted 30.8K against 1.0K frames/s for two candidates whose
# real ratio is 0.4x-1.4x). Measured again once; still noisy, used for this run only, never
# cached.
NOISY_SHARE = 0.25
MEASURE_TRIES = 2
TRIAL_START_S = 10.0  # a trial's allowance for spawning actors, beyond the seconds it measures


@dataclass(frozen=True)
class Candidate:
    precision: str
    num_actors: int
    envs_per_actor: int

    def overrides(self) -> str:
        return (
            f"precision={self.precision} num_actors={self.num_actors} "
            f"envs_per_actor={self.envs_per_actor}"
        )


@dataclass
class Decision:
    """What ``auto`` chose, and the predictions it chose from (agent steps per second)."""

    chosen: Candidate
    predictions: dict[Candidate, float]
    frames_per_step: int
    cached: bool
    cache_file: str
    trials: dict[Candidate, float] = field(default_factory=dict)  # measured end to end
    noisy: bool = False  # measured while other processes were busy: not cached

    def describe(self, auto_keys: list[str]) -> str:
        fps = {c: v * self.frames_per_step for c, v in self.predictions.items()}
        ranked = sorted(fps, key=fps.get, reverse=True)  # type: ignore[arg-type]
        others = ", ".join(
            f"{c.precision} {c.num_actors}x{c.envs_per_actor} {_k(fps[c])}"
            for c in ranked
            if c != self.chosen
        )[:160]
        where = "cached" if self.cached else "measured now"
        if self.noisy:
            where = "measured now beside other busy processes, so not cached"
        if self.trials:
            ran = sorted(self.trials, key=self.trials.get, reverse=True)  # type: ignore[arg-type]
            tried = " vs ".join(
                f"{c.precision} {c.num_actors}x{c.envs_per_actor} "
                f"{_k(self.trials[c] * self.frames_per_step)}"
                for c in ran
            )
            return (
                f"auto ({', '.join(auto_keys)}): {self.chosen.overrides()}, fastest in real "
                f"runs ({tried} frames/s; predicted within {TRIAL_MARGIN:.0%}: {others}; "
                f"{where}, {self.cache_file})"
            )
        return (
            f"auto ({', '.join(auto_keys)}): {self.chosen.overrides()}, predicted "
            f"{_k(fps[self.chosen])} frames/s (others: {others or 'none'}; {where}, "
            f"{self.cache_file})"
        )

    def as_dict(self, auto_keys: list[str]) -> dict[str, Any]:
        return {
            "auto_keys": auto_keys,
            "chosen": dataclasses.asdict(self.chosen),
            "predicted_frames_per_s": [
                {**dataclasses.asdict(c), "frames_per_s": v * self.frames_per_step}
                for c, v in sorted(self.predictions.items(), key=lambda kv: -kv[1])
            ],
            "trial_frames_per_s": [
                {**dataclasses.asdict(c), "frames_per_s": v * self.frames_per_step}
                for c, v in sorted(self.trials.items(), key=lambda kv: -kv[1])
            ],
            "cached": self.cached,
            "noisy": self.noisy,
            "cache_file": self.cache_file,
        }


def _k(frames_per_s: float) -> str:
    return f"{frames_per_s / 1000:.1f}K"


# ----------------------------------------------------------------------------- the prediction


@dataclass
class Timings:
    """Seconds, measured here. Keys: ``"fp32/2/32"`` (precision/threads/batch) for a learner
    update at ``[T, batch]``; ``"fp32/16"`` (precision/envs) for one actor policy step."""

    learner_step_s: dict[str, float]
    policy_step_s: dict[str, float]
    env_step_s: float  # one env, one agent step, through the vector env


def learner_threads(device_type: str, precision: str, cores: int, num_actors: int, fixed: int):
    """The learner's torch threads for this candidate (``learner_threads``, 0 = auto)."""
    from impala_gpu.speed import default_learner_threads

    return fixed or default_learner_threads(device_type, precision, cores, num_actors)


def predict(
    c: Candidate, t: Timings, algo: str, device_type: str, cores: int, T: int, B: int, threads: int
) -> float:
    """Predicted agent steps per second of candidate ``c`` (needs its timings in ``t``).

    IMPALA is the slowest of three limits: the learner's update rate, the actors' stepping
    rate (one core each) and, for a CPU learner, the cores all of it shares (the learner takes
    ``threads`` cores while it updates). A2C alternates acting and learning, and A3C's workers
    each do both on one core.
    """
    act = c.envs_per_actor * t.env_step_s + t.policy_step_s[_key((c.precision, c.envs_per_actor))]
    per_step_actor = act / c.envs_per_actor  # core-seconds per agent step
    if algo == "a3c":
        E = c.envs_per_actor
        update = t.learner_step_s[_key((c.precision, 1, E))]
        return min(c.num_actors, cores) * T * E / (T * act + update)
    if algo == "a2c":
        B = c.num_actors * c.envs_per_actor
    step = t.learner_step_s[_key((c.precision, threads, B))]
    if algo == "a2c":
        crowding = max(1.0, c.num_actors / cores)
        return T * B / (T * act * crowding + step)
    learner_cap = T * B / step
    actor_cap = c.num_actors / per_step_actor
    if device_type == "cuda":  # the learner's process needs about one core to feed the GPU
        cpu_cap = max(cores - 1, 1) / per_step_actor
    else:
        cpu_cap = cores / (threads * step / (T * B) + per_step_actor)
    return min(learner_cap, actor_cap, cpu_cap)


def rank(predictions: dict[Candidate, float]) -> Candidate:
    """The fastest; near-ties (within ``SIMILAR``) go to fp32 (exact), then fewer processes."""
    best = max(predictions.values())
    close = [c for c, v in predictions.items() if v >= (1 - SIMILAR) * best]
    return min(close, key=lambda c: (c.precision != "fp32", c.num_actors, -predictions[c]))


def contenders(predictions: dict[Candidate, float]) -> list[Candidate]:
    """The candidates predicted within ``TRIAL_MARGIN`` of the best, best first (at most
    ``MAX_TRIALS``): closer than the model can rank them, so a real run decides."""
    best = max(predictions.values())
    close = [c for c, v in predictions.items() if v >= (1 - TRIAL_MARGIN) * best]
    return sorted(close, key=predictions.get, reverse=True)[:MAX_TRIALS]  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- what is auto


def auto_keys(cfg) -> list[str]:
    return [k for k in ("precision", "num_actors", "envs_per_actor") if getattr(cfg, k) == AUTO]


def check_values(cfg) -> None:
    """``auto`` or a valid value for each key, else a ConfigError naming the fix."""
    from impala_gpu.speed import PRECISIONS
    from impala_gpu.validate import ConfigError

    if cfg.precision != AUTO and cfg.precision not in PRECISIONS:
        raise ConfigError(
            f"precision={cfg.precision!r} is not one of {(AUTO, *PRECISIONS)}. Fix: "
            "precision=auto (measured here), fp32 or bf16."
        )
    for key in ("num_actors", "envs_per_actor"):
        v = getattr(cfg, key)
        if v != AUTO and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(
                f"{key}={v!r} must be a positive integer or auto. Fix: {key}=auto or {key}=2."
            )


def candidates(cfg, cores: int) -> list[Candidate]:
    precisions = ("fp32", "bf16") if cfg.precision == AUTO else (cfg.precision,)
    if cfg.algo.name == "a3c" and cfg.num_actors == AUTO:
        counts = [cores]  # Mnih et al.: one worker per core (each learns on its own core)
    elif cfg.num_actors == AUTO:
        counts = sorted({n for n in (1, 2, 4, 8, 16, 32, cores) if n <= max(cores, 1)})
    else:
        counts = [cfg.num_actors]
    out = []
    for p in precisions:
        for n in counts:
            E = cfg.envs_per_actor if cfg.envs_per_actor != AUTO else math.ceil(TOTAL_ENVS / n)
            out.append(Candidate(p, n, E))
    return out


# ----------------------------------------------------------------------------- measuring


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


def _synthetic_batch(spec, T: int, B: int, model, device: torch.device):
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


def time_learner_step(cfg, spec, device, precision: str, threads: int, B: int) -> float:
    """Seconds per update at ``[T, B]`` on synthetic data (fresh model and optimizer)."""
    from impala_gpu.learning.learner import make_optimizer, sgd_steps
    from impala_gpu.models import build_model
    from impala_gpu.speed import compile_model

    model = build_model(spec.obs_shape, spec.num_actions, cfg.model).to(device)
    optimizer = make_optimizer(model, cfg.algo)
    compile_model(model, cfg.compile)
    batch = _synthetic_batch(spec, cfg.unroll_length, B, model, device)

    def update() -> None:
        sgd_steps(model, optimizer, batch, cfg.algo, precision)[0].item()  # .item(): sync

    with _threads(threads):
        return _median_time(update, min_reps=3, min_s=0.3, warmup=2 if cfg.compile else 1)


def time_policy_step(cfg, spec, precision: str, E: int) -> float:
    """Seconds for one actor's policy step over ``E`` envs (CPU, one thread)."""
    from impala_gpu.acting.rollout import policy_step
    from impala_gpu.models import build_model

    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    model.eval()
    batch = _synthetic_batch(spec, 0, E, model, torch.device("cpu"))
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


def trial_run(cfg, c: Candidate, seconds: float) -> float:
    """Agent steps per second of a real run of candidate ``c`` (this algo, env and model) for
    about ``seconds``, in a temporary dir with W&B, checkpoints and health checks off. It may
    take ``TRIAL_START_S`` more to spawn its actors; the count starts at its first log line,
    so the start-up is not in it."""
    from impala_gpu.cli import algo_registry

    trial = dataclasses.replace(
        cfg,
        precision=c.precision,
        num_actors=c.num_actors,
        envs_per_actor=c.envs_per_actor,
        total_frames=10**15,
        max_seconds=seconds + TRIAL_START_S,
        log_interval_s=seconds / 4,
        target_return=None,
        resume=None,
        progress=False,
        wandb=dataclasses.replace(cfg.wandb, mode="disabled"),
        checkpoint=dataclasses.replace(cfg.checkpoint, every_frames=0, every_minutes=0),
        health=dataclasses.replace(cfg.health, enabled=False),
        tensorboard=False,
    )
    # A trial's own console lines (its run dir, its end-of-run summary) would read as the
    # user's run: keep them off the console; an exception still propagates.
    quiet = io.StringIO()
    with (
        tempfile.TemporaryDirectory(prefix="impala_gpu_trial_") as tmp,
        contextlib.redirect_stdout(quiet),
        contextlib.redirect_stderr(quiet),
    ):
        algo_registry()[cfg.algo.name](trial, tmp, None)
        text = (Path(tmp) / "metrics.jsonl").read_text()
    lines = [json.loads(x) for x in text.splitlines()]
    if len(lines) < 2:
        raise RuntimeError(
            f"auto's {seconds:g} s trial of {c.overrides()} logged {len(lines)} metric lines; "
            "it needs 2. Fix: raise auto_trial_s, or set precision, num_actors and "
            "envs_per_actor by hand."
        )
    first, last = lines[0], lines[-1]
    return (last["agent_steps"] - first["agent_steps"]) / (last["elapsed_s"] - first["elapsed_s"])


class _threads:
    def __init__(self, n: int):
        self.n, self.saved = n, torch.get_num_threads()

    def __enter__(self):
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


# ----------------------------------------------------------------------------- the cache


def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "impala_gpu"
    )
    return Path(root) / "calibration.json"


# The instruction sets that decide fp32 against bf16 on a CPU learner.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's name, model number and speed-relevant flags, from ``/proc/cpuinfo`` text.

    Cloud VMs often report one name ("Intel(R) Xeon(R) Processor") for CPUs that differ in
    exactly what matters here: under that name, one box ran the Pong defaults in bf16 at 1.4x
    fp32's frames/s (model 167, AMX) and another at 0.4x (model 207, no AVX-512 BF16). So the
    model number and the flags are part of the name, and of the calibration cache's key.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        if key.strip() in fields:  # the first processor describes them all
            break
        fields[key.strip()] = value.strip()
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "model" not in fields:
        return name
    flags = set(fields.get("flags", "").split())
    has = " ".join(f for f in SPEED_FLAGS if f in flags) or "no avx2"
    return f"{name} (family {fields.get('cpu family', '?')} model {fields['model']}; {has})"


def machine_key(device: torch.device) -> dict[str, Any]:
    """What the timings depend on besides the workload: the hardware and library versions."""
    import gymnasium

    from impala_gpu import __version__
    from impala_gpu.speed import allocator

    try:
        import ale_py

        ale = ale_py.__version__
    except ImportError:
        ale = None
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 1,
        "gpu": gpu,
        "torch": torch.__version__,
        "ale_py": ale,
        "gymnasium": gymnasium.__version__,
        "impala_gpu": __version__,
        "allocator": allocator(),
    }


def workload_key(cfg, device: torch.device) -> dict[str, Any]:
    e, m = cfg.env, cfg.model
    return {
        "env": [e.id, e.frame_skip, e.frame_stack, e.screen_size, e.vector_backend],
        "model": [m.name, m.hidden_size, m.mlp_layers, m.use_lstm, m.lstm_size, m.channels_last],
        "algo": [cfg.algo.name, cfg.algo.optimizer],
        "T": cfg.unroll_length,
        "device": device.type,
        "compile": cfg.compile,
    }


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


def _noise_note(share: float, what: str, attempt: int) -> str:
    cores = os.cpu_count() or 1
    then = (
        "measuring again"
        if attempt < MEASURE_TRIES
        else "using them for this run only: not cached, so the next run measures again"
    )
    return (
        f"impala_gpu: auto: other processes used {share:.0%} of this machine's {cores} cores "
        f"while it measured {what} (more than {NOISY_SHARE:.0%}: noise); {then}."
    )


def _load_cache(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or unreadable (a half-written file): measure again


def _save_cache(path: Path, cache: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, path)  # atomic: parallel sweep jobs never read half a file


def _entry_key(cfg, device) -> str:
    return json.dumps({**machine_key(device), **workload_key(cfg, device)}, sort_keys=True)


def needed(c: Candidate, cfg, device_type: str, cores: int) -> tuple[tuple, tuple]:
    """The learner timing ``(precision, threads, batch)`` and the policy-step timing
    ``(precision, envs)`` that ``predict`` reads for ``c``."""
    if cfg.algo.name == "a3c":
        learner = (c.precision, 1, c.envs_per_actor)
    else:
        B = c.num_actors * c.envs_per_actor if cfg.algo.name == "a2c" else cfg.batch_size
        threads = learner_threads(
            device_type, c.precision, cores, c.num_actors, cfg.learner_threads
        )
        learner = (c.precision, threads, B)
    return learner, (c.precision, c.envs_per_actor)


def _key(parts: tuple) -> str:
    return "/".join(map(str, parts))  # ("fp32", 2, 32) -> "fp32/2/32", as Timings keys them


def _cached_entry(cfg, device) -> dict[str, Any]:
    """This machine's cached timings for ``cfg``'s workload (empty when none)."""
    entry = _load_cache(cache_path()).get(_entry_key(cfg, device))
    return entry or {"learner_step_s": {}, "policy_step_s": {}, "env_step_s": None}


def _timings(entry: dict[str, Any]) -> Timings:
    return Timings(entry["learner_step_s"], entry["policy_step_s"], entry["env_step_s"])


def _measure_missing(entry: dict[str, Any], cfg, spec, device, cands, cores: int) -> bool:
    """Time what ``entry`` lacks for ``cands`` into it; True if anything was measured."""
    fresh = False
    for c in cands:
        learner, policy = needed(c, cfg, device.type, cores)
        if _key(learner) not in entry["learner_step_s"]:
            entry["learner_step_s"][_key(learner)] = time_learner_step(cfg, spec, device, *learner)
            fresh = True
        if _key(policy) not in entry["policy_step_s"]:
            entry["policy_step_s"][_key(policy)] = time_policy_step(cfg, spec, *policy)
            fresh = True
    if entry["env_step_s"] is None:
        entry["env_step_s"] = time_env_step(cfg)
        fresh = True
    return fresh


def timings_for(cfg, spec, device, cands: list[Candidate]) -> tuple[Timings, bool, bool]:
    """The timings the candidates need: from the cache, measuring what is missing. Returns
    (timings, all cached, noisy). A measurement taken while other processes used more than
    ``NOISY_SHARE`` of the cores is taken again; still noisy, it serves this run only and is
    not cached (a cached figure is trusted by every later run, and by nothing else)."""
    path, key, cores = cache_path(), _entry_key(cfg, device), os.cpu_count() or 1
    cached = _cached_entry(cfg, device)
    for attempt in range(1, MEASURE_TRIES + 1):
        entry = json.loads(json.dumps(cached))  # a copy: a noisy attempt adds nothing to it
        with OtherLoad() as load:
            fresh = _measure_missing(entry, cfg, spec, device, cands, cores)
        if not fresh:
            return _timings(entry), True, False
        if load.share <= NOISY_SHARE:
            break
        print(_noise_note(load.share, "its timings", attempt), file=sys.stderr, flush=True)
    else:
        return _timings(entry), False, True
    entry["other_cpu_share"] = round(load.share, 3)  # what else ran while this was measured
    entry["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    cache = _load_cache(path)  # another job may have written meanwhile
    cache[key] = {**entry, "trial_steps_per_s": cache.get(key, {}).get("trial_steps_per_s", {})}
    _save_cache(path, cache)
    return _timings(entry), False, False


def _trial_key(c: Candidate, cfg) -> str:
    return _key((c.precision, c.num_actors, c.envs_per_actor, cfg.batch_size, cfg.learner_threads))


def trials_for(cfg, device, preds: dict[Candidate, float]) -> tuple[dict[Candidate, float], bool]:
    """End-to-end agent steps per second of the ``contenders`` (from the cache, running the
    missing ones), or {} when the prediction alone decides. Returns (trials, all cached)."""
    close = contenders(preds)
    if len(close) < 2 or cfg.auto_trial_s <= 0:
        return {}, True
    path, key = cache_path(), _entry_key(cfg, device)
    done = dict(_cached_entry(cfg, device).get("trial_steps_per_s", {}))
    missing = [c for c in close if _trial_key(c, cfg) not in done]
    if missing:
        names = ", ".join(f"{c.precision} {c.num_actors}x{c.envs_per_actor}" for c in close)
        print(
            f"impala_gpu: auto: {names} are predicted within {TRIAL_MARGIN:.0%} of each other; "
            f"running each for {cfg.auto_trial_s:g} s to choose (once: cached in {path})",
            file=sys.stderr,
            flush=True,
        )
        with OtherLoad() as load:
            for c in missing:
                done[_trial_key(c, cfg)] = trial_run(cfg, c, cfg.auto_trial_s)
        if load.share > NOISY_SHARE:  # the tuning hint quotes cached trials: never noise
            print(_noise_note(load.share, "its trials", MEASURE_TRIES), file=sys.stderr)
            return {c: done[_trial_key(c, cfg)] for c in close}, False
        cache = _load_cache(path)
        entry = cache.get(key)
        if entry is not None:  # trials are kept beside cached (quiet) timings only
            entry["trial_steps_per_s"] = {**entry.get("trial_steps_per_s", {}), **done}
            _save_cache(path, cache)
    return {c: done[_trial_key(c, cfg)] for c in close}, not missing


def predictions(cfg, device, cands: list[Candidate], t: Timings) -> dict[Candidate, float]:
    cores = os.cpu_count() or 1
    out = {}
    for c in cands:
        threads = learner_threads(
            device.type, c.precision, cores, c.num_actors, cfg.learner_threads
        )
        out[c] = predict(
            c, t, cfg.algo.name, device.type, cores, cfg.unroll_length, cfg.batch_size, threads
        )
    return out


# ----------------------------------------------------------------------------- entry points


def resolve_auto(cfg):
    """``cfg`` with every ``auto`` replaced by what this machine measured to be fastest, and
    the Decision (None when nothing was auto). Idempotent: a resolved config comes back as is.
    """
    check_values(cfg)
    keys = auto_keys(cfg)
    if not keys:
        return cfg, None
    from impala_gpu.envs import env_spec
    from impala_gpu.validate import resolve_device

    device = resolve_device(cfg.device)
    if cfg.algo.name == "a3c":
        device = torch.device("cpu")  # Hogwild on CPU by definition
    spec = env_spec(cfg.env)
    cands = candidates(cfg, os.cpu_count() or 1)
    t, cached, noisy = timings_for(cfg, spec, device, cands)
    preds = predictions(cfg, device, cands, t)
    trials, trials_cached = trials_for(cfg, device, preds)
    chosen = rank(trials or preds)
    decision = Decision(
        chosen,
        preds,
        spec.frames_per_step,
        cached and trials_cached,
        str(cache_path()),
        trials,
        noisy=noisy,
    )
    resolved = dataclasses.replace(
        cfg,
        precision=chosen.precision,
        num_actors=chosen.num_actors,
        envs_per_actor=chosen.envs_per_actor,
    )
    return resolved, decision


def measured_alternatives(cfg, device: torch.device) -> dict[Candidate, float] | None:
    """For the tuning hint, during a run: agent steps per second of this config and its
    alternatives (both precisions, the actor counts ``auto`` would try, the same envs in all)
    as ``auto``'s real trials ran them end to end on this machine, from the cache. Never the
    micro-benchmark's prediction: under load it once put bf16 at 30x fp32 where real runs
    measure 0.4x-1.4x. None when fewer than two of them, or not this config, were run: the
    hint then suggests none."""
    if cfg.algo.name == "a3c":
        return None
    cores = os.cpu_count() or 1
    total = cfg.num_actors * cfg.envs_per_actor
    counts = sorted({n for n in (1, 2, 4, 8, 16, 32, cores, cfg.num_actors) if n <= total})
    cands = [
        Candidate(p, n, math.ceil(total / n) if n != cfg.num_actors else cfg.envs_per_actor)
        for p in ("fp32", "bf16")
        for n in counts
    ]
    ran = _cached_entry(cfg, device).get("trial_steps_per_s", {})  # nothing is measured here
    out = {c: ran[_trial_key(c, cfg)] for c in cands if _trial_key(c, cfg) in ran}
    current = Candidate(cfg.precision, cfg.num_actors, cfg.envs_per_actor)
    return out if current in out and len(out) >= 2 else None


def write_decision(decision: Decision | None, keys: list[str], run_dir: str | Path) -> None:
    if decision is None:
        return
    path = Path(run_dir) / "auto.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(decision.as_dict(keys), indent=1))


def apply_auto(cfg, run_dir: str | Path | None = None, check=None):
    """``resolve_auto``, saying in one line what was chosen and why (and in ``auto.json``).
    ``check(resolved)``, when given, runs before ``auto.json`` is written, so a config that
    cannot run leaves no file behind."""
    keys = auto_keys(cfg)
    cfg, decision = resolve_auto(cfg)
    if decision is not None:
        print(f"impala_gpu: {decision.describe(keys)}", file=sys.stderr, flush=True)
    if check is not None:
        check(cfg)
    if decision is not None and run_dir is not None:
        write_decision(decision, keys, run_dir)
    return cfg
