"""The seed's experiment: does the data path cost the learner anything?

Runs the same learner (model, V-trace loss, optimizer, threads) two ways, alternating:
- synthetic: one batch already on the device, reused every update (the upper bound);
- ring: batches come from the real shared-memory ring through the batcher thread, with feeder
  processes refilling slots as fast as memory allows (so the feed keeps up, and what is left
  is the data path's own cost: queues, gathering, copies, freeing slots).
Reports the update-rate ratio ring/synthetic and the ring run's busy/wait/overhead split.

    python -m benchmarks.learner_overhead                      # Pong, shallow, T=20, B=32
    python -m benchmarks.learner_overhead --model resnet --updates 10
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.multiprocessing as mp

from benchmarks.common import median, write_result
from impala_gpu.channels.ring import (
    STEP_FIELDS,
    RingSpec,
    SlotManager,
    TrajectoryRing,
    numpy_to_torch_dtype,
)
from impala_gpu.config import AlgoCfg, EnvCfg, ModelCfg, resolve_device
from impala_gpu.envs import env_spec
from impala_gpu.learning.batcher import Batch, Batcher
from impala_gpu.learning.learner import Learner, make_optimizer
from impala_gpu.models import build_model
from impala_gpu.speed.tcmalloc import reexec_with_tcmalloc


def random_slot(ring: TrajectoryRing, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in ring.fields.items():
        like = t[0]
        if like.dtype == torch.uint8:
            out[name] = torch.randint(0, 256, like.shape, generator=g, dtype=torch.uint8)
        elif like.dtype == torch.bool:
            out[name] = torch.rand(like.shape, generator=g) < 0.01
        elif like.dtype == torch.int64:
            out[name] = torch.randint(0, ring.spec.num_actions, like.shape, generator=g)
        else:
            out[name] = torch.randn(like.shape, generator=g)
    out["version"].zero_()
    return out


def feed(ring: TrajectoryRing, stop, index: int) -> None:
    """A feeder: refill its free slots with a fixed trajectory (a memcpy per field)."""
    torch.set_num_threads(1)
    data = random_slot(ring, index)
    while not stop.is_set():
        item = ring.acquire(index, timeout=0.1)
        if item is None:
            continue
        for name, t in ring.fields.items():
            t[item[0]].copy_(data[name])
        ring.commit(index, item)


def stop_processes(procs, timeout: float = 5) -> None:
    """Join each (already told to stop); kill what does not exit in time."""
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()


def synthetic_batch(ring: TrajectoryRing, B: int, device: torch.device) -> Batch:
    slot = random_slot(ring, 0)
    fields = {
        n: slot[n].unsqueeze(1).expand(-1, B, *slot[n].shape[1:]).contiguous().to(device)
        for n in STEP_FIELDS
    }
    return Batch(**fields, versions=torch.zeros(B, dtype=torch.int64))


def run_synthetic(learner: Learner, batch: Batch, updates: int) -> float:
    for _ in range(2):  # warm-up
        learner.update(batch).cpu()
    t0 = time.perf_counter()
    for _ in range(updates):
        learner.update(batch).cpu()
    return updates / (time.perf_counter() - t0)


def run_ring(learner: Learner, batcher: Batcher, updates: int) -> dict[str, float]:
    for _ in range(2):  # warm-up
        k, b = batcher.get()
        learner.update(b).cpu()
        batcher.done(k)
    busy = wait = 0.0
    start = time.perf_counter()
    for _ in range(updates):
        t0 = time.perf_counter()
        k, b = batcher.get()
        t1 = time.perf_counter()
        learner.update(b).cpu()
        t2 = time.perf_counter()
        batcher.done(k)
        busy += t2 - t1
        wait += t1 - t0
    wall = time.perf_counter() - start
    return {
        "updates_per_s": updates / wall,
        "busy": busy / wall,
        "wait": wait / wall,
        "overhead": 1 - busy / wall - wait / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--model", default="shallow")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--unroll-length", type=int, default=20)
    ap.add_argument("--updates", type=int, default=20, help="timed updates per repetition")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--feeders", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    ap.add_argument("--out", default="bench_out")
    args = ap.parse_args()
    reexec_with_tcmalloc()  # as the CLI does (IMPALA_GPU_TCMALLOC=0: glibc malloc)

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    spec = env_spec(EnvCfg(id=args.env))
    mcfg = ModelCfg(name=args.model, channels_last=args.channels_last)
    algo = AlgoCfg()
    model = build_model(spec.obs_shape, spec.num_actions, mcfg).to(device)
    opt = make_optimizer(model, algo)
    ctx = mp.get_context("spawn")
    B, T = args.batch_size, args.unroll_length
    ring = TrajectoryRing(
        RingSpec(4 * B, T, spec.obs_shape, numpy_to_torch_dtype(spec.obs_dtype), spec.num_actions),
        args.feeders,
        ctx,
    )
    slots = SlotManager(ring)
    stop = ctx.Event()
    feeders = [
        ctx.Process(target=feed, args=(ring, stop, i), daemon=True) for i in range(args.feeders)
    ]
    for p in feeders:
        p.start()
    batcher = Batcher(ring, slots, B, device, learner_version=lambda: 0)
    batcher.start()
    batch = synthetic_batch(ring, B, device)
    synth, fed = [], []
    try:
        for _ in range(args.repeats):
            learner = Learner(model, opt, algo, args.precision)
            synth.append(run_synthetic(learner, batch, args.updates))
            fed.append(run_ring(learner, batcher, args.updates))
    finally:
        stop.set()
        batcher.stop()
        stop_processes(feeders)
        ring.close()

    ratios = [f["updates_per_s"] / s for f, s in zip(fed, synth, strict=True)]
    result = {
        "config": vars(args),
        "device": str(device),
        "synthetic_updates_per_s": synth,
        "ring_updates_per_s": [f["updates_per_s"] for f in fed],
        "ratio_per_repeat": ratios,
        "ratio_median": median(ratios),
        "ring_busy_median": median([f["busy"] for f in fed]),
        "ring_wait_median": median([f["wait"] for f in fed]),
        "ring_overhead_median": median([f["overhead"] for f in fed]),
        "frames_per_update": B * T * spec.frames_per_step,
    }
    name = f"learner_overhead_{args.model}_{args.precision}_{device.type}"
    path = write_result(name, result, args.out)
    print(
        f"{name}: ring {median(result['ring_updates_per_s']):.2f} "
        f"upd/s vs synthetic {median(synth):.2f} upd/s -> ratio {result['ratio_median']:.3f}; "
        f"busy {result['ring_busy_median']:.1%} wait {result['ring_wait_median']:.1%} "
        f"overhead {result['ring_overhead_median']:.1%}  ({path})"
    )


if __name__ == "__main__":
    main()
