"""Per-pixel running mean and variance of the observations (rl_games' ``normalize_input``).

On Atari most pixels are background that never changes; scaled by 1/255 they still dominate
the first layer's input. Centred and divided by their own spread, constant pixels go to 0 and
the few that move (ball, paddles) stand out from the first update.

The statistics are parameters without gradient, so that checkpoints and the parameter store
carry them to the actors with the weights; only the learner updates them, once per batch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ObsNormalizer(nn.Module):
    """``(x - mean) / sqrt(var + eps)``, clipped to ``[-clip, clip]``, per element of the
    observation shape. ``update`` merges a batch's moments (Chan et al.'s parallel variance)."""

    def __init__(self, obs_shape: tuple[int, ...], clip: float = 5.0, eps: float = 1e-5):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.mean = nn.Parameter(torch.zeros(obs_shape), requires_grad=False)
        self.var = nn.Parameter(torch.ones(obs_shape), requires_grad=False)
        # A tiny prior count: the first batch's moments replace the prior almost entirely.
        self.count = nn.Parameter(torch.full((), 1e-4), requires_grad=False)

    @torch.no_grad()
    def update(self, obs: Tensor) -> None:
        """Merge ``obs [..., *obs_shape]`` (any leading dims, any dtype) into the moments."""
        x = obs.reshape(-1, *self.mean.shape).float()
        n = float(x.shape[0])
        batch_var, batch_mean = torch.var_mean(x, dim=0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta.square() * (self.count * n / total)
        self.mean.add_(delta * (n / total))
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: Tensor) -> Tensor:
        """``x [N, *obs_shape]`` -> fp32 normalised: ``x * scale + shift`` in one fused op."""
        scale = torch.rsqrt(self.var + self.eps)  # [*obs_shape]: small next to x
        shift = -self.mean * scale
        return torch.addcmul(shift, x.float(), scale).clamp_(-self.clip, self.clip)
