"""The words of a comparison: how rows are named (``group_label``) and the paragraph read off a
``summaries.summary_table`` (``conclusion``), with nothing in it hard-coded."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from impala_gpu.analysis.runs import IMPALA_ALGOS

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
