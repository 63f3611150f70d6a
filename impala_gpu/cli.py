"""Hydra entry point: ``python -m impala_gpu`` and the ``impala-gpu`` console script."""

from __future__ import annotations

import math
import re
import shutil
import signal
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from impala_gpu import interrupts
from impala_gpu.calibration import apply_auto
from impala_gpu.cli_help import register_help_resolvers
from impala_gpu.config import Config, ConfigError, conf_dir, register_configs, save_config
from impala_gpu.interrupts import Terminated
from impala_gpu.lifecycle.run import interrupted_text
from impala_gpu.lifecycle.rundir import RunDirInUse, claim_run_dir, release_all
from impala_gpu.overrides import check_command_line
from impala_gpu.reporting.checkpoint import list_checkpoints, load_checkpoint
from impala_gpu.speed.tcmalloc import reexec_with_tcmalloc
from impala_gpu.sweep import (
    DONE_FILE,
    LAST_SWEEP_FAILURES,
    SUPERSEDED,
    finished_point,
    mark_finished,
    record_failure,
    set_aside_unfinished,
)
from impala_gpu.validate import validate_config, validate_run_config
from impala_gpu.validate_inputs import validate_resume, validate_run_dir, writable_target

if TYPE_CHECKING:
    from impala_gpu.algos.registry import Algorithm

CONF_DIR = conf_dir()

register_configs()
register_help_resolvers()  # conf/config.yaml's help template calls them


def _sweep_info() -> tuple[str, dict[str, Any]]:
    hc = HydraConfig.get()
    info: dict[str, Any] = {}
    if hc.mode == RunMode.MULTIRUN:
        info["group"] = Path(hc.sweep.dir).name
        info["name"] = hc.job.override_dirname or f"job{hc.job.num}"
        # The day the sweep started (its dir holds it), not this point's: one W&B group.
        day = re.search(r"\d{4}-\d{2}-\d{2}", str(hc.sweep.dir))
        if day:
            info["date"] = day.group()
    return hc.runtime.output_dir, info


def resume_config(resume: str, overrides: list[str]) -> DictConfig:
    """The config a run was trained with, plus this command's scalar overrides (e.g. a larger
    ``total_frames``). Its ``run_dir`` is the checkpoint's own, where the run dir lies now (it
    may have moved since the run started), unless the command gives ``run_dir=``.

    In a run dir, the newest checkpoint that loads (see ``load_checkpoint``); ``cfg.resume``
    then names that file, so the algorithm's ``restore`` reads the same one."""
    path, ckpt = load_checkpoint(resume, set_aside=True)
    saved = ckpt["config"]
    cfg = OmegaConf.merge(OmegaConf.structured(Config), saved)
    cfg.run_dir = str(path.parent.parent)
    groups = {"env", "model", "algo", "wandb", "checkpoint", "experiment", "recipe"}
    groups |= {"compare_cell", "lag_cell"}  # the sweep presets' own groups
    # A deletion (~key) changes the defaults the run was composed from, which it keeps.
    scalar = [
        o
        for o in overrides
        if not o.startswith("~") and o.split("=", 1)[0].lstrip("+") not in groups
    ]
    skipped = sorted(set(overrides) - set(scalar))
    if skipped:
        print(
            f"impala_gpu: resuming keeps the run's own groups; ignoring {skipped}", file=sys.stderr
        )
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o.lstrip("+") for o in scalar]))
    cfg.resume = str(path)
    return cfg


def run(dcfg: DictConfig) -> float:
    """One run (or one sweep point). Returns the final mean return, the sweepers' objective.
    Its run dir is locked for it (``lifecycle.rundir``) until it returns."""
    hydra_dir, sweep = _sweep_info()
    try:
        if sweep:  # a sweep point's dir: the sweep's own rules below decide what it holds
            try:
                claim_run_dir(dcfg.run_dir or hydra_dir, check_files=False)
            except RunDirInUse as e:  # another process runs this point: leave its dir alone
                _say_sweep(sweep, f"skipped: {e}")
                return float("-inf")
        return _run(dcfg, hydra_dir, sweep)
    except KeyboardInterrupt:
        if not sweep:  # stopped before writing anything (calibrating): leave no run dir
            remove_hydra_debris(hydra_dir)
        raise
    finally:
        release_all()


