"""Checkpoints: atomic, periodic, the last N kept plus the best by mean return; and resume.

A checkpoint holds everything a resumed run needs to continue as if it had never stopped:
model, optimizer, LR schedule, update and frame counters, wall-clock so far, RNG states, the
config, how many lines ``metrics.jsonl`` had (so a resumed run drops the lines logged after the
checkpoint and no step is logged twice), the W&B run id, and the telemetry that spans windows
(last 100 episode returns, the lag histogram).
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

CKPT_DIR = "checkpoints"
_NAME = re.compile(r"ckpt_(\d{12})\.pt$")


def atomic_torch_save(obj: Any, path: Path) -> None:
    """Temp file in the same directory, then ``os.replace``: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Periodic checkpoints of a run, oldest first."""
    d = Path(run_dir) / CKPT_DIR
    return sorted(p for p in d.glob("ckpt_*.pt") if _NAME.search(p.name)) if d.is_dir() else []


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run dir (its latest checkpoint). Clear error when there is none."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        found = list_checkpoints(p)
        if found:
            return found[-1]
        raise FileNotFoundError(
            f"no checkpoint in run dir {p} (looked for {p / CKPT_DIR}/ckpt_*.pt). Fix: point "
            "at a run dir that has saved one, or at a .pt file."
        )
    raise FileNotFoundError(
        f"checkpoint path {p} does not exist. Fix: give a run dir or a .pt file."
    )


@dataclass
class CheckpointPolicy:
    every_frames: int
    every_minutes: float
    keep_last: int


class Checkpointer:
    """Decides when to save, writes atomically, prunes old ones, keeps ``best.pt``."""

    def __init__(self, run_dir: str | Path, policy: CheckpointPolicy, frames: int = 0):
        self.dir = Path(run_dir) / CKPT_DIR
        self.policy = policy
        self.last_frames = frames
        self.last_time = time.monotonic()
        self.best_return = float("-inf")

    def due(self, frames: int) -> bool:
        p = self.policy
        by_frames = p.every_frames > 0 and frames - self.last_frames >= p.every_frames
        by_time = p.every_minutes > 0 and time.monotonic() - self.last_time >= p.every_minutes * 60
        return by_frames or by_time

    def save(self, state: dict[str, Any], frames: int, mean_return: float | None) -> Path:
        path = self.dir / f"ckpt_{frames:012d}.pt"
        state = {**state, "best_return": self.best_return}
        atomic_torch_save(state, path)
        self.last_frames, self.last_time = frames, time.monotonic()
        if mean_return is not None and np.isfinite(mean_return) and mean_return > self.best_return:
            self.best_return = mean_return
            atomic_torch_save({**state, "best_return": mean_return}, self.dir / "best.pt")
        for old in list_checkpoints(self.dir.parent)[: -self.policy.keep_last]:
            old.unlink(missing_ok=True)
        return path


def truncate_lines(path: Path, keep: int) -> None:
    """Keep the first ``keep`` lines of a text file (drop what was logged after a checkpoint)."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    if len(lines) > keep:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(lines[:keep]))
        os.replace(tmp, path)


def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(1 for _ in f)
