"""Telemetry: the early-stop rule on the mean return of the last 100 episodes."""

from __future__ import annotations

from impala_gpu.learning.learner import STAT_NAMES
from impala_gpu.reporting.telemetry import Telemetry


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
