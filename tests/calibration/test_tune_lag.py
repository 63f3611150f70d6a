"""``auto``'s exact lag: resolved from the counts ``auto`` chose, said at start, and a warning
when a fixed lag makes actors wait for the learner."""

from __future__ import annotations

import dataclasses

from impala_gpu.algos.registry import algorithm
from impala_gpu.calibration.tune import apply_auto, lag_note, resolve_auto
from impala_gpu.config import AUTO, Config

FIXED = Config(precision="fp32", num_actors=4, envs_per_actor=16, batch_size=16)


def test_auto_lag_follows_the_counts_without_measuring_anything():
    cfg, decision = resolve_auto(dataclasses.replace(FIXED, bounded_lag=AUTO), algorithm("impala"))
    assert decision is None  # nothing else was auto: no timings taken
    assert cfg.bounded_lag == 4
    wide = dataclasses.replace(FIXED, batch_size=64, bounded_lag=AUTO)
    assert resolve_auto(wide, algorithm("impala"))[0].bounded_lag == 1


def test_auto_lag_is_said_at_start(capsys):
    apply_auto(dataclasses.replace(FIXED, bounded_lag=AUTO), algorithm("impala"))
    err = capsys.readouterr().err
    assert "bounded_lag=4, the least at which no actor waits (4 actors x 16 envs" in err


def test_a_fixed_lag_below_the_least_warns_with_the_fix():
    note = lag_note(FIXED, dataclasses.replace(FIXED, bounded_lag=1))
    assert note is not None and note.startswith("warning: bounded_lag=1")
    assert "at most 1 of the 4 actors can step" in note
    assert "bounded_lag=auto (4 here)" in note and "batch_size of 64" in note
    # The batch it suggests holds whole unrolls (bounded_lag needs a multiple of 16 here).
    lag3 = lag_note(FIXED, dataclasses.replace(FIXED, bounded_lag=3))
    assert lag3 is not None and "batch_size of 32 for lag 3" in lag3
    assert lag_note(FIXED, dataclasses.replace(FIXED, bounded_lag=4)) is None
    assert lag_note(FIXED, FIXED) is None  # free-running: nothing to say
    assert lag_note(FIXED, dataclasses.replace(FIXED, bounded_lag=0)) is None  # synchronous
    a2c_algo = dataclasses.replace(FIXED.algo, name="a2c")
    a2c = dataclasses.replace(FIXED, bounded_lag=0, algo=a2c_algo)
    assert lag_note(a2c, a2c) is None  # A2C's barrier waits on purpose


def test_a_trial_runs_each_candidate_at_its_own_least_lag():
    from impala_gpu.calibration.model import Candidate
    from impala_gpu.calibration.trials import trial_config

    asked = dataclasses.replace(FIXED, num_actors=AUTO, bounded_lag=AUTO)
    assert trial_config(asked, Candidate("bf16", 2, 16), 8.0).bounded_lag == 2
    assert trial_config(asked, Candidate("bf16", 1, 16), 8.0).bounded_lag == 1
    fixed = dataclasses.replace(asked, bounded_lag=5)
    assert trial_config(fixed, Candidate("bf16", 2, 16), 8.0).bounded_lag == 5
