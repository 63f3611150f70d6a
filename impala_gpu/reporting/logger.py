"""Metrics sinks: ``metrics.jsonl`` always, W&B when enabled, a live console line.

Only the learner process logs; actors send their episode stats to it.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

from impala_gpu.config import Config, to_container

WANDB_MODES = ("offline", "online", "disabled")


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null keeps every line parseable
    return v


class MetricsLogger:
    """Append-only JSONL writer plus optional W&B run. Safe to use as a context manager."""

    def __init__(
        self,
        run_dir: str | Path,
        cfg: Config,
        sweep: dict[str, Any] | None = None,
        resume_id: str | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._file = open(self.path, "a", buffering=1)  # line-buffered: a crash loses no line
        self.wandb_run = None
        self.console = None
        if cfg.wandb.mode not in WANDB_MODES:
            raise ValueError(f"wandb.mode={cfg.wandb.mode!r} is not one of {WANDB_MODES}.")
        if cfg.wandb.mode != "disabled":
            self.wandb_run = _init_wandb(self.run_dir, cfg, sweep or {}, resume_id)

    def log(
        self, metrics: dict[str, Any], histograms: dict[str, list[float]] | None = None
    ) -> None:
        self._file.write(json.dumps({k: _jsonable(v) for k, v in metrics.items()}) + "\n")
        if self.wandb_run is not None:
            import wandb

            data = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
            for name, values in (histograms or {}).items():
                if values:
                    data[name] = wandb.Histogram(values)
            self.wandb_run.log(data, step=int(metrics.get("frames", 0)))

    def event(self, event: dict[str, Any]) -> None:
        """One line in ``events.jsonl``: things that happened (an actor replaced, ...)."""
        with open(self.run_dir / "events.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), **event}) + "\n")

    def write_json(self, name: str, obj: Any) -> None:
        """Replace ``run_dir/name`` atomically (readers never see half a file)."""
        tmp = self.run_dir / f".{name}.tmp"
        tmp.write_text(json.dumps(obj))
        os.replace(tmp, self.run_dir / name)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def wandb_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None


def _init_wandb(run_dir: Path, cfg: Config, sweep: dict[str, Any], resume_id: str | None):
    import wandb

    mode = cfg.wandb.mode
    kwargs = dict(
        project=cfg.wandb.project,
        entity=cfg.wandb.entity,
        group=cfg.wandb.group or sweep.get("group"),
        job_type=cfg.wandb.job_type or cfg.algo.name,
        name=sweep.get("name"),
        tags=list(cfg.wandb.tags),
        config=to_container(cfg),
        dir=str(run_dir),
        reinit="finish_previous",
    )
    if resume_id:  # a resumed run continues the same W&B run
        kwargs.update(id=resume_id, resume="allow")
    os.environ.setdefault("WANDB_SILENT", "true")
    if mode == "online":
        try:
            return wandb.init(
                mode="online",
                settings=wandb.Settings(init_timeout=cfg.wandb.init_timeout),
                **kwargs,
            )
        except Exception as e:  # no key, no network: keep the run, log offline instead
            warnings.warn(
                f"wandb online init failed ({type(e).__name__}: {e}); logging offline instead. "
                f"Upload later with `wandb sync {run_dir}/wandb/offline-run-*`.",
                stacklevel=2,
            )
    return wandb.init(mode="offline", **kwargs)
