"""Scale-out against the single-box defaults, side by side (ABBA order per round, so both see
the same machine drift): throughput for a fixed time, and optionally CartPole solved.

    python -m benchmarks.scale_out --variant runtime=ray experiment=pong_impala
    python -m benchmarks.scale_out --variant learners=2 experiment=pong_impala
    python -m benchmarks.scale_out --variant runtime=ray --solve --seeds 0 1 2

``--variant`` takes the overrides that make the variant (comma-separated); the rest of the
command line is shared by both. Throughput: median frames/s per side and the ratio
(variant / baseline), with the learner's busy fraction, actor idle and policy lag. ``--solve``:
frames and seconds to a mean return of 475 on CartPole (experiment=cartpole_impala) per seed.
"""

from __future__ import annotations

import argparse

from benchmarks.cartpole_solve import solve
from benchmarks.common import median, write_result
from benchmarks.throughput import run

REPORTED = ("frames_per_s", "learner_busy", "actor_idle", "policy_lag_mean")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--variant", required=True, help="overrides of the variant, comma-separated")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--solve", action="store_true", help="CartPole to 475 instead of throughput")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", default="bench_out")
    args, shared = ap.parse_known_args()
    variant = [x for x in args.variant.split(",") if x]
    sides = {"baseline": shared, "variant": [*shared, *variant]}
    runs: dict[str, list[dict]] = {k: [] for k in sides}
    if args.solve:
        for seed in args.seeds:
            order = ("baseline", "variant") if seed % 2 == 0 else ("variant", "baseline")
            for side in order:
                runs[side].append(solve(seed, 475.0, [*sides[side], "target_return=475"]))
                print(side, runs[side][-1], flush=True)
        summary = {
            side: {
                key: median([r[key] for r in rs if r.get(key) is not None])
                for key in ("frames_to_threshold", "seconds_to_threshold", "frames_per_s")
            }
            for side, rs in runs.items()
        }
    else:
        for r in range(args.rounds):
            order = ("baseline", "variant", "variant", "baseline")
            for side in order if r % 2 == 0 else order[::-1]:
                runs[side].append(run(args.seconds, sides[side], 5.0))
                print(side, {k: runs[side][-1].get(k) for k in REPORTED}, flush=True)
        summary = {
            side: {k: median([x[k] for x in rs if x.get(k) is not None]) for k in REPORTED}
            for side, rs in runs.items()
        }
        summary["ratio_frames_per_s"] = (
            summary["variant"]["frames_per_s"] / summary["baseline"]["frames_per_s"]
        )
    print(summary)
    name = args.name or "scale_out_" + "_".join(v.replace("=", "") for v in variant)
    result = {"variant": variant, "shared": shared, "summary": summary, "runs": runs}
    print(write_result(name, result, args.out))


if __name__ == "__main__":
    main()
