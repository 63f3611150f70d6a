"""The lag study's numbers (``experiment=lag_study``): per cell of correction x exact lag x
replay, the final return and the area under the curve with 95% bootstrap intervals over seeds,
the share of seeds that collapse, and the off-policy diagnostics.

Pure functions of a ``load_sweep`` frame (one row per metrics line); nothing is hard-coded, so
the conclusion is read off whatever the runs measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from impala_gpu.analysis.conclusions import CORRECTION_LABELS

STUDY_KEYS = ("correction", "bounded_lag", "replay")
COLLAPSE_DROP = 0.5  # a seed collapses when it falls back this much of its gain, peak to final


def bootstrap_ci(
    values: np.ndarray,
    stat: Callable[[np.ndarray], float] = np.mean,
    level: float = 0.95,
    resamples: int = 5000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over ``values`` (NaN, NaN for none; the value
    itself, twice, for one)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan, math.nan
    if len(values) == 1:
        return float(values[0]), float(values[0])
    rng = np.random.default_rng(seed)
    draws = rng.choice(values, size=(resamples, len(values)), replace=True)
    stats = np.apply_along_axis(stat, 1, draws)
    alpha = (1 - level) / 2
    return float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def returns_curve(run: pd.DataFrame) -> pd.DataFrame:
    """``frames`` and ``episode_return`` (the logged mean of the last 100 episodes) of one run,
    where a return was logged."""
    return run[["frames", "episode_return"]].dropna().sort_values("frames")


def area_under_curve(run: pd.DataFrame) -> float:
    """The return averaged over the run's frames (trapezoids, from its first to its last
    logged return): one number for how fast and how well it learned."""
    curve = returns_curve(run)
    if len(curve) < 2:
        return float(curve["episode_return"].iloc[0]) if len(curve) else math.nan
    x, y = curve["frames"].to_numpy(float), curve["episode_return"].to_numpy(float)
    span = x[-1] - x[0]
    if span <= 0:
        return float(y.mean())
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / span)


def collapsed(run: pd.DataFrame, drop: float = COLLAPSE_DROP) -> bool:
    """Whether the run fell back more than ``drop`` of what it had gained: with ``first``,
    ``peak`` and ``final`` its first, best and last logged returns, ``final < peak - drop *
    (peak - first)``. Relative to the gain, because returns can be negative (LunarLander starts
    near -200): "50% below the peak" of a negative number means nothing."""
    curve = returns_curve(run)["episode_return"].to_numpy(float)
    if len(curve) < 2:
        return False
    first, peak, final = curve[0], curve.max(), curve[-1]
    gain = peak - first
    return bool(gain > 0 and final < peak - drop * gain)


def _final(run: pd.DataFrame) -> float:
    curve = returns_curve(run)
    return float(curve["episode_return"].iloc[-1]) if len(curve) else math.nan


def _steady_mean(run: pd.DataFrame, column: str) -> float:
    if column not in run.columns:
        return math.nan
    values = run[column].iloc[1:] if len(run) > 1 else run[column]
    return float(values.mean())


def per_run(df: pd.DataFrame, keys=STUDY_KEYS) -> pd.DataFrame:
    """One row per run: its cell keys, final return, AUC, whether it collapsed, and its mean
    |log rho|, KL(mu || pi), fresh and replayed policy lag over its steady windows."""
    rows = []
    for run_name, rdf in df.groupby("run", sort=True):
        first = rdf.iloc[0]
        rows.append(
            {
                "run": run_name,
                **{k: first[k] for k in (*keys, "seed")},
                "final_return": _final(rdf),
                "auc": area_under_curve(rdf),
                "collapsed": collapsed(rdf),
                "mean_abs_log_rho": _steady_mean(rdf, "mean_abs_log_rho"),
                "kl_behavior_target": _steady_mean(rdf, "kl_behavior_target"),
                "policy_lag_mean": _steady_mean(rdf, "policy_lag_mean"),
                "replay_lag_mean": _steady_mean(rdf, "replay_lag_mean"),
            }
        )
    return pd.DataFrame(rows)


def study_table(df: pd.DataFrame, keys=STUDY_KEYS, level: float = 0.95) -> pd.DataFrame:
    """One row per cell: ``seeds``, ``final_return`` and ``auc`` (means over seeds) with their
    bootstrap intervals (``*_lo``, ``*_hi``), ``collapse_share``, and the means of
    ``mean_abs_log_rho``, ``kl_behavior_target``, ``policy_lag_mean`` and
    ``replay_lag_mean``."""
    runs = per_run(df, keys)
    rows = []
    for cell, cdf in runs.groupby(list(keys), sort=True, dropna=False):
        row: dict[str, Any] = dict(zip(keys, cell, strict=True))
        row["seeds"] = len(cdf)
        for metric in ("final_return", "auc"):
            values = cdf[metric].to_numpy(float)
            lo, hi = bootstrap_ci(values, level=level)
            row.update({metric: float(np.nanmean(values)), f"{metric}_lo": lo, f"{metric}_hi": hi})
        row["collapse_share"] = float(cdf["collapsed"].mean())
        for metric in ("mean_abs_log_rho", "kl_behavior_target", "policy_lag_mean"):
            row[metric] = float(cdf[metric].mean())
        row["replay_lag_mean"] = float(cdf["replay_lag_mean"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def decimals(table: pd.DataFrame, metric: str = "final_return") -> int:
    """Digits after the point that tell the table's cells apart: none for returns in the
    hundreds (LunarLander), one for returns of a few points (MinAtar Breakout)."""
    cols = [c for c in (metric, f"{metric}_lo", f"{metric}_hi") if c in table]
    largest = table[cols].abs().max().max() if cols and len(table) else float("nan")
    return 1 if largest < 100 else 0  # NaN (no rows): whole numbers


def interval(row: pd.Series, metric: str, digits: int = 0) -> str:
    """``mean [lo, hi]`` of ``metric`` in one row of ``study_table``."""
    lo, hi = row[f"{metric}_lo"], row[f"{metric}_hi"]
    return f"{row[metric]:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _setting(lag: int, replay: float) -> str:
    text = f"lag {lag}" if lag >= 0 else "no imposed lag"
    return text + (f", {replay:.0%} replay" if replay > 0 else "")


def study_conclusion(table: pd.DataFrame, metric: str = "final_return") -> str:
    """Where correction mattered and where it did not, read off ``study_table``: per lag and
    replay setting, V-trace against each other correction. A difference counts only when the
    two bootstrap intervals do not overlap."""
    if table.empty:
        return "No runs."
    mattered, overlapped = [], []
    digits = decimals(table, metric)
    for (lag, replay), sdf in table.groupby(["bounded_lag", "replay"], sort=True):
        by = {row["correction"]: row for _, row in sdf.iterrows()}
        if "vtrace" not in by:
            continue
        v = by["vtrace"]
        for other in ("none", "is1"):
            if other not in by:
                continue
            o = by[other]
            name = CORRECTION_LABELS.get(other, other)
            where = (
                f"{_setting(lag, replay)}: V-trace {interval(v, metric, digits)} vs {name} "
                f"{interval(o, metric, digits)}"
            )
            if v[f"{metric}_lo"] > o[f"{metric}_hi"]:
                mattered.append(where + " (V-trace higher)")
            elif v[f"{metric}_hi"] < o[f"{metric}_lo"]:
                mattered.append(where + f" ({name} higher)")
            else:
                overlapped.append(where)
    what = "final return" if metric == "final_return" else "area under the curve"
    text = f"Mean {what} over seeds, with 95% bootstrap intervals. "
    if mattered:
        text += "Correction mattered (intervals apart) at " + "; ".join(mattered) + ". "
    else:
        text += "V-trace beat no other correction with separate intervals anywhere. "
    if overlapped:
        text += "Intervals overlapped (no measured difference) at " + "; ".join(overlapped) + "."
    collapses = table[table["collapse_share"] > 0]
    if len(collapses):
        text += " Seeds that collapsed: " + "; ".join(
            f"{CORRECTION_LABELS.get(r['correction'], r['correction'])} at "
            f"{_setting(r['bounded_lag'], r['replay'])} {r['collapse_share']:.0%}"
            for _, r in collapses.iterrows()
        )
        text += "."
    return text.strip()
