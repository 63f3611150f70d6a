"""The GPU check (scripts/gpu_check.sh, ``python -m benchmarks.gpu``) without a GPU: its
--dry-run passes on the CPU in under 2 minutes with a line for every stage, and its verdict can
FAIL (a low measurement, an unmeasured one, a crashed stage) with a non-zero exit."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
STAGES = ("preflight", "tests", "cartpole", "learner", "ring", "e2e")
# This checkout's impala_gpu and benchmarks, not another checkout an editable install points at
# (the script sets it too).
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
}


@pytest.fixture(scope="module")
def gpu():
    """benchmarks/gpu.py, imported from the repository root (pytest's ``pythonpath``)."""
    return importlib.import_module("benchmarks.gpu")


def verdicts(path: Path) -> dict[str, str]:
    """verdict.txt's lines by name: their result (the last column)."""
    lines = [x.split() for x in path.read_text().splitlines() if x and not x.startswith("#")]
    return {x[0]: x[-1] for x in lines}


# ------------------------------------------------------------------------------------ verdict
def test_a_low_busy_fraction_fails_and_exits_nonzero(gpu, tmp_path):
    path = tmp_path / "verdict.txt"
    checks = [
        gpu.Check("ring.fp32.learner_busy", 0.42, gpu.RING_BUSY_MIN),
        gpu.Check("e2e.heavy.learner_busy", 0.97, gpu.HEAVY_BUSY_MIN),
    ]
    assert gpu.record(checks, path, dry_run=False) == 1
    got = verdicts(path)
    assert got == {"ring.fp32.learner_busy": "FAIL", "e2e.heavy.learner_busy": "PASS"}
    assert "0.42" in path.read_text() and ">= 0.9" in path.read_text()


@pytest.mark.parametrize("value", [None, math.nan])
def test_an_unmeasured_value_fails(gpu, tmp_path, value):
    check = gpu.Check("e2e.heavy.gpu_util_nvml", value, gpu.HEAVY_GPU_UTIL_MIN)
    assert check.result(dry_run=False) == "FAIL"
    assert gpu.record([check], tmp_path / "v.txt", dry_run=False) == 1


def test_a_dry_run_reports_speed_unjudged_but_judges_the_rest(gpu, tmp_path):
    speed = gpu.Check("learner.fp32.gpu_kernel_frac", 0.01, gpu.KERNEL_FRAC_MIN)
    ran = gpu.Check("cartpole.dry_run_lines_logged", 0.0, 1, gpu_only=False)
    assert speed.result(dry_run=True) == "DRY-RUN"
    assert ran.result(dry_run=True) == "FAIL"
    assert gpu.record([speed], tmp_path / "v.txt", dry_run=True) == 0


def test_kernel_time_is_the_union_of_device_spans_without_annotations(gpu):
    assert gpu.union_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert gpu.union_us([]) == 0

    def event(name, device, start, end, annotation=False):
        return SimpleNamespace(
            name=name,
            device_type=f"DeviceType.{device}",
            is_user_annotation=annotation,
            time_range=SimpleNamespace(start=start, end=end),
        )

    events = [
        event("aten::mm", "CPU", 0, 50),
        event("Optimizer.step#Adam.step", "CPU", 60, 100),
        event("ampere_sgemm", "CUDA", 10, 20),
        event("Optimizer.step#Adam.step", "CUDA", 61, 99),  # a GPU annotation, older torch
        event("multi_tensor_apply_kernel", "CUDA", 70, 75),
        event("gpu_user_annotation", "CUDA", 0, 200, annotation=True),
    ]
    assert gpu.device_spans(events) == [(10, 20), (70, 75)]


def test_the_heavy_variant_is_learner_bound_by_its_epochs(gpu):
    # Learner alone 60K steps/s at 2 epochs; raw env 20K, so actors deliver 10K: 24 epochs
    # leave the learner 5K, half of that.
    assert gpu.heavy_epochs(60_000, 20_000, 2, 32) == 24
    assert gpu.heavy_epochs(5_000, 20_000, 2, 32) == 4  # at least twice the recipe's
    assert gpu.heavy_epochs(1e7, 20_000, 2, 32) == 32
    assert gpu.heavy_epochs(math.nan, 20_000, 2, 32) == 8


def test_gpu_py_exits_nonzero_when_a_judged_threshold_fails(tmp_path):
    """--judge on a CPU: no CUDA device is a FAIL line and exit code 1."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--dry-run", "--judge", "--stages", "preflight"]
        + ["--out", str(tmp_path), "--verdict", str(tmp_path / "verdict.txt")],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = verdicts(tmp_path / "verdict.txt")
    assert got["preflight.cuda_available"] == "FAIL"
    assert got["preflight.shm_free_over_ring"] == "PASS"


def test_a_broken_python_fails_every_stage_of_the_script(tmp_path):
    env = {**ENV, "OUT": str(tmp_path), "PY": "false"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = verdicts(tmp_path / "verdict.txt")
    assert all(got[f"stage.{s}"] == "FAIL" for s in STAGES), got
    assert got["preflight.imports"] == got["overall"] == "FAIL"


# ------------------------------------------------------------------------------------ dry run
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dry_run_passes_every_stage_on_the_cpu_in_under_two_minutes(tmp_path):
    env = {**ENV, "OUT": str(tmp_path), "PY": sys.executable}
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=170
    )
    seconds = time.monotonic() - t0
    text = (tmp_path / "verdict.txt").read_text()
    assert proc.returncode == 0, text + proc.stdout[-4000:] + proc.stderr[-4000:]
    assert seconds < 120, f"dry run took {seconds:.0f} s"
    assert text.startswith("# gpu_check DRY RUN"), text
    got = verdicts(tmp_path / "verdict.txt")
    assert "FAIL" not in got.values(), text
    assert all(got[f"stage.{s}"] == "PASS" for s in STAGES), text
    assert got["cartpole.dry_run_lines_logged"] == got["overall"] == "PASS"
    for name in ("learner.bf16.gpu_kernel_frac", "ring.fp32.learner_busy"):
        assert got[name] == "DRY-RUN", text  # measured and shown, not judged on a CPU
    assert {"e2e.free.actor_ratio_to_raw", "e2e.heavy.gpu_util_nvml"} <= got.keys()
