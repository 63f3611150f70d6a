"""A reference learner to check impala_gpu's Atari learning against: a minimal synchronous A2C
in one file, written apart from the package (it shares nothing with it but ale-py's vector env,
used directly with its own defaults), with the recipe of the PyTorch A2C implementations that
learn Pong (OpenAI baselines / ikostrikov): Nature CNN with orthogonal init, 16 envs x 5 steps,
n-step returns, mean loss, value cost 0.5, entropy 0.01, PyTorch RMSprop lr 7e-4 eps 1e-5
alpha 0.99, gradient clip 0.5.

    python -m benchmarks.reference_a2c --frames 6000000 --out runs/reference_a2c

Writes ``metrics.jsonl`` in the package's format (frames, elapsed_s, episode_return as the
mean of the last 100 games, entropy, logit_spread, dead/*), so
``impala_gpu.reports.plot_learning`` and ``impala_gpu.reports.run_summary`` read it beside
impala_gpu's runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import numpy as np
import torch
from ale_py import AtariVectorEnv
from torch import nn

from benchmarks.common import machine


def layer(m: nn.Module, gain: float = 2**0.5) -> nn.Module:
    nn.init.orthogonal_(m.weight, gain)
    nn.init.zeros_(m.bias)
    return m


class Net(nn.Module):
    def __init__(self, n_actions: int):
        super().__init__()
        self.convs = nn.Sequential(
            layer(nn.Conv2d(4, 32, 8, 4)), nn.ReLU(),
            layer(nn.Conv2d(32, 64, 4, 2)), nn.ReLU(),
            layer(nn.Conv2d(64, 64, 3, 1)), nn.ReLU(),
        )  # fmt: skip
        self.fc = nn.Sequential(layer(nn.Linear(3136, 512)), nn.ReLU())
        self.pi = layer(nn.Linear(512, n_actions), 0.01)
        self.v = layer(nn.Linear(512, 1), 1.0)

    def forward(self, obs_u8: torch.Tensor, keep: dict | None = None):
        h = self.convs(obs_u8.float() / 255.0)
        f = self.fc(h.flatten(1))
        if keep is not None:
            keep["conv3"], keep["fc"] = h, f
        return self.pi(f), self.v(f).squeeze(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--frames", type=int, default=6_000_000)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=7e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/reference_a2c")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"args": vars(args), "machine": machine()}))
    env = AtariVectorEnv(game="pong", num_envs=args.envs, num_threads=2, autoreset_mode="SameStep")
    obs, _ = env.reset(seed=np.arange(args.seed, args.seed + args.envs))
    net = Net(env.single_action_space.n)
    opt = torch.optim.RMSprop(net.parameters(), lr=args.lr, alpha=0.99, eps=1e-5)
    returns, ep_ret = collections.deque(maxlen=100), np.zeros(args.envs)
    frames, start, last_log, log = 0, time.time(), 0.0, open(out / "metrics.jsonl", "w")
    while frames < args.frames:
        b_obs, b_act, b_rew, b_done = [], [], [], []
        for _ in range(args.steps):
            o = torch.from_numpy(obs)
            with torch.no_grad():
                logits, _ = net(o)
            a = torch.distributions.Categorical(logits=logits).sample()
            obs, r, term, trunc, _ = env.step(a.numpy())
            done = term | trunc
            ep_ret += r
            returns.extend(ep_ret[done].tolist())
            ep_ret[done] = 0.0
            b_obs.append(o), b_act.append(a)
            b_rew.append(torch.from_numpy(np.sign(r)).float())
            b_done.append(torch.from_numpy(done).float())
        with torch.no_grad():
            _, ret = net(torch.from_numpy(obs))
        targets = []
        for r, d in zip(reversed(b_rew), reversed(b_done), strict=True):
            ret = r + 0.99 * (1.0 - d) * ret  # SameStep autoreset: done cuts the return
            targets.append(ret)
        targets = torch.stack(targets[::-1]).flatten()
        keep: dict = {}
        logits, values = net(torch.cat(b_obs), keep)
        dist = torch.distributions.Categorical(logits=logits)
        adv = targets - values
        loss = (
            -(dist.log_prob(torch.cat(b_act)) * adv.detach()).mean()
            + 0.5 * adv.pow(2).mean()
            - 0.01 * dist.entropy().mean()
        )
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        opt.step()
        frames += args.steps * args.envs * 4
        if time.time() - last_log > 10:
            last_log = time.time()
            centred = logits - logits.mean(-1, keepdim=True)
            m = {
                "frames": frames,
                "elapsed_s": time.time() - start,
                "episode_return": float(np.mean(returns)) if returns else None,
                "entropy": float(dist.entropy().mean()),
                "logit_spread": float(centred.std(0).mean()),
                "dead/fc": float(1 - (keep["fc"] > 0).any(0).float().mean()),
                "dead/conv3": float(1 - (keep["conv3"] > 0).flatten(1).any(0).float().mean()),
                "frames_per_s": frames / (time.time() - start),
            }
            log.write(json.dumps(m) + "\n")
            log.flush()
    env.close()


if __name__ == "__main__":
    main()
