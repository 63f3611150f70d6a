"""What ``auto`` chose and why: the console line and the run's ``auto.json``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from impala_gpu.calibration.model import TRIAL_MARGIN, Candidate


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
        others = ", ".join(f"{c.short()} {_k(fps[c])}" for c in ranked if c != self.chosen)[:160]
        where = "cached" if self.cached else "measured now"
        if self.noisy:
            where = "measured now beside other busy processes, so not cached"
        if self.trials:
            ran = sorted(self.trials, key=self.trials.get, reverse=True)  # type: ignore[arg-type]
            tried = " vs ".join(
                f"{c.short()} {_k(self.trials[c] * self.frames_per_step)}" for c in ran
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
            "predicted_frames_per_s": self._frames_per_s(self.predictions),
            "trial_frames_per_s": self._frames_per_s(self.trials),
            "cached": self.cached,
            "noisy": self.noisy,
            "cache_file": self.cache_file,
        }

    def _frames_per_s(self, steps_per_s: dict[Candidate, float]) -> list[dict[str, Any]]:
        return [
            {**dataclasses.asdict(c), "frames_per_s": v * self.frames_per_step}
            for c, v in sorted(steps_per_s.items(), key=lambda kv: -kv[1])
        ]


def _k(frames_per_s: float) -> str:
    return f"{frames_per_s / 1000:.1f}K"


def write_decision(decision: Decision | None, keys: list[str], run_dir: str | Path) -> None:
    if decision is None:
        return
    path = Path(run_dir) / "auto.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(decision.as_dict(keys), indent=1))
