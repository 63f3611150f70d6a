"""CartPole-v1: frames and wall-clock seconds until the mean return of the last 100 episodes
reaches 475, per seed, on this machine.

    python -m benchmarks.cartpole_solve                        # experiment=cartpole_impala, 3 seeds
    python -m benchmarks.cartpole_solve --seeds 0 1 2 algo.learning_rate=1e-3
    python -m benchmarks.cartpole_solve --name cartpole_solve_bf16 precision=bf16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import cli_command, median, write_result


def solve(seed: int, threshold: float, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = cli_command(
            tmp, "experiment=cartpole_impala", f"seed={seed}", "log_interval_s=1", *overrides
        )
        subprocess.run(cmd, check=True)
        metrics = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    hit = next((m for m in metrics if (m.get("episode_return") or 0) >= threshold), None)
    return {
        "seed": seed,
        "solved": hit is not None,
        "frames_to_threshold": hit["frames"] if hit else None,
        "seconds_to_threshold": hit["elapsed_s"] if hit else None,
        "final_return": metrics[-1]["episode_return"],
        "frames_per_s": median(
            [m["frames_per_s"] for m in metrics[1:-1]] or [metrics[-1]["frames_per_s"]]
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threshold", type=float, default=475.0)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--name", default="cartpole_solve", help="result file name")
    args, overrides = ap.parse_known_args()
    runs = [solve(s, args.threshold, overrides) for s in args.seeds]
    solved = [r for r in runs if r["solved"]]
    result = {
        "overrides": overrides,
        "threshold": args.threshold,
        "runs": runs,
        "solved": f"{len(solved)}/{len(runs)}",
        "median_frames": median([r["frames_to_threshold"] for r in solved]),
        "median_seconds": median([r["seconds_to_threshold"] for r in solved]),
        "median_frames_per_s": median([r["frames_per_s"] for r in runs]),
    }
    path = write_result(args.name, result, args.out)
    print(
        f"{args.name}: solved {result['solved']}; median {result['median_frames']:,.0f} frames, "
        f"{result['median_seconds']:.1f} s to {args.threshold:g}; "
        f"{result['median_frames_per_s']:,.0f} frames/s  ({path})"
    )


if __name__ == "__main__":
    main()
