"""The GPU check's measurements and verdict. ``scripts/gpu_check.sh`` runs one stage per process,
each under its own timeout; a stage adds what it measured to ``gpu.json`` and one line per
threshold to ``verdict.txt`` (name, value, threshold, PASS/FAIL), and exits 1 on any FAIL.

- preflight: torch, CUDA, the device; /dev/shm free against the e2e ring's size.
- cartpole: ``python -m impala_gpu experiment=cartpole_impala`` on the device until the mean
  return of 100 episodes reaches 475 (the experiment's goal), under a time cap.
- learner: the default recipe's learner alone (pong_impala: T=64, B=16, 2 epochs x 4
  minibatches, shallow, normalize_input) in fp32 and bf16 on one batch reused: updates/s over
  a steady window, and the device's kernel time in one torch.profiler window.
- ring: that learner fed by the shared-memory ring and the Batcher (feeders refill slots at
  memcpy speed), publishing its weights every update as the train loop does.
- e2e: the CLI with ``cores - 2`` actors at the recipe's ``bounded_lag: auto`` (an exact lag
  of as many updates as there are actors, the least at which none waits for the learner)
  against the raw vector env in as many processes; then a learner-heavy variant, GPU
  utilisation sampled from nvidia-smi.

``--dry-run``: every stage on the CPU at tiny sizes; speed thresholds are reported, not judged
(DRY-RUN), and CartPole passes when it ran and logged. ``--judge`` judges them anyway.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from benchmarks import actors as actors_bench
from benchmarks.common import cli_command, gpu_util, median, steady_windows, write_result
from benchmarks.learner_overhead import feed, stop_processes, synthetic_batch
from benchmarks.learner_step import compose_config
from benchmarks.throughput import KEYS
from impala_gpu.channels.params import ParamStore
from impala_gpu.channels.ring import SlotManager, TrajectoryRing, ring_spec
from impala_gpu.config import Config, EnvCfg, steps_per_update
from impala_gpu.envs import env_spec
from impala_gpu.learning.batcher import Batcher
from impala_gpu.learning.learner import build_learner
from impala_gpu.speed.threads import learner_threads

STAGES = ("preflight", "cartpole", "learner", "ring", "e2e")
LEARNER_CORES = 2  # the learner process: its train thread and the Batcher's gather thread
# ---- thresholds (see each's reason) -----------------------------------------------------------
SHM_MARGIN = 1.25  # /dev/shm free >= 1.25 x the e2e ring (docker's 64 MB default fails here)
CARTPOLE_TARGET = 475.0  # cartpole_impala's goal; 2 CPU cores reach it in 35-50 s
# Kernel time over wall while the learner alone updates: under half, the GPU waits on the host
# (launches, syncs) more than it computes, and the GPU buys the recipe little.
KERNEL_FRAC_MIN = 0.5
# Ring-fed learner busy over the whole window (busy_s / wall): the gather, slot frees and the
# weights published every update may cost it at most 10% (the feeders outrun it).
RING_BUSY_MIN = 0.90
# Actor steps/s over the raw vector env (random actions, same processes x envs). Actors alone
# (benchmarks/actors.py, slots handed straight back) reached 0.49-0.51 in fp32 and 0.60-0.62
# in bf16 on the CPUs measured so far, never 0.8: the e2e runs are bf16, and 0.5 leaves them
# ~20% for what the learner process and a full ring cost.
ACTOR_RAW_MIN = 0.5
# The learner-heavy run is learner-bound by construction (heavy_epochs): busy_s / wall below
# 0.9 there is the data path starving the learner; GPU utilisation as KERNEL_FRAC_MIN.
HEAVY_BUSY_MIN = 0.90
HEAVY_GPU_UTIL_MIN = 0.5


# ------------------------------------------------------------------------------------ verdict
@dataclass
class Check:
    name: str
    value: float | None  # None or NaN: not measured, a FAIL wherever it is judged
    minimum: float  # every threshold is a floor
    gpu_only: bool = True  # a speed threshold: a dry run on the CPU reports it, unjudged

    def result(self, dry_run: bool) -> str:
        if dry_run and self.gpu_only:
            return "DRY-RUN"
        v = self.value
        return "PASS" if v is not None and math.isfinite(v) and v >= self.minimum else "FAIL"


def verdict_line(name: str, value: str, threshold: str, result: str) -> str:
    """One verdict.txt line; scripts/gpu_check.sh writes its own in the same columns."""
    return f"{name:<34} {value:>14} {threshold:>16}  {result}"


def record(checks: list[Check], path: Path | None, dry_run: bool) -> int:
    """Print ``checks``' verdict lines (appended to ``path``); 1 if any FAILs, else 0."""
    lines, failed = [], False
    for c in checks:
        value = "n/a" if c.value is None or not math.isfinite(c.value) else f"{c.value:.4g}"
        result = c.result(dry_run)
        failed |= result == "FAIL"
        lines.append(verdict_line(c.name, value, f">= {c.minimum:g}", result))
    print("\n".join(lines), flush=True)
    if path is not None:
        with open(path, "a") as f:
            f.writelines(line + "\n" for line in lines)
    return int(failed)


