"""The algorithm registry: every name the config accepts has a train function and a cost
model, so the CLI and ``auto`` need no branch on a name."""

from __future__ import annotations

import warnings

from impala_gpu.algos.registry import ALGORITHMS, algorithm
from impala_gpu.config import Config, EnvCfg
from impala_gpu.validate import ALGO_NAMES


def test_every_algorithm_the_config_accepts_is_registered():
    assert set(ALGORITHMS) == set(ALGO_NAMES)
    assert all(algorithm(name).name == name for name in ALGO_NAMES)


def test_the_config_a2c_runs_is_the_one_the_cli_saves():
    cfg = Config(env=EnvCfg(id="CartPole-v1"), precision="fp32", num_actors=2, envs_per_actor=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = algorithm("a2c").runs(cfg)
    assert (runs.batch_size, runs.bounded_lag, runs.algo.correction) == (8, 0, "none")
    assert algorithm("impala").runs(cfg) is cfg
