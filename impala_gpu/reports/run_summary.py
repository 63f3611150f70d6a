"""One table row per run: where it got to, and how healthy its network was at the end.

    python -m impala_gpu.reports.run_summary runs/abl/A_a2clike runs/abl/C_tf_ortho [--last 10]

Return, entropy and the health metrics are medians over the last ``--last`` metric lines (the
health sample is a few hundred states per line, so single lines are noisy). Also prints the
frames and wall-clock at which the mean return first reached each ``--thresholds`` value.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from impala_gpu.analysis import (
    frames_to_threshold,
    metrics_path,
    read_metrics,
    seconds_to_threshold,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--last", type=int, default=10)
    p.add_argument("--thresholds", default="-15,0,10,18")
    p.add_argument(
        "--at", default="", help="also: return and logit spread at these frames, e.g. 1e6,3e6"
    )
    args = p.parse_args()
    thresholds = [float(t) for t in args.thresholds.split(",")]
    cols = ["episode_return", "entropy", "dead/conv1", "dead/fc", "logit_spread", "frames_per_s"]
    print(
        "| run | frames | " + " | ".join(cols) + " | " + " | ".join(f"to {t:g}" for t in thresholds)
    )
    for run in args.runs:
        df = read_metrics(metrics_path(run))
        tail = df.tail(args.last)
        cells = [
            f"{tail[c].median():.3g}" if c in tail and tail[c].notna().any() else "-" for c in cols
        ]
        reach = []
        for t in thresholds:
            f, s = frames_to_threshold(df, t), seconds_to_threshold(df, t)
            reach.append("not reached" if f != f else f"{f / 1e6:.1f}M frames, {s / 60:.0f} min")
        frames = df["frames"].iloc[-1] / 1e6
        print(f"| {Path(run).name} | {frames:.2f}M | " + " | ".join(cells + reach) + " |")
        for at in [float(x) for x in args.at.split(",") if x]:
            near = df.iloc[(df["frames"] - at).abs().argsort()[: args.last]]
            if (near["frames"] - at).abs().min() > 0.1 * at:
                continue
            spread = near["logit_spread"].median() if "logit_spread" in near else float("nan")
            print(
                f"    at {at / 1e6:.1f}M frames: return {near['episode_return'].median():.2f}, "
                f"logit spread {spread:.3f}"
            )


if __name__ == "__main__":
    main()
