"""Curves, summary tables and the generated conclusions of runs loaded by ``analysis.runs``."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from impala_gpu.analysis.runs import (
    IMPALA_ALGOS,
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


#: How tables, plots and conclusions name each ``algo.correction``.
CORRECTION_LABELS = {"vtrace": "V-trace", "none": "no correction", "is1": "1-step IS"}


def _label(row: pd.Series, keys: Sequence[str]) -> str:
    name = str(row["algo"]) if "algo" in keys else ""
    extra = [
        CORRECTION_LABELS.get(row[k], str(row[k])) if k == "correction" else f"{k}={row[k]}"
        for k in keys
        # impala_nocorrection already says it in its name
        if k != "algo" and not (k == "correction" and name == "impala_nocorrection")
    ]
    if not extra:
        return name
    return f"{name} ({', '.join(extra)})" if name else ", ".join(extra)


def group_label(row: pd.Series | dict[str, Any], keys: Sequence[str]) -> str:
    """How tables' rows are named in conclusions and legends: ``a3c``, ``impala (V-trace,
    refresh_every=8)``, ``compare_cell=a3c_160``: ``row`` holds (at least) the ``keys``."""
    return _label(pd.Series(row) if isinstance(row, dict) else row, keys)


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return "n/a"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _group_keys(summary: pd.DataFrame) -> list[str]:
    if "keys" in summary.attrs:
        return list(summary.attrs["keys"])
    known = {"algo", "env", "seed", "refresh_every", "correction"}
    return [c for c in summary.columns if c in known]


def conclusion(summary: pd.DataFrame, threshold: float | None = None) -> str:
    """A short paragraph read off a ``summary_table``: nothing in it is hard-coded.

    It names the fastest configuration in frames/s, the best final return, and, with a
    threshold (given here or kept by ``summary_table``), who reached it in the fewest frames
    and the least wall-clock time (runs that all got there rank before those that only
    partly did). When the table holds IMPALA runs with and without V-trace, it compares their
    final returns at each injected lag (``refresh_every``). A difference smaller than the
    spread over seeds is called out as such: a few seeds cannot separate it.
    """
    if summary.empty:
        return "No runs to compare."
    if threshold is None:
        threshold = summary.attrs.get("threshold")
    keys = _group_keys(summary)
    labels = {i: _label(row, keys) for i, row in summary.iterrows()}
    seeds = summary["runs"] if "runs" in summary.columns else pd.Series(1, index=summary.index)
    parts = []

    fps = summary["frames_per_s"].dropna()
    if len(fps) == 1:
        i = fps.index[0]
        parts.append(f"{labels[i]} ran at {_fmt(fps[i])} frames/s (median over steady windows).")
    elif fps.max() == fps.min():
        parts.append(f"All {len(fps)} configurations ran at {_fmt(fps.max())} frames/s.")
    elif len(fps) > 1:
        hi, lo = fps.idxmax(), fps.idxmin()
        ratio = f"{fps[hi] / fps[lo]:.2g}x" if fps[lo] > 0 else "ahead of"
        parts.append(
            f"{labels[hi]} was the fastest at {_fmt(fps[hi])} frames/s (median over steady "
            f"windows), {ratio} the slowest, {labels[lo]} ({_fmt(fps[lo])})."
        )

    fin = summary["final_return"].dropna()
    if len(fin) == 0:
        parts.append("No run finished an episode, so there is no return to compare.")
    else:
        best = fin.idxmax()
        std = summary.loc[best, "final_return_std"] if "final_return_std" in summary else math.nan
        spread = f" ± {_fmt(std)}" if math.isfinite(std) else ""
        what = "the best final return" if len(fin) > 1 else "a final return"
        parts.append(
            f"{labels[best]} reached {what}: {_fmt(fin[best])}{spread} "
            f"(mean of the last logged return over {int(seeds[best])} run(s))."
        )

    if threshold is not None and "frames_to_threshold" in summary.columns:
        parts.append(_threshold_sentence(summary, labels, seeds, threshold))

    lag = _lag_sentences(summary)
    if lag:
        parts.append(lag)
    return " ".join(parts)


def _threshold_sentence(
    summary: pd.DataFrame, labels: dict[Any, str], seeds: pd.Series, threshold: float
) -> str:
    reached = summary[summary["reached"] > 0]
    if reached.empty:
        return f"No configuration reached a return of {_fmt(threshold)}."
    # Rank by the share of seeds that got there first: a mean over the lucky seed of a group
    # that mostly failed must not beat a group that always made it.
    share = reached["reached"] / seeds[reached.index]

    def best(column: str) -> Any:
        ranked = reached.assign(_share=share).sort_values(
            ["_share", column], ascending=[False, True]
        )
        return ranked.index[0]

    f, s = best("frames_to_threshold"), best("seconds_to_threshold")

    def how_many(i: Any) -> str:
        return f"{int(summary.loc[i, 'reached'])}/{int(seeds[i])} runs"

    text = (
        f"To a return of {_fmt(threshold)}, {labels[f]} needed the fewest frames "
        f"({_fmt(summary.loc[f, 'frames_to_threshold'])}, {how_many(f)})"
    )
    if s == f:
        text += (
            f" and the least wall-clock time ({_fmt(summary.loc[s, 'seconds_to_threshold'])} s)."
        )
    else:
        text += (
            f"; {labels[s]} the least wall-clock time "
            f"({_fmt(summary.loc[s, 'seconds_to_threshold'])} s, {how_many(s)})."
        )
    missing = [labels[i] for i in summary.index if summary.loc[i, "reached"] == 0]
    if missing:
        text += f" Never reached it: {', '.join(missing)}."
    return text


def _lag_sentences(summary: pd.DataFrame) -> str:
    table = summary
    if "algo" in table.columns and table["algo"].isin(IMPALA_ALGOS).any():
        # a2c/a3c also run without correction, but on fresh data: not part of this ablation.
        table = table[table["algo"].isin(IMPALA_ALGOS)]
        if "correction" not in table.columns:
            # Grouped by algo alone (impala vs impala_nocorrection): the name says it.
            table = table.assign(correction=table["algo"].map({"impala": "vtrace"}).fillna("none"))
    if "correction" not in table.columns or table["correction"].nunique() < 2:
        return ""
    if "refresh_every" not in table.columns:
        table = table.assign(refresh_every=-1)  # not in the table: one unnamed setting
    clauses, gaps = [], {}
    for k, kdf in table.groupby("refresh_every", sort=True):
        on, off = kdf[kdf["correction"] == "vtrace"], kdf[kdf["correction"] == "none"]
        if on.empty or off.empty:
            continue
        a, b = float(on["final_return"].mean()), float(off["final_return"].mean())
        if not (math.isfinite(a) and math.isfinite(b)):
            continue
        # The larger of the two seed spreads: a gap inside it is not a measured difference.
        stds = pd.concat([on, off]).get("final_return_std", pd.Series(dtype="float64"))
        noise = float(stds.max()) if stds.notna().any() else math.nan
        diff = a - b
        if math.isfinite(noise) and abs(diff) <= noise:
            verdict = "within the spread over seeds"
        else:
            verdict = "higher" if diff > 0 else ("lower" if diff < 0 else "the same")
            if "runs" in kdf.columns and min(on["runs"].sum(), off["runs"].sum()) < 2:
                verdict += "; one seed, so no spread to judge it by"
        lag = kdf["policy_lag_mean"].mean() if "policy_lag_mean" in kdf.columns else math.nan
        measured = f", measured mean lag {_fmt(lag)}" if math.isfinite(lag) else ""
        where = f"at refresh_every={k}" if k != -1 else "at the table's one lag setting"
        clauses.append(
            f"{where}{measured}, V-trace {_fmt(a)} vs {_fmt(b)} without correction ({verdict})"
        )
        gaps[k] = diff
    if not clauses:
        return ""
    text = "Final return with and without V-trace: " + "; ".join(clauses) + "."
    if len(gaps) > 1:
        lo, hi = min(gaps), max(gaps)
        text += (
            f" The gap (V-trace minus no correction) went from {_fmt(gaps[lo])} at "
            f"refresh_every={lo} to {_fmt(gaps[hi])} at refresh_every={hi}."
        )
    return text
