"""Where a run's cores go: the CPU time of every thread of the CLI and its child processes
(actors, learner ranks), read from Linux's ``/proc`` over a steady window of a real run.

    python -m benchmarks.thread_cpu --warmup 20 --window 20 \\
        experiment=compare_pong compare_cell=impala envs_per_actor=32 precision=fp32

Prints, per process and thread, the cores it kept busy over the window (CPU seconds per
second) and its context switches per second, voluntary (it waited) and not (the OS took its
core). Writes them to ``bench_out/<name>.json``. Overrides after the flags go to the CLI.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import cli_command, write_result

TICKS = os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def thread_times(pids: list[int]) -> dict[tuple[int, int], dict]:
    """``(pid, tid)`` -> name, CPU seconds (user + system), voluntary and forced switches."""
    out = {}
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                name = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = dict(
                    line.split(":", 1) for line in (task / "status").read_text().splitlines()
                )
            except OSError:
                continue
            out[(pid, int(task.name))] = {
                "name": name,
                "cpu_s": (int(fields[11]) + int(fields[12])) / TICKS,  # utime, stime
                "voluntary": int(status["voluntary_ctxt_switches"]),
                "forced": int(status["nonvoluntary_ctxt_switches"]),
            }
    return out


def sample(root: int, window: float) -> list[dict]:
    """Every thread that ran during ``window`` seconds, busiest first."""
    before = thread_times(descendants(root))
    t0 = time.perf_counter()
    time.sleep(window)
    after = thread_times(descendants(root))
    seconds = time.perf_counter() - t0
    rows = []
    for key, now in after.items():
        then = before.get(key)
        if then is None:
            continue
        cores = (now["cpu_s"] - then["cpu_s"]) / seconds
        rows.append(
            {
                "process": "cli" if key[0] == root else f"child {key[0]}",
                "pid": key[0],
                "tid": key[1],
                "thread": now["name"],
                "cores": cores,
                "voluntary_per_s": (now["voluntary"] - then["voluntary"]) / seconds,
                "forced_per_s": (now["forced"] - then["forced"]) / seconds,
            }
        )
    return sorted(rows, key=lambda r: -r["cores"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds before the window")
    ap.add_argument("--window", type=float, default=20.0, help="seconds sampled")
    ap.add_argument("--name", default="thread_cpu")
    ap.add_argument("--out", default="bench_out")
    args, overrides = ap.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        limit = f"max_seconds={args.warmup + args.window + 15:.0f}"
        cli = subprocess.Popen(cli_command(Path(tmp) / "run", limit, *overrides))
        try:
            time.sleep(args.warmup)
            if cli.poll() is not None:
                raise SystemExit(f"the run ended during the warm-up (exit {cli.returncode})")
            rows = sample(cli.pid, args.window)
        finally:
            cli.terminate()  # SIGTERM: the CLI stops as on Ctrl-C and cleans up
            cli.wait(timeout=120)
    shown = [r for r in rows if r["cores"] >= 0.005]
    for r in shown:
        print(
            f"{r['process']:>12} {r['thread']:<16} {r['cores']:6.3f} cores  "
            f"switches/s: {r['voluntary_per_s']:7.0f} waited {r['forced_per_s']:6.0f} forced"
        )
    print(f"total: {sum(r['cores'] for r in rows):.3f} cores")
    setup = {"overrides": overrides, "warmup_s": args.warmup, "window_s": args.window}
    path = write_result(args.name, {**setup, "threads": shown}, args.out)
    print(path)


if __name__ == "__main__":
    main()
