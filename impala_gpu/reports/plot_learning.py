"""Learning curves from runs' ``metrics.jsonl``: return against frames and against wall-clock,
with the network's health (entropy, logit spread, dead fc units) underneath.

    python -m impala_gpu.reports.plot_learning runs/abl/B_tf runs/abl/C_tf_ortho --out docs/pong.png
    python -m impala_gpu.reports.plot_learning NAME=RUN_DIR ... --target 18
    python -m impala_gpu.reports.plot_learning NAME=RUN_DIR ... --returns-only \\
        --out docs/headline.png

Each argument is a run dir, or ``label=run_dir``. The learning-curve PNGs in docs/ are made by
this script (commands in docs/results/).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from impala_gpu.analysis import metrics_path, read_metrics

PANELS = (
    ("frames", "episode_return", "mean return (last 100 games)"),
    ("elapsed_s", "episode_return", "mean return (last 100 games)"),
    ("frames", "entropy", "policy entropy (nats)"),
    ("frames", "logit_spread", "logit spread across states"),
    ("frames", "dead/fc", "dead fc units (fraction)"),
    ("frames", "dead/conv1", "dead conv1 units (fraction)"),
    ("frames", "grad_norm", "gradient norm (before clipping)"),
    ("frames", "frames_per_s", "frames/s"),
)


def main() -> None:
    # Files only, no display. Chosen here, not on import: a notebook that imports this
    # module keeps its own backend.
    matplotlib.use("Agg")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("runs", nargs="+", help="run dir or label=run_dir")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--title", default="")
    p.add_argument("--target", type=float, default=None, help="draw this return as a line")
    p.add_argument("--max-frames", type=float, default=None, help="cut every run at these frames")
    p.add_argument(
        "--returns-only", action="store_true", help="only return against frames and minutes"
    )
    args = p.parse_args()

    panels = PANELS[:2] if args.returns_only else PANELS
    fig, axes = plt.subplots(*((1, 2) if args.returns_only else (2, 4)))
    fig.set_size_inches((12, 4.2) if args.returns_only else (19, 8))
    for i, spec in enumerate(args.runs):
        label, _, path = spec.rpartition("=")
        label = label or Path(path).name
        df = read_metrics(metrics_path(path))
        if args.max_frames is not None:
            df = df[df["frames"] <= args.max_frames]
        for ax, (x, y, _) in zip(axes.flat, panels, strict=True):
            if y in df and df[y].notna().any():
                xs = df[x] / (1e6 if x == "frames" else 60.0)
                ax.plot(xs, df[y], label=label, lw=1.2, color=f"C{i}")  # same colour everywhere
    for ax, (x, y, title) in zip(axes.flat, panels, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("frames (millions)" if x == "frames" else "wall-clock (minutes)")
        ax.grid(alpha=0.3)
        if y == "episode_return" and args.target is not None:
            ax.axhline(args.target, color="gray", ls="--", lw=0.8)
    axes.flat[0].legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
