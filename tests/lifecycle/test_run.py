"""The run scaffolding every algorithm shares: the stop rule, restoring from a checkpoint (and
refusing another model's), the checkpoint's run fields, health warnings, the end of a run."""

from __future__ import annotations

import json
import time

import pytest
import torch
from leakcheck import read_events

from impala_gpu.config import CheckpointCfg, Config, ConfigError, EnvCfg, ModelCfg, WandbCfg
from impala_gpu.lifecycle.run import Resume, Run, RunProgress, StopRule
from impala_gpu.models import build_model
from impala_gpu.telemetry.window import Telemetry


def make_cfg(**kw) -> Config:
    return Config(
        env=EnvCfg(id="CartPole-v1"),
        wandb=WandbCfg(mode="disabled"),
        tensorboard=False,
        progress=False,
        checkpoint=CheckpointCfg(every_frames=0, every_minutes=0, keep_last=2),
        **kw,
    )


class Notes:
    """Stands in for the console progress bar: keeps what it is told."""

    def __init__(self):
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def telemetry_with_returns(returns: list[float]) -> Telemetry:
    tele = Telemetry(("total_loss",), cuda=False)
    tele.add_episodes([(r, 10) for r in returns])
    return tele


# -- the stop rule --------------------------------------------------------------------------------


def test_stop_rule_ends_at_total_frames():
    stop = StopRule(make_cfg(total_frames=1000), start=0.0)
    tele = telemetry_with_returns([])
    assert stop.running(999, now=1e9) and not stop.done(999, tele, now=1e9)  # no time limit
    assert not stop.running(1000, now=0.0) and stop.done(1000, tele, now=0.0)


def test_stop_rule_ends_max_seconds_after_its_start():
    stop = StopRule(make_cfg(total_frames=10**9, max_seconds=30.0), start=100.0)
    tele = telemetry_with_returns([])
    assert stop.running(0, now=129.9) and not stop.done(0, tele, now=129.9)
    assert not stop.running(0, now=130.0) and stop.done(0, tele, now=130.0)
    starts_now = StopRule(make_cfg(max_seconds=30.0))  # the clock starts at construction
    assert starts_now.running(0, time.perf_counter())


def test_stop_rule_ends_at_target_return_over_a_full_window_and_says_so():
    bar = Notes()
    stop = StopRule(make_cfg(total_frames=10**9, target_return=18.0), bar, start=0.0)
    # 99 episodes at 20 are not a full window of 100: too noisy to stop on.
    assert not stop.done(0, telemetry_with_returns([20.0] * 99), now=1.0)
    assert not stop.done(0, telemetry_with_returns([17.0] * 100), now=1.0)
    assert bar.notes == []
    assert stop.done(0, telemetry_with_returns([17.0] * 50 + [19.0] * 50), now=1.0)
    assert bar.notes == ["target_return=18 reached (mean of the last 100 episodes)"]


def test_stop_rule_without_target_return_never_stops_on_returns():
    stop = StopRule(make_cfg(total_frames=10**9), start=0.0)
    assert not stop.done(0, telemetry_with_returns([1e9] * 100), now=1.0)


# -- restore --------------------------------------------------------------------------------------


def test_a_checkpoint_of_another_model_is_refused_naming_the_fix(tmp_path):
    big = build_model((4,), 2, ModelCfg(name="mlp", hidden_size=64))
    torch.save({"model": big.state_dict()}, tmp_path / "c.pt")
    small = build_model((4,), 2, ModelCfg(name="mlp", hidden_size=32))
    resume = Resume.read(tmp_path / "c.pt")
    with pytest.raises(ConfigError, match=r"c\.pt holds a different model.*Fix: resume with"):
        resume.load(small)
    same = build_model((4,), 2, ModelCfg(name="mlp", hidden_size=64))
    resume_big = Resume.read(tmp_path / "c.pt")
    resume_big.load(same)
    assert all(torch.equal(big.state_dict()[k], v) for k, v in same.state_dict().items())


def test_a_run_saves_its_progress_and_a_resumed_run_goes_on_from_it(tmp_path, capsys):
    cfg = make_cfg(total_frames=10_000)
    tele = telemetry_with_returns([1.0, 3.0])
    run = Run.open(cfg, tmp_path, None, tele)
    assert run.progress.frames == 0 and run.progress.resumes == 0
    run.progress.version, run.progress.frames = 7, 4_000
    run.write({"frames": 4_000, "updates": 7}, {})
    path = run.save_checkpoint({"model": {"w": torch.ones(2)}, "extra": 5})
    run.write({"frames": 4_500, "updates": 8}, {})  # logged after the checkpoint
    run.close()
    saved = torch.load(path, weights_only=False)
    assert saved["extra"] == 5 and saved["version"] == 7 and saved["frames"] == 4_000
    assert saved["metrics_lines"] == 1 and saved["resumes"] == 0
    assert saved["episode_returns"] == [1.0, 3.0] and saved["elapsed_s"] >= 0
    assert saved["config"]["total_frames"] == 10_000 and "rng" in saved
    assert json.loads((tmp_path / "lag_hist.json").read_text())["counts"] == [0]

    resume = Resume.read(tmp_path)  # a run dir: its newest checkpoint
    assert resume.path == path
    again = Telemetry(("total_loss",), cuda=False)
    run2 = Run.open(cfg, tmp_path, None, again, resume)
    run2.close()
    assert f"resumed from {path} at 4,000 frames (update 7)" in capsys.readouterr().out
    p = run2.progress
    assert (p.version, p.frames, p.resumes) == (7, 4_000, 1)
    assert p.elapsed_s() >= saved["elapsed_s"]  # the clock goes on from the checkpoint's
    assert list(again.episode_returns) == [1.0, 3.0]
    assert run2.checkpointer.best_return == saved["best_return"]
    assert run2.checkpointer.last_frames == 4_000
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["frames"] for line in lines] == [4_000]  # no step logged twice


def test_health_warnings_are_recorded_and_printed_once(tmp_path, capsys):
    cfg = make_cfg()
    cfg.health.warmup_updates = 0
    run = Run.open(cfg, tmp_path, None, telemetry_with_returns([]))
    for updates in (1, 2):
        run.warn_health({"frames": 100 * updates, "updates": updates, "logit_spread": 0.0})
    run.close()
    events = read_events(tmp_path)
    warned = [e for e in events if e["event"] == "health_warning"]
    assert len(warned) == 1 and warned[0]["frames"] == 100
    assert "the policy barely depends on its input" in warned[0]["message"]
    assert capsys.readouterr().err.count("impala_gpu: warning: the policy barely") == 1


def test_the_end_writes_the_weights_and_the_summary(tmp_path, capsys):
    run = Run.open(make_cfg(), tmp_path, None, telemetry_with_returns([5.0]))
    run.progress = RunProgress(version=3, frames=1_234)
    model = build_model((4,), 2, ModelCfg(name="mlp", hidden_size=8))
    ckpt = run.save_checkpoint({"model": model.state_dict()})
    run.end(ckpt, model, interrupted=True)
    run.close()
    weights = torch.load(tmp_path / "model.pt")
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    err = capsys.readouterr().err
    assert "impala_gpu: run interrupted: 1,234 frames in" in err
    assert f"impala_gpu:   checkpoint: {ckpt}" in err
    assert f"impala_gpu:   weights: {tmp_path / 'model.pt'}" in err
