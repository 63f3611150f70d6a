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
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from impala_gpu.config import ConfigError

CKPT_DIR = "checkpoints"
BEST = "best.pt"
SET_ASIDE = ".unreadable"  # suffix of a periodic checkpoint resume found unreadable
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


class UnreadableCheckpoint(ConfigError):
    """A checkpoint file ``torch.load`` cannot read: truncated (a full disk, a copy cut short)
    or corrupt. The message names the file, the reason and what to pass instead."""


def read_checkpoint(path: Path) -> dict[str, Any]:
    """``torch.load`` of one file onto the CPU. A damaged file raises ``UnreadableCheckpoint``
    naming it and why, instead of the reader's bare traceback; a missing one raises
    ``FileNotFoundError``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as e:
        # A damaged file fails anywhere in the zip reader or the unpickler, so with nearly any
        # type: RuntimeError (zip archive), OSError (Invalid argument), EOFError, ValueError,
        # UnpicklingError... The reason goes into the message, so nothing is hidden.
        text = str(e).splitlines()[0] if str(e) else ""
        if len(text) > 120:  # torch's zip reader appends a paragraph of advice
            text = text.split(". ")[0]
        reason = f"{type(e).__name__}: {text}".rstrip(": ")
        raise UnreadableCheckpoint(
            f"checkpoint {path} is not a readable checkpoint (truncated or corrupt: {reason})."
        ) from e


def _alternatives(bad: Path) -> str:
    """The 'Fix:' for an unreadable checkpoint file: the run's other checkpoints to pass."""
    d = bad.parent
    run_dir = d.parent if d.name == CKPT_DIR else d
    older = [p for p in list_checkpoints(run_dir) if p.name < bad.name]
    options = [f"an older checkpoint of the run, e.g. {older[-1]}"] if older else []
    if (d / BEST).is_file() and bad.name != BEST:
        options.append(f"its best checkpoint {d / BEST}")
    if not options:
        return (
            f"Fix: the run has no other checkpoint in {d}; restore the file from a copy, or "
            "start the run again without it."
        )
    options.append(f"the run dir {run_dir} (the newest checkpoint that loads is taken)")
    return "Fix: pass " + ", or ".join(options) + "."


def load_checkpoint(
    source: str | Path, prefer_best: bool = False, set_aside: bool = False
) -> tuple[Path, dict[str, Any]]:
    """The checkpoint to continue from (or evaluate) and its contents, read once.

    ``source`` is a ``.pt`` file (it must load: an unreadable one is an error naming it and the
    run's other checkpoints) or a run dir. In a run dir the periodic checkpoints are tried
    newest first, then ``best.pt`` (``prefer_best``: ``best.pt`` first); a file that does not
    load is skipped with a warning naming it and the file used instead, so one truncated
    checkpoint (a crash or a full disk mid-copy) does not end a run that has older good ones.

    ``set_aside`` (resume): a skipped file is renamed ``*.pt.unreadable``. Left in place it
    would be pruned last (checkpoints are pruned by name, and it has the highest frames), so
    with ``keep_last=1`` the resumed run's next save would delete the good one it resumed from.

    This is the one place that picks and reads a checkpoint: ``cli.resume_config`` (the
    config), the algorithms' ``restore`` and ``evaluate`` all call it."""
    p = Path(source)
    if p.is_file():
        try:
            return p, read_checkpoint(p)
        except UnreadableCheckpoint as e:
            raise UnreadableCheckpoint(f"{e} {_alternatives(p)}") from e.__cause__
    if not p.is_dir():
        raise FileNotFoundError(
            f"checkpoint path {p} does not exist. Fix: give a run dir or a .pt file."
        )
    best = [p / CKPT_DIR / BEST] if (p / CKPT_DIR / BEST).is_file() else []
    periodic = list_checkpoints(p)[::-1]
    candidates = best + periodic if prefer_best else periodic + best
    if not candidates:
        raise FileNotFoundError(
            f"no checkpoint in run dir {p} (looked for {p / CKPT_DIR}/ckpt_*.pt and {BEST}). "
            "Fix: point at a run dir that has saved one, or at a .pt file."
        )
    skipped: list[str] = []
    for path in candidates:
        try:
            state = read_checkpoint(path)
        except FileNotFoundError:  # pruned (or set aside) by another process meanwhile
            continue
        except UnreadableCheckpoint as e:
            reason = str(e)
            if set_aside:
                try:
                    path.rename(path.with_name(path.name + SET_ASIDE))
                    reason += f" Set aside as {path.name}{SET_ASIDE}."
                except OSError:
                    pass  # still skipped; only the pruning hazard above remains
            skipped.append(reason)
            continue
        for reason in skipped:
            print(f"impala_gpu: warning: {reason} Using {path} instead.", file=sys.stderr)
        return path, state
    raise UnreadableCheckpoint(
        f"no checkpoint in run dir {p} loads: " + " ".join(skipped) + " Fix: restore one of "
        "them from a copy, or start the run again in a new run dir."
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
            atomic_torch_save({**state, "best_return": mean_return}, self.dir / BEST)
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
