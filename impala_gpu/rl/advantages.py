"""Advantage normalisation over a batch's valid steps, or over every share of a minibatch that
is split over threads (``learner_shards``) or processes (``learners``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["MomentsReduce", "masked_sum", "normalized"]

# One share's advantage moments ``[3]`` (valid count, sum, sum of squares; float64) -> the same
# summed over every share of the minibatch, when a minibatch is split over threads
# (``learner_shards``) or processes (``learners``), so that every share normalises alike.
MomentsReduce = Callable[[torch.Tensor], torch.Tensor]


def masked_sum(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over its ``valid`` entries (same shape, bool), 0-dim."""
    # torch.where (not a multiply) so NaN/inf in masked-out slots cannot leak through.
    return torch.where(valid, x, torch.zeros_like(x)).sum()


def normalized(
    x: torch.Tensor, valid: torch.Tensor, eps: float = 1e-8, reduce: MomentsReduce | None = None
) -> torch.Tensor:
    """``x [T, B]`` shifted and scaled to mean 0, std 1 over its ``valid`` entries (0 elsewhere);
    with ``reduce``, over the valid entries of every share whose moments ``reduce`` sums."""
    if reduce is not None:
        return _normalized_over_shares(x, valid, eps, reduce)
    n = valid.sum().clamp(min=1)
    mean = masked_sum(x, valid) / n
    var = masked_sum((x - mean) ** 2, valid) / (n - 1).clamp(min=1)
    return torch.where(valid, (x - mean) / (var.sqrt() + eps), torch.zeros_like(x))


def _normalized_over_shares(
    x: torch.Tensor, valid: torch.Tensor, eps: float, reduce: MomentsReduce
) -> torch.Tensor:
    x64 = torch.where(valid, x.double(), torch.zeros_like(x, dtype=torch.float64))
    moments = torch.stack([valid.sum().double(), x64.sum(), x64.square().sum()])
    n, total, squares = reduce(moments).unbind()
    n = n.clamp(min=1)
    mean = total / n
    # float64: the one-pass variance loses ~1e-16 relative per term, not fp32's 1e-7
    var = ((squares - n * mean * mean) / (n - 1).clamp(min=1)).clamp(min=0)
    scaled = (x - mean.to(x.dtype)) / (var.sqrt().to(x.dtype) + eps)
    return torch.where(valid, scaled, torch.zeros_like(x))
