"""The Pong lag study's table and figure, from its archived runs (``results/pong_lag/``).

    python -m impala_gpu.reports.pong_lag results/pong_lag/*/ \\
        --figure docs/results/pong_lag.png > table.md

One row per run: the exact lag (``bounded_lag``; ``free, N actors`` when none was imposed,
with the mean lag its histogram measured), the correction, the batch and learning rate, the
clip's anchor and the policy gradient's rho-bar, any other setting it changed
(``OTHER_SETTINGS``), the seed and the CPU it ran on, the frames at which the mean return
(last 100 games) first reached each threshold, or the return where the run ended, and three
health signals over the run: the median policy entropy, logit spread and mean |log rho| of its
log windows. The figure draws return against frames, one panel per correction and one colour
per lag (``--figure-only`` picks its runs).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from impala_gpu.analysis import load_run
from impala_gpu.analysis.runs import Run, run_machine
from impala_gpu.analysis.summaries import frames_to_threshold

THRESHOLDS = (-15.0, 0.0, 10.0, 18.0)

# Settings a run may change that have no column of their own, with the Atari recipe's value
# (conf/recipe/atari.yaml); the `other` column names those a run changed.
OTHER_SETTINGS = {
    "algo.adam_beta1": 0.9,
    "algo.ppo_clip": 0.1,
    "algo.entropy_cost": 0.01,
    "algo.minibatches": 4,
    "algo.vtrace_lambda": 0.95,
}


def mean_lag(run: Run) -> float:
    """The mean policy lag (updates) of the run's samples, from ``lag_hist.json``."""
    hist = run.lag_hist
    if hist is None or len(hist["bins"]) != len(hist["counts"]):
        return math.nan
    total = sum(hist["counts"])
    return sum(b * c for b, c in zip(hist["bins"], hist["counts"], strict=True)) / total


def lag_label(run: Run) -> str:
    if run.bounded_lag >= 0:
        return str(run.bounded_lag)
    return f"free, {run.get('num_actors', '?')} actors ({mean_lag(run):.1f})"


def anchor_label(run: Run) -> str:
    """The clip's anchor: ``first_visit``, ``behavior`` or ``target/N`` (IMPACT's target
    network, refreshed every N updates), with ``, mu±c`` where ``algo.behavior_clip=c`` also
    bounds pi/mu."""
    reference = str(run.get("algo.ppo_reference", "?"))
    if reference == "target":
        reference = f"target/{run.get('algo.target_interval', '?')}"
    bound = run.get("algo.behavior_clip", None)
    return reference if bound in (None, "?") else f"{reference}, mu±{bound}"


def other_label(run: Run) -> str:
    """The ``OTHER_SETTINGS`` the run changed, as ``key=value`` (``algo.`` dropped), or ``-``."""
    changed = [
        f"{key.removeprefix('algo.')}={run.get(key)}"
        for key, recipe in OTHER_SETTINGS.items()
        if run.get(key, recipe) != recipe
    ]
    return ", ".join(changed) or "-"


def cpu_label(cpu: str) -> str:
    """A short name for ``run_machine``'s CPU: ``AMD EPYC (family 25 model 17; avx2 ...)`` ->
    ``AMD EPYC 25/17``; ``Intel(R) Xeon(R) Processor (family 6 model 167; ...)`` ->
    ``Intel Xeon 6/167``. The full string is in the run's events."""
    name, _, rest = cpu.partition("(family ")
    name = name.replace("(R)", "").replace("Processor", "").split()
    family, _, model = rest.partition(" model ")
    model = model.split(";")[0].split(")")[0]
    return " ".join(name) + (f" {family}/{model}" if family and model else "")


def row(run: Run) -> dict:
    m = run.metrics
    out = {
        "run": run.name,
        "lag": lag_label(run),
        "correction": run.correction,
        "batch": run.get("batch_size", "?"),
        "lr": run.get("algo.learning_rate", "?"),
        "epochs": run.get("algo.epochs", "?"),
        "anchor": anchor_label(run),
        "pg rho-bar": run.get("algo.clip_pg_rho_threshold", "?"),
        "other": other_label(run),
        "seed": run.seed,
        "cpu": cpu_label(run_machine(run.path)[0]),
    }
    for t in THRESHOLDS:
        out[f"to {t:g}"] = frames_to_threshold(m, t)
    ret = m["episode_return"].dropna()
    out["end"] = f"{ret.iloc[-1]:.1f} at {m['frames'].max() / 1e6:.2f}M" if len(ret) else "-"
    for col in ("entropy", "logit_spread", "mean_abs_log_rho"):
        out[col] = float(m[col].median()) if col in m else math.nan
    return out


