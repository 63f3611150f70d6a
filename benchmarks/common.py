"""Shared bits of the benchmark scripts: machine description, JSON output, medians."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from impala_gpu.calibration import cpu_model


def machine() -> dict[str, Any]:
    info = {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d"),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }
    try:
        info["git"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        pass
    return info


def cli_command(run_dir: str | Path, *overrides: str) -> list[str]:
    """``python -m impala_gpu`` into ``run_dir``, W&B and the progress line off; later
    overrides win."""
    base = [sys.executable, "-m", "impala_gpu", f"run_dir={run_dir}"]
    return [*base, "wandb.mode=disabled", "progress=false", *overrides]


def write_result(name: str, result: dict[str, Any], out_dir: str | Path = "bench_out") -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **result}, indent=2))
    return path


def rotated(names: list[str], round_: int) -> list[str]:
    """``names`` in round ``round_``'s order: each round starts one later, so every variant
    runs first, last and in between as the machine drifts."""
    k = round_ % len(names)
    return names[k:] + names[:k]


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def steady_windows(metrics: list[dict[str, Any]], skip: int = 1) -> list[dict[str, Any]]:
    """Log windows after the warm-up ones (and without the short final one)."""
    body = metrics[skip:-1] if len(metrics) > skip + 1 else metrics[-1:]
    return body


@contextlib.contextmanager
def gpu_util(device: torch.device):
    """A list that fills with (time, nvidia-smi's utilization.gpu: the share of the sample period
    in which a kernel ran) every 200 ms while the block runs; stays empty without a GPU."""
    samples: list[tuple[float, float]] = []
    exe = shutil.which("nvidia-smi")
    if not exe or device.type != "cuda":
        yield samples
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    index = visible[device.index or 0] if visible[0] else str(device.index or 0)
    query = ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"]
    proc = subprocess.Popen([exe, *query, "-i", index], stdout=subprocess.PIPE, text=True)

    def read() -> None:
        for line in proc.stdout:
            with contextlib.suppress(ValueError):  # "[N/A]" or a warning line
                samples.append((time.time(), float(line) / 100))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        thread.join(timeout=5)
