"""One run's scaffolding, the same for every algorithm (IMPALA and A2C, A3C).

Around its algorithm a run continues from a checkpoint (``Resume``), opens its reporting
(``Run.open``: the metrics logger and W&B, the checkpointer, the health watch, a resumed run's
progress, RNG and episode record), stops at the same rule (``StopRule``: ``total_frames``,
``max_seconds``, ``target_return``), writes each metrics line with its health warnings, saves
checkpoints and the final weights, and ends with the summary (``Run.end``). The algorithm adds
only what it alone knows: what its checkpoint holds besides the run's progress, and the metrics
of each line.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from impala_gpu.config import Config, ConfigError, to_container
from impala_gpu.reporting.checkpoint import (
    Checkpointer,
    CheckpointPolicy,
    atomic_torch_save,
    count_lines,
    load_checkpoint,
    rng_state,
    set_rng_state,
    truncate_lines,
)
from impala_gpu.reporting.health_watch import HealthWatch
from impala_gpu.reporting.logger import MetricsLogger
from impala_gpu.reporting.progress import Progress
from impala_gpu.reporting.summary import print_summary
from impala_gpu.telemetry.window import Telemetry

# The checkpoint this process saved last (a run's final one on Ctrl-C/SIGTERM): what the CLI's
# last line may claim was saved. A trial's (auto) lay in a temporary dir, gone by then.
_LAST_SAVED: list[Path] = []


def interrupted_text() -> str:
    """What a Ctrl-C/SIGTERM left, for the CLI's last line: true whether or not the run got
    as far as saving a checkpoint (one stopped while starting up or calibrating has none; a
    resume stopped so keeps the checkpoints it was resumed from)."""
    saved = _LAST_SAVED[-1] if _LAST_SAVED else None
    if saved is not None and saved.exists():
        return f"checkpoint saved ({saved}), actors stopped, shared memory freed."
    return "stopped before saving a checkpoint (this command wrote none); no process left."


def say(text: str) -> None:
    """One console line of the run, on stderr, prefixed like every other."""
    print(f"impala_gpu: {text}", file=sys.stderr, flush=True)


@dataclass
class RunProgress:
    """How far the run has got: what every checkpoint carries and a resumed run goes on from."""

    version: int = 0  # updates applied: the version of the weights
    frames: int = 0
    resumes: int = 0  # how many times the run was resumed before this process
    # The clock ``elapsed_s`` counts from: earlier than now for a resumed run, so wall-clock
    # curves of the two parts join up.
    start: float = field(default_factory=time.perf_counter)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start


@dataclass
class Resume:
    """The checkpoint a run continues from (``resume=``), read once."""

    path: Path
    state: dict[str, Any]

    @classmethod
    def read(cls, source: str | Path) -> Resume:
        """A ``.pt`` file, or a run dir's newest checkpoint that loads (one that does not is
        set aside: ``checkpoint.load_checkpoint``)."""
        return cls(*load_checkpoint(source, set_aside=True))

    def load(self, model: nn.Module, **parts: Any) -> None:
        """The saved weights into ``model``, in place (a shared model stays shared), then each
        of ``parts`` from its own entry (``optimizer=opt``: ``opt.load_state_dict(state[
        "optimizer"])``). Weights of another architecture are a ``ConfigError`` that names
        the fix."""
        try:
            model.load_state_dict(self.state["model"])
        except RuntimeError as e:
            raise ConfigError(
                f"checkpoint {self.path} holds a different model than this config builds "
                f"(model.*/env.* changed?): {str(e).splitlines()[0]} Fix: resume with the config "
                "the run was trained with (omit model/env overrides)."
            ) from e
        for name, part in parts.items():
            part.load_state_dict(self.state[name])

    def progress(self) -> RunProgress:
        s = self.state
        start = time.perf_counter() - s["elapsed_s"]
        return RunProgress(s["version"], s["frames"], s["resumes"] + 1, start)


class StopRule:
    """When a run ends: at ``total_frames``, ``max_seconds`` after its loop started, or once the
    mean return of the last 100 episodes reaches ``target_return`` (said on ``bar``)."""

    def __init__(self, cfg: Config, bar: Progress | None = None, start: float | None = None):
        start = time.perf_counter() if start is None else start
        self.total_frames, self.target_return = cfg.total_frames, cfg.target_return
        self.deadline = start + cfg.max_seconds if cfg.max_seconds > 0 else float("inf")
        self.bar = bar

    def running(self, frames: int, now: float) -> bool:
        """Whether frames and time are left at ``frames`` frames, at clock ``now``."""
        return frames < self.total_frames and now < self.deadline

    def done(self, frames: int, tele: Telemetry, now: float) -> bool:
        """Whether the run ends here (``target_return`` is judged only while running)."""
        return not self.running(frames, now) or self.solved(tele)

    def solved(self, tele: Telemetry) -> bool:
        """``target_return`` reached: the run ends as if at ``total_frames``."""
        if not tele.reached(self.target_return):
            return False
        if self.bar is not None:
            self.bar.note(
                f"target_return={self.target_return:g} reached (mean of the last 100 episodes)"
            )
        return True


@dataclass
class Run:
    """Where a run reports and what it keeps: telemetry, progress, the metrics and events files
    (and W&B), checkpoints, network-health warnings."""

    cfg: Config
    run_dir: Path
    tele: Telemetry
    progress: RunProgress
    logger: MetricsLogger
    checkpointer: Checkpointer
    health_watch: HealthWatch

    @classmethod
    def open(
        cls,
        cfg: Config,
        run_dir: str | Path,
        sweep: dict[str, Any] | None,
        tele: Telemetry,
        resume: Resume | None = None,
    ) -> Run:
        """Start reporting: a new run, or the rest of ``resume``'s (its progress, RNG state,
        episode record, W&B run and best return; the metrics lines logged after its checkpoint
        are dropped, so no step is logged twice). The algorithm has loaded its own state."""
        run_dir = Path(run_dir)
        progress, saved = RunProgress(), {}
        if resume is not None:
            saved = resume.state
            set_rng_state(saved["rng"])
            progress = resume.progress()
            tele.load_episode_record(saved)
            at = f"{progress.frames:,} frames (update {progress.version})"
            print(f"impala_gpu: resumed from {resume.path} at {at}")
            truncate_lines(run_dir / "metrics.jsonl", saved["metrics_lines"])
        logger = MetricsLogger(run_dir, cfg, sweep, resume_id=saved.get("wandb_id"))
        ck = cfg.checkpoint
        checkpointer = Checkpointer(
            run_dir,
            CheckpointPolicy(ck.every_frames, ck.every_minutes, ck.keep_last),
            frames=progress.frames,
        )
        checkpointer.best_return = saved.get("best_return", float("-inf"))
        watch = HealthWatch.from_config(cfg.health)
        return cls(cfg, run_dir, tele, progress, logger, checkpointer, watch)

    def progress_bar(self) -> Progress:
        cfg = self.cfg
        return Progress(
            cfg.total_frames,
            enabled=cfg.progress,
            target_return=cfg.target_return,
            start=self.progress.start,  # a resumed run's elapsed time goes on from its own
        )

    def on_event(self, event: dict) -> None:
        """An actor-pool event: into events.jsonl, and replacements onto the console."""
        p = self.progress
        self.logger.event({**event, "frames": p.frames, "updates": p.version})
        if event["event"] == "actor_replaced":
            lost = (
                f"{event['unrolls_dropped']} in-flight unrolls dropped"
                if "unrolls_dropped" in event
                else f"{event['slots_reclaimed']} slots reclaimed"
            )
            n, cause = event["restart"], event["cause"]
            say(f"actor-{event['actor']} {cause}; replaced (restart {n}, {lost})")

    def warn_health(self, m: dict[str, Any]) -> None:
        """Judge one metrics line's health; record and print each new warning."""
        for text in self.health_watch.check(m, m["updates"]):
            self.logger.event({"event": "health_warning", "message": text, "frames": m["frames"]})
            say(f"warning: {text}")

    def write(self, m: dict[str, Any], hist: dict[str, list[float]]) -> None:
        """One metrics line (metrics.jsonl, TensorBoard, W&B), and the whole run's lags."""
        self.logger.log(m, hist)
        self.logger.write_json("lag_hist.json", self.tele.lag_histogram())

    def save_checkpoint(self, state: dict[str, Any]) -> Path:
        """A checkpoint of ``state`` (the algorithm's: weights, optimizer, ...) with the run's
        progress, RNG states, config, metrics line count, W&B id and episode record."""
        p, tele = self.progress, self.tele
        checkpoint = {
            **state,
            "version": p.version,
            "frames": p.frames,
            "elapsed_s": p.elapsed_s(),
            "resumes": p.resumes,
            "rng": rng_state(),
            "config": to_container(self.cfg),
            "metrics_lines": count_lines(self.logger.path),
            "wandb_id": self.logger.wandb_id,
            **tele.episode_record(),
        }
        path = self.checkpointer.save(checkpoint, p.frames, tele.mean_return())
        _LAST_SAVED[:] = [path]
        return path

    def end(self, checkpoint: Path, model: nn.Module, interrupted: bool = False) -> None:
        """After the final checkpoint (also on Ctrl-C/SIGTERM): the final weights, then the
        end-of-run summary (``reporting.summary``)."""
        save_weights(model, self.run_dir / "model.pt")
        p, best = self.progress, self.checkpointer.best_return
        elapsed = p.elapsed_s()
        print_summary(self.logger, self.tele, p.frames, elapsed, checkpoint, best, interrupted)

    def close(self) -> None:
        self.logger.close()


def save_weights(model: nn.Module, path: Path) -> None:
    """Final weights alone (state_dict on CPU), written atomically."""
    atomic_torch_save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)
