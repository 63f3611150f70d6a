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

from impala_gpu.config import Config, register_configs

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

register_configs()


def algo_registry() -> dict[str, Any]:
    from impala_gpu.algos import impala

    return {"impala": impala.train}


def save_config(cfg: Config, run_dir: str | Path) -> Path:
    """Write the resolved config beside the run's metrics."""
    path = Path(run_dir) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return path


def _sweep_info() -> tuple[str, dict[str, Any]]:
    hc = HydraConfig.get()
    info: dict[str, Any] = {}
    if hc.mode == RunMode.MULTIRUN:
        info["group"] = Path(hc.sweep.dir).name
        info["name"] = hc.job.override_dirname or f"job{hc.job.num}"
    return hc.runtime.output_dir, info


def run(dcfg: DictConfig) -> float:
    cfg: Config = OmegaConf.to_object(dcfg)  # type: ignore[assignment]
    hydra_dir, sweep = _sweep_info()
    run_dir = cfg.run_dir or hydra_dir
    save_config(cfg, run_dir)
    algos = algo_registry()
    if cfg.algo.name not in algos:
        raise ValueError(f"algo.name={cfg.algo.name!r} is not one of {sorted(algos)}.")
    last = algos[cfg.algo.name](cfg, run_dir, sweep)
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
    sys.exit(0)
