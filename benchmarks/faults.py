"""Fault tolerance under load: Pong throughput with an actor SIGKILLed every N seconds against a
clean run of the same length, and the time from each kill until the replacement's first
unroll is in the ring.

    python -m benchmarks.faults --seconds 90 --kill-every 30
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import cli_command, median, steady_windows, write_result
from impala_gpu.acting.children import actor_pids


def run(seconds: float, kill_every: float, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = cli_command(
            tmp,
            f"max_seconds={seconds}",
            "log_interval_s=5",
            "total_frames=10_000_000_000",
            *overrides,
        )
        proc = subprocess.Popen(cmd)
        kills = []
        metrics_path = Path(tmp) / "metrics.jsonl"
        while not metrics_path.exists() and proc.poll() is None:
            time.sleep(0.1)
        next_kill = time.monotonic() + kill_every if kill_every > 0 else float("inf")
        while proc.poll() is None:
            if time.monotonic() >= next_kill:
                pids = actor_pids(proc.pid)
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    kills.append(time.time())
                next_kill += kill_every
            time.sleep(0.05)
        metrics = [json.loads(x) for x in metrics_path.read_text().splitlines()]
        ev_path = Path(tmp) / "events.jsonl"
        events = (
            [json.loads(x) for x in ev_path.read_text().splitlines()] if ev_path.exists() else []
        )
    ready = [e for e in events if e["event"] == "actor_ready"]
    replaced = [e for e in events if e["event"] == "actor_replaced"]
    # kill -> detected and respawned (replaced) -> the new actor's first unroll (ready)
    kill_to_ready = [r["time"] - k for k, r in zip(kills, ready, strict=False)]
    kill_to_replaced = [r["time"] - k for k, r in zip(kills, replaced, strict=False)]
    body = steady_windows(metrics)
    return {
        "kills": len(kills),
        "replacements": len(replaced),
        "kill_to_replaced_s": kill_to_replaced,
        "kill_to_ready_s": kill_to_ready,
        "frames_per_s": metrics[-1]["frames"] / metrics[-1]["elapsed_s"],
        "frames_per_s_median_window": median([m["frames_per_s"] for m in body]),
        "frames_total": metrics[-1]["frames"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--kill-every", type=float, default=30)
    ap.add_argument("--out", default="bench_out")
    args, overrides = ap.parse_known_args()
    clean = run(args.seconds, 0, overrides)
    faulty = run(args.seconds, args.kill_every, overrides)
    result = {
        "overrides": overrides,
        "clean": clean,
        "faulty": faulty,
        "throughput_ratio": faulty["frames_per_s"] / clean["frames_per_s"],
    }
    path = write_result("faults", result, args.out)
    print(
        f"faults: {faulty['kills']} kills, {faulty['replacements']} replacements; kill->replaced "
        f"median {median(faulty['kill_to_replaced_s']):.2f} s, kill->first new unroll median "
        f"{median(faulty['kill_to_ready_s']):.2f} s; throughput {faulty['frames_per_s']:,.0f} vs "
        f"clean {clean['frames_per_s']:,.0f} frames/s "
        f"(ratio {result['throughput_ratio']:.3f})  ({path})"
    )


if __name__ == "__main__":
    main()
