"""IMPALA vs A2C vs A3C from their runs: the table and figure of docs/results/compare.md.

    python -m impala_gpu.reports.compare multirun/compare_pong results/pong \\
        --thresholds 0,10,18 --png docs/compare_pong.png --md /tmp/compare_pong.md

Each argument is a run dir or a tree of them (a sweep; archived runs with ``metrics.jsonl.gz``
count too); runs are grouped by their config's ``algo.name``. Per algo: the seeds, each seed's
frames and wall-clock to each threshold ("not in 15.0M": never, in the frames it played), the
median frames/s, the learner's busy fraction and the mean policy lag over steady log windows
(A3C: updates applied between a worker's weight copy and its own update; no central learner,
so no busy fraction). The figure: mean return against frames and against wall-clock, one line
per run, one colour per algo.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from impala_gpu.analysis import (
    find_runs,
    load_run,
    runs_frame,
    summary_table,
    threshold_times,
)

COLORS = {"impala": "tab:blue", "a2c": "tab:orange", "a3c": "tab:green"}


def load(paths: list[str]) -> pd.DataFrame:
    """Every run under ``paths`` in long format (``analysis.runs_frame``), failed ones left out."""
    runs = []
    for p in paths:
        found = find_runs(p) or [Path(p)]
        runs += [r for r in (load_run(d) for d in found) if not r.failed and len(r.metrics)]
    if not runs:
        raise SystemExit(f"no runs with metrics under {paths}")
    df = runs_frame(runs)
    df["run"] = [str(r.path) for r in runs for _ in range(len(r.metrics))]
    return df


def table(df: pd.DataFrame, thresholds: list[float]) -> pd.DataFrame:
    """Per algo: ``summary_table``'s seeds, frames/s, learner busy and lag, and each run's
    frames and wall-clock to each threshold (``threshold_times``), as lists in seed order."""
    summary = summary_table(df, by="algo").set_index("algo")
    times = threshold_times(df, thresholds)
    rows = []
    for algo, adf in times.groupby("algo", sort=True):
        row = {"algo": algo, "seeds": len(adf), "frames_played": adf["frames"].tolist()}
        row.update(summary.loc[algo, ["frames_per_s", "learner_busy", "policy_lag_mean"]])
        for t in thresholds:
            row[f"frames_to_{t:g}"] = adf[f"frames_to_{t:g}"].tolist()
            row[f"seconds_to_{t:g}"] = adf[f"seconds_to_{t:g}"].tolist()
        rows.append(row)
    return pd.DataFrame(rows)


def _when(frames: float, seconds: float, played: float) -> str:
    if math.isnan(frames):
        return f"not in {played / 1e6:.1f}M"
    return f"{frames / 1e6:.1f}M, {seconds / 60:.0f} min"


def markdown(tab: pd.DataFrame, thresholds: list[float]) -> str:
    """One row per algo; each threshold cell lists the seeds' frames and wall-clock to it."""
    head = ["algo", "seeds", *(f"to {t:g}: frames, wall-clock" for t in thresholds)]
    head += ["frames/s", "learner busy", "policy lag"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in tab.iterrows():
        cells = [r["algo"], f"{r['seeds']}"]
        for t in thresholds:
            when = zip(
                r[f"frames_to_{t:g}"], r[f"seconds_to_{t:g}"], r["frames_played"], strict=True
            )
            cells.append("; ".join(_when(*w) for w in when))
        busy = "—" if math.isnan(r["learner_busy"]) else f"{r['learner_busy']:.0%}"
        cells += [f"{r['frames_per_s']:,.0f}", busy, f"{r['policy_lag_mean']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(df: pd.DataFrame, title: str, out: Path, target: float | None) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for ax, (x, scale, label) in zip(
        axes, (("frames", 1e6, "frames (M)"), ("elapsed_s", 60, "wall-clock (min)")), strict=True
    ):
        seen = set()
        for (algo, _), r in df.groupby(["algo", "run"], sort=True):
            r = r.dropna(subset=["episode_return"]).sort_values(x)
            name = algo if algo not in seen else None
            seen.add(algo)
            ax.plot(r[x] / scale, r["episode_return"], color=COLORS.get(algo), label=name, lw=1.2)
        if target is not None:
            ax.axhline(target, color="gray", ls=":", lw=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean return (last 100 games)")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    # Files only, no display. Chosen here, not on import: a notebook that imports this
    # module keeps its own backend.
    matplotlib.use("Agg")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("paths", nargs="+", help="run dirs or trees of them")
    p.add_argument("--thresholds", default="0,10,18")
    p.add_argument("--png", default=None, help="write the figure here")
    p.add_argument("--md", default=None, help="write the markdown table here")
    p.add_argument("--title", default="IMPALA vs A2C vs A3C")
    p.add_argument("--target", type=float, default=None, help="draw this return as a line")
    args = p.parse_args()
    thresholds = [float(t) for t in args.thresholds.split(",")]
    df = load(args.paths)
    md = markdown(table(df, thresholds), thresholds)
    print(md)
    if args.md:
        Path(args.md).write_text(md + "\n")
    if args.png:
        figure(df, args.title, Path(args.png), args.target)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
