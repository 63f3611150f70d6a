"""Hydra entry point: ``python -m impala_gpu`` and the ``impala-gpu`` console script."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from impala_gpu.config import Config, register_configs, save_config
from impala_gpu.sweep import LAST_SWEEP_FAILURES, record_failure

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

register_configs()


def algo_registry() -> dict[str, Any]:
    """algo.name -> train(cfg, run_dir, sweep). Imported lazily: start-up stays fast."""
    from impala_gpu.algos import a2c, impala

    algos = {"impala": impala.train, "impala_nocorrection": impala.train, "a2c": a2c.train}
    try:
        from impala_gpu.algos import a3c

        algos["a3c"] = a3c.train
    except ImportError:  # pragma: no cover - a3c lands separately
        pass
    return algos


def _sweep_info() -> tuple[str, dict[str, Any]]:
    hc = HydraConfig.get()
    info: dict[str, Any] = {}
    if hc.mode == RunMode.MULTIRUN:
        info["group"] = Path(hc.sweep.dir).name
        info["name"] = hc.job.override_dirname or f"job{hc.job.num}"
    return hc.runtime.output_dir, info


def run(dcfg: DictConfig) -> float:
    """One run (or one sweep point). Returns the final mean return, the sweepers' objective."""
    cfg: Config = OmegaConf.to_object(dcfg)  # type: ignore[assignment]
    hydra_dir, sweep = _sweep_info()
    run_dir = cfg.run_dir or hydra_dir
    save_config(cfg, run_dir)
    algos = algo_registry()
    if cfg.algo.name not in algos:
        raise ValueError(f"algo.name={cfg.algo.name!r} is not one of {sorted(algos)}.")
    try:
        last = algos[cfg.algo.name](cfg, run_dir, sweep)
    except Exception as e:
        if not sweep:
            raise
        # In a sweep one bad point must not take the others down, nor vanish: record it, go
        # on, and let SweepReport fail the whole multirun at the end.
        record_failure(run_dir, sweep.get("name", ""), e)
        return float("-inf")
    ret = last.get("episode_return", float("nan"))
    return ret if isinstance(ret, float) and math.isfinite(ret) else float("-inf")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(dcfg: DictConfig) -> float:
    return run(dcfg)


def main() -> None:
    # Hydra returns the objective for sweepers; the process exit code stays 0 on success.
    try:
        _hydra_main()
    except KeyboardInterrupt:
        print("impala_gpu: interrupted; actors stopped, shared memory freed.", file=sys.stderr)
        sys.exit(130)
    sys.exit(1 if LAST_SWEEP_FAILURES else 0)
