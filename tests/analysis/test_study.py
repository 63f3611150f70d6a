"""The lag study's statistics: bootstrap intervals, AUC, collapse, the per-cell table and the
conclusion read off it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from impala_gpu.analysis.study import (
    area_under_curve,
    bootstrap_ci,
    collapsed,
    decimals,
    interval,
    study_conclusion,
    study_table,
)


def curve(frames, returns, **cols) -> pd.DataFrame:
    return pd.DataFrame({"frames": frames, "episode_return": returns, **cols})


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_agreement():
    wide = bootstrap_ci(np.array([0.0, 100.0, 50.0, 20.0, 80.0]))
    narrow = bootstrap_ci(np.array([49.0, 50.0, 51.0, 50.0, 50.0]))
    assert wide[0] < 50 < wide[1] and narrow[0] <= 50 <= narrow[1]
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 10
    assert bootstrap_ci(np.array([7.0])) == (7.0, 7.0)
    assert all(np.isnan(bootstrap_ci(np.array([]))))


def test_area_under_the_curve_is_the_frame_weighted_mean_return():
    # A line from -100 to 100 over frames 0..1000 averages 0; a flat 5 averages 5.
    assert area_under_curve(curve([0, 500, 1000], [-100, 0, 100])) == pytest.approx(0.0)
    assert area_under_curve(curve([0, 250, 1000], [5, 5, 5])) == pytest.approx(5.0)
    # Uneven spacing: trapezoids, not a plain mean of the points.
    assert area_under_curve(curve([0, 100, 1000], [0, 100, 100])) == pytest.approx(95.0)


def test_collapse_is_falling_back_more_than_half_the_gain():
    assert collapsed(curve([0, 1, 2], [-200, 100, -100]))  # gained 300, kept 100 of it
    assert not collapsed(curve([0, 1, 2], [-200, 100, 0]))  # kept 200 of 300
    assert not collapsed(curve([0, 1, 2], [-200, -250, -260]))  # never gained: not a collapse


def sweep_frame() -> pd.DataFrame:
    """Two lag settings x two corrections x 3 seeds; V-trace clearly ahead at lag 32 only (at
    lag 0 the seeds spread by 30, so 5 apart is no difference)."""
    rows = []
    final = {("vtrace", 0): 200, ("none", 0): 195, ("vtrace", 32): 180, ("none", 32): 20}
    for (corr, lag), top in final.items():
        for seed in range(3):
            run = f"{corr}-{lag}-{seed}"
            for i, f in enumerate((0, 1000, 2000)):
                rows.append(
                    {
                        "run": run,
                        "seed": seed,
                        "correction": corr,
                        "bounded_lag": lag,
                        "replay": 0.0,
                        "frames": f,
                        "episode_return": -200
                        + (top + 200 + seed * (30 if lag == 0 else 1)) * i / 2,
                        "mean_abs_log_rho": 0.1 * lag / 32,
                        "kl_behavior_target": 0.01 * lag,
                        "policy_lag_mean": float(lag),
                    }
                )
    return pd.DataFrame(rows)


def test_study_table_has_one_row_per_cell_with_intervals():
    table = study_table(sweep_frame())
    assert len(table) == 4 and set(table["seeds"]) == {3}
    row = table[(table["correction"] == "none") & (table["bounded_lag"] == 32)].iloc[0]
    assert row["final_return"] == pytest.approx(21.0)  # 20 + mean seed offset 1
    assert row["final_return_lo"] <= 21.0 <= row["final_return_hi"]
    assert row["collapse_share"] == 0.0 and row["policy_lag_mean"] == 32
    assert row["kl_behavior_target"] == pytest.approx(0.32)


def test_the_conclusion_names_where_correction_mattered_and_where_it_did_not():
    text = study_conclusion(study_table(sweep_frame()))
    assert (
        "Correction mattered (intervals apart) at lag 32: V-trace 181 [180, 182] vs no "
        "correction 21 [20, 22] (V-trace higher)."
    ) in text
    assert "Intervals overlapped (no measured difference) at lag 0: V-trace 230 [" in text
    assert "collapsed" not in text


def test_small_returns_get_a_decimal_and_large_ones_none():
    table = study_table(sweep_frame())
    assert decimals(table) == 0  # returns in the hundreds: whole numbers tell cells apart
    small = table.assign(
        **{c: table[c] / 100 for c in ("final_return", "final_return_lo", "final_return_hi")}
    )
    assert decimals(small) == 1
    row = small.iloc[0]
    lo, hi = row["final_return_lo"], row["final_return_hi"]
    assert interval(row, "final_return", 1) == f"{row['final_return']:.1f} [{lo:.1f}, {hi:.1f}]"
    assert "." in study_conclusion(small).split("lag 32: V-trace ")[1].split(" [")[0]