def _run(dcfg: DictConfig, hydra_dir: str, sweep: dict[str, Any]) -> float:
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
        try:
            dcfg = resume_config(dcfg.resume, HydraConfig.get().overrides.task)
        except (FileNotFoundError, ConfigError) as e:  # none there, or none loads
            err = e if isinstance(e, ConfigError) else ConfigError(f"resume={dcfg.resume}: {e}")
            if not sweep:
                remove_hydra_debris(hydra_dir)
                exit_config_error(err)
            record_failure(dcfg.run_dir or hydra_dir, sweep.get("name", ""), err)
            return float("-inf")
    cfg: Config = OmegaConf.to_object(dcfg)  # type: ignore[assignment]
    run_dir = cfg.run_dir or hydra_dir
    from impala_gpu.algos.registry import algorithm  # here: start-up stays fast
    from impala_gpu.learning.distributed import torchrun_rendezvous

    try:
        # The callback's verdict (a resume, or a point of a sweeper that draws its points as
        # it goes, is checked here): before the calibration, any process or any file.
        check_config(cfg)
        checked = cfg
        algo = algorithm(cfg.algo.name)
        rank = torchrun_rendezvous()
        if rank is None or rank.leader:  # torchrun's other ranks take rank 0's config
            # The CLI claimed it before Hydra wrote there (ClaimRunDir): a no-op then.
            own = Path(cfg.resume).parent.parent if cfg.resume else None
            claim_run_dir(run_dir, resuming=own, job_name=HydraConfig.get().job.name)
            # auto's one resolution: no algorithm resolves it again.
            cfg = apply_auto(cfg, algo, run_dir, check=lambda c: check_runnable(checked, c, algo))
            cfg = algo.runs(cfg)
            save_config(cfg, run_dir)  # config.yaml records what runs, auto's choice included
    except ConfigError as e:
        if not sweep:
            remove_hydra_debris(hydra_dir)
            exit_config_error(e)
        record_failure(run_dir, sweep.get("name", ""), e)  # as any failed point: go on
        return float("-inf")
    try:
        last = algo.train(cfg, run_dir, sweep)
    except Exception as e:
        if not sweep:
            if isinstance(e, ConfigError):  # one line, as every other ConfigError
                exit_config_error(e)
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


# The configs validate_config passed in this process: the Hydra callbacks check each before
# Hydra makes its run dir, and ``_run`` takes their verdict instead of checking again.
_CHECKED: list[Config] = []


def check_config(cfg: Config) -> None:
    """``validate_config`` with ``auto`` allowed, once per config in this process."""
    if cfg not in _CHECKED:
        validate_config(cfg, allow_auto=True)
        _CHECKED.append(cfg)


def check_runnable(checked: Config, cfg: Config, algo: Algorithm) -> None:
    """The config ``algo`` will run (``auto`` resolved in ``cfg``; A2C derives its batch from
    the actors), checked where it differs from ``checked``, which ``check_config`` passed."""
    with warnings.catch_warnings():  # what algo.runs warns of, it says once, when it applies
        warnings.simplefilter("ignore")
        cfg = algo.runs(cfg)
    validate_run_config(checked, cfg)


def remove_hydra_debris(hydra_dir: str | Path) -> None:
    """A run that failed its config check leaves no run dir: remove Hydra's output dir when it
    holds nothing but what Hydra wrote there (``.hydra/`` and the job's log), so that
    ``analysis.find_runs`` and the user see no run that never ran."""
    path = Path(hydra_dir)
    try:
        log = f"{HydraConfig.get().job.name}.log"
    except ValueError:  # not under Hydra
        return
    if not path.is_dir() or {p.name for p in path.iterdir()} - {".hydra", log}:
        return
    hydra_files = path / ".hydra"
    if hydra_files.is_dir() and {p.name for p in hydra_files.iterdir()} - HYDRA_FILES:
        return
    shutil.rmtree(hydra_files, ignore_errors=True)
    (path / log).unlink(missing_ok=True)
    try:
        path.rmdir()
    except OSError:  # something else appeared meanwhile: leave it
        pass


HYDRA_FILES = {"config.yaml", "hydra.yaml", "overrides.yaml"}


