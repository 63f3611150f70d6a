"""Hydra entry point: ``python -m impala_gpu`` and the ``impala-gpu`` console script."""

from __future__ import annotations

import math
import signal
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from impala_gpu.calibration import apply_auto
from impala_gpu.config import Config, conf_dir, register_configs, save_config
from impala_gpu.reporting.checkpoint import list_checkpoints, resolve_checkpoint
from impala_gpu.speed import reexec_with_tcmalloc
from impala_gpu.sweep import (
    DONE_FILE,
    LAST_SWEEP_FAILURES,
    SUPERSEDED,
    finished_point,
    mark_finished,
    record_failure,
    set_aside_unfinished,
)

CONF_DIR = conf_dir()

register_configs()


def algo_registry() -> dict[str, Any]:
    """algo.name -> train(cfg, run_dir, sweep). Imported lazily: start-up stays fast."""
    from impala_gpu.algos import a2c, a3c, impala

    return {
        "impala": impala.train,
        "impala_nocorrection": impala.train,
        "a2c": a2c.train,
        "a3c": a3c.train,
    }


def _sweep_info() -> tuple[str, dict[str, Any]]:
    hc = HydraConfig.get()
    info: dict[str, Any] = {}
    if hc.mode == RunMode.MULTIRUN:
        info["group"] = Path(hc.sweep.dir).name
        info["name"] = hc.job.override_dirname or f"job{hc.job.num}"
    return hc.runtime.output_dir, info


def resume_config(resume: str, overrides: list[str]) -> tuple[DictConfig, str]:
    """The config a run was trained with, plus this command's scalar overrides (e.g. a larger
    ``total_frames``), and the run dir to continue in."""
    import torch

    path = resolve_checkpoint(resume)
    saved = torch.load(path, map_location="cpu", weights_only=False)["config"]
    cfg = OmegaConf.merge(OmegaConf.structured(Config), saved)
    groups = {"env", "model", "algo", "wandb", "checkpoint", "experiment"}
    groups |= {"compare_cell", "lag_cell"}  # the sweep presets' own groups
    scalar = [o for o in overrides if o.split("=", 1)[0].lstrip("+") not in groups]
    skipped = sorted(set(overrides) - set(scalar))
    if skipped:
        print(
            f"impala_gpu: resuming keeps the run's own groups; ignoring {skipped}", file=sys.stderr
        )
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o.lstrip("+") for o in scalar]))
    cfg.resume = str(path)
    return cfg, str(path.parent.parent)


def run(dcfg: DictConfig) -> float:
    """One run (or one sweep point). Returns the final mean return, the sweepers' objective."""
    hydra_dir, sweep = _sweep_info()
    if sweep and not dcfg.resume:  # a sweep rerun into its own dir picks up where it stopped
        point_dir = dcfg.run_dir or hydra_dir
        done = finished_point(point_dir)
        if done is not None:
            _say_sweep(sweep, f"already finished in {point_dir} ({DONE_FILE}); skipped")
            return float(done["objective"])
        if list_checkpoints(point_dir):  # every algo resumes from its own checkpoints
            dcfg.resume = str(point_dir)
            _say_sweep(sweep, "did not finish; resuming it from its last checkpoint")
        elif set_aside_unfinished(point_dir):
            _say_sweep(sweep, f"did not finish; starting again (its files are *{SUPERSEDED})")
    if dcfg.resume:
        dcfg, run_dir = resume_config(dcfg.resume, HydraConfig.get().overrides.task)
    cfg: Config = OmegaConf.to_object(dcfg)  # type: ignore[assignment]
    run_dir = cfg.run_dir or (run_dir if cfg.resume else hydra_dir)
    from impala_gpu.learning.distributed import torchrun_rendezvous

    rank = torchrun_rendezvous()
    if rank is None or rank.leader:  # torchrun's other ranks take rank 0's config
        cfg = apply_auto(cfg, run_dir)  # config.yaml records what auto chose
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
    objective = ret if isinstance(ret, float) and math.isfinite(ret) else float("-inf")
    if sweep:
        mark_finished(run_dir, objective, last)  # rerunning the sweep into its dir skips it
    return objective


def _say_sweep(sweep: dict[str, Any], text: str) -> None:
    print(f"impala_gpu: sweep point [{sweep.get('name', '')}] {text}", file=sys.stderr, flush=True)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(dcfg: DictConfig) -> float:
    return run(dcfg)


class Terminated(KeyboardInterrupt):
    """SIGTERM (preemption, ``kill``): handled exactly like Ctrl-C."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def main() -> None:
    # SIGTERM takes Ctrl-C's path: checkpoint, stop actors, free shared memory, exit 128+15.
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        _hydra_main()
    except KeyboardInterrupt as e:
        how = "terminated" if isinstance(e, Terminated) else "interrupted"
        print(
            f"impala_gpu: {how}; checkpoint saved, actors stopped, shared memory freed.",
            file=sys.stderr,
        )
        sys.exit(143 if isinstance(e, Terminated) else 130)
    # Hydra returns the objective for sweepers; the exit code says whether every point ran.
    sys.exit(1 if LAST_SWEEP_FAILURES else 0)


def entry() -> None:
    """Command-line entry: restart under tcmalloc when it is installed (see
    ``impala_gpu/speed.py``), then ``main``."""
    reexec_with_tcmalloc()
    main()
