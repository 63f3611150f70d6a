"""End-to-end throughput: real actors, real ring, real learner, for a fixed wall-clock time.

    python -m benchmarks.throughput                              # Pong, shallow, defaults, 60 s
    python -m benchmarks.throughput --seconds 90 model=resnet    # any Hydra override after flags

Reports medians over the steady log windows (the first window, with process start-up and
warm-up, is dropped): agent steps/s, frames/s (frames = agent steps x frameskip 4), learner
busy/wait/overhead, actor idle, policy lag; and, from ``/proc/stat`` over the same steady span, how
many of the machine's cores were busy (so CPU-ms per 1,000 frames) and the hypervisor's steal (run
on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import cli_command, median, steady_windows, write_result

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
        with CpuSampler() as cpu:
            subprocess.run(cmd, check=True)
        metrics = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    body = steady_windows(metrics)
    result = {k: median([m[k] for m in body if m.get(k) is not None]) for k in KEYS}
    result |= {"windows": len(body), "frames_total": metrics[-1]["frames"]}
    # A window's line is written at its end, window_s after the window began.
    result |= cpu.usage(body[0]["time"] - body[0]["window_s"], body[-1]["time"])
    # What a frame costs in CPU time, busy-waiting included: comparable across algorithms.
    result["cpu_ms_per_kframe"] = 1e6 * result["cores_busy"] / result["frames_per_s"]
    return result


class CpuSampler:
    """The machine's CPU time (``/proc/stat``) once a second while a run goes on, so that its
    steady windows can be told apart from start-up: how many cores were busy then, and what
    share the hypervisor took (steal: another guest ran on our cores, the run's figures are
    noisier)."""

    def __enter__(self) -> CpuSampler:
        self.samples: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            self.samples.append((time.time(), *proc_stat()))
            if self._stop.wait(1.0):
                return

    def usage(self, start: float, end: float) -> dict[str, float]:
        """Busy cores and steal fraction between wall-clock times ``start`` and ``end``."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {"cores_busy": float("nan"), "steal": float("nan")}
        (_, busy0, steal0, total0), (_, busy1, steal1, total1) = inside[0], inside[-1]
        total = max(total1 - total0, 1.0)
        return {
            "cores_busy": (busy1 - busy0) / total * (os.cpu_count() or 1),
            "steal": (steal1 - steal0) / total,
        }


def proc_stat() -> tuple[float, float, float]:
    """All cores' busy, steal and total jiffies from ``/proc/stat`` (NaN where there is none)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return float("nan"), float("nan"), float("nan")
    idle = fields[3] + fields[4]  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0.0
    total = sum(fields[:8])
    return total - idle - steal, steal, total


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
        f"overhead {result['learner_overhead']:.1%}; lag {result['policy_lag_mean']:.2f}; "
        f"{result['cores_busy']:.2f} cores busy ({result['cpu_ms_per_kframe']:.0f} CPU-ms per 1K "
        f"frames), steal {result['steal']:.1%}  ({path})"
    )


if __name__ == "__main__":
    main()
