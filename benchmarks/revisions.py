"""Throughput of two revisions of impala_gpu, side by side: runs alternate between a worktree of
``--base`` and this checkout (ABBA order per round), so both see the same machine drift.

    python -m benchmarks.revisions --base main~3 --seconds 60 --rounds 3 --precisions fp32,bf16
    python -m benchmarks.revisions --base v1 experiment=pong_impala    # extra Hydra overrides

Writes one JSON with every run and, per precision, the median frames/s of each revision and
the ratio (this checkout / base). Uses ``benchmarks/throughput.py`` of each revision.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import write_result

REPO = Path(__file__).resolve().parents[1]


def one_run(tree: Path, seconds: float, overrides: list[str]) -> float:
    """frames/s of one ``throughput.py`` run of the package in ``tree``."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, PYTHONPATH=str(tree))
        cmd = [sys.executable, "-m", "benchmarks.throughput", f"--seconds={seconds}", "--out", out]
        subprocess.run([*cmd, "--name", "run", *overrides], cwd=tree, env=env, check=True)
        return json.loads((Path(out) / "run.json").read_text())["frames_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--name", default="revisions")
    ap.add_argument("--out", default="bench_out")
    args, overrides = ap.parse_known_args()
    base_tree = Path(tempfile.mkdtemp(prefix="impala_base_"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=REPO, check=True
    )
    trees = {"base": base_tree, "head": REPO}
    runs: list[dict] = []
    try:
        for precision in args.precisions.split(","):
            for r in range(args.rounds):
                order = ("base", "head") if r % 2 == 0 else ("head", "base")
                for which in order:
                    fps = one_run(
                        trees[which], args.seconds, [f"precision={precision}", *overrides]
                    )
                    runs.append(
                        {"precision": precision, "round": r, "rev": which, "frames_per_s": fps}
                    )
                    print(f"{precision} round {r} {which}: {fps:,.0f} frames/s", flush=True)
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, check=False
        )
    summary = {}
    for precision in args.precisions.split(","):
        med = {
            rev: statistics.median(
                x["frames_per_s"] for x in runs if x["precision"] == precision and x["rev"] == rev
            )
            for rev in trees
        }
        summary[precision] = {**med, "ratio": med["head"] / med["base"]}
        print(
            f"{precision}: base {med['base']:,.0f}, head {med['head']:,.0f} frames/s, "
            f"ratio {summary[precision]['ratio']:.3f}"
        )
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    result = {
        "base": args.base,
        "head": head,
        "seconds": args.seconds,
        "overrides": overrides,
        "runs": runs,
        "summary": summary,
    }
    print(write_result(args.name, result, args.out))


if __name__ == "__main__":
    main()
