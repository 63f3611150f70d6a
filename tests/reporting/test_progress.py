"""The console's progress line and end-of-run summary."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from impala_gpu.reporting.progress import Progress, eta_text, short_count
from impala_gpu.reporting.summary import RunEnd, format_duration, summary_text


def test_format_duration_and_short_count():
    assert [format_duration(s) for s in (0, 45, 725, 11220)] == ["0s", "45s", "12m05s", "3h07m"]
    assert [short_count(n) for n in (800, 200_000, 1_500_000, 10_000_000)] == [
        "800", "200K", "1.5M", "10M",
    ]  # fmt: skip


def test_eta_counts_to_total_frames_at_the_current_rate():
    assert eta_text(1_000_000, 10_000_000, 12_500.0, None) == "ETA 12m00s to 10M frames"
    assert eta_text(0, 10_000_000, 0.0, None) == "ETA ? to 10M frames"  # no rate yet


def test_eta_with_a_target_return_says_it_may_end_sooner():
    text = eta_text(1_000_000, 10_000_000, 12_500.0, 18.0)
    assert text == "ETA 12m00s to 10M frames (or sooner at return 18)"


def test_plain_line_has_elapsed_and_eta(capsys):
    bar = Progress(2_000_000, enabled=True, target_return=475)  # stderr is no tty under pytest
    m = {"frames_per_s": 1000.0, "elapsed_s": 90.0, "episode_return": 30.0}
    bar.update(1_000_000, m)
    err = capsys.readouterr().err
    assert err.startswith("frames 1,000,000/2,000,000 | 1m30s, ETA 16m40s to 2M frames ")
    assert "(or sooner at return 475) | fps 1,000 | return 30.0" in err
    Progress(2_000_000, enabled=False).update(1, m)
    assert capsys.readouterr().err == ""


METRICS = {
    "frames_per_s": 5000.0,
    "episode_return": -20.25,
    "learner_busy": 0.8,
    "learner_wait": 0.1,
    "policy_lag_mean": 2.5,
}


def _terminal_line(width: int, frames: int, m: dict, elapsed_s: float = 185.0) -> str:
    """The progress line as rich draws it on a terminal ``width`` columns wide."""
    console = Console(width=width, record=True, file=io.StringIO())
    bar = Progress(10_000_000, target_return=18, start=time.perf_counter() - elapsed_s,
                   console=console)  # fmt: skip
    bar.update(frames, m)
    bar.close()  # draws the last state
    lines = console.export_text().splitlines()
    assert len(lines) == 1, lines  # never wrapped
    return lines[0]


@pytest.mark.parametrize("width", [80, 160])
def test_the_terminal_line_shows_frames_elapsed_eta_and_return_at_any_width(width):
    """Before: at 80 columns rich's columns cut the frame count and the elapsed time, and at
    160 the elapsed time still read ``0:00:…``."""
    line = _terminal_line(width, 1_234_560, METRICS)
    assert len(line) < width
    for field in ("frames 1.235M/10M", "elapsed 3m05s", "ETA 29m13s", "return -20.2"):
        assert f"{field}" in line, (field, line)
    if width == 160:  # room for the rest
        assert "ETA 29m13s (or sooner at return 18)" in line and line.startswith("━")
        assert line.endswith("| fps 5,000 | busy 80% wait 10% | lag 2.5")


def test_the_terminal_line_before_the_first_metrics_and_on_a_narrow_terminal():
    before = _terminal_line(80, 0, {}, 3660)
    assert before == "frames 0/10M | elapsed 1h01m | ETA ? (or sooner at return 18) | return n/a"
    narrow = _terminal_line(40, 1_234_560, METRICS)
    assert narrow.startswith("frames 1.235M/10M | elapsed 3m05s")


def _end(**kw) -> RunEnd:
    base = dict(
        frames=1_234_560, elapsed_s=725.0, final_return=18.25, best_return=19.5,
        checkpoint=Path("run/checkpoints/ckpt_1234560.pt"), model=Path("run/model.pt"),
        pointers=("TensorBoard: tensorboard --logdir run",),
    )  # fmt: skip
    return RunEnd(**{**base, **kw})


def test_summary_names_frames_time_returns_files_and_pointers():
    lines = summary_text(_end()).splitlines()
    assert lines == [
        "impala_gpu: run finished: 1,234,560 frames in 12m05s",
        "impala_gpu:   mean return (last 100 episodes): final 18.25, best 19.50",
        "impala_gpu:   checkpoint: run/checkpoints/ckpt_1234560.pt",
        "impala_gpu:   weights: run/model.pt",
        "impala_gpu:   TensorBoard: tensorboard --logdir run",
    ]


def test_summary_of_an_interrupted_run_without_episodes():
    text = summary_text(_end(interrupted=True, final_return=None, best_return=None, pointers=()))
    assert text.splitlines()[0] == "impala_gpu: run interrupted: 1,234,560 frames in 12m05s"
    assert "final n/a (no episode ended), best n/a (no episode ended)" in text
