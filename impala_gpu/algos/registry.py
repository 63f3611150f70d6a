"""Every algorithm the CLI runs, by ``algo.name``: its train function, the config it really
runs, and its cost model for ``auto``. Adding an algorithm means adding it here (and its name
to ``validate.ALGO_NAMES``); the tuner and the CLI know none by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from impala_gpu.algos import a2c, a3c, impala
from impala_gpu.algos.costs import A2C_COST, A3C_COST, IMPALA_COST
from impala_gpu.calibration.model import CostModel
from impala_gpu.config import Config


def _as_given(cfg: Config) -> Config:
    return cfg


@dataclass(frozen=True)
class Algorithm:
    name: str
    train: Callable[..., dict[str, Any]]  # train(cfg, run_dir, sweep): the last metrics
    cost: CostModel
    # The config it runs, from a resolved one, as config.yaml records it (A2C: the batch is
    # one unroll of every env); its train applies it too, for library callers.
    runs: Callable[[Config], Config] = _as_given


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("impala", impala.train, IMPALA_COST),
        Algorithm("impala_nocorrection", impala.train, IMPALA_COST),
        Algorithm("a2c", a2c.train, A2C_COST, runs=a2c.synchronous_config),
        Algorithm("a3c", a3c.train, A3C_COST),
    )
}


def algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"algo.name={name!r} is not one of {sorted(ALGORITHMS)}.")
    return ALGORITHMS[name]
