"""The learning-rate schedule: linear decay to 0 over total_frames (the paper's), or over
algo.lr_decay_frames (independent of the budget), or constant; the torch scheduler the learner
steps once per update follows it."""

from __future__ import annotations

import pytest
import torch

from impala_gpu.config import AlgoCfg, Config
from impala_gpu.learning.optim import lr_factor, make_lr_scheduler


def cfg(total: int, schedule: str = "linear", decay: int = 0) -> Config:
    return Config(total_frames=total, algo=AlgoCfg(lr_schedule=schedule, lr_decay_frames=decay))


def test_linear_decays_to_zero_over_the_budget():
    c = cfg(1_000)
    assert [lr_factor(c, f) for f in (0, 250, 1_000, 2_000)] == [1.0, 0.75, 0.0, 0.0]


def test_lr_decay_frames_unties_the_schedule_from_the_budget():
    short, long = cfg(1_000, decay=4_000), cfg(8_000, decay=4_000)
    for frames in (0, 500, 1_000):
        assert lr_factor(short, frames) == lr_factor(long, frames) == 1 - frames / 4_000
    assert lr_factor(long, 6_000) == 0.0


def test_constant_stays_one():
    assert lr_factor(cfg(1_000, "constant", decay=10), 5_000) == 1.0


def test_the_scheduler_steps_the_factor_once_per_update():
    c = cfg(1_000, decay=800)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    sched = make_lr_scheduler(opt, c, frames_per_update=100)
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.5 * max(0.0, 1 - 100 * u / 800) for u in range(10)])
