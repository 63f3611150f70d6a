"""Summarise a finished sweep (the figures quoted in docs/results/ come from here):

    python -m benchmarks.sweep_report sweeps/compare_cartpole --threshold 475
    python -m benchmarks.sweep_report sweeps/lag_cartpole
    python -m benchmarks.sweep_report sweeps/compare_cartpole --threshold 475 --by compare_cell

Prints the per-group table (frames/s, learner busy, mean policy lag, final return, frames and
wall-clock seconds to the threshold) and the generated conclusion; writes JSON.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from benchmarks.common import write_result
from impala_gpu.analysis import conclusion, load_sweep, overrides, summary_table
from impala_gpu.sweep import failed_points


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("sweep_dir")
    ap.add_argument("--threshold", type=float, default=None)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument(
        "--by",
        default=None,
        help="group by this swept override (from the run dirs' names); default: "
        "analysis.summary_keys, the swept keys that tell the runs apart",
    )
    args = ap.parse_args()
    df = load_sweep(args.sweep_dir)
    if args.by and args.by not in df.columns:  # load_sweep has a column per swept key already
        df[args.by] = [overrides(run).get(args.by) for run in df["run"]]
    table = summary_table(df, threshold=args.threshold, by=[args.by] if args.by else None)
    text = conclusion(table, threshold=args.threshold)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string())
    print(text)
    final = df.sort_values("frames").groupby("run").tail(1)
    result = {
        "sweep_dir": args.sweep_dir,
        "threshold": args.threshold,
        "table": table.to_dict(orient="records"),
        "per_run_final": final[
            ["run", "algo", "seed", "frames", "elapsed_s", "episode_return"]
        ].to_dict(orient="records"),
        "failed": failed_points(args.sweep_dir),
        "conclusion": text,
    }
    path = write_result(f"sweep_{Path(args.sweep_dir).name}", result, args.out)
    print(f"({path})")


if __name__ == "__main__":
    main()
