"""The auto-tuning hint: from one steady log window, is this run actor-bound or learner-bound,
and which overrides would help on this machine.

The learner's telemetry decides it. A learner that waits for batches is starved (actor-bound);
one that is busy while actors sit idle, blocked on free ring slots, is the bottleneck
(learner-bound). A precision or actor-count change is suggested only when ``auto``'s real
trials on this machine (``impala_gpu/calibration/trials.py``) ran it faster end to end: which
precision and layout win differs from one CPU to the next, and a micro-benchmark's prediction
is only as good as the quiet it was taken in (docs/performance.md has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from impala_gpu.calibration.model import Candidate
from impala_gpu.config import Config

STARVED_WAIT = 0.10  # learner waiting more than this fraction of its time: actor-bound
BUSY = 0.90  # learner busy at least this fraction...
IDLE_ACTORS = 0.10  # ...while actors wait for free slots this much: learner-bound


@dataclass
class Hint:
    bound: str  # "actors" | "learner" | "balanced"
    reason: str
    suggestions: list[str] = field(default_factory=list)  # Hydra overrides, most useful first

    def describe(self) -> str:
        what = "balanced" if self.bound == "balanced" else f"{self.bound}-bound"
        text = f"tuning: {what} ({self.reason})"
        if self.suggestions:
            text += "; try " + " ".join(self.suggestions)
        return text

    def as_event(self) -> dict[str, Any]:
        return {
            "event": "tuning_hint",
            "bound": self.bound,
            "reason": self.reason,
            "suggestions": self.suggestions,
        }


FASTER = 1.05  # suggest an alternative only if it ran this much faster on this machine


def diagnose(
    m: dict[str, Any],
    cfg: Config,
    cores: int,
    device_type: str,
    allocator: str = "glibc",
    alternatives: dict[Candidate, float] | None = None,
) -> Hint:
    """``m``: one metrics line (learner_busy, learner_wait, actor_idle, ...).
    ``alternatives``: speeds of this config and its alternatives as ``auto``'s trials ran them
    on this machine (``calibration.measured_alternatives``); None when it has none, and then
    no precision or actor-count change is suggested."""
    busy, wait = float(m["learner_busy"]), float(m["learner_wait"])
    actor_idle = float(m.get("actor_idle", 0.0))
    cuda = device_type == "cuda"
    measured = measured_faster(cfg, alternatives)
    if wait > STARVED_WAIT:
        reason = f"learner waits {wait:.0%} of the time for batches, actors idle {actor_idle:.0%}"
        return Hint("actors", reason, measured)
    if busy >= BUSY and actor_idle >= IDLE_ACTORS:
        reason = f"learner busy {busy:.0%}, actors idle {actor_idle:.0%} waiting for free slots"
        tips = list(measured)
        if not cuda and allocator != "tcmalloc":
            tips.append("LD_PRELOAD=<libtcmalloc_minimal.so.4>")  # CPU, Pong: 5.3K -> 6.2K
        if cuda:
            tips.append(f"batch_size={2 * cfg.batch_size}")  # a GPU step costs about the same
        return Hint("learner", reason, tips)
    reason = f"learner busy {busy:.0%}, waits {wait:.0%}; actors idle {actor_idle:.0%}"
    return Hint("balanced", reason, [])


def measured_faster(cfg: Config, alternatives: dict[Candidate, float] | None) -> list[str]:
    """The overrides of the alternative that ran fastest on this machine, if it beat the
    current config by ``FASTER``; else none."""
    current = Candidate(cfg.precision, cfg.num_actors, cfg.envs_per_actor)
    if not alternatives or current not in alternatives:
        return []
    best = max(alternatives, key=alternatives.get)  # type: ignore[arg-type]
    if alternatives[best] < FASTER * alternatives[current]:
        return []
    tips = [f"precision={best.precision}"] if best.precision != current.precision else []
    if (best.num_actors, best.envs_per_actor) != (current.num_actors, current.envs_per_actor):
        tips.append(f"num_actors={best.num_actors} envs_per_actor={best.envs_per_actor}")
    ratio = alternatives[best] / alternatives[current]
    return [*tips, f"(measured end to end on this machine: {ratio:.2f}x faster)"]
