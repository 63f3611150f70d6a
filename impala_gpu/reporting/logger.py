"""Metrics sinks: ``metrics.jsonl`` always, TensorBoard and W&B when enabled.

Only the learner process logs; actors send their episode stats to it. ``metrics.jsonl`` keeps
flat keys (the analysis code reads them); TensorBoard and W&B get the same scalars under a
prefix (``metric_group``) so their dashboards open on sections, with frames as the x-axis.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from impala_gpu.config import Config, short_env, to_container

WANDB_MODES = ("offline", "online", "disabled")
TB_FLUSH_S = 5.0  # TensorBoard's event file: flushed this often, and close() waits at most this

# Which dashboard section a flat key belongs to; anything not named here is perf/.
_CHARTS = {
    "episode_return", "episode_length", "episodes", "frames_per_s", "agent_steps_per_s",
    "agent_steps", "updates", "elapsed_s", "lr",
}  # fmt: skip
_LOSSES = {
    "total_loss", "pg_loss", "baseline_loss", "entropy_loss", "entropy", "mean_rho",
    "mean_abs_log_rho", "kl_behavior_target", "clipped_rho_fraction", "clipped_pg_rho_fraction",
    "behavior_clipped_fraction",
}  # fmt: skip
_HEALTH = {"logit_spread", "grad_norm", "nonfinite"}
_HEALTH_PREFIXES = ("dead/", "grad_norm/")
_NOT_PLOTTED = {"frames", "time"}  # the x-axis itself, and a wall-clock timestamp


def metric_group(key: str) -> str:
    """The dashboard name of a flat metrics key: ``charts/``, ``losses/``, ``health/`` or
    ``perf/`` in front of it (``episode_return`` -> ``charts/episode_return``,
    ``dead/conv1`` -> ``health/dead/conv1``, ``policy_lag_mean`` -> ``perf/policy_lag_mean``).
    Keys that are the step (``frames``) or a timestamp (``time``) come back unchanged."""
    if key in _NOT_PLOTTED:
        return key
    if key in _CHARTS:
        return f"charts/{key}"
    if key in _LOSSES or {"kl", "rho"} & set(key.split("_")):
        return f"losses/{key}"
    if key in _HEALTH or key.startswith(_HEALTH_PREFIXES):
        return f"health/{key}"
    return f"perf/{key}"


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The plottable scalars under their dashboard names (lists and NaNs left out)."""
    out = {}
    for k, v in metrics.items():
        if k in _NOT_PLOTTED or isinstance(v, bool) or not isinstance(v, numbers.Real):
            continue
        if math.isfinite(v):  # numpy scalars too: float() makes them plain for both sinks
            out[metric_group(k)] = float(v)
    return out


@dataclass(frozen=True)
class RunNames:
    """What W&B calls a run: its name, its group and its job type."""

    name: str
    group: str | None
    job_type: str


def run_names(cfg: Config, sweep: dict[str, Any], choices: dict[str, Any], today: str) -> RunNames:
    """W&B's (name, group, job_type) for a run: ``<experiment or algo>-<env>-s<seed>``, in a
    sweep followed by the point's other overrides so points stay apart; the group is the
    experiment (or, in a sweep without one, ``<algo>-<env>``) plus the date it started; the
    job type is the algo. ``choices``: Hydra's runtime group choices (``experiment``);
    ``sweep``: ``cli._sweep_info``'s dict (``name``, ``date``) or empty. ``cfg.wandb.group``
    and ``cfg.wandb.job_type`` win when set."""
    experiment = choices.get("experiment")
    # The env that runs: env=pong env.id=ALE/SpaceInvaders-v5 is spaceinvaders, not pong.
    env = short_env(cfg.env.id)
    name = f"{experiment or cfg.algo.name}-{env}-s{cfg.seed}"
    if sweep:
        rest = [o for o in str(sweep.get("name", "")).split(",") if o and "seed=" not in o]
        if rest:
            name += "-" + ",".join(rest)
    date = sweep.get("date") or today
    group = None
    if experiment:
        group = f"{experiment}-{date}"
    elif sweep:
        group = f"{cfg.algo.name}-{env}-{date}"
    return RunNames(
        name=name, group=cfg.wandb.group or group, job_type=cfg.wandb.job_type or cfg.algo.name
    )


