"""Actor efficiency: real actor processes (vector env + batched inference + ring writes) against
the raw vector env stepping random actions, same process count, envs and threads.

    python -m benchmarks.actors                          # Pong, 2 processes x 16 envs, shallow
    python -m benchmarks.actors --precision bf16 --seconds 20

The actor side is the real ``actor_main`` writing into a real ring; a drain thread in this
process hands every full slot straight back, so no learner competes for the cores and the
ratio is the cost of inference and ring writes alone. Alternates raw/actor ``--repeats`` times.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np
import torch
import torch.multiprocessing as mp

from benchmarks.common import median, write_result
from impala_gpu.acting.actor import ACTOR_STEPS, ActorHandles, actor_main
from impala_gpu.channels.params import ParamStore
from impala_gpu.channels.ring import RingSpec, SlotManager, TrajectoryRing, numpy_to_torch_dtype
from impala_gpu.config import Config, EnvCfg, ModelCfg, resolve_num_slots
from impala_gpu.envs import env_spec, make_vector_env
from impala_gpu.models import build_model
from impala_gpu.speed.tcmalloc import reexec_with_tcmalloc


def raw_worker(env_cfg: EnvCfg, num_envs: int, seconds: float, seed: int, out) -> None:
    """Step the vector env with uniformly random actions; report steps/s (after a warm-up)."""
    torch.set_num_threads(1)
    env = make_vector_env(env_cfg, num_envs, num_threads=1)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    n = env.single_action_space.n
    for _ in range(20):
        env.step(rng.integers(0, n, num_envs))
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(rng.integers(0, n, num_envs))
        steps += num_envs
    out.put(steps / (time.perf_counter() - t0))
    env.close()


def run_raw(ctx, cfg: Config, seconds: float) -> float:
    out = ctx.Queue()
    procs = [
        ctx.Process(target=raw_worker, args=(cfg.env, cfg.envs_per_actor, seconds, i, out))
        for i in range(cfg.num_actors)
    ]
    for p in procs:
        p.start()
    rates = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return float(sum(rates))


def run_actors(ctx, cfg: Config, seconds: float, warmup: float) -> float:
    spec = env_spec(cfg.env)
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    ring = TrajectoryRing(
        RingSpec(
            resolve_num_slots(cfg),
            cfg.unroll_length,
            spec.obs_shape,
            numpy_to_torch_dtype(spec.obs_dtype),
            spec.num_actions,
        ),
        cfg.num_actors,
        ctx,
    )
    slots = SlotManager(ring)
    params = ParamStore.for_model(model)
    params.publish(model, version=0)
    handles = ActorHandles.create(ctx, ring, params, cfg.num_actors)
    drain_stop = threading.Event()

    def drain() -> None:  # the learner's side, minus the learning: free every slot at once
        while not drain_stop.is_set():
            item = ring.take(timeout=0.1)
            if item is not None and (slot := slots.accept(item)) is not None:
                slots.give(slot)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    procs = [
        ctx.Process(target=actor_main, args=(i, cfg, spec, handles, 1000 + i), daemon=True)
        for i in range(cfg.num_actors)
    ]
    try:
        for p in procs:
            p.start()
        steps = handles.counters[:, ACTOR_STEPS]
        deadline = time.perf_counter() + 180
        while int(steps.sum()) == 0 and time.perf_counter() < deadline:  # process start-up
            time.sleep(0.1)
        time.sleep(warmup)
        s0, t0 = int(steps.sum()), time.perf_counter()
        time.sleep(seconds)
        rate = (int(steps.sum()) - s0) / (time.perf_counter() - t0)
        while not handles.messages.empty():  # an actor that failed says why
            kind, actor, payload = handles.messages.get()
            if kind == "error":
                raise RuntimeError(f"actor {actor} failed:\n{payload}")
        return rate
    finally:
        handles.stop.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        drain_stop.set()
        drainer.join()
        handles.messages.cancel_join_thread()
        ring.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--model", default="shallow")
    ap.add_argument("--actors", type=int, default=2, help="processes (default: 2)")
    ap.add_argument("--envs-per-actor", type=int, default=16)
    ap.add_argument("--unroll-length", type=int, default=20)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--seconds", type=float, default=20, help="timed seconds per run")
    ap.add_argument("--warmup", type=float, default=3, help="seconds before timing the actors")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    reexec_with_tcmalloc()  # as the CLI does (IMPALA_GPU_TCMALLOC=0: glibc malloc)

    cfg = Config(
        env=EnvCfg(id=args.env),
        model=ModelCfg(name=args.model),
        num_actors=args.actors,
        envs_per_actor=args.envs_per_actor,
        unroll_length=args.unroll_length,
        precision=args.precision,
    )
    ctx = mp.get_context("spawn")
    raw, actors = [], []
    for _ in range(args.repeats):
        raw.append(run_raw(ctx, cfg, args.seconds))
        actors.append(run_actors(ctx, cfg, args.seconds, args.warmup))
    ratios = [a / r for a, r in zip(actors, raw, strict=True)]
    spec = env_spec(cfg.env)
    result = {
        "config": vars(args),
        "cores": os.cpu_count(),
        "raw_steps_per_s": raw,
        "actor_steps_per_s": actors,
        "ratio_per_repeat": ratios,
        "ratio_median": median(ratios),
        "raw_frames_per_s_median": median(raw) * spec.frames_per_step,
        "actor_frames_per_s_median": median(actors) * spec.frames_per_step,
    }
    name = args.name or f"actors_{args.model}_{args.precision}"
    path = write_result(name, result, args.out)
    print(
        f"{name}: actors {median(actors):,.0f} agent steps/s "
        f"({result['actor_frames_per_s_median']:,.0f} frames/s) vs raw vector env "
        f"{median(raw):,.0f} ({result['raw_frames_per_s_median']:,.0f} frames/s) -> ratio "
        f"{result['ratio_median']:.3f} ({args.actors} processes x {args.envs_per_actor} envs, "
        f"{args.precision})  ({path})"
    )


if __name__ == "__main__":
    main()
