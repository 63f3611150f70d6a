"""End-to-end throughput: real actors, real ring, real learner, for a fixed wall-clock time.

    python benchmarks/throughput.py                              # Pong, shallow, defaults, 60 s
    python benchmarks/throughput.py --seconds 90 model=resnet    # any Hydra override after flags

Reports medians over the steady log windows (the first window, with process start-up and
warm-up, is dropped): agent steps/s, frames/s (frames = agent steps x frameskip 4), learner
busy/wait/overhead, actor idle, policy lag.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cli_command, median, steady_windows, write_result  # noqa: E402

KEYS = (
    "agent_steps_per_s",
    "frames_per_s",
    "updates_per_s",
    "learner_busy",
    "learner_wait",
    "learner_overhead",
    "actor_steps_per_s",
    "actor_idle",
    "ring_occupancy",
    "policy_lag_mean",
    "policy_lag_p95",
    "gpu_busy",
)


def run(seconds: float, overrides: list[str], log_interval: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = cli_command(
            tmp,
            f"max_seconds={seconds}",
            f"log_interval_s={log_interval}",
            "total_frames=10_000_000_000",
            *overrides,
        )
        subprocess.run(cmd, check=True)
        metrics = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    body = steady_windows(metrics)
    return {k: median([m[k] for m in body if m.get(k) is not None]) for k in KEYS} | {
        "windows": len(body),
        "frames_total": metrics[-1]["frames"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--log-interval", type=float, default=5)
    ap.add_argument("--name", default=None, help="result file name (default from overrides)")
    ap.add_argument("--out", default="bench_out")
    args, overrides = ap.parse_known_args()
    result = run(args.seconds, overrides, args.log_interval)
    name = args.name or "throughput_" + (
        "_".join(o.replace("=", "-") for o in overrides) or "default"
    )
    path = write_result(name, {"overrides": overrides, "seconds": args.seconds, **result}, args.out)
    print(
        f"{name}: {result['agent_steps_per_s']:,.0f} agent steps/s = {result['frames_per_s']:,.0f} "
        f"frames/s; learner busy {result['learner_busy']:.0%} wait {result['learner_wait']:.0%} "
        f"overhead {result['learner_overhead']:.1%}; lag {result['policy_lag_mean']:.2f}  ({path})"
    )


if __name__ == "__main__":
    main()
