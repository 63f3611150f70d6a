"""A2C: synchronous advantage actor-critic, on the IMPALA runtime.

Same actors, ring, learner, envs, models and logging as IMPALA; the one difference is the
barrier. With ``bounded_lag=0`` every actor acts with the learner's current version and each
update waits for exactly one unroll from every actor, so every sample has policy lag 0. Without
importance weights (``correction=none``, λ = 1) the V-trace targets reduce to n-step returns.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

from impala_gpu.algos import impala
from impala_gpu.config import Config, auto_keys


def synchronous_config(cfg: Config) -> Config:
    """``cfg`` with the synchronous barrier: one unroll per env per update, zero lag."""
    batch = cfg.num_actors * cfg.envs_per_actor
    if cfg.batch_size != batch:
        warnings.warn(
            f"a2c updates on one unroll from every env: batch_size is num_actors x "
            f"envs_per_actor = {batch} (batch_size={cfg.batch_size} ignored).",
            stacklevel=2,
        )
    return dataclasses.replace(
        cfg,
        batch_size=batch,
        bounded_lag=0,
        refresh_every=1,
        max_policy_lag=0,
        algo=dataclasses.replace(cfg.algo, correction="none"),
    )


def train(cfg: Config, run_dir: str | Path, sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train with A2C: IMPALA's ``train`` on ``synchronous_config(cfg)``."""
    # With auto unresolved, impala.train names the fix (or, on a torchrun rank > 0, takes
    # rank 0's config, resolved and synchronous already).
    if not auto_keys(cfg):
        cfg = synchronous_config(cfg)
    return impala.train(cfg, run_dir, sweep)
