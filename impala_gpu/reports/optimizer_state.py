"""What the optimizer's second-moment state says about a checkpoint: per parameter tensor, the
quantiles of sqrt(v) (RMSprop's ``square_avg``, Adam's ``exp_avg_sq``) and the fraction under
1e-5 and 1e-4. A parameter whose sqrt(v) is far under the size of a fresh gradient takes a step
of up to lr * g / (sqrt(v) + eps) the moment that gradient arrives: with eps = 1e-5 and a dead
unit's sqrt(v) near 0, about 10 x lr for a gradient of 1e-4.

    python -m impala_gpu.reports.optimizer_state \\
        runs/pong/seed0/checkpoints/ckpt_000006150400.pt ...
"""

from __future__ import annotations

import argparse

import torch

STATE_KEYS = ("square_avg", "exp_avg_sq")


def describe(path: str, sample: int = 200_000) -> None:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    names = list(ckpt["model"].keys())
    state = ckpt["optimizer"]["state"]
    print(f"{path}: {ckpt['frames']:,} frames, update {ckpt['version']}")
    print("| parameter | n | sqrt(v) p10 | p50 | p90 | < 1e-5 | < 1e-4 | mean abs w |")
    print("|---|---|---|---|---|---|---|---|")
    for i, name in enumerate(names):
        key = next((k for k in STATE_KEYS if i in state and k in state[i]), None)
        if key is None:
            continue
        root = state[i][key].flatten().sqrt()
        picked = root[torch.randperm(len(root))[:sample]]
        q = torch.quantile(picked, torch.tensor([0.1, 0.5, 0.9]))
        w = ckpt["model"][name].abs().mean()
        print(
            f"| {name} | {len(root)} | {q[0]:.1e} | {q[1]:.1e} | {q[2]:.1e} | "
            f"{(root < 1e-5).float().mean():.2f} | {(root < 1e-4).float().mean():.2f} | {w:.3f} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("checkpoints", nargs="+")
    for path in p.parse_args().checkpoints:
        describe(path)


if __name__ == "__main__":
    main()