def job_config(config: DictConfig) -> Config:
    """The run's ``Config`` from the config a Hydra callback sees (the job's keys and
    ``hydra``)."""
    from omegaconf.errors import OmegaConfBaseException

    job = OmegaConf.to_container(config, resolve=False)
    assert isinstance(job, dict)
    job.pop("hydra", None)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), job)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:  # a key or type overrides.check_overrides let by
        key = getattr(e, "full_key", None) or "the config"
        raise ConfigError(
            f"{key}: {str(e).splitlines()[0]}. Fix: the keys and types of "
            "impala_gpu/config/schema.py (python -m impala_gpu --help lists the frequent ones)."
        ) from None


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_points(config: DictConfig) -> list[list[str]] | None:
    """Every point's overrides, as Hydra's basic sweeper will expand them (its own code), or
    None for another sweeper (Optuna's points are drawn as the sweep goes)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        return None
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += list(config.hydra.overrides.task)
    parser = OverridesParser.create()
    batches = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)
    return [point for batch in batches for point in batch]


def exit_config_error(e: Exception) -> NoReturn:
    """End the process (exit 1) with ``e``'s one line, ``impala_gpu: ConfigError: ...``: no
    traceback (Hydra prints one for an exception its task raises)."""
    sys.exit(f"impala_gpu: {type(e).__name__}: {e}")


def _exit_on_config_error(check: Callable[[], None]) -> None:
    """Run ``check()``; a ConfigError ends the process (exit 1) with its message. SystemExit,
    because Hydra turns a callback's Exception into a warning and carries on: any other
    exception ends it too, with its traceback (a bug in a check), never a run on a config
    that was not checked (``+foo=1`` once trained Pong after that warning)."""
    try:
        check()
    except ConfigError as e:
        exit_config_error(e)
    except Exception:
        traceback.print_exc()
        sys.exit("impala_gpu: the config check failed (the traceback above); nothing was run.")


class CheckConfig(Callback):
    """Hydra callback (``conf/config.yaml``): check the config before Hydra makes the run's
    dir, and every point of a sweep before its first point starts, so that an impossible value
    fails at once, with nothing written, instead of after a calibration or hours into a sweep.
    A resumed run is checked in ``run``, on the config it resumes."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_on_config_error(lambda: check_start(config))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_on_config_error(lambda: check_sweep(config))


def check_start(config: DictConfig) -> None:
    """A single run's checks before Hydra makes its dir: the config (``validate_config``,
    ``auto`` allowed), and that its run dir can be written; a resumed run's config is
    checked in ``run``, once read from its checkpoint, and here only that there is one."""
    if config.get("resume"):
        validate_resume(str(config.resume))
        return
    cfg = job_config(config)
    check_config(cfg)
    # hydra.run.dir unresolved: its default interpolates the date, which only run_job sets.
    hydra_run = OmegaConf.to_container(config.hydra.run, resolve=False)
    assert isinstance(hydra_run, dict)
    key, path = writable_target(cfg.run_dir, hydra_run.get("dir"))
    validate_run_dir(path, key=key)


def check_sweep(config: DictConfig) -> None:
    """Every point of the multirun ``config`` describes, checked (``validate_config`` with
    ``auto`` allowed); one ConfigError names every point that cannot run."""
    from hydra.core.global_hydra import GlobalHydra

    points = sweep_points(config)
    if points is None:  # another sweeper: its points are checked as each starts
        if not config.get("resume"):
            check_config(job_config(config))
        return
    loader = GlobalHydra.instance().config_loader()
    bad = []
    for num, point in enumerate(points):
        point_cfg = loader.load_sweep_config(config, list(point))
        if point_cfg.get("resume"):
            continue
        try:
            check_config(job_config(point_cfg))
        except ConfigError as e:
            bad.append(f"  point #{num} ({' '.join(point)}): {e}")
    if bad:
        raise ConfigError(
            f"{len(bad)} of the sweep's {len(points)} points cannot run, so none was started:\n"
            + "\n".join(bad)
        )


def _say_sweep(sweep: dict[str, Any], text: str) -> None:
    print(f"impala_gpu: sweep point [{sweep.get('name', '')}] {text}", file=sys.stderr, flush=True)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(dcfg: DictConfig) -> float:
    return run(dcfg)


def version() -> str:
    """This package's installed version (its metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("impala_gpu")
    except PackageNotFoundError:
        from impala_gpu import __version__

        return __version__


def main() -> None:
    if "--version" in sys.argv[1:]:
        print(f"impala_gpu {version()}")  # then Hydra's own --version line, and exit 0

    try:  # before Hydra composes: a typo'd key, a wrong type, 1e7 for an int (rewritten)
        sys.argv[1:] = check_command_line(sys.argv[1:])
    except ConfigError as e:
        exit_config_error(e)
    # SIGTERM takes Ctrl-C's path: checkpoint, stop actors, free shared memory, exit 128+15.
    interrupts.install()
    try:
        _hydra_main()
    except KeyboardInterrupt as e:
        how = "terminated" if isinstance(e, Terminated) else "interrupted"
        print(f"impala_gpu: {how}; {interrupted_text()}", file=sys.stderr)
        # CPython quirk: a KeyboardInterrupt that left an exec() of a string (dataclasses
        # builds methods so, in torch's lazy imports during calibration) marks the interpreter
        # to kill itself by SIGINT at exit, whatever exit code follows; an exec of a string
        # that completes clears that mark, so the exit code is 130/143 every time.
        exec("")
        sys.exit(
            interrupts.exit_code(signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
        )
    # Hydra returns the objective for sweepers; the exit code says whether every point ran.
    sys.exit(1 if LAST_SWEEP_FAILURES else 0)


def entry() -> None:
    """Command-line entry: restart under tcmalloc when it is installed (see
    ``impala_gpu/speed/tcmalloc.py``), then ``main``."""
    reexec_with_tcmalloc()
    main()
