"""Network health of saved checkpoints, on the same real frames for each.

    python -m impala_gpu.reports.checkpoint_health runs/abl/A_a2clike runs/abl/C_tf_ortho \\
        [--steps 300]

Plays ``--steps`` steps of 4 envs of the checkpoint's own env with the checkpoint's policy,
keeps every 5th observation (about 240 states), and reports the dead fraction per layer and
the logit spread (``impala_gpu.telemetry.health``). A run dir stands for its latest checkpoint.
"""

from __future__ import annotations

import argparse

import torch

from impala_gpu.envs import make_vector_env, reset_vector_env
from impala_gpu.evaluate import load_policy
from impala_gpu.reporting.checkpoint import resolve_checkpoint
from impala_gpu.telemetry import health


def states(model, cfg, steps: int, seed: int) -> torch.Tensor:
    env = make_vector_env(cfg.env, 4)
    obs, _ = reset_vector_env(env, [seed + i for i in range(4)])
    gen = torch.Generator().manual_seed(seed)
    kept, first = [], torch.zeros(1, 4, dtype=torch.bool)
    for t in range(steps):
        with torch.no_grad():
            logits = model(torch.from_numpy(obs)[None], first).logits[0]
        action = torch.multinomial(logits.softmax(-1), 1, generator=gen).squeeze(-1)
        obs, *_ = env.step(action.numpy())
        if t % 5 == 0:
            kept.append(torch.from_numpy(obs))
    env.close()
    return torch.stack(kept)  # [steps / 5, 4, ...]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    for ckpt in args.checkpoints:
        path = resolve_checkpoint(ckpt)
        model, cfg = load_policy(path)
        if model.lstm is not None:
            raise SystemExit(f"{path}: LSTM policies need their core state; not supported here")
        x = states(model, cfg, args.steps, args.seed)
        m = health.measure(model, x, torch.zeros(x.shape[:2], dtype=torch.bool), (), x[0].numel())
        frames = torch.load(path, map_location="cpu", weights_only=False)["frames"]
        cells = " ".join(f"{k}={v:.3f}" for k, v in m.items())
        print(f"{path} ({frames / 1e6:.2f}M frames, {x.shape[0] * x.shape[1]} states): {cells}")


if __name__ == "__main__":
    main()