# ------------------------------------------------------------------------------ measurements
def _update(learner, batch, cfg: Config) -> torch.Tensor:  # noqa: ARG001
    """One learner update, as the train loop makes it."""
    return learner.update(batch)


def timed_updates(learner, cfg, next_batch, after, sizes) -> dict[str, float]:
    """Untimed warm-up updates, then a steady window of at least ``sizes['updates']`` and
    ``sizes['min_s']`` seconds (cut at ``max_s``). Busy: in the update, its one stats sync
    included; wait: getting the batch; the rest (``after``: freeing it, publishing) neither."""
    for _ in range(sizes["warmup"]):
        k, b = next_batch()
        _update(learner, b, cfg).cpu()
        after(k)
    busy = wait = 0.0
    n, start = 0, time.perf_counter()
    while True:
        t0 = time.perf_counter()
        k, b = next_batch()
        t1 = time.perf_counter()
        stats = _update(learner, b, cfg).cpu()
        busy += time.perf_counter() - t1
        wait += t1 - t0
        after(k)
        n += 1
        elapsed = time.perf_counter() - start
        if (n >= sizes["updates"] and elapsed >= sizes["min_s"]) or elapsed >= sizes["max_s"]:
            break
    wall = time.perf_counter() - start
    r = dict(updates=n, seconds=wall, learner_busy=busy / wall, learner_wait=wait / wall)
    return r | dict(updates_per_s=n / wall, total_loss=float(stats[0]))


def union_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] spans: time with at least one of them running."""
    total, end = 0.0, -math.inf
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def device_spans(events) -> list[tuple[float, float]]:
    """The device-side spans (kernels, copies, memsets) among torch.profiler events. A GPU
    user annotation (a record_function range, e.g. the optimizer's step) spans the gaps
    between its kernels: left out by its flag, or by sharing its name with a host-side range."""
    host = {e.name for e in events if "CUDA" not in str(getattr(e, "device_type", ""))}
    return [
        (e.time_range.start, e.time_range.end)
        for e in events
        if "CUDA" in str(getattr(e, "device_type", ""))
        and not getattr(e, "is_user_annotation", False)
        and e.name not in host
    ]


def kernel_time(step: Callable[[], None], n: int, cuda: bool) -> dict[str, float]:
    """Device busy time per update from one torch.profiler window of ``n`` updates. Profiling
    slows the host's launches, so the window's own wall is not the denominator: the caller
    divides by the unprofiled steady window's seconds per update."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            step()
        if cuda:
            torch.cuda.synchronize()
    spans = device_spans(prof.events())
    busy = union_us(spans) / 1e6 / n if spans else float("nan")  # NaN: no device (CPU)
    return {"kernel_s_per_update": busy, "device_events": len(spans)}


def recipe(args, *overrides: str) -> Config:
    """The default command's config (experiment pong_impala), tiny in a dry run."""
    return compose_config([f"env.id={args.env}", *DRY_RECIPE * args.dry_run, *overrides])


DRY_RECIPE = ["unroll_length=8", "batch_size=4", "envs_per_actor=4", "algo.minibatches=1"]


# ------------------------------------------------------------------------------------ stages
def stage_preflight(args, device, out: dict, stages: dict) -> list[Check]:
    cuda = torch.cuda.is_available()
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=cuda)
    if cuda:
        p = torch.cuda.get_device_properties(0)
        out.update(device_name=p.name, capability=f"{p.major}.{p.minor}")
        out["memory_gib"] = p.total_memory / 2**30
    # The e2e ring: room for every env's unroll plus two batches (config.resolve_num_slots).
    cfg, actors = recipe(args), e2e_actors(args)
    spec = env_spec(cfg.env)
    slots = 2 * cfg.batch_size + 2 * actors * cfg.envs_per_actor
    step_bytes = math.prod(spec.obs_shape) * spec.obs_dtype.itemsize + 64 + 4 * spec.num_actions
    need = slots * (cfg.unroll_length + 1) * step_bytes / 2**30
    free = shutil.disk_usage("/dev/shm").free / 2**30
    out.update(shm_free_gib=free, e2e_ring_gib=need)
    print(f"gpu preflight: {json.dumps(out)}", flush=True)
    return [
        Check("preflight.cuda_available", float(cuda), 1),
        Check("preflight.shm_free_over_ring", free / need, SHM_MARGIN, gpu_only=False),
    ]


