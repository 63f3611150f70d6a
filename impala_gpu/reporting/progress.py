"""Live console progress line (rich on a terminal, a plain line per log interval otherwise).

Both say the elapsed time and an ETA. The ETA counts to ``total_frames`` at the current frame
rate; with ``target_return`` set the run may stop sooner, so the ETA says so instead of
promising a time it cannot know.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.progress import ProgressColumn, Task
from rich.text import Text

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


def details(m: dict[str, Any]) -> list[str]:
    """A metrics line's details, most telling first: fps, learner busy/wait, policy lag, and
    the health figures that are present."""
    parts = [
        f"fps {m.get('frames_per_s', 0):,.0f}",
        f"busy {m.get('learner_busy', 0):.0%} wait {m.get('learner_wait', 0):.0%}",
        f"lag {m.get('policy_lag_mean', 0):.1f}",
    ]
    dead = {k.removeprefix("dead/"): v for k, v in m.items() if k.startswith("dead/")}
    if dead:
        worst = max(dead, key=lambda k: dead[k])
        parts.append(f"dead {worst} {dead[worst]:.0%}")
    grads = {k.removeprefix("grad_norm/"): v for k, v in m.items() if k.startswith("grad_norm/")}
    if grads:  # the weakest layer: a vanished gradient means that layer stopped learning
        weakest = min(grads, key=lambda k: grads[k])
        parts.append(f"grad {weakest} {grads[weakest]:.1e}")
    if "logit_spread" in m:
        parts.append(f"spread {m['logit_spread']:.3f} | entropy {m.get('entropy', 0):.2f}")
    return parts


def _return_text(m: dict[str, Any]) -> str:
    ret = m.get("episode_return", float("nan"))
    return f"return {ret:.1f}" if math.isfinite(ret) else "return n/a"


BAR_WIDTH = 20  # the bar's columns, when the line has room for it


def fit_line(
    frames: int,
    total: int,
    elapsed_s: float,
    m: dict[str, Any],
    target_return: float | None,
    width: int,
) -> Text:
    """The terminal's progress line in ``width`` columns. Frames, elapsed time, ETA and return
    come first and always show (under 60 columns); the room left goes, in this order, to the
    ETA's "or sooner" note, a bar, and whole ``details`` (fps, busy, lag, ...): the line is
    never wrapped, since a wrapped line scrolls the terminal at every refresh."""
    rate = m.get("frames_per_s", 0.0)
    left = max(0, total - frames)
    eta = format_duration(left / rate) if rate > 0 and math.isfinite(rate) else "?"
    core = [
        f"frames {short_count(frames)}/{short_count(total)}",
        f"elapsed {format_duration(elapsed_s)}",
        f"ETA {eta}",
        _return_text(m),
    ]
    sooner = f" (or sooner at return {target_return:g})" if target_return is not None else ""
    if len(" | ".join(core)) + len(sooner) <= width:
        core[2] += sooner
    line = Text(" | ".join(core))
    if width - len(line) >= BAR_WIDTH + 1:
        done = round(BAR_WIDTH * min(1.0, frames / total)) if total > 0 else 0
        bar = Text("━" * done, style="bar.complete")
        bar.append("━" * (BAR_WIDTH - done), style="bar.back")
        line = bar + " " + line
    for part in details(m) if m else []:  # none before the first metrics line
        if len(line) + 3 + len(part) > width:
            break
        line.append(" | " + part)
    line.truncate(width, overflow="ellipsis")  # a narrow terminal: cut, still no wrap
    return line


class Progress:
    def __init__(
        self,
        total_frames: int,
        enabled: bool = True,
        target_return: float | None = None,
        start: float | None = None,
        console: Any = None,
    ):
        """``start``: the ``time.perf_counter()`` the run's elapsed time counts from (earlier
        than now for a resumed run); ``console``: a rich Console to draw on (default: stderr,
        when it is a terminal; otherwise a plain line per log interval)."""
        self.enabled = enabled
        self.total = total_frames
        self.target_return = target_return
        self.start = time.perf_counter() if start is None else start
        self.frames = 0
        self.metrics: dict[str, Any] = {}  # the last metrics line
        self._bar = None
        if enabled and (console is not None or sys.stderr.isatty()):
            from rich.console import Console
            from rich.progress import Progress as RichProgress

            console = console or Console(stderr=True)
            # One column that fits the line to the terminal's width itself: rich's table of
            # columns cut the frame count and the elapsed time first at 80 columns, and its
            # TimeElapsedColumn was squeezed to "0:00:..." at 160 by the metrics beside it.
            self._bar = RichProgress(
                _LineColumn(lambda: self.line(console.width - 1)),
                console=console,
                transient=False,
            )
            self._task = self._bar.add_task("train", total=total_frames)
            self._bar.start()

    def line(self, width: int) -> Text:
        """The terminal line now, in ``width`` columns (the elapsed time is live)."""
        elapsed = time.perf_counter() - self.start
        return fit_line(self.frames, self.total, elapsed, self.metrics, self.target_return, width)

    @staticmethod
    def describe(m: dict[str, Any]) -> str:
        """The metrics of the plain line: fps, return, then ``details``."""
        ret = m.get("episode_return", float("nan"))
        fps, *rest = details(m)
        return " | ".join([fps, f"return {ret:.1f}", *rest])

    def update(self, frames: int, m: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self.frames, self.metrics = frames, m
            self._bar.update(self._task, completed=frames)
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


class _LineColumn(ProgressColumn):
    """The whole progress line as one rich column (``Progress.line``)."""

    def __init__(self, line: Callable[[], Text]):
        super().__init__()
        self._line = line

    def render(self, task: Task) -> Text:
        return self._line()
