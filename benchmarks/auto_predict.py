"""What ``auto`` would choose on another machine, and the frames/s its cost model predicts: a
PREDICTION, not a measurement.

The actors' costs (one env step, one policy step over E envs, on one core) are measured here
and assumed the same per core there. A CUDA learner cannot be timed without a GPU, so its
update is modelled: the FLOPs of one real update (counted by ``torch.utils.flop_counter`` on
this CPU: forward, backward and optimizer, every epoch and minibatch) at an assumed effective
throughput, plus an assumed fixed cost per SGD step (kernel launches). Both assumptions are
arguments and are printed beside the result. The candidates, the prediction and the choice
are ``auto``'s own (``calibration.model.candidates``, ``algos.costs.IMPALA_COST``, ``rank``),
and the exact lag is ``bounded_lag=auto``'s (``config.least_bounded_lag``).

    python -m benchmarks.auto_predict                 # the default recipe, 16 cores + 1 GPU
    python -m benchmarks.auto_predict --cores 32 --gpu-tflops 40 precision=bf16
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import machine, write_result
from benchmarks.learner_step import compose_config
from impala_gpu.algos.costs import IMPALA_COST
from impala_gpu.calibration.measure import (
    OtherLoad,
    synthetic_batch,
    time_env_step,
    time_policy_step,
)
from impala_gpu.calibration.model import (
    Timings,
    Workload,
    candidates,
    policy_timing,
    rank,
    timing_key,
)
from impala_gpu.config import Config, least_bounded_lag, steps_per_update
from impala_gpu.envs import env_spec
from impala_gpu.learning.learner import Learner
from impala_gpu.learning.optim import make_optimizer
from impala_gpu.models import build_model


def update_flops(cfg: Config, spec, batch_size: int) -> float:
    """FLOPs of one learner update at ``[T, batch_size]`` (all epochs and minibatches)."""
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    learner = Learner(model, make_optimizer(model, cfg.algo), cfg.algo, "fp32")
    batch = synthetic_batch(spec, cfg.unroll_length, batch_size, model, torch.device("cpu"))
    with FlopCounterMode(display=False) as counter:
        learner.update(batch)
    return float(counter.get_total_flops())


def gpu_update_s(flops_per_sample: float, samples: int, sgd_steps: int, args) -> float:
    """The modelled CUDA update: its FLOPs at ``--gpu-tflops``, plus ``--gpu-step-ms`` per SGD
    step."""
    return (
        flops_per_sample * samples / (args.gpu_tflops * 1e12) + sgd_steps * args.gpu_step_ms / 1e3
    )


def predict(cfg: Config, cores: int, args, timings_here: dict) -> dict:
    """Every candidate ``auto`` weighs on a ``cores``-core box with one GPU, its predicted
    frames/s, and the choice."""
    spec = env_spec(cfg.env)
    sgd_steps = cfg.algo.epochs * cfg.algo.minibatches
    per_sample = timings_here["update_flops"] / (cfg.unroll_length * timings_here["flops_batch"])
    cands = candidates(cfg, cores, IMPALA_COST)
    out = []
    for c in cands:
        run = dataclasses.replace(cfg, num_actors=c.num_actors, envs_per_actor=c.envs_per_actor)
        batch = run.num_actors * run.envs_per_actor if args.batch_grows else run.batch_size
        run = dataclasses.replace(run, batch_size=batch)
        w = Workload("cuda", cores, run.unroll_length, batch, 0)
        learner = IMPALA_COST.learner_timing(c, w)
        update_s = gpu_update_s(per_sample, steps_per_update(run), sgd_steps, args)
        t = Timings(
            {timing_key(learner): update_s},
            timings_here["policy_step_s"],
            timings_here["env_step_s"],
        )
        steps_per_s = IMPALA_COST.predict(c, t, w)
        out.append(
            {
                "candidate": c,
                "batch_size": batch,
                "bounded_lag": least_bounded_lag(run),
                "gpu_update_ms": update_s * 1e3,
                "frames_per_s": steps_per_s * spec.frames_per_step,
                "learner_busy": min(1.0, steps_per_s * update_s / steps_per_update(run)),
            }
        )
    chosen = rank({r["candidate"]: r["frames_per_s"] for r in out})
    return {"rows": out, "chosen": chosen}


def measure_here(cfg: Config, policies: set[tuple[str, int]]) -> dict:
    """The actors' timings on this CPU (``policies``: the (precision, envs) policy steps the
    candidates need), the FLOPs of one update, and the share of the cores other processes
    took meanwhile (above ~0.25 the timings measure the contention)."""
    spec = env_spec(cfg.env)
    flops_batch = 2  # FLOPs are linear in the batch: a small one counts them
    with OtherLoad() as load:
        policy_s = {timing_key(p): time_policy_step(cfg, spec, *p) for p in sorted(policies)}
        env_s = time_env_step(cfg)
    return {
        "env_step_s": env_s,
        "policy_step_s": policy_s,
        "update_flops": update_flops(cfg, spec, flops_batch),
        "flops_batch": flops_batch,
        "other_cpu_share": load.share,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cores", type=int, default=16, help="the other box's CPU cores")
    ap.add_argument(
        "--gpu-tflops",
        type=float,
        default=25.0,
        help="ASSUMED effective TFLOP/s of the learner's update on the GPU (small convolutions "
        "reach a fraction of an H100's peak)",
    )
    ap.add_argument(
        "--gpu-step-ms",
        type=float,
        default=1.5,
        help="ASSUMED fixed milliseconds per SGD step (kernel launches, optimizer)",
    )
    ap.add_argument(
        "--batch-grows",
        action="store_true",
        help="batch_size = actors x envs (one unroll of every env per update; lag 1)",
    )
    ap.add_argument("--out", default="bench_out")
    args, overrides = ap.parse_known_args()
    cfg = compose_config(["num_actors=auto", *overrides])
    here = measure_here(cfg, {policy_timing(c) for c in candidates(cfg, args.cores, IMPALA_COST)})
    result = predict(cfg, args.cores, args, here)
    per_sample = here["update_flops"] / here["flops_batch"] / cfg.unroll_length
    print(
        f"PREDICTION for a {args.cores}-core box with one GPU (actor costs measured on "
        f"{machine()['cpu']}; GPU update ASSUMED: {args.gpu_tflops:g} TFLOP/s effective + "
        f"{args.gpu_step_ms:g} ms per SGD step; {per_sample / 1e6:.0f} MFLOP per sample per "
        f"update; other processes took {here['other_cpu_share']:.0%} of this box's cores)"
    )
    print("candidate            batch  bounded_lag  GPU update  learner busy  frames/s")
    for r in sorted(result["rows"], key=lambda r: -r["frames_per_s"]):
        mark = "  <- auto" if r["candidate"] == result["chosen"] else ""
        print(
            f"{r['candidate'].short():20} {r['batch_size']:5}  {r['bounded_lag']:11}  "
            f"{r['gpu_update_ms']:7.1f} ms  {r['learner_busy']:11.0%}  "
            f"{r['frames_per_s']:8,.0f}{mark}"
        )
    rows = [{**r, "candidate": dataclasses.asdict(r["candidate"])} for r in result["rows"]]
    write_result(
        "auto_predict",
        {
            "prediction": True,
            "cores": args.cores,
            "assumed_gpu_tflops": args.gpu_tflops,
            "assumed_gpu_step_ms": args.gpu_step_ms,
            "batch_grows": args.batch_grows,
            "overrides": overrides,
            "measured_here": here,
            "rows": rows,
            "chosen": dataclasses.asdict(result["chosen"]),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
