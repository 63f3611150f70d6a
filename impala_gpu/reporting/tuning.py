"""The auto-tuning hint: from one steady log window, is this run actor-bound or learner-bound,
and which overrides would help on this machine.

The learner's telemetry decides it. A learner that waits for batches is starved (actor-bound);
one that is busy while actors sit idle, blocked on free ring slots, is the bottleneck
(learner-bound). Every suggestion is one measured in ``benchmarks/README.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
        text = f"tuning: {self.bound}-bound ({self.reason})"
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


def diagnose(
    m: dict[str, Any],
    cfg: Config,
    cores: int,
    device_type: str,
    allocator: str = "glibc",
    conv: bool = True,
) -> Hint:
    """``m``: one metrics line (learner_busy, learner_wait, actor_idle, ...). ``conv``: the
    model is a CNN (bf16 pays there; for a small MLP it was not measured to)."""
    busy, wait = float(m["learner_busy"]), float(m["learner_wait"])
    actor_idle = float(m.get("actor_idle", 0.0))
    cuda = device_type == "cuda"
    if wait > STARVED_WAIT:
        reason = f"learner waits {wait:.0%} of the time for batches, actors idle {actor_idle:.0%}"
        tips: list[str] = []
        spare = cores - cfg.num_actors - (1 if cuda else 0)
        if spare > 0:
            tips.append(f"num_actors={cfg.num_actors + spare}")  # one actor per free core
        if cfg.precision == "fp32" and conv:
            tips.append("precision=bf16")  # actor inference at batch 16: 3.3 -> 2.0 ms on CPU
        return Hint("actors", reason, tips)
    if busy >= BUSY and actor_idle >= IDLE_ACTORS:
        reason = f"learner busy {busy:.0%}, actors idle {actor_idle:.0%} waiting for free slots"
        tips = []
        if cfg.precision == "fp32" and conv:
            tips.append("precision=bf16")  # CPU, Pong: 6.2K -> 8.4K frames/s
        if not cuda and allocator != "tcmalloc":
            tips.append("LD_PRELOAD=<libtcmalloc_minimal.so.4>")  # CPU, Pong: 5.3K -> 6.2K
        if cuda:
            tips.append(f"batch_size={2 * cfg.batch_size}")  # a GPU step costs about the same
        elif cfg.num_actors > 1 and cores <= cfg.num_actors and conv:
            # Fewer actor processes, same envs: less CPU taken from the learner (2 cores,
            # Pong, fp32: 2x16 -> 1x32 envs, 6.2K -> 6.8K frames/s).
            fewer = cfg.num_actors - 1
            envs = -(-cfg.num_actors * cfg.envs_per_actor // fewer)
            tips.append(f"num_actors={fewer} envs_per_actor={envs}")
        return Hint("learner", reason, tips)
    reason = f"learner busy {busy:.0%}, waits {wait:.0%}; actors idle {actor_idle:.0%}"
    return Hint("balanced", reason, [])
