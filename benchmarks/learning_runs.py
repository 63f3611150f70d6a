"""Learning runs of named cells, at most ``--parallel`` at a time, each in its own run dir.

    python -m benchmarks.learning_runs --out runs/lag_pong --parallel 2 \\
        --cell "K16_s1=bounded_lag=16 seed=1" --cell "K1_s1=bounded_lag=1 seed=1" \\
        precision=bf16 total_frames=6000000 algo.lr_decay_frames=10000000

Each cell is ``python -m impala_gpu run_dir=OUT/NAME <common overrides> <cell overrides>``, so a
cell's overrides win. A cell whose run reached its end (``finished``) is skipped;
one that holds a checkpoint is resumed, so a stopped sweep continues where it was. Runs with
``bounded_lag`` see the same data whatever the wall-clock, so running two side by side changes
only their minutes, never their frames. SIGTERM or Ctrl-C stops every run the way the CLI stops
on its own: each writes its checkpoint and metrics.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def parse_cell(text: str) -> tuple[str, list[str]]:
    name, sep, overrides = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--cell {text!r}: write NAME=OVERRIDES, e.g. K16=bounded_lag=16 seed=1")
    return name, overrides.split()


def finished(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` got to its end: its last metrics line reached
    ``total_frames`` or ``target_return``. (``model.pt`` does not say so: a run stopped by
    SIGTERM writes it too.)"""
    metrics, config = run_dir / "metrics.jsonl", run_dir / "config.yaml"
    if not (metrics.exists() and config.exists()):
        return False
    lines = metrics.read_text().splitlines()
    if not lines:
        return False
    last, cfg = json.loads(lines[-1]), yaml.safe_load(config.read_text())
    target = cfg.get("target_return")
    reached = target is not None and (last.get("episode_return") or float("-inf")) >= target
    return reached or last.get("frames", 0) >= cfg["total_frames"]


def command(run_dir: Path, common: list[str], overrides: list[str]) -> list[str] | None:
    """The CLI call that starts or resumes the run in ``run_dir``; None when it has finished."""
    if finished(run_dir):
        return None
    if any((run_dir / "checkpoints").glob("*.pt")):
        return [sys.executable, "-m", "impala_gpu", f"resume={run_dir}"]
    return [sys.executable, "-m", "impala_gpu", f"run_dir={run_dir}", *common, *overrides]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cell", action="append", required=True, help="NAME=OVERRIDES")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--parallel", type=int, default=1)
    args, common = ap.parse_known_args()
    pending = [parse_cell(c) for c in args.cell]
    args.out.mkdir(parents=True, exist_ok=True)
    running: list[subprocess.Popen] = []
    stopping = False

    def stop(signum, frame):  # noqa: ARG001
        nonlocal stopping
        stopping = True
        for p in running:
            p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while (pending and not stopping) or running:
        running = [p for p in running if p.poll() is None]
        while pending and not stopping and len(running) < args.parallel:
            name, overrides = pending.pop(0)
            cmd = command(args.out / name, common, overrides)
            if cmd is None:
                print(f"{name}: finished already", flush=True)
                continue
            print(f"{name}: {' '.join(cmd)}", flush=True)
            log = open(args.out / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
            running.append(subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
        time.sleep(2)


if __name__ == "__main__":
    main()
