"""Network-health warnings: when most of a layer is dead, or the policy stops depending on its
input (``telemetry.health`` measures both), the run says so once, on the console and in
``events.jsonl``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from impala_gpu.config import HealthCfg


@dataclass
class HealthWatch:
    """Warns, once per episode of trouble, when most of a layer is dead or the policy stops
    depending on its input. Returns the warnings as text; the caller prints and records them."""

    dead_warn: float = 0.5
    min_logit_spread: float = 0.05
    warmup_updates: int = 1000

    smoothing: float = 0.3  # weight of the newest line in the moving average judged

    @classmethod
    def from_config(cls, cfg: HealthCfg) -> HealthWatch:
        return cls(cfg.dead_warn, cfg.min_logit_spread, cfg.warmup_updates)

    def __post_init__(self):
        self._active: set[str] = set()
        self._ema: dict[str, float] = {}

    def _smooth(self, m: dict[str, float]) -> dict[str, float]:
        """Exponential moving average of the health metrics: one line's sample of a few hundred
        states is noisy (a dead fraction can swing by 0.2 between lines)."""
        for key, v in m.items():
            if (key.startswith("dead/") or key == "logit_spread") and v is not None and v == v:
                prev = self._ema.get(key, v)
                self._ema[key] = prev + self.smoothing * (v - prev)
        return dict(self._ema)

    def check(self, m: dict[str, float], updates: int) -> list[str]:
        """New warnings for this log line, judged on the moving average. A warned problem stays
        quiet until it has clearly recovered (dead fraction 0.1 under the threshold, spread
        twice the minimum), so a value hovering at the threshold warns once."""
        m = self._smooth(m)
        problems: dict[str, str] = {}
        recovered: set[str] = set()
        for key, frac in m.items():
            if not key.startswith("dead/"):
                continue
            if frac > self.dead_warn:
                problems[key] = (
                    f"{frac:.0%} of layer {key.removeprefix('dead/')}'s units are dead (never "
                    "fire on the current batch); dead units get no gradient and stay dead"
                )
            elif frac < self.dead_warn - 0.1:
                recovered.add(key)
        spread = m.get("logit_spread", math.nan)
        if updates >= self.warmup_updates and spread < self.min_logit_spread:
            problems["logit_spread"] = (
                f"the policy barely depends on its input (logit spread {spread:.3f} < "
                f"{self.min_logit_spread} after {updates} updates): it plays the same way in "
                "every state"
            )
        elif spread > 2 * self.min_logit_spread:
            recovered.add("logit_spread")
        new = [text for key, text in problems.items() if key not in self._active]
        self._active = (self._active - recovered) | set(problems)
        return new
