"""Curves and summary tables of runs loaded by ``analysis.runs``; ``analysis.conclusions`` puts
them into words."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from impala_gpu.analysis.runs import (
    OVERRIDE_COLUMNS,
    Run,
    overrides,
)


def _keys(by: str | Sequence[str]) -> list[str]:
    return [by] if isinstance(by, str) else list(by)


def curves(
    df: pd.DataFrame,
    x: str = "frames",
    y: str = "episode_return",
    by: str | Sequence[str] = ("algo",),
    grid: int | Sequence[float] | np.ndarray = 200,
    coverage: str = "all",
) -> pd.DataFrame:
    """Each run's ``y`` against ``x`` on a common grid, aggregated over the runs of a group.

    Each run is linearly interpolated onto the grid inside its own logged range only (no
    extrapolation), then each group's runs are aggregated per grid point. ``grid`` is a
    number of points spanning the smallest to the largest ``x`` of any run, or explicit x
    values. ``coverage="all"`` keeps only the grid points every run of the group covers: a
    mean over a changing set of seeds jumps wherever one joins or drops out (runs log their
    first return at different frames and finish at different times). ``"any"`` keeps every
    point at least one run covers.

    Returns one row per kept (group, grid point) with the ``by`` columns, ``x``, and
    ``mean``, ``min``, ``max``, ``std`` (over runs, ddof=1: NaN for a single run) and ``n``
    (runs covering the point).
    """
    if coverage not in ("all", "any"):
        raise ValueError(f"coverage={coverage!r} is not 'all' or 'any'")
    keys = _keys(by)
    cols = [*keys, x, "mean", "min", "max", "std", "n"]
    data = df.dropna(subset=[x, y])
    if data.empty:
        return pd.DataFrame(columns=cols)
    if isinstance(grid, int):
        xs = np.linspace(float(data[x].min()), float(data[x].max()), grid)
    else:
        xs = np.asarray(grid, dtype=float)
    out = []
    for group, gdf in data.groupby(keys, sort=True, dropna=False):
        values = []
        for _, rdf in gdf.groupby("run", sort=False):
            # Sorted, one y per x: np.interp needs increasing sample points.
            r = rdf.sort_values(x).drop_duplicates(subset=x, keep="last")
            values.append(np.interp(xs, r[x], r[y], left=np.nan, right=np.nan))
        stack = np.vstack(values)
        n = np.sum(~np.isnan(stack), axis=0)
        with warnings.catch_warnings():  # all-NaN columns are dropped below
            warnings.simplefilter("ignore", RuntimeWarning)
            stats = {
                "mean": np.nanmean(stack, axis=0),
                "min": np.nanmin(stack, axis=0),
                "max": np.nanmax(stack, axis=0),
                "std": np.nanstd(stack, axis=0, ddof=1) if len(values) > 1 else np.nan,
            }
        frame = pd.DataFrame({x: xs, **stats, "n": n})
        if len(values) > 1:
            frame.loc[frame["n"] < 2, "std"] = np.nan
        for key, value in zip(keys, group, strict=True):
            frame[key] = value
        need = len(values) if coverage == "all" else 1
        out.append(frame.loc[frame["n"] >= need, cols])
    return pd.concat(out, ignore_index=True)


def _first_reaching(run_metrics: pd.DataFrame, threshold: float, column: str) -> float:
    ret = run_metrics["episode_return"]
    hit = run_metrics.loc[ret.notna() & (ret >= threshold), column]
    return float(hit.iloc[0]) if len(hit) else math.nan


def frames_to_threshold(run_metrics: pd.DataFrame, threshold: float) -> float:
    """Frames at the first log line whose ``episode_return`` is >= ``threshold`` (NaN: never).

    The resolution is the log interval: the return is only known at log lines. Rows are taken
    in file order, which is the order they were logged.
    """
    return _first_reaching(run_metrics, threshold, "frames")


def seconds_to_threshold(run_metrics: pd.DataFrame, threshold: float) -> float:
    """Wall-clock seconds since training start (``elapsed_s``) at the same line as
    ``frames_to_threshold`` (NaN: never)."""
    return _first_reaching(run_metrics, threshold, "elapsed_s")


def threshold_times(
    df: pd.DataFrame, thresholds: Sequence[float], by: str | Sequence[str] | None = None
) -> pd.DataFrame:
    """When each run first reached each return: one row per run of a ``load_sweep`` frame.

    Columns: ``run``, ``algo``, the other group keys (``by``, default ``summary_keys(df)``,
    e.g. ``compare_cell``), ``seed``, ``frames`` (the most it played), and per threshold
    ``t``: ``frames_to_{t:g}`` and ``seconds_to_{t:g}`` (``frames_to_threshold`` and
    ``seconds_to_threshold``; NaN: never got there). Rows sorted by algo and those keys, then
    seed.
    """
    keys = _keys(by) if by is not None else summary_keys(df)
    front = ["algo", *(k for k in keys if k not in ("algo", "seed"))]
    rows = []
    for run, rdf in df.groupby("run", sort=False):
        row: dict[str, Any] = {"run": run}
        row.update({k: rdf[k].iloc[0] for k in front})
        row.update(seed=rdf["seed"].iloc[0], frames=float(rdf["frames"].max()))
        for t in thresholds:
            row[f"frames_to_{t:g}"] = frames_to_threshold(rdf, t)
            row[f"seconds_to_{t:g}"] = seconds_to_threshold(rdf, t)
        rows.append(row)
    columns = ["run", *front, "seed", "frames"]
    columns += [f"{k}_to_{t:g}" for t in thresholds for k in ("frames", "seconds")]
    table = pd.DataFrame(rows, columns=columns)
    return table.sort_values([*front, "seed"], ignore_index=True)


def _final_return(run_metrics: pd.DataFrame) -> float:
    ret = run_metrics["episode_return"].dropna()
    return float(ret.iloc[-1]) if len(ret) else math.nan


def _steady(run_metrics: pd.DataFrame) -> pd.DataFrame:
    # The first window holds start-up (actors spawning, first compile/alloc); drop it, unless
    # it is all there is.
    return run_metrics.iloc[1:] if len(run_metrics) > 1 else run_metrics


def _varies_within(df: pd.DataFrame, key: str, keys: Sequence[str]) -> bool:
    if not keys:
        return df[key].nunique(dropna=False) > 1
    return bool((df.groupby(list(keys), dropna=False)[key].nunique(dropna=False) > 1).any())


def swept_keys(df: pd.DataFrame) -> list[str]:
    """The columns of a ``load_sweep`` frame that hold its swept overrides (read off the run
    dirs' names, ``overrides``), in the order the names give them, ``seed`` left out: the
    column a key maps to (``OVERRIDE_COLUMNS``; ``algo.correction`` -> ``correction``) or the
    key's own column (``compare_cell``)."""
    keys: list[str] = []
    for run in df["run"].unique() if "run" in df.columns else ():
        for key in overrides(str(run)):
            column = OVERRIDE_COLUMNS.get(key, key)
            if column != "seed" and column in df.columns and column not in keys:
                keys.append(column)
    return keys


def summary_keys(df: pd.DataFrame) -> list[str]:
    """What tells a sweep's runs apart, seeds aside: the columns to group them by.

    ``algo``, plus ``refresh_every`` and ``correction`` when they vary within an algo
    (within, not across: a2c always runs without correction and impala with it, so in a
    baselines sweep ``correction`` tells nothing ``algo`` does not already say), plus each
    swept override (``swept_keys``) that still varies within those groups: compare_cartpole's
    ``compare_cell`` tells its two A3C layouts (a3c, a3c_160) apart, which ``algo`` pools.
    When the swept keys added that way already say which algo a run is (one algo per
    ``compare_cell``), ``algo`` is left out: the groups are the swept cells themselves.
    """
    keys = ["algo"]
    for key in ("refresh_every", "correction"):
        if key in df.columns and _varies_within(df, key, ["algo"]):
            keys.append(key)
    added = []
    for key in swept_keys(df):
        if key not in keys and _varies_within(df, key, keys):
            keys.append(key)
            added.append(key)
    if added and df["algo"].nunique() > 1 and not _varies_within(df, "algo", added):
        keys.remove("algo")
    return keys


def summary_table(
    df: pd.DataFrame,
    threshold: float | None = None,
    by: str | Sequence[str] | None = None,
) -> pd.DataFrame:
    """One row per group (default ``summary_keys(df)``) of a ``load_sweep`` frame.

    Columns:
        runs: number of runs (seeds) in the group.
        frames_per_s: median over every steady log window (each run's first line dropped) of
            the group's runs.
        learner_busy, policy_lag_mean: mean over the same windows (NaN when not logged).
        final_return: mean over runs of each run's last non-null ``episode_return``;
        final_return_std: its spread over runs (ddof=1; NaN for one run).
        With ``threshold``: ``reached`` (runs that got there), ``frames_to_threshold`` and
        ``seconds_to_threshold`` (means over the runs that got there; NaN if none did).

    The threshold is kept in ``result.attrs["threshold"]`` for ``conclusion``.
    """
    keys = _keys(by) if by is not None else summary_keys(df)
    rows = []
    for group, gdf in df.groupby(keys, sort=True, dropna=False):
        per_run = [rdf for _, rdf in gdf.groupby("run", sort=True)]
        steady = pd.concat([_steady(r) for r in per_run])
        finals = pd.Series([_final_return(r) for r in per_run], dtype="float64")
        row: dict[str, Any] = dict(zip(keys, group, strict=True))
        row.update(
            runs=len(per_run),
            frames_per_s=float(steady["frames_per_s"].median()),
            learner_busy=float(steady["learner_busy"].mean()),
            policy_lag_mean=float(steady["policy_lag_mean"].mean()),
            final_return=float(finals.mean()),
            final_return_std=float(finals.std(ddof=1)) if finals.count() > 1 else math.nan,
        )
        if threshold is not None:
            fr = pd.Series([frames_to_threshold(r, threshold) for r in per_run], dtype="float64")
            sec = pd.Series([seconds_to_threshold(r, threshold) for r in per_run], dtype="float64")
            row.update(
                reached=int(fr.notna().sum()),
                frames_to_threshold=float(fr.mean()),
                seconds_to_threshold=float(sec.mean()),
            )
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["threshold"] = threshold
    table.attrs["keys"] = keys  # what conclusion() names each row by
    return table


def lag_summary(
    df: pd.DataFrame, by: str | Sequence[str] = ("refresh_every", "correction")
) -> pd.DataFrame:
    """Measured policy lag per group over steady windows, for when no ``lag_hist.json``
    exists: ``lag_mean`` and ``lag_p95`` (means of the per-window values) and ``lag_max``
    (the largest lag seen)."""
    keys = _keys(by)
    rows = []
    for group, gdf in df.groupby(keys, sort=True, dropna=False):
        steady = pd.concat([_steady(r) for _, r in gdf.groupby("run", sort=True)])
        row: dict[str, Any] = dict(zip(keys, group, strict=True))
        row.update(
            lag_mean=float(steady["policy_lag_mean"].mean()),
            lag_p95=float(steady["policy_lag_p95"].mean()),
            lag_max=float(steady["policy_lag_max"].max()),
        )
        rows.append(row)
    return pd.DataFrame(rows, columns=[*keys, "lag_mean", "lag_p95", "lag_max"])


def lag_histograms(
    runs: Iterable[Run], by: str | Sequence[str] = ("refresh_every", "correction")
) -> pd.DataFrame:
    """The runs' ``lag_hist.json`` histograms summed per group, in long format.

    Columns: the ``by`` keys (attributes of ``Run``), ``lag`` (the bin's value, or its left
    edge when the file gives edges), ``width``, ``center`` (where to draw the bar: the value
    itself, or the middle of the edges), ``count`` and ``fraction`` (of the group's samples).
    Runs without a histogram are skipped; the result is empty when none has one.
    """
    keys = _keys(by)
    rows = []
    for run in runs:
        if run.lag_hist is None:
            continue
        bins, counts = run.lag_hist["bins"], run.lag_hist["counts"]
        if len(bins) == len(counts) + 1:
            lefts, widths = bins[:-1], list(np.diff(bins))
            centers = [a + w / 2 for a, w in zip(lefts, widths, strict=True)]
        else:
            lefts, widths, centers = bins, [1.0] * len(bins), bins  # one integer lag per bin
        base = {key: getattr(run, key) for key in keys}
        for lag, width, center, count in zip(lefts, widths, centers, counts, strict=True):
            rows.append(
                {**base, "lag": lag, "width": float(width), "center": center, "count": count}
            )
    cols = [*keys, "lag", "width", "center", "count", "fraction"]
    if not rows:
        return pd.DataFrame(columns=cols)
    bin_keys = [*keys, "lag", "width", "center"]
    hist = pd.DataFrame(rows).groupby(bin_keys, as_index=False)["count"].sum()
    total = hist.groupby(keys)["count"].transform("sum")
    hist["fraction"] = hist["count"] / total.where(total > 0)
    return hist[cols]
