"""The learner's update alone, for config variants side by side: seconds per update on a
synthetic batch (``calibration.measure.time_learner_step``: a fresh model and optimizer, the
whole update with its epochs and minibatches), with no actors on the cores. Rounds rotate the
variants' order, so all see the same machine drift. Set against an end-to-end run of the same
config (``benchmarks/throughput.py``), it says what the learner loses to sharing the cores.

    python -m benchmarks.learner_step --threads 1,2 --variant "recipe=" \\
        --variant "compile=compile=true" experiment=compare_pong

``--variant NAME=OVERRIDES`` (space-separated Hydra overrides, empty for none); overrides after
the flags go to every variant. Writes one JSON with every timing and, per variant and thread
count, the median ms per update and the learner-only frames/s it allows.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from benchmarks.common import rotated, write_result
from benchmarks.variants import parse_variant
from impala_gpu.calibration.measure import time_learner_step
from impala_gpu.config import Config, conf_dir, frames_per_update, register_configs
from impala_gpu.envs import env_spec
from impala_gpu.speed.tcmalloc import reexec_with_tcmalloc


def compose_config(overrides: list[str]) -> Config:
    register_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=overrides))


def main() -> None:
    reexec_with_tcmalloc()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=OVERRIDES")
    ap.add_argument("--threads", default="2", help="comma-separated torch thread counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="learner_step")
    ap.add_argument("--out", default="bench_out")
    args, common = ap.parse_known_args()
    variants = dict(parse_variant(v) for v in args.variant)
    names, threads = list(variants), [int(t) for t in args.threads.split(",")]
    runs: list[dict] = []
    for r in range(args.rounds):
        for name in rotated(names, r):
            cfg = compose_config([*common, *variants[name]])
            spec = env_spec(cfg.env)
            precision = "fp32" if cfg.precision == "auto" else cfg.precision
            for n in threads:
                s = time_learner_step(cfg, spec, torch.device("cpu"), precision, n, cfg.batch_size)
                fps = frames_per_update(cfg, spec.frames_per_step) / s
                runs.append({"round": r, "variant": name, "threads": n, "ms": s * 1e3, "fps": fps})
                print(f"round {r} {name} {n} threads: {s * 1e3:,.1f} ms ({fps:,.0f} frames/s)")
    summary = {}
    for name in names:
        for n in threads:
            mine = [x for x in runs if x["variant"] == name and x["threads"] == n]
            ms = statistics.median(x["ms"] for x in mine)
            fps = statistics.median(x["fps"] for x in mine)
            summary[f"{name}/{n}"] = {"ms": ms, "frames_per_s": fps}
            print(f"{name}, {n} threads: {ms:,.1f} ms per update, {fps:,.0f} frames/s")
    result = {"variants": variants, "common": common, "runs": runs, "summary": summary}
    print(write_result(args.name, result, args.out))


if __name__ == "__main__":
    main()
