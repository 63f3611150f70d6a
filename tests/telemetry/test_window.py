"""Telemetry: the early-stop rule on the mean return of the last 100 episodes, and the
episode record a checkpoint carries."""

from __future__ import annotations

import numpy as np

from impala_gpu.learning.learner import STAT_NAMES
from impala_gpu.telemetry.window import Telemetry


def test_reached_needs_a_full_window_at_or_above_the_target():
    tele = Telemetry(STAT_NAMES, cuda=False)
    tele.add_episodes([(20.0, 100)] * 99)
    assert not tele.reached(18.0), "99 episodes are not a full window"
    tele.add_episodes([(16.0, 100)])
    assert tele.reached(18.0)  # mean (99 * 20 + 16) / 100 = 19.96
    assert not tele.reached(19.97)
    tele.add_episodes([(-21.0, 100)] * 5)  # the window slides: 94 x 20, 1 x 16, 5 x -21
    assert not tele.reached(18.0)
    assert not tele.reached(None)


def test_the_episode_record_goes_on_after_a_checkpoint():
    tele = Telemetry(STAT_NAMES, cuda=False)
    assert tele.mean_return() is None
    tele.add_episodes([(float(r), 10 + r) for r in range(120)])
    tele.add_update(np.zeros(len(STAT_NAMES)), np.array([0, 2, 2]), frames=1, steps=1)
    saved = tele.episode_record()

    resumed = Telemetry(STAT_NAMES, cuda=False)
    resumed.load_episode_record(saved)
    assert resumed.episodes == 120 and resumed.mean_return() == np.mean(range(20, 120))
    assert list(resumed.episode_lengths) == [10 + r for r in range(20, 120)]
    resumed.add_update(np.zeros(len(STAT_NAMES)), np.array([1]), frames=1, steps=1)
    assert resumed.lag_histogram()["counts"] == [1, 1, 2]
    assert tele.lag_histogram()["counts"] == [1, 0, 2]  # the saved record is a copy