def stage_cartpole(args, device, out: dict, stages: dict) -> list[Check]:
    over = ["experiment=cartpole_impala", f"device={device}", "precision=fp32"]
    if args.dry_run:  # ran and logged: a thousand frames
        over += ["total_frames=1000", "num_actors=1", "envs_per_actor=4", "log_interval_s=1"]
    else:
        over += [f"target_return={CARTPOLE_TARGET}", f"max_seconds={args.cartpole_seconds}"]
        over += ["log_interval_s=2"]
    metrics = cli_metrics(over)
    returns = [r for m in metrics if isinstance(r := m.get("episode_return"), float) and r == r]
    out.update(overrides=over, lines=len(metrics), frames=metrics[-1]["frames"])
    out.update(best_return=max(returns, default=float("nan")), seconds=metrics[-1]["elapsed_s"])
    print(f"gpu cartpole: {json.dumps(out)}", flush=True)
    if args.dry_run:
        return [Check("cartpole.dry_run_lines_logged", float(len(metrics)), 1, False)]
    return [Check("cartpole.best_mean_return", out["best_return"], CARTPOLE_TARGET)]


def stage_learner(args, device, out: dict, stages: dict) -> list[Check]:
    out.update(fp32=learner_alone(args, device, "fp32"), bf16=learner_alone(args, device, "bf16"))
    k = "gpu_kernel_frac"
    return [Check(f"learner.{p}.{k}", out[p][k], KERNEL_FRAC_MIN) for p in ("fp32", "bf16")]


