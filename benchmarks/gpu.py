"""The GPU benchmark (issue 6), for a lent GPU: how fast the learner updates and how busy it
keeps the GPU, then how close the whole system gets to what its actor cores can step.

Three stages (``--stages``, default all), one JSON (``bench_out/gpu.json``), one summary line
per stage:

- synthetic: the learner alone, one batch already on the device reused every update, for each
  model x precision x batch size (T=20). Updates/s, agent steps/s (updates x B x T), frames/s
  (x4 frameskip), and the GPU busy fraction: CUDA events around each train step, summed, over
  the wall time (as the train loop's ``gpu_busy``). The span between the events includes the
  step's own mid-step sync (the non-finite check), so it is "a step is in flight on the GPU",
  not SM occupancy. ``--compile`` adds a ``torch.compile`` run of each config.
- ring: the same learner fed through the real shared-memory ring and Batcher (pinned staging,
  side-stream copies, double buffering) by feeder processes that refill slots as fast as memory
  allows (``learner_overhead.feed``). Learner busy = time in train steps / wall time, and
  ``learner_busy_when_ready`` the same over the time a batch was ready (wait excluded): the data
  path's own cost (target >= 95%); and the update rate relative to the synthetic one.
- e2e: ``python -m impala_gpu`` for ``--e2e-seconds`` (Pong, shallow, defaults otherwise, once
  per ``--e2e-precisions``) with ``cores - 1`` actor processes x 16 envs; the learner process
  (kernel launches, the Batcher's gather into pinned memory) keeps the last core, since the
  Batcher's gather is on the critical path and 16 actors would oversubscribe it. Against the
  raw vector env (random actions, ``actors.run_raw``) in the same number of processes x envs:
  the ratio (target >= 0.80) is what inference, ring writes and the learner cost the actors.

    python benchmarks/gpu.py                          # the H200 check, 4-5 minutes
    python benchmarks/gpu.py --stages synthetic --models resnet --compile
    python benchmarks/gpu.py --device cpu --smoke     # every stage, tiny (about a minute)
    python benchmarks/gpu.py --stages e2e compile=true  # key=value: Hydra overrides for e2e

Results are written after every measurement (``--append`` merges into an existing file), so a
stage killed by a timeout keeps what it had measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import actors as actors_bench  # noqa: E402
import throughput  # noqa: E402
from common import write_result  # noqa: E402
from learner_overhead import feed, stop_processes, synthetic_batch  # noqa: E402

from impala_gpu.algos.impala import _GpuTimer  # noqa: E402
from impala_gpu.channels.ring import RingSpec, SlotManager, TrajectoryRing, numpy_to_torch_dtype  # noqa: E402
from impala_gpu.config import AlgoCfg, Config, EnvCfg, ModelCfg  # noqa: E402
from impala_gpu.envs import env_spec  # noqa: E402
from impala_gpu.learning.batcher import Batch, Batcher  # noqa: E402
from impala_gpu.learning.learner import make_optimizer, train_step  # noqa: E402
from impala_gpu.models import build_model  # noqa: E402
from impala_gpu.speed import compile_model, learner_threads  # noqa: E402

STAGES = ("synthetic", "ring", "e2e")
# --smoke: every stage, tiny, for a CPU box (explicit flags still win).
SMOKE = {
    "models": "shallow",
    "batch_sizes": "4",
    "warmup": 1,
    "updates": 3,
    "min_seconds": 0.0,
    "e2e_seconds": 10.0,
    "e2e_log_interval": 2.0,
    "raw_seconds": 3.0,
    "envs_per_actor": 4,
}
DEFAULTS = {
    "models": "shallow,resnet",
    "batch_sizes": "32,128",
    "warmup": 3,
    "updates": 20,
    "min_seconds": 2.0,
    "e2e_seconds": 40.0,
    "e2e_log_interval": 5.0,
    "raw_seconds": 15.0,
    "envs_per_actor": 16,
}


# ------------------------------------------------------------------------------ learner timing
def timed_updates(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    algo: AlgoCfg,
    precision: str,
    next_batch: Callable[[], tuple[int, Batch]],
    done: Callable[[int], None],
    cuda: bool,
    warmup: int,
    updates: int,
    min_seconds: float,
    max_seconds: float,
) -> dict[str, float]:
    """The train loop's own steps (CUDA events around train_step, one stats read per update):
    ``warmup`` untimed updates, then at least ``updates`` and ``min_seconds`` timed ones
    (stopping early, after one, past ``max_seconds``)."""
    for _ in range(warmup):
        k, b = next_batch()
        train_step(model, opt, b, algo, precision).cpu()
        done(k)
    events = []
    busy = wait = 0.0
    n = 0
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        k, b = next_batch()
        t1 = time.perf_counter()
        timer = _GpuTimer() if cuda else None
        stats = train_step(model, opt, b, algo, precision)
        if timer is not None:
            events.append(timer.stop())
        stats_np = stats.cpu().numpy()
        t2 = time.perf_counter()
        done(k)
        busy += t2 - t1
        wait += t1 - t0
        n += 1
        elapsed = time.perf_counter() - start
        if (n >= updates and elapsed >= min_seconds) or elapsed >= max_seconds:
            break
    wall = time.perf_counter() - start
    out = {
        "updates": n,
        "seconds": wall,
        "updates_per_s": n / wall,
        "learner_busy": busy / wall,
        "learner_wait": wait / wall,
        "learner_overhead": max(0.0, 1.0 - (busy + wait) / wall),
        # Busy while a batch was ready: the data path's own cost, whatever the feed's speed.
        "learner_busy_when_ready": busy / max(wall - wait, 1e-9),
        "total_loss": float(stats_np[0]),
    }
    if cuda:
        torch.cuda.synchronize()
        gpu_ms = sum(s.elapsed_time(e) for s, e in events)
        out["gpu_busy"] = min(1.0, gpu_ms / 1000.0 / wall)
        out["gpu_ms_per_update"] = gpu_ms / n
        out["gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def make_learner(spec, model_name: str, device: torch.device, compiled: bool, seed: int = 0):
    torch.manual_seed(seed)
    algo = AlgoCfg()
    model = build_model(spec.obs_shape, spec.num_actions, ModelCfg(name=model_name)).to(device)
    opt = make_optimizer(model, algo)
    compile_model(model, compiled)
    return model, opt, algo


def make_ring(spec, num_slots: int, T: int, num_actors: int, ctx) -> TrajectoryRing:
    return TrajectoryRing(
        RingSpec(
            num_slots, T, spec.obs_shape, numpy_to_torch_dtype(spec.obs_dtype), spec.num_actions
        ),
        num_actors,
        ctx,
    )


def free_device_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def add_rates(row: dict[str, Any], B: int, T: int, frames_per_step: int) -> dict[str, Any]:
    row["agent_steps_per_s"] = row["updates_per_s"] * B * T
    row["frames_per_s"] = row["agent_steps_per_s"] * frames_per_step
    return row


def label(row: dict[str, Any]) -> str:
    c = " compiled" if row.get("compile") else ""
    return f"{row['model']} {row['precision']}{c} B={row['batch_size']}"


def describe(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{label(row)}: FAILED {row['error']}"
    gpu = f", gpu busy {row['gpu_busy']:.0%}" if "gpu_busy" in row else ""
    return (
        f"{label(row)}: {row['updates_per_s']:.1f} upd/s = {row['agent_steps_per_s']:,.0f} "
        f"agent steps/s ({row['frames_per_s']:,.0f} frames/s), learner busy "
        f"{row['learner_busy']:.0%}{gpu}"
    )


# ------------------------------------------------------------------------------------ stages
def stage_synthetic(args, device, spec, ctx, save: Callable[[], None], rows: list) -> None:
    cuda = device.type == "cuda"
    ring = make_ring(spec, 1, args.unroll_length, 1, ctx)  # only its field shapes are used
    try:
        for B in args.batch_sizes:
            for model_name in args.models:
                for precision in args.precisions:
                    for compiled in (False, True) if args.compile else (False,):
                        row: dict[str, Any] = {
                            "model": model_name,
                            "precision": precision,
                            "batch_size": B,
                            "unroll_length": args.unroll_length,
                            "compile": compiled,
                        }
                        try:
                            free_device_memory(device)
                            model, opt, algo = make_learner(spec, model_name, device, compiled)
                            batch = synthetic_batch(ring, B, device)
                            row |= timed_updates(
                                model,
                                opt,
                                algo,
                                precision,
                                lambda batch=batch: (0, batch),
                                lambda k: None,
                                cuda,
                                args.warmup + (2 if compiled else 0),
                                args.updates,
                                args.min_seconds,
                                args.max_seconds,
                            )
                            add_rates(row, B, args.unroll_length, spec.frames_per_step)
                            del model, opt, batch
                        except Exception as e:  # one config failing must not stop the rest
                            traceback.print_exc()
                            row["error"] = f"{type(e).__name__}: {e}"[:500]
                        rows.append(row)
                        print(f"gpu synthetic: {describe(row)}", flush=True)
                        save()
    finally:
        ring.close()


def stage_ring(args, device, spec, ctx, save: Callable[[], None], rows: list, synth: list):
    cuda = device.type == "cuda"
    for B in args.batch_sizes:
        # As learner_overhead.py: 4 batches of slots, feeders refilling them with a fixed
        # trajectory, the real Batcher in front of the learner.
        ring = make_ring(spec, 4 * B, args.unroll_length, args.feeders, ctx)
        slots = SlotManager(ring)
        stop = ctx.Event()
        feeders = [
            ctx.Process(target=feed, args=(ring, stop, i), daemon=True) for i in range(args.feeders)
        ]
        batcher = None
        try:
            for p in feeders:
                p.start()
            batcher = Batcher(ring, slots, B, device, learner_version=lambda: 0)
            batcher.start()

            def next_batch(batcher=batcher) -> tuple[int, Batch]:
                got = batcher.get(timeout=30)
                if got is None:
                    raise TimeoutError("no batch from the ring in 30 s (feeders stalled?)")
                return got

            for model_name in args.models:
                for precision in args.precisions:
                    row: dict[str, Any] = {
                        "model": model_name,
                        "precision": precision,
                        "batch_size": B,
                        "unroll_length": args.unroll_length,
                        "feeders": args.feeders,
                    }
                    try:
                        free_device_memory(device)
                        model, opt, algo = make_learner(spec, model_name, device, False)
                        gather0 = batcher.gather_s
                        row |= timed_updates(
                            model,
                            opt,
                            algo,
                            precision,
                            next_batch,
                            batcher.done,
                            cuda,
                            args.warmup,
                            args.updates,
                            args.min_seconds,
                            args.max_seconds,
                        )
                        add_rates(row, B, args.unroll_length, spec.frames_per_step)
                        # The Batcher's gather time per batch over the run (includes warm-up).
                        row["batcher_gather_s_per_batch"] = (batcher.gather_s - gather0) / (
                            row["updates"] + args.warmup
                        )
                        ref = [
                            s
                            for s in synth
                            if (s["model"], s["precision"], s["batch_size"])
                            == (model_name, precision, B)
                            and not s.get("compile")
                            and "error" not in s
                        ]
                        if ref:
                            row["ratio_to_synthetic"] = (
                                row["updates_per_s"] / ref[0]["updates_per_s"]
                            )
                        del model, opt
                    except Exception as e:
                        traceback.print_exc()
                        row["error"] = f"{type(e).__name__}: {e}"[:500]
                    rows.append(row)
                    vs = ""
                    if "error" not in row:
                        vs = (
                            f", wait {row['learner_wait']:.0%}, busy when ready "
                            f"{row['learner_busy_when_ready']:.0%}"
                        )
                    if "ratio_to_synthetic" in row:
                        vs += f", {row['ratio_to_synthetic']:.2f}x synthetic"
                    print(f"gpu ring: {describe(row)}{vs}", flush=True)
                    save()
        finally:
            stop.set()
            if batcher is not None:
                batcher.stop()
            stop_processes(feeders)
            ring.close()


def stage_e2e(args, device, spec, ctx, save: Callable[[], None], out: dict) -> None:
    cores = os.cpu_count() or 1
    actors = args.actors or max(1, cores - 1)
    E = args.envs_per_actor
    out.update(actors=actors, envs_per_actor=E, cores=cores, runs={})
    try:
        cfg = Config(env=EnvCfg(id=args.env), num_actors=actors, envs_per_actor=E)
        raw = actors_bench.run_raw(ctx, cfg, args.raw_seconds)
        out["raw_steps_per_s"] = raw
        out["raw_frames_per_s"] = raw * spec.frames_per_step
        print(
            f"gpu e2e: raw vector env ceiling {raw:,.0f} agent steps/s "
            f"({actors} processes x {E} envs, random actions)",
            flush=True,
        )
    except Exception as e:
        traceback.print_exc()
        out["raw_error"] = f"{type(e).__name__}: {e}"[:500]
    save()
    hydra_dir = tempfile.mkdtemp(prefix="gpu_bench_hydra_")  # keep Hydra's logs out of runs/
    try:
        for precision in args.e2e_precisions:
            overrides = [
                f"device={device}",
                f"env.id={args.env}",
                "model=shallow",
                f"num_actors={actors}",
                f"envs_per_actor={E}",
                f"precision={precision}",
                f"hydra.run.dir={hydra_dir}/{precision}",
                *args.e2e_overrides,
            ]
            try:
                r = throughput.run(args.e2e_seconds, overrides, args.e2e_log_interval)
                r["overrides"] = overrides
                if out.get("raw_steps_per_s"):
                    r["ratio_to_raw"] = r["agent_steps_per_s"] / out["raw_steps_per_s"]
                    r["actor_ratio_to_raw"] = r["actor_steps_per_s"] / out["raw_steps_per_s"]
            except Exception as e:  # a failed run must not stop the next
                traceback.print_exc()
                r = {"overrides": overrides, "error": f"{type(e).__name__}: {e}"[:500]}
            out["runs"][precision] = r
            print(f"gpu e2e: {precision}: {describe_e2e(r)}", flush=True)
            save()
    finally:
        shutil.rmtree(hydra_dir, ignore_errors=True)


def describe_e2e(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"FAILED {r['error']}"
    ratio = f", {r['ratio_to_raw']:.2f}x raw" if "ratio_to_raw" in r else ""
    gpu = r.get("gpu_busy")
    gpu_s = f", gpu busy {gpu:.1%}" if isinstance(gpu, float) and gpu == gpu else ""
    return (
        f"{r['agent_steps_per_s']:,.0f} agent steps/s ({r['frames_per_s']:,.0f} frames/s){ratio}"
        f"; learner busy {r['learner_busy']:.0%} wait {r['learner_wait']:.0%}{gpu_s}; actor "
        f"idle {r['actor_idle']:.0%}; lag {r['policy_lag_mean']:.2f}"
    )


# -------------------------------------------------------------------------------- summaries
def summary_rows(stage: str, rows: list[dict[str, Any]]) -> str:
    parts = []
    for r in rows:
        if "error" in r:
            parts.append(f"{label(r)} FAILED")
            continue
        extra = f" gpu {r['gpu_busy']:.0%}" if "gpu_busy" in r else ""
        if stage == "ring":
            extra += (
                f" busy {r['learner_busy']:.0%} (when ready {r['learner_busy_when_ready']:.0%})"
            )
        parts.append(f"{label(r)} {r['updates_per_s']:.0f} upd/s{extra}")
    return f"gpu {stage} summary: " + " | ".join(parts)


def summary_e2e(e2e: dict[str, Any]) -> str:
    raw = e2e.get("raw_steps_per_s")
    head = f"{e2e.get('actors')} actors x {e2e.get('envs_per_actor')} envs, raw " + (
        f"{raw:,.0f} steps/s" if raw else "FAILED"
    )
    parts = []
    for precision, r in e2e.get("runs", {}).items():
        if "error" in r:
            parts.append(f"{precision} FAILED")
            continue
        ratio = f" ({r['ratio_to_raw']:.2f}x raw)" if "ratio_to_raw" in r else ""
        parts.append(f"{precision} {r['agent_steps_per_s']:,.0f} steps/s{ratio}")
    return f"gpu e2e summary: {head}; " + "; ".join(parts)


# ------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny version of every stage")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"subset of {','.join(STAGES)}")
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--models", default=None, help="shallow,resnet (smoke: shallow)")
    ap.add_argument("--precisions", default="fp32,bf16", help="learner stages: fp32,bf16")
    ap.add_argument("--batch-sizes", default=None, help="32,128 (smoke: 4)")
    ap.add_argument("--unroll-length", type=int, default=20)
    ap.add_argument("--compile", action="store_true", help="synthetic: also torch.compile each")
    ap.add_argument("--warmup", type=int, default=None, help="untimed updates per config (3)")
    ap.add_argument("--updates", type=int, default=None, help="timed updates per config, min (20)")
    ap.add_argument("--min-seconds", type=float, default=None, help="timed seconds, min (2)")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="timed seconds, max")
    ap.add_argument("--feeders", type=int, default=None, help="ring: feeder processes")
    ap.add_argument("--actors", type=int, default=0, help="e2e: actor processes (0: cores-1)")
    ap.add_argument("--envs-per-actor", type=int, default=None, help="e2e: 16 (smoke: 4)")
    ap.add_argument("--e2e-precisions", default="fp32,bf16")
    ap.add_argument("--e2e-seconds", type=float, default=None, help="e2e: per run (40)")
    ap.add_argument("--e2e-log-interval", type=float, default=None)
    ap.add_argument("--raw-seconds", type=float, default=None, help="e2e: raw env run (15)")
    ap.add_argument("--name", default="gpu", help="result file name")
    ap.add_argument("--append", action="store_true", help="merge into an existing result file")
    ap.add_argument("--out", default="bench_out")
    args, extra = ap.parse_known_args(argv)
    flags = [x for x in extra if x.startswith("-")]
    if flags:
        ap.error(f"unrecognized arguments: {' '.join(flags)} (Hydra overrides are key=value)")
    args.e2e_overrides = extra  # Hydra overrides for the e2e runs (e.g. batch_size=64)
    if args.smoke and not any(o.startswith("batch_size=") for o in extra):
        args.e2e_overrides = ["batch_size=8", *extra]  # a few updates/s from one small actor
    for key, value in (SMOKE if args.smoke else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.stages = [s for s in args.stages.split(",") if s]
    bad = sorted(set(args.stages) - set(STAGES))
    if bad:
        ap.error(f"unknown stages {bad}; choose from {STAGES}")
    args.models = args.models.split(",")
    args.precisions = args.precisions.split(",")
    args.e2e_precisions = [p for p in args.e2e_precisions.split(",") if p]
    args.batch_sizes = [int(b) for b in str(args.batch_sizes).split(",")]
    if args.feeders is None:
        args.feeders = max(1, min(4, (os.cpu_count() or 1) // 4))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"gpu: --device {args.device} but CUDA is not available (torch {torch.__version__}); "
            "nothing measured. On a CPU box: --device cpu --smoke.",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device)
    cores = os.cpu_count() or 1
    # The learner's threads as the train loop picks them (2 on CUDA; on CPU, all cores).
    torch.set_num_threads(learner_threads(device.type, "fp32", cores, 0))
    spec = env_spec(EnvCfg(id=args.env))
    ctx = mp.get_context("spawn")

    path = Path(args.out) / f"{args.name}.json"
    stages: dict[str, Any] = {}
    stage_seconds: dict[str, float] = {}
    if args.append and path.exists():
        previous = json.loads(path.read_text())
        stages, stage_seconds = previous.get("stages", {}), previous.get("stage_seconds", {})
    result: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items()},
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch_cuda": torch.version.cuda,
        "learner_threads": torch.get_num_threads(),
        "stages": stages,
        "stage_seconds": stage_seconds,
    }

    def save() -> None:
        write_result(args.name, result, args.out)

    t_start = time.perf_counter()
    failed = False
    synth: list[dict[str, Any]] = stages.get("synthetic", []) if args.append else []
    for stage in args.stages:
        t0 = time.perf_counter()
        try:
            if stage == "synthetic":
                rows: list[dict[str, Any]] = []
                stages["synthetic"] = rows
                stage_synthetic(args, device, spec, ctx, save, rows)
                synth = rows
                print(summary_rows("synthetic", rows), flush=True)
            elif stage == "ring":
                rows = []
                stages["ring"] = rows
                stage_ring(args, device, spec, ctx, save, rows, synth)
                print(summary_rows("ring", rows), flush=True)
            else:
                e2e: dict[str, Any] = {}
                stages["e2e"] = e2e
                stage_e2e(args, device, spec, ctx, save, e2e)
                print(summary_e2e(e2e), flush=True)
        except Exception as e:
            traceback.print_exc()
            stages[f"{stage}_error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"gpu {stage}: FAILED {e}", flush=True)
        rows_now = stages.get(stage)
        if isinstance(rows_now, list) and any("error" in r for r in rows_now):
            failed = True
        if isinstance(rows_now, dict) and (
            "raw_error" in rows_now or any("error" in r for r in rows_now.get("runs", {}).values())
        ):
            failed = True
        failed |= f"{stage}_error" in stages
        stage_seconds[stage] = time.perf_counter() - t0
        save()
    result["seconds"] = time.perf_counter() - t_start
    print(f"gpu: done in {result['seconds']:.0f} s -> {write_result(args.name, result, args.out)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