def hydra_choices() -> dict[str, Any]:
    """Hydra's group choices for this run (``{"env": "cartpole", "experiment": ...}``); empty
    when the run was not started through Hydra (tests, notebooks)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return {k: v for k, v in HydraConfig.get().runtime.choices.items() if v is not None}


def _last_frames(path: Path) -> int | None:
    """The ``frames`` of the last line in a metrics file; None when there is none."""
    last = None
    if path.is_file():
        with open(path) as f:
            for line in f:
                if line.strip():
                    last = line
    return None if last is None else int(json.loads(last).get("frames", 0))


def _say(text: str) -> None:
    print(f"impala_gpu: {text}", file=sys.stderr, flush=True)


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()  # numpy scalars (an int64 counter) as the plain numbers JSON takes
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null keeps every line parseable
    return v


class MetricsLogger:
    """Append-only JSONL writer plus optional TensorBoard writer and W&B run. Safe to use as a
    context manager; ``close`` flushes and closes every sink (each algo calls it in a
    ``finally``, so Ctrl-C and errors too)."""

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
        self.tb = None
        if cfg.wandb.mode not in WANDB_MODES:
            raise ValueError(f"wandb.mode={cfg.wandb.mode!r} is not one of {WANDB_MODES}.")
        _say(f"run dir {self.run_dir}")
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # A resumed run dropped the lines past its checkpoint (truncate_lines): TensorBoard
            # hides the first attempt's points from there on too, so no step shows twice.
            last = _last_frames(self.path)
            purge = None if last is None else last + 1
            # Its writer thread sleeps until the next flush, and a Ctrl-C that lands inside a
            # write can cost it the wake-up for close()'s stop signal: flush_secs bounds how long
            # close() may then wait, and how far a live TensorBoard view lags the run.
            self.tb = SummaryWriter(
                log_dir=str(self.run_dir), purge_step=purge, flush_secs=TB_FLUSH_S
            )
        if cfg.wandb.mode != "disabled":
            names = run_names(cfg, sweep or {}, hydra_choices(), time.strftime("%Y-%m-%d"))
            self.wandb_run = _init_wandb(self.run_dir, cfg, names, resume_id)
            if self.wandb_url:  # WANDB_SILENT hides wandb's own line: say where it is
                _say(f"W&B run {self.wandb_url}")

    def log(
        self, metrics: dict[str, Any], histograms: dict[str, list[float]] | None = None
    ) -> None:
        self._file.write(json.dumps({k: _jsonable(v) for k, v in metrics.items()}) + "\n")
        if self.tb is None and self.wandb_run is None:
            return
        frames = int(metrics.get("frames", 0))
        scalars = _scalars(metrics)
        if self.tb is not None:
            for name, v in scalars.items():
                self.tb.add_scalar(name, v, global_step=frames)
            for name, values in (histograms or {}).items():
                if values:
                    self.tb.add_histogram(
                        metric_group(name), np.asarray(values), global_step=frames
                    )
        if self.wandb_run is not None:
            import wandb

            data: dict[str, Any] = {"frames": frames, **scalars}
            for name, values in (histograms or {}).items():
                if values:
                    data[metric_group(name)] = wandb.Histogram(values)
            self.wandb_run.log(data)  # x-axis: frames (define_metric in _init_wandb)

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
        """Flush and close every sink. Idempotent."""
        if not self._file.closed:
            self._file.close()
        if self.tb is not None:
            self.tb.close()  # flushes the event file
            self.tb = None
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

    @property
    def wandb_url(self) -> str | None:
        """The run's page when it logs online; None offline or disabled."""
        if self.wandb_run is None or self.wandb_run.offline:
            return None  # (run.url would warn on an offline run)
        return self.wandb_run.url

    def pointers(self) -> list[str]:
        """Where to look at this run's curves: the W&B page (or the command that uploads an
        offline run) and the TensorBoard command."""
        out = []
        if self.wandb_url:
            out.append(f"W&B: {self.wandb_url}")
        elif self.wandb_run is not None:
            out.append(f"W&B (offline): wandb sync {self.wandb_run.sync_dir}")
        if self.tb is not None or any(self.run_dir.glob("events.out.tfevents.*")):
            out.append(f"TensorBoard: tensorboard --logdir {self.run_dir}")
        return out


def _init_wandb(run_dir: Path, cfg: Config, names: RunNames, resume_id: str | None):
    run = _start_wandb(run_dir, cfg, names, resume_id)
    run.define_metric("frames")
    run.define_metric("*", step_metric="frames")
    return run


def _start_wandb(run_dir: Path, cfg: Config, names: RunNames, resume_id: str | None):
    import wandb

    mode = cfg.wandb.mode
    kwargs = dict(
        project=cfg.wandb.project,
        entity=cfg.wandb.entity,
        group=names.group,
        job_type=names.job_type,
        name=names.name,
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