def learner_alone(args, device, precision: str) -> dict[str, float]:
    cuda, cfg = device.type == "cuda", recipe(args, f"precision={precision}")
    spec = env_spec(cfg.env)
    ring = TrajectoryRing(ring_spec(cfg, spec, 1), 1, mp.get_context("spawn"))
    try:  # the ring only lends its field shapes to the synthetic batch
        torch.manual_seed(0)
        learner = build_learner(cfg, spec, device)
        batch = synthetic_batch(ring, cfg.batch_size, device)
    finally:
        ring.close()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    r = timed_updates(learner, cfg, lambda: (0, batch), lambda k: None, args.sizes)
    try:  # without the profiler (no CUPTI?) the rates still count; the check FAILs unmeasured
        r |= kernel_time(lambda: _update(learner, batch, cfg).cpu(), args.sizes["profiled"], cuda)
    except Exception as e:
        traceback.print_exc()
        r |= {"kernel_s_per_update": float("nan"), "kernel_error": f"{type(e).__name__}: {e}"}
    r["gpu_kernel_frac"] = r["kernel_s_per_update"] * r["updates_per_s"]
    r["agent_steps_per_s"] = r["updates_per_s"] * steps_per_update(cfg)
    r["frames_per_s"] = r["agent_steps_per_s"] * spec.frames_per_step
    if cuda:
        r["gpu_mem_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(f"gpu learner {precision}: {json.dumps(r)}", flush=True)
    learner.close()
    return r


def stage_ring(args, device, out: dict, stages: dict) -> list[Check]:
    cfg = recipe(args, "precision=fp32")
    spec, ctx = env_spec(cfg.env), mp.get_context("spawn")
    feeders = 1 if args.dry_run else 4
    ring = TrajectoryRing(ring_spec(cfg, spec, 4 * cfg.batch_size), feeders, ctx)
    stop = ctx.Event()
    procs = [ctx.Process(target=feed, args=(ring, stop, i), daemon=True) for i in range(feeders)]
    batcher = None
    try:
        for p in procs:
            p.start()
        torch.manual_seed(0)
        learner = build_learner(cfg, spec, device)
        store = ParamStore.for_model(learner.model)
        version = [0]
        batcher = Batcher(ring, SlotManager(ring), cfg.batch_size, device, lambda: version[0])
        batcher.start()

        def next_batch():
            got = batcher.get(timeout=30)
            if got is None:
                raise TimeoutError("no batch from the ring in 30 s (feeders stalled?)")
            return got

        def after(k: int) -> None:  # as the train loop: free the buffer, publish the weights
            batcher.done(k)
            version[0] += 1
            store.publish(learner.model, version[0])

        r = timed_updates(learner, cfg, next_batch, after, args.sizes) | {"feeders": feeders}
        alone = stages.get("learner", {}).get("fp32", {}).get("updates_per_s")
        r["ratio_to_learner_alone"] = r["updates_per_s"] / alone if alone else float("nan")
        out["fp32"] = r
        print(f"gpu ring fp32: {json.dumps(r)}", flush=True)
        learner.close()
    finally:
        stop.set()
        if batcher is not None:
            batcher.stop()
        stop_processes(procs)
        ring.close()
    return [Check("ring.fp32.learner_busy", r["learner_busy"], RING_BUSY_MIN)]


def e2e_actors(args) -> int:
    return args.actors or max(1, (os.cpu_count() or 1) - LEARNER_CORES)


def heavy_epochs(learner_steps_per_s: float, raw: float, epochs: int, cap: int) -> int:
    """The recipe's sample reuse (algo.epochs) raised until the learner alone could take at most
    half of what the actors deliver (ACTOR_RAW_MIN x the raw env's steps/s): learner-bound
    whatever the GPU. At least twice the recipe's."""
    supply = ACTOR_RAW_MIN * raw
    if not (learner_steps_per_s > 0 and supply > 0):
        return min(cap, 4 * epochs)
    return min(cap, max(2 * epochs, math.ceil(epochs * learner_steps_per_s / (supply / 2))))


def stage_e2e(args, device, out: dict, stages: dict) -> list[Check]:
    actors, cfg = e2e_actors(args), recipe(args)
    E = cfg.envs_per_actor
    raw_cfg = Config(env=EnvCfg(id=args.env), num_actors=actors, envs_per_actor=E)
    raw = actors_bench.run_raw(mp.get_context("spawn"), raw_cfg, args.sizes["raw_s"])
    out.update(actors=actors, envs_per_actor=E, raw_steps_per_s=raw)
    print(f"gpu e2e: raw vector env {raw:,.0f} steps/s ({actors} x {E} envs)", flush=True)
    base = [f"device={device}", f"env.id={args.env}", "precision=bf16"]
    base += [f"num_actors={actors}", *DRY_RECIPE * args.dry_run]
    base += ["total_frames=256"] * args.dry_run  # a dry run: two updates (e2e_s caps it)
    alone = stages.get("learner", {}).get("bf16", {}).get("agent_steps_per_s", float("nan"))
    epochs = heavy_epochs(alone, raw, cfg.algo.epochs, 4 if args.dry_run else 32)
    runs = {"free": base, "heavy": [*base, f"algo.epochs={epochs}"]}
    for name, over in runs.items():
        with gpu_util(device) as util:
            metrics = cli_metrics([*over, *args.e2e_overrides], args.sizes, util)
        r = metrics[-1] | {"overrides": over}
        r["actor_ratio_to_raw"] = r["actor_steps_per_s"] / raw
        out[name] = r
        print(f"gpu e2e {name}: {json.dumps(r)}", flush=True)
    heavy = out["heavy"]
    return [
        Check("e2e.free.actor_ratio_to_raw", out["free"]["actor_ratio_to_raw"], ACTOR_RAW_MIN),
        Check("e2e.heavy.learner_busy", heavy["learner_busy_span"], HEAVY_BUSY_MIN),
        Check("e2e.heavy.gpu_util_nvml", heavy["gpu_util"], HEAVY_GPU_UTIL_MIN),
    ]


# ------------------------------------------------------------------------ runs of the CLI
def cli_metrics(overrides, sizes: dict | None = None, util: list | None = None) -> list[dict]:
    """``python -m impala_gpu`` in a scratch run dir; its metric lines, and with ``sizes`` (a
    run of ``sizes['e2e_s']``) one more: its steady windows' medians and mean GPU utilisation
    (from ``util``'s samples)."""
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        over = [f"max_seconds={sizes['e2e_s']}", "total_frames=10_000_000_000"] if sizes else []
        over += [f"log_interval_s={sizes['log_s']}"] if sizes else []
        subprocess.run(cli_command(tmp, *over, *overrides), check=True)
        lines = (Path(tmp) / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(x) for x in lines]
    if not metrics:
        raise RuntimeError("the run logged no metrics")
    if sizes:
        body = steady_windows(metrics)
        steady = {k: median([m[k] for m in body if m.get(k) is not None]) for k in KEYS}
        start, end = body[0]["time"] - body[0]["window_s"], body[-1]["time"]
        inside = [u for t, u in util or [] if start <= t <= end]
        steady["gpu_util"] = sum(inside) / len(inside) if inside else float("nan")
        steady["gpu_util_samples"] = len(inside)
        # Busy over the whole steady span: a long update's busy time lands in one window.
        span = sum(m["window_s"] for m in body)
        steady["learner_busy_span"] = sum(m["learner_busy"] * m["window_s"] for m in body) / span
        steady["windows"] = len(body)
        metrics.append(steady)
    return metrics


# ------------------------------------------------------------------------------------- main
SIZES = {  # a GPU run: stages of 20-40 s (e2e: 100 s); a dry run: seconds
    "gpu": dict(warmup=3, updates=10, min_s=5, max_s=12, profiled=3, raw_s=10, e2e_s=25, log_s=3),
    "dry": dict(warmup=0, updates=1, min_s=0, max_s=10, profiled=1, raw_s=1, e2e_s=30, log_s=1),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, speed unjudged")
    ap.add_argument("--device", default=None, help="cuda (default), cuda:N; cpu in a dry run")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"subset of {','.join(STAGES)}")
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--actors", type=int, default=0, help=f"e2e (0: cores - {LEARNER_CORES})")
    ap.add_argument("--cartpole-seconds", type=float, default=75.0, help="CartPole's time cap")
    ap.add_argument("--out", default="bench_out", help="gpu.json goes here")
    ap.add_argument("--verdict", default=None, help="append verdict lines here")
    ap.add_argument("--judge", action="store_true", help="judge speed even in a dry run")
    args, extra = ap.parse_known_args(argv)
    if any(x.startswith("-") for x in extra):
        ap.error(f"unrecognized arguments: {extra} (Hydra overrides for e2e are key=value)")
    args.e2e_overrides = extra
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    args.stages = [s for s in args.stages.split(",") if s]
    if set(args.stages) - set(STAGES):
        ap.error(f"unknown stages {sorted(set(args.stages) - set(STAGES))}; from {STAGES}")
    args.sizes = SIZES["dry" if args.dry_run else "gpu"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unjudged = args.dry_run and not args.judge
    verdict = Path(args.verdict) if args.verdict else None
    device = torch.device(args.device)
    path = Path(args.out) / "gpu.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    for key in ("benchmark", "machine"):  # write_result adds fresh ones
        result.pop(key, None)
    stages = result.setdefault("stages", {})
    result.update(dry_run=args.dry_run, device=str(device))
    failed = 0
    for stage in args.stages:
        torch.set_num_threads(learner_threads(device.type, "fp32", os.cpu_count() or 1, 0))
        out: dict[str, Any] = {}
        stages[stage] = out
        t0 = time.perf_counter()
        try:
            if stage != "preflight" and device.type == "cuda" and not torch.cuda.is_available():
                raise RuntimeError(f"CUDA is not available (torch {torch.__version__})")
            checks = globals()[f"stage_{stage}"](args, device, out, stages)
        except Exception as e:  # a crash is a FAIL line of its own; the next stage still runs
            traceback.print_exc()
            out["error"] = f"{type(e).__name__}: {e}"[:500]
            checks = [Check(f"{stage}.ran", None, 1, gpu_only=False)]
        out["seconds"] = time.perf_counter() - t0
        write_result("gpu", result, args.out)
        failed |= record(checks, verdict, unjudged)
    return failed


if __name__ == "__main__":
    sys.exit(main())
