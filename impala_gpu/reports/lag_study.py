"""The lag study's table, conclusion and figure, from its sweep (``-m experiment=lag_study``).

    python -m impala_gpu.reports.lag_study multirun/<date>/<time> \\
        --png docs/lag_study.png --md table.md

Per cell (correction x exact lag x replay): final return and area under the curve with 95%
bootstrap intervals over seeds, the share of collapsed seeds, mean |log rho| and KL(mu || pi).
The figure: final return and AUC against lag per correction (filled: no replay; hollow: half
of each batch replayed), and the two off-policy diagnostics against lag.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from impala_gpu import analysis

COLORS = {"vtrace": "tab:blue", "none": "tab:red", "is1": "tab:green"}
COLUMNS = [
    "correction",
    "bounded_lag",
    "replay",
    "seeds",
    "final_return",
    "final_return_lo",
    "final_return_hi",
    "auc",
    "auc_lo",
    "auc_hi",
    "collapse_share",
    "mean_abs_log_rho",
    "kl_behavior_target",
    "policy_lag_mean",
    "replay_lag_mean",
]


def markdown(table: pd.DataFrame) -> str:
    head = (
        "| correction | lag | replay | seeds | final return [95% CI] | AUC [95% CI] | "
        "collapsed | mean abs log rho | KL(mu, pi) | lag (fresh / replayed) |"
    )
    lines = [head, "|" + "---|" * 10]
    digits = {m: analysis.decimals(table, m) for m in ("final_return", "auc")}
    for _, r in table.iterrows():
        replay_lag = "" if pd.isna(r["replay_lag_mean"]) else f" / {r['replay_lag_mean']:.0f}"
        lines.append(
            f"| {analysis.CORRECTION_LABELS.get(r['correction'], r['correction'])} "
            f"| {r['bounded_lag']} | {r['replay']:.0%} | {r['seeds']} "
            f"| {analysis.interval(r, 'final_return', digits['final_return'])} "
            f"| {analysis.interval(r, 'auc', digits['auc'])} "
            f"| {r['collapse_share']:.0%} | {r['mean_abs_log_rho']:.3f} "
            f"| {r['kl_behavior_target']:.4f} | {r['policy_lag_mean']:.0f}{replay_lag} |"
        )
    return "\n".join(lines)


def figure(table: pd.DataFrame, title: str, out: Path) -> None:
    lags = sorted(table["bounded_lag"].unique())
    pos = {lag: i for i, lag in enumerate(lags)}  # 0, 8, 32, 128: evenly spaced
    panels = (
        ("final_return", "final return (mean of seeds, 95% CI)"),
        ("auc", "area under the curve (mean return over training)"),
        ("mean_abs_log_rho", "mean |log rho| (taken actions)"),
        ("kl_behavior_target", "KL(mu || pi) (nats)"),
    )
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for ax, (metric, label) in zip(axes, panels, strict=True):
        for (corr, replay), cdf in table.groupby(["correction", "replay"], sort=True):
            cdf = cdf.sort_values("bounded_lag")
            x = [pos[lag] + (0.08 if replay else 0) for lag in cdf["bounded_lag"]]
            kw = dict(color=COLORS.get(corr, "gray"), marker="o", ms=6)
            kw["mfc"] = "white" if replay else kw["color"]
            name = analysis.CORRECTION_LABELS.get(corr, corr) + (
                f", {replay:.0%} replay" if replay else ""
            )
            if f"{metric}_lo" in cdf:
                err = [cdf[metric] - cdf[f"{metric}_lo"], cdf[f"{metric}_hi"] - cdf[metric]]
                ax.errorbar(
                    x, cdf[metric], yerr=err, ls="-" if not replay else ":", label=name, **kw
                )
            else:
                ax.plot(x, cdf[metric], ls="-" if not replay else ":", label=name, **kw)
        ax.set_xticks(range(len(lags)), [str(lag) for lag in lags])
        ax.set_xlabel("policy lag (updates, exact: bounded_lag)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    # Files only, no display. Chosen here, not on import: a notebook that imports this
    # module keeps its own backend.
    matplotlib.use("Agg")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("sweep", help="the sweep dir (multirun/<date>/<time>)")
    p.add_argument("--png", default=None, help="write the figure here")
    p.add_argument("--md", default=None, help="write the markdown table and conclusion here")
    p.add_argument("--title", default="The lag study")
    args = p.parse_args()
    df = analysis.load_sweep(args.sweep)
    if df.empty:
        raise SystemExit(
            f"no runs under {args.sweep}: run python -m impala_gpu -m experiment=lag_study"
        )
    table = analysis.study_table(df)[COLUMNS]
    text = markdown(table) + "\n\n" + analysis.study_conclusion(table) + "\n"
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    if args.png:
        figure(table, args.title, Path(args.png))
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
