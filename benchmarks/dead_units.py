"""Which part of the learning dynamics kills the network on Pong? A fixed-data ablation.

Records real Pong play once (a uniform-random policy, the ale-py vector env of the actors),
then trains fresh copies of the shallow net on batches drawn from it with the real
``Learner.update``, one variant per run, and tracks network health (dead units per layer,
logit spread, per-layer gradient norms) every few updates. Same data, same batches, same seed
for every variant, so differences come from the change alone. Minutes instead of hours:

    python -m benchmarks.dead_units --updates 600 \
        --variant base: \
        --variant no_value:algo.baseline_cost=0 \
        --variant ortho_mean_adam:model.init=orthogonal,algo.reduction=mean,algo.optimizer=adam

Writes ``results/dead_units.json`` (per variant: the health curve).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from benchmarks.common import machine
from impala_gpu.config import Config, EnvCfg
from impala_gpu.envs import env_spec, make_vector_env, reset_vector_env
from impala_gpu.learning.learner import Batch, Learner, make_optimizer
from impala_gpu.models import build_model
from impala_gpu.telemetry import health


def record(env_cfg: EnvCfg, num_envs: int, steps: int, seed: int) -> dict[str, torch.Tensor]:
    """``steps`` steps of ``num_envs`` envs under a uniform policy, time-major ``[S, E, ...]``,
    in the ring's layout (reward/flags of arriving at each observation)."""
    env = make_vector_env(env_cfg, num_envs)
    obs, _ = reset_vector_env(env, list(range(seed, seed + num_envs)))
    n = env.single_action_space.n
    rng = np.random.default_rng(seed)
    out = {k: [] for k in ("obs", "reward", "terminated", "truncated", "first", "action")}
    reward = np.zeros(num_envs, np.float32)
    term = trunc = np.zeros(num_envs, bool)
    first = np.ones(num_envs, bool)
    for _ in range(steps):
        action = rng.integers(0, n, num_envs)
        for k, v in (("obs", obs), ("reward", reward), ("terminated", term)):
            out[k].append(np.array(v))
        out["truncated"].append(np.array(trunc))
        out["first"].append(first.copy())
        out["action"].append(action)
        prev_done = term | trunc
        obs, reward, term, trunc, _ = env.step(action)
        reward = np.clip(reward, -1, 1).astype(np.float32)
        first = prev_done
    env.close()
    data = {k: torch.from_numpy(np.stack(v)) for k, v in out.items()}
    data["logits"] = torch.zeros(*data["action"].shape, n)  # uniform behaviour policy
    return data


def sample_batch(data, T: int, B: int, gen: torch.Generator) -> Batch:
    S, E = data["action"].shape
    starts = torch.randint(0, S - T, (B,), generator=gen)
    envs = torch.randint(0, E, (B,), generator=gen)
    idx = starts[None, :] + torch.arange(T + 1)[:, None]  # [T+1, B]
    fields = {k: v[idx, envs[None, :]] for k, v in data.items()}
    return Batch(**fields, versions=torch.zeros(B, dtype=torch.int64))


def run_variant(cfg: Config, data, spec, updates: int, every: int, seed: int) -> list[dict]:
    torch.manual_seed(seed)
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    optimizer = make_optimizer(model, cfg.algo)
    names, groups = health.grad_groups(model)
    learner = Learner(model, optimizer, cfg.algo, "fp32", grad_groups=groups)
    gen = torch.Generator().manual_seed(seed)
    probe = sample_batch(data, 20, 12, torch.Generator().manual_seed(seed + 1))  # fixed states
    curve, acc = [], []
    for u in range(updates + 1):
        if u % every == 0:
            m = health.measure(model, probe.obs, probe.first)
            if acc:
                mean = np.mean(acc, axis=0)
                m.update(dict(zip(("total_loss", "entropy", "grad_norm"), mean[:3], strict=True)))
                m.update(dict(zip(names, mean[3:], strict=True)))
                acc = []
            m = {k: float(v) for k, v in m.items()}
            curve.append({"update": u, **m})
            dead = {k: round(v, 2) for k, v in m.items() if k.startswith("dead/")}
            print(f"  {u:5d} spread {m['logit_spread']:.3f} dead {dead}", flush=True)
        if u == updates:
            break
        batch = sample_batch(data, cfg.unroll_length, cfg.batch_size, gen)
        stats = learner.update(batch).numpy()
        acc.append(np.concatenate([stats[[0, 4, 5]], stats[10:]]))
    return curve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--variant", action="append", required=True, help="name:key=val,key=val")
    p.add_argument("--updates", type=int, default=600)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base", default="batch_size=8", help="overrides common to every variant")
    p.add_argument("--out", default="results/dead_units.json")
    args = p.parse_args()
    torch.set_num_threads(2)
    base = OmegaConf.merge(
        OmegaConf.structured(Config), {"env": {"id": "ALE/Pong-v5"}}, _dotlist(args.base)
    )
    env_cfg: EnvCfg = OmegaConf.to_object(base).env
    spec = env_spec(env_cfg)
    t0 = time.time()
    data = record(env_cfg, args.envs, args.steps, args.seed)
    print(f"recorded {args.envs}x{args.steps} steps in {time.time() - t0:.0f}s", flush=True)
    results = {"machine": machine(), "args": vars(args), "variants": {}}
    for v in args.variant:
        name, _, overrides = v.partition(":")
        cfg: Config = OmegaConf.to_object(OmegaConf.merge(base, _dotlist(overrides)))
        print(f"{name}: {overrides or '(base)'}", flush=True)
        curve = run_variant(cfg, data, spec, args.updates, args.every, args.seed)
        results["variants"][name] = {"overrides": overrides, "curve": curve}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))


def _dotlist(text: str):
    return OmegaConf.from_dotlist([s for s in text.split(",") if s])


if __name__ == "__main__":
    main()
