"""Live console progress line (rich on a terminal, a plain line per log interval otherwise)."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    def __init__(self, total_frames: int, enabled: bool = True):
        self.enabled = enabled
        self.total = total_frames
        self._bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]frames[/]"),
                BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._task = self._bar.add_task("train", total=total_frames, info="")
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
            self._bar.update(self._task, completed=frames, info=self.describe(m))
        else:
            print(
                f"frames {frames:,}/{self.total:,} | {self.describe(m)}",
                file=sys.stderr,
                flush=True,
            )

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
