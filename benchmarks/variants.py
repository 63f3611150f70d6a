"""Throughput of config variants of this checkout, side by side: each round runs every variant
once (``benchmarks/throughput.py``), in an order rotated per round, so all see the same machine
drift. The first variant is the reference of the ratios.

    python -m benchmarks.variants --seconds 60 --rounds 3 \\
        --variant "elu=" --variant "relu=model.activation=relu" precision=fp32
    python -m benchmarks.variants --variant "impala=" \\
        --variant "a3c=experiment=compare_pong compare_cell=a3c" precision=fp32

``--variant NAME=OVERRIDES`` (space-separated Hydra overrides, empty for none); overrides after
the flags go to every variant. Writes one JSON with every run and, per variant, the median
frames/s, learner busy, cores kept busy, CPU-ms per 1K frames, steal and the ratio to the first
variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import rotated, write_result

REPO = Path(__file__).resolve().parents[1]
SUMMARISED = ("frames_per_s", "learner_busy", "cores_busy", "cpu_ms_per_kframe", "steal")
KEPT = (*SUMMARISED, "policy_lag_mean")


def one_run(seconds: float, overrides: list[str]) -> dict:
    """``throughput.py``'s result for one run with ``overrides``."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "benchmarks.throughput", f"--seconds={seconds}", "--out", out]
        subprocess.run([*cmd, "--name", "run", *overrides], cwd=REPO, check=True)
        return json.loads((Path(out) / "run.json").read_text())


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, sep, overrides = text.partition("=")
    if not sep or not name:
        raise SystemExit(
            f"--variant {text!r}: write NAME=OVERRIDES, e.g. relu=model.activation=relu"
        )
    return name, overrides.split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=OVERRIDES")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="variants")
    ap.add_argument("--out", default="bench_out")
    args, common = ap.parse_known_args()
    variants = dict(parse_variant(v) for v in args.variant)
    names = list(variants)
    runs: list[dict] = []
    for r in range(args.rounds):
        for name in rotated(names, r):
            res = one_run(args.seconds, [*common, *variants[name]])
            keep = {k: res.get(k) for k in KEPT}
            runs.append({"round": r, "variant": name, **keep})
            print(f"round {r} {name}: {res['frames_per_s']:,.0f} frames/s", flush=True)
    summary = {}
    for name in names:
        mine = [x for x in runs if x["variant"] == name]
        # A figure a run did not report (None) counts as 0.
        summary[name] = {k: statistics.median(x[k] or 0.0 for x in mine) for k in SUMMARISED}
    ref = summary[names[0]]["frames_per_s"]
    for name in names:
        summary[name]["ratio"] = summary[name]["frames_per_s"] / ref
        s = summary[name]
        print(
            f"{name}: {s['frames_per_s']:,.0f} frames/s, busy {s['learner_busy']:.0%}, "
            f"{s['cores_busy']:.2f} cores busy, {s['cpu_ms_per_kframe']:.0f} CPU-ms/1K frames, "
            f"steal {s['steal']:.1%}, "
            f"ratio {s['ratio']:.3f}"
        )
    result = {
        "variants": variants,
        "common": common,
        "seconds": args.seconds,
        "runs": runs,
        "summary": summary,
    }
    print(write_result(args.name, result, args.out))


if __name__ == "__main__":
    main()
