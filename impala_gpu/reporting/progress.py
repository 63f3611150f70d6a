"""Live console progress line (rich on a terminal, a plain line per log interval otherwise).

Both say the elapsed time and an ETA. The ETA counts to ``total_frames`` at the current frame
rate; with ``target_return`` set the run may stop sooner, so the ETA says so instead of
promising a time it cannot know.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from impala_gpu.reporting.summary import format_duration


def short_count(n: float) -> str:
    """``10_000_000`` -> ``10M``, ``1_500_000`` -> ``1.5M``, ``200_000`` -> ``200K``."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.4g}{unit}"
    return f"{n:.0f}"


def eta_text(frames: int, total: int, frames_per_s: float, target_return: float | None) -> str:
    """``ETA 12m00s to 10M frames`` at this rate, ``(or sooner at return 18)`` appended when a
    target return can stop the run first; ``ETA ?`` before there is a rate."""
    left = max(0, total - frames)
    if not (frames_per_s > 0 and math.isfinite(frames_per_s)):
        text = f"ETA ? to {short_count(total)} frames"
    else:
        text = f"ETA {format_duration(left / frames_per_s)} to {short_count(total)} frames"
    if target_return is not None:
        text += f" (or sooner at return {target_return:g})"
    return text


class Progress:
    def __init__(self, total_frames: int, enabled: bool = True, target_return: float | None = None):
        self.enabled = enabled
        self.total = total_frames
        self.target_return = target_return
        self._bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            # Our own ETA column: rich's TimeRemainingColumn counts to total_frames even when
            # target_return will stop the run first, and cannot say so.
            self._bar = RichProgress(
                TextColumn("[bold]frames[/]"),
                BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                TextColumn("{task.fields[info]}"),
                transient=False,
            )
            self._task = self._bar.add_task("train", total=total_frames, info="", eta="")
            self._bar.start()

    @staticmethod
    def describe(m: dict[str, Any]) -> str:
        ret = m.get("episode_return", float("nan"))
        line = (
            f"fps {m.get('frames_per_s', 0):,.0f} | return {ret:.1f} | "
            f"busy {m.get('learner_busy', 0):.0%} wait {m.get('learner_wait', 0):.0%} | "
            f"lag {m.get('policy_lag_mean', 0):.1f}"
        )
        dead = {k.removeprefix("dead/"): v for k, v in m.items() if k.startswith("dead/")}
        if dead:
            worst = max(dead, key=lambda k: dead[k])
            line += f" | dead {worst} {dead[worst]:.0%}"
        grads = {
            k.removeprefix("grad_norm/"): v for k, v in m.items() if k.startswith("grad_norm/")
        }
        if grads:  # the weakest layer: a vanished gradient means that layer stopped learning
            weakest = min(grads, key=lambda k: grads[k])
            line += f" | grad {weakest} {grads[weakest]:.1e}"
        if "logit_spread" in m:
            line += f" | spread {m['logit_spread']:.3f} | entropy {m.get('entropy', 0):.2f}"
        return line

    def update(self, frames: int, m: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            eta = eta_text(frames, self.total, m.get("frames_per_s", 0.0), self.target_return)
            self._bar.update(self._task, completed=frames, info=self.describe(m), eta=eta)
        else:
            print(self.plain_line(frames, m), file=sys.stderr, flush=True)

    def plain_line(self, frames: int, m: dict[str, Any]) -> str:
        """The line printed per log interval when stderr is no terminal."""
        elapsed = format_duration(m.get("elapsed_s", 0.0))
        eta = eta_text(frames, self.total, m.get("frames_per_s", 0.0), self.target_return)
        return f"frames {frames:,}/{self.total:,} | {elapsed}, {eta} | {self.describe(m)}"

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
