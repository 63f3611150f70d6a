"""The cost model's arithmetic, pure: candidates, the timings a prediction reads, and how the
predictions choose. No I/O, no clock; each algorithm states its own prediction (a
``CostModel``, in ``impala_gpu/algos/costs.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from impala_gpu.config import AUTO, Config

# Envs in all when both counts are auto: one unroll from each fills a batch of the default
# batch_size (32), and the candidates differ only in how the envs are spread over processes.
TOTAL_ENVS = 32
SIMILAR = 0.03  # candidates this close to the best count as ties: fp32, then fewer processes
TRIAL_MARGIN = 0.10  # predictions this close to the best are tried end to end (the model's miss)
MAX_TRIALS = 3
ACTOR_COUNTS = (1, 2, 4, 8, 16, 32)  # actor processes auto tries (and the core count)


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

    def short(self) -> str:
        return f"{self.precision} {self.num_actors}x{self.envs_per_actor}"


def timing_key(parts: tuple) -> str:
    return "/".join(map(str, parts))  # ("fp32", 2, 32) -> "fp32/2/32", as Timings keys them


LearnerTiming = tuple[str, int, int]  # (precision, torch threads, batch): one learner update


@dataclass
class Timings:
    """Seconds, measured here. Keys: ``"fp32/2/32"`` (precision/threads/batch) for a learner
    update at ``[T, batch]``; ``"fp32/16"`` (precision/envs) for one actor policy step."""

    learner_step_s: dict[str, float]
    policy_step_s: dict[str, float]
    env_step_s: float  # one env, one agent step, through the vector env

    def learner(self, timing: LearnerTiming) -> float:
        return self.learner_step_s[timing_key(timing)]

    def acting(self, c: Candidate) -> float:
        """Seconds for one actor's step of its envs: the envs, then one policy step."""
        policy = self.policy_step_s[timing_key(policy_timing(c))]
        return c.envs_per_actor * self.env_step_s + policy


def policy_timing(c: Candidate) -> tuple[str, int]:
    """The policy-step timing ``(precision, envs)`` a candidate's actors need."""
    return c.precision, c.envs_per_actor


@dataclass(frozen=True)
class Workload:
    """What a prediction reads besides the candidate and the timings."""

    device_type: str  # where the learner runs: "cpu" or "cuda"
    cores: int
    unroll_length: int  # T
    batch_size: int  # B, as configured
    learner_threads: int  # as configured; 0: speed.learner_threads' rule


class CostModel(Protocol):
    """What an algorithm tells ``auto`` about its speed on this machine."""

    cpu_only: bool  # its learning runs on the CPU whatever ``device`` says

    def actor_counts(self, cores: int) -> list[int]:
        """The ``num_actors`` values to try when it is ``auto``."""
        ...

    def learner_timing(self, c: Candidate, w: Workload) -> LearnerTiming:
        """The learner update ``predict`` reads for ``c``: what ``auto`` must time."""
        ...

    def predict(self, c: Candidate, t: Timings, w: Workload) -> float:
        """Agent steps per second of ``c``, from timings that hold what ``c`` needs."""
        ...


def candidates(cfg: Config, cores: int, cost: CostModel) -> list[Candidate]:
    """Every combination ``auto`` weighs: explicit values kept, ``TOTAL_ENVS`` envs in all."""
    precisions = ("fp32", "bf16") if cfg.precision == AUTO else (cfg.precision,)
    counts = cost.actor_counts(cores) if cfg.num_actors == AUTO else [cfg.num_actors]
    out = []
    for p in precisions:
        for n in counts:
            E = cfg.envs_per_actor if cfg.envs_per_actor != AUTO else math.ceil(TOTAL_ENVS / n)
            out.append(Candidate(p, n, E))
    return out


def alternatives(cfg: Config, cores: int) -> list[Candidate]:
    """A resolved config's neighbours, for the tuning hint: both precisions, the actor counts
    ``auto`` tries (and its own), the same envs in all."""
    total = cfg.num_actors * cfg.envs_per_actor
    counts = sorted({n for n in (*ACTOR_COUNTS, cores, cfg.num_actors) if n <= total})
    return [
        Candidate(p, n, math.ceil(total / n) if n != cfg.num_actors else cfg.envs_per_actor)
        for p in ("fp32", "bf16")
        for n in counts
    ]


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
