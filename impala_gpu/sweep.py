"""Hydra multirun support: a failed point is recorded and reported, never silently lost."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

ERROR_FILE = "error.txt"


def record_failure(run_dir: str | Path, point: str, exc: BaseException) -> Path:
    """Write the point's overrides and traceback into ``run_dir/error.txt`` and say so."""
    path = Path(run_dir) / ERROR_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(traceback.format_exception(exc))
    path.write_text(f"sweep point: {point}\n\n{text}")
    print(
        f"impala_gpu: sweep point [{point}] FAILED: {type(exc).__name__}: {exc}\n"
        f"  traceback: {path}\n  the sweep goes on with the next point.",
        file=sys.stderr,
        flush=True,
    )
    return path


def failed_points(sweep_dir: str | Path) -> list[tuple[str, str]]:
    """(run dir name, first line of the error) for every failed point under ``sweep_dir``."""
    out = []
    for path in sorted(Path(sweep_dir).glob(f"*/{ERROR_FILE}")):
        lines = path.read_text().splitlines()
        last = next((ln for ln in reversed(lines) if ln.strip()), "")
        out.append((path.parent.name, last))
    return out


# Failed points of the multirun that just ended in this process; cli.main exits 1 if any.
LAST_SWEEP_FAILURES: list[tuple[str, str]] = []


class SweepReport(Callback):
    """At the end of a multirun: list the failed points (cli.main then exits non-zero)."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        LAST_SWEEP_FAILURES[:] = failed_points(config.hydra.sweep.dir)
        if LAST_SWEEP_FAILURES:
            rows = "\n".join(f"  {name}: {err}" for name, err in LAST_SWEEP_FAILURES)
            print(
                f"impala_gpu: {len(LAST_SWEEP_FAILURES)} sweep point(s) failed "
                f"(details in each error.txt):\n{rows}",
                file=sys.stderr,
                flush=True,
            )


DONE_FILE = "done.json"  # a finished sweep point: rerunning the sweep into its dir skips it
SUPERSEDED = ".interrupted"  # suffix for what an unfinished earlier attempt left


def finished_point(run_dir: str | Path) -> dict[str, Any] | None:
    """What a finished sweep point recorded (``mark_finished``), or None if it did not finish."""
    path = Path(run_dir) / DONE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def mark_finished(run_dir: str | Path, objective: float, last: dict[str, Any]) -> None:
    """Record that this sweep point ran to the end (its objective and its last metrics)."""
    path = Path(run_dir) / DONE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = {k: v for k, v in last.items() if isinstance(v, int | float | str | bool)}
    path.write_text(json.dumps({"objective": objective, "last": keep}, allow_nan=True))


def set_aside_unfinished(run_dir: str | Path) -> list[Path]:
    """An earlier attempt at this point stopped before the end (Ctrl-C, SIGTERM, a session
    limit): rename its metrics and events (``*.interrupted``) so the new attempt starts clean
    and nothing is deleted. Returns the renamed files."""
    moved = []
    for name in ("metrics.jsonl", "events.jsonl", ERROR_FILE):
        path = Path(run_dir) / name
        if path.is_file():
            target = path.with_name(path.name + SUPERSEDED)
            path.replace(target)
            moved.append(target)
    return moved