def table(runs: list[Run]) -> pd.DataFrame:
    rows = [row(r) for r in runs]
    order = {"none": 0, "vtrace": 1}
    rows.sort(
        key=lambda r: (order.get(r["correction"], 2), str(r["batch"]), _lag_key(r), r["seed"])
    )
    return pd.DataFrame(rows)


def _lag_key(r: dict) -> float:
    return float(r["lag"]) if r["lag"].isdigit() else math.inf


def markdown(df: pd.DataFrame) -> str:
    spec = ["run", "lag", "correction", "batch", "lr", "epochs", "anchor", "pg rho-bar", "other"]
    spec += ["seed", "cpu"]
    head = spec + [f"to {t:g}" for t in THRESHOLDS] + ["end", "entropy", "spread", "abs log rho"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in df.iterrows():
        cells = [str(r[k]) for k in spec]
        cells += [_frames(r[f"to {t:g}"]) for t in THRESHOLDS] + [r["end"]]
        cells += [f"{r[k]:.2f}" for k in ("entropy", "logit_spread", "mean_abs_log_rho")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _frames(v: float) -> str:
    return "-" if math.isnan(v) else f"{v / 1e6:.2f}M"


def figure(runs: list[Run], out: Path, target: float = 18.0) -> None:
    """Return against frames: one panel per correction, one colour per lag, seeds alike."""
    matplotlib.use("Agg")  # here, not on import: a notebook that imports this keeps its backend
    lags = sorted({r.bounded_lag for r in runs})
    shades = plt.cm.viridis([i / max(len(lags) - 1, 1) for i in range(len(lags))])
    colours = dict(zip(lags, shades, strict=True))
    corrections = sorted({r.correction for r in runs})
    fig, axes = plt.subplots(1, len(corrections), figsize=(6 * len(corrections), 4.5), sharey=True)
    for ax, correction in zip(fig.axes, corrections, strict=True):
        for r in sorted(runs, key=lambda r: (r.bounded_lag, r.seed or 0)):
            if r.correction != correction:
                continue
            m = r.metrics.dropna(subset=["episode_return"])
            style = ("-", "--", ":")[((r.seed or 1) - 1) % 3]
            free = f"free-running, {r.get('num_actors', '?')} actors, mean lag {mean_lag(r):.1f}"
            label = f"{f'lag {r.bounded_lag}' if r.bounded_lag >= 0 else free}, seed {r.seed}"
            ax.plot(
                m["frames"] / 1e6,
                m["episode_return"],
                style,
                color=colours[r.bounded_lag],
                label=label,
                lw=1.4,
            )
        ax.axhline(target, color="grey", lw=0.8, ls=":")
        ax.set_title(f"algo.correction={correction}")
        ax.set_xlabel("frames (millions)")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    fig.axes[0].set_ylabel("mean return (last 100 games)")
    fig.suptitle("Pong, the Atari recipe at exact policy lag (bounded_lag)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def matches(run: Run, only: list[str]) -> bool:
    """Whether ``run``'s config holds every ``key=value`` of ``only``; a key its config lacks
    (one from before the key existed) reads ``None``, the value such a run had."""
    return all(str(run.get(k, None)) == v for k, v in (o.split("=", 1) for o in only))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("runs", nargs="+", help="archived run dirs")
    p.add_argument("--figure", default=None, help="PNG to write")
    p.add_argument(
        "--figure-only",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="draw only the runs whose config holds these (e.g. batch_size=16 algo.epochs=2)",
    )
    args = p.parse_args()
    runs = [load_run(d) for d in args.runs]
    print(markdown(table(runs)))
    if args.figure:
        figure([r for r in runs if matches(r, args.figure_only)], Path(args.figure))


if __name__ == "__main__":
    main()
