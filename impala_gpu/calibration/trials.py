"""A trial: a short real run of one candidate, for when the cost model cannot rank the best
ones apart. The algorithm's train function is passed in, so the tuner imports no algorithm
and no CLI."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from impala_gpu.calibration.model import Candidate
from impala_gpu.config import with_bounded_lag

TRIAL_START_S = 10.0  # a trial's allowance for spawning actors, beyond the seconds it measures

Train = Callable[..., dict[str, Any]]  # train(cfg, run_dir, sweep): an algorithm's entry point


def trial_config(cfg, c: Candidate, seconds: float):
    """``cfg`` as ``c``, for about ``seconds``, with W&B, checkpoints and health checks off;
    ``bounded_lag=auto`` as it would resolve for ``c``'s counts."""
    counts = dataclasses.replace(
        cfg, precision=c.precision, num_actors=c.num_actors, envs_per_actor=c.envs_per_actor
    )
    return dataclasses.replace(
        with_bounded_lag(counts),
        total_frames=10**15,
        max_seconds=seconds + TRIAL_START_S,
        log_interval_s=seconds / 4,
        target_return=None,
        resume=None,
        progress=False,
        wandb=dataclasses.replace(cfg.wandb, mode="disabled"),
        checkpoint=dataclasses.replace(cfg.checkpoint, every_frames=0, every_minutes=0),
        health=dataclasses.replace(cfg.health, enabled=False),
        tensorboard=False,
    )


def trial_run(train: Train, cfg, c: Candidate, seconds: float) -> float:
    """Agent steps per second of a real run of candidate ``c`` (``train``: the algorithm's,
    with this env and model) for about ``seconds``, in a temporary dir. It may take
    ``TRIAL_START_S`` more to spawn its actors; the count starts at its first log line, so the
    start-up is not in it."""
    # A trial's own console lines (its run dir, its end-of-run summary) would read as the
    # user's run: keep them off the console; an exception still propagates.
    quiet = io.StringIO()
    with (
        tempfile.TemporaryDirectory(prefix="impala_gpu_trial_") as tmp,
        contextlib.redirect_stdout(quiet),
        contextlib.redirect_stderr(quiet),
    ):
        train(trial_config(cfg, c, seconds), tmp, None)
        text = (Path(tmp) / "metrics.jsonl").read_text()
    lines = [json.loads(x) for x in text.splitlines()]
    if len(lines) < 2:
        raise RuntimeError(
            f"auto's {seconds:g} s trial of {c.overrides()} logged {len(lines)} metric lines; "
            "it needs 2. Fix: raise auto_trial_s, or set precision, num_actors and "
            "envs_per_actor by hand."
        )
    first, last = lines[0], lines[-1]
    return (last["agent_steps"] - first["agent_steps"]) / (last["elapsed_s"] - first["elapsed_s"])
