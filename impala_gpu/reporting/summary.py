"""The end of a run on the console: what it reached and where its files and curves are.

Every algorithm calls ``print_summary`` (through ``lifecycle.run.Run.end``) after the final
checkpoint is saved, on a normal end and on Ctrl-C/SIGTERM alike, so a user always learns where
the weights went and how to look at the run.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from impala_gpu.reporting.logger import MetricsLogger
from impala_gpu.telemetry.window import Telemetry


@dataclass(frozen=True)
class RunEnd:
    """What the summary reports; every field comes from the run's own records."""

    frames: int
    elapsed_s: float
    final_return: float | None  # mean of the last 100 episodes; None before the first ends
    best_return: float | None  # the best such mean at a checkpoint (best.pt's)
    checkpoint: Path
    model: Path
    pointers: tuple[str, ...]  # W&B url or sync command, TensorBoard command
    interrupted: bool = False


def format_duration(seconds: float) -> str:
    """A short wall-clock duration: ``45s``, ``12m05s``, ``3h07m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _ret(v: float | None) -> str:
    return "n/a (no episode ended)" if v is None or not math.isfinite(v) else f"{v:.2f}"


def summary_text(end: RunEnd) -> str:
    """The summary block, one fact a line, each prefixed ``impala_gpu:`` like the other
    console lines so a log grep finds them."""
    how = "interrupted" if end.interrupted else "finished"
    lines = [
        f"run {how}: {end.frames:,} frames in {format_duration(end.elapsed_s)}",
        f"  mean return (last 100 episodes): final {_ret(end.final_return)}, "
        f"best {_ret(end.best_return)}",
        f"  checkpoint: {end.checkpoint}",
        f"  weights: {end.model}",
        *(f"  {p}" for p in end.pointers),
    ]
    return "\n".join(f"impala_gpu: {line}" for line in lines)


def print_summary(
    logger: MetricsLogger,
    tele: Telemetry,
    frames: int,
    elapsed_s: float,
    checkpoint: Path,
    best_return: float,
    interrupted: bool = False,
) -> None:
    """Print the end-of-run summary to stderr (call after the final checkpoint and
    ``model.pt`` are written, before ``logger.close``)."""
    end = RunEnd(
        frames=frames,
        elapsed_s=elapsed_s,
        final_return=tele.mean_return(),
        best_return=best_return if math.isfinite(best_return) else None,
        checkpoint=checkpoint,
        model=logger.run_dir / "model.pt",
        pointers=tuple(logger.pointers()),
        interrupted=interrupted,
    )
    print(summary_text(end), file=sys.stderr, flush=True)
