"""Checkpoints and resume: atomic files, last-N and best kept, a run interrupted and resumed
continues its counters and metrics with no step missing or logged twice; SIGTERM and NaN."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from leakcheck import (
    cli_command,
    kill_marked,
    leaked_shm,
    popen_marked,
    processes_with_marker,
    run_cli,
    shm_entries,
    wait_for_log,
)

from impala_gpu.config import AlgoCfg, ModelCfg
from impala_gpu.learning.learner import (
    STAT_NAMES,
    Batch,
    Learner,
    NonfiniteGuard,
    make_optimizer,
)
from impala_gpu.models import build_model
from impala_gpu.reporting.checkpoint import (
    Checkpointer,
    CheckpointPolicy,
    UnreadableCheckpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    truncate_lines,
)


def test_checkpointer_keeps_last_n_and_best(tmp_path):
    ck = Checkpointer(tmp_path, CheckpointPolicy(every_frames=100, every_minutes=0, keep_last=2))
    assert not ck.due(99) and ck.due(100)
    for frames, ret in [(100, 5.0), (200, 9.0), (300, 7.0), (400, None)]:
        ck.save({"frames": frames}, frames, ret)
    kept = [torch.load(p)["frames"] for p in list_checkpoints(tmp_path)]
    assert kept == [300, 400]
    best = torch.load(tmp_path / "checkpoints" / "best.pt")
    assert best["frames"] == 200 and best["best_return"] == 9.0
    assert not list((tmp_path / "checkpoints").glob(".*tmp")), "a temp file was left behind"
    assert resolve_checkpoint(tmp_path).name == "ckpt_000000000400.pt"


def test_missing_checkpoints_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no checkpoint in run dir"):
        resolve_checkpoint(tmp_path)


def _damage(path: Path, how: str) -> None:
    """Damage a checkpoint file the ways a crash, a full disk or a bad copy do."""
    data = path.read_bytes()
    damaged = {
        "truncated": data[: len(data) // 2],  # zip reader: "failed finding central directory"
        "tail_cut": data[:-10],  # OSError "Invalid argument"
        "empty": b"",  # EOFError
        "garbage": bytes(range(256)) * 8,  # UnpicklingError
    }[how]
    path.write_bytes(damaged)


def _saved_run(tmp_path, frames=(100, 200, 300), best_at=None) -> list[Path]:
    ck = Checkpointer(tmp_path, CheckpointPolicy(every_frames=100, every_minutes=0, keep_last=5))
    for f in frames:
        ck.save({"frames": f, "w": torch.full((50,), float(f))}, f, 1.0 if f == best_at else None)
    return list_checkpoints(tmp_path)


@pytest.mark.parametrize("how", ["truncated", "tail_cut", "empty", "garbage"])
def test_resume_skips_an_unreadable_newest_checkpoint(tmp_path, capsys, how):
    old, middle, newest = _saved_run(tmp_path)
    _damage(newest, how)
    _damage(middle, "garbage")
    path, state = load_checkpoint(tmp_path, set_aside=True)
    assert path == old and state["frames"] == 100
    err = capsys.readouterr().err
    for bad in (newest, middle):
        assert f"checkpoint {bad} is not a readable checkpoint" in err
        # Set aside: pruning goes by name, so left in place it would outlive good ones.
        assert bad.with_name(bad.name + ".unreadable").is_file() and not bad.exists()
    assert err.count(f"Using {old} instead") == 2
    assert list_checkpoints(tmp_path) == [old]
    assert load_checkpoint(tmp_path)[0] == old  # and the next resume is quiet
    assert capsys.readouterr().err == ""


def test_resume_falls_back_to_best_then_fails_clearly(tmp_path, capsys):
    ckpts = _saved_run(tmp_path, best_at=200)
    for p in ckpts:
        _damage(p, "truncated")
    best = tmp_path / "checkpoints" / "best.pt"
    path, state = load_checkpoint(tmp_path)
    assert path == best and state["frames"] == 200
    assert f"Using {best} instead" in capsys.readouterr().err
    _damage(best, "empty")
    with pytest.raises(UnreadableCheckpoint, match="no checkpoint in run dir .* loads") as e:
        load_checkpoint(tmp_path)
    assert all(str(p) in str(e.value) for p in [*ckpts, best]) and "Fix:" in str(e.value)


def test_evaluation_prefers_best_and_reads_the_file_given(tmp_path):
    old, _, newest = _saved_run(tmp_path, best_at=200)
    best = tmp_path / "checkpoints" / "best.pt"
    assert load_checkpoint(tmp_path, prefer_best=True)[0] == best
    assert load_checkpoint(tmp_path)[0] == newest
    assert load_checkpoint(old)[1]["frames"] == 100


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_an_unreadable_file_given_directly_names_it_and_the_fix(tmp_path, how):
    old, middle, newest = _saved_run(tmp_path, best_at=100)
    _damage(newest, how)
    with pytest.raises(UnreadableCheckpoint) as e:
        load_checkpoint(newest, set_aside=True)
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {newest} is not a readable checkpoint (truncated or ")
    assert f"Fix: pass an older checkpoint of the run, e.g. {middle}" in msg
    assert str(tmp_path / "checkpoints" / "best.pt") in msg
    assert newest.exists(), "a file named directly is not moved"
    lone = tmp_path / "elsewhere" / "model.pt"
    lone.parent.mkdir()
    lone.write_bytes(b"not a checkpoint")
    with pytest.raises(UnreadableCheckpoint, match=r"model.pt is not a readable.*no other check"):
        load_checkpoint(lone)


def test_resuming_from_an_unreadable_file_fails_before_starting(tmp_path):
    older, newest = _saved_run(tmp_path, frames=(100, 200))
    _damage(newest, "tail_cut")
    proc = subprocess.run(
        cli_command(tmp_path / "x", f"resume={newest}"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert f"checkpoint {newest} is not a readable checkpoint (truncated or" in proc.stderr
    assert f"Fix: pass an older checkpoint of the run, e.g. {older}" in proc.stderr


def test_truncate_lines(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text("a\nb\nc\n")
    truncate_lines(p, 2)
    assert p.read_text() == "a\nb\n"


def _batch(T=4, B=2, nan_reward=False) -> Batch:
    g = torch.Generator().manual_seed(0)
    reward = torch.randn(T + 1, B, generator=g)
    if nan_reward:
        reward[2, 1] = float("nan")
    return Batch(
        obs=torch.randn(T + 1, B, 4, generator=g),
        reward=reward,
        terminated=torch.zeros(T + 1, B, dtype=torch.bool),
        truncated=torch.zeros(T + 1, B, dtype=torch.bool),
        first=torch.zeros(T + 1, B, dtype=torch.bool),
        action=torch.randint(0, 2, (T + 1, B), generator=g),
        logits=torch.randn(T + 1, B, 2, generator=g),
    )


def test_nonfinite_update_is_skipped_not_applied():
    model = build_model((4,), 2, ModelCfg(name="mlp", hidden_size=16))
    opt = make_optimizer(model, AlgoCfg())
    before = [p.detach().clone() for p in model.parameters()]
    learner = Learner(model, opt, AlgoCfg())
    stats = learner.update(_batch(nan_reward=True))
    assert stats[STAT_NAMES.index("nonfinite")] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    stats = learner.update(_batch())
    assert stats[STAT_NAMES.index("nonfinite")] == 0
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_repeated_nonfinite_updates_trip_the_guard():
    guard = NonfiniteGuard(limit=3)
    bad = np.zeros(len(STAT_NAMES))
    bad[STAT_NAMES.index("nonfinite")] = 1
    assert not guard.tripped(bad)
    assert not guard.tripped(np.zeros(len(STAT_NAMES)))  # a good update resets the streak
    assert not guard.tripped(bad) and not guard.tripped(bad)
    assert guard.tripped(bad)
    with pytest.raises(FloatingPointError, match="3 consecutive.*saved to ckpt.pt"):
        raise guard.error(Path("ckpt.pt"))


def _start(run_dir, *overrides):
    return popen_marked(cli_command(run_dir, *overrides), run_dir.parent)


def _wait_for_lines(proc, path, n, timeout=120):
    wait_for_log(proc, path, lambda text: text.count("\n") >= n, timeout, "training never logged")


def _metrics(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_then_resume_continues_counters_and_metrics(tmp_path, sig, code):
    run_dir = tmp_path / "run"
    shm_before = shm_entries()
    proc, marker = _start(
        run_dir,
        "experiment=cartpole_impala",
        "total_frames=120000",
        "log_interval_s=0.3",
        "checkpoint.every_frames=8000",
    )
    try:
        _wait_for_lines(proc, run_dir / "metrics.jsonl", 3)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_marked(proc, marker)
    assert proc.returncode == code, err[-3000:]
    assert processes_with_marker(marker) == [] and leaked_shm(shm_before) == set()
    ckpt = torch.load(resolve_checkpoint(run_dir), weights_only=False)
    before = _metrics(run_dir)
    assert ckpt["frames"] >= before[-1]["frames"] > 0

    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "impala_gpu",
            f"resume={run_dir}",
            "wandb.mode=disabled",
            "progress=false",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _metrics(run_dir)
    assert after[: len(before)] == before, "lines logged before the checkpoint changed"
    frames = [m["frames"] for m in after]
    updates = [m["updates"] for m in after]
    assert frames == sorted(set(frames)), "a step was logged twice or out of order"
    assert updates == sorted(set(updates))
    first_new = after[len(before)]
    assert first_new["frames"] > ckpt["frames"]
    # No step is missing: each line's frames = updates x frames per update, across the resume.
    per_update = 16 * 20
    assert all(m["frames"] == m["updates"] * per_update for m in after)
    assert first_new["elapsed_s"] >= before[-1]["elapsed_s"]
    assert after[-1]["frames"] >= 120_000
    cfg = (run_dir / "config.yaml").read_text()
    assert "hidden_size: 128" in cfg  # the run's own config, not the CLI defaults


@pytest.mark.slow
def test_resume_continues_from_the_older_checkpoint_when_the_newest_is_truncated(tmp_path):
    run_dir = tmp_path / "run"
    train = ["experiment=cartpole_impala", "log_interval_s=0.2", "checkpoint.every_frames=1600"]
    run_cli(run_dir, *train, "total_frames=3200")
    *_, older, newest = list_checkpoints(run_dir)
    kept = torch.load(older, weights_only=False)
    _damage(newest, "truncated")  # e.g. the disk filled up while it was written

    resumed = run_cli(run_dir, *train, f"resume={run_dir}", "total_frames=4800")
    assert f"checkpoint {newest} is not a readable checkpoint (truncated" in resumed.stderr
    assert f"Using {older} instead" in resumed.stderr
    assert f"resumed from {older} at {kept['frames']:,} frames" in resumed.stdout
    metrics = _metrics(run_dir)
    # The lines logged after the older checkpoint were dropped; the run went on from there.
    frames, n = [m["frames"] for m in metrics], kept["metrics_lines"]
    assert all(f <= kept["frames"] for f in frames[:n]) and frames[n] > kept["frames"]
    assert frames == sorted(set(frames))
    final = torch.load(list_checkpoints(run_dir)[-1], weights_only=False)
    assert final["resumes"] == 1 and final["frames"] >= 4800
    assert final["version"] - kept["version"] == (final["frames"] - kept["frames"]) // 320
