"""``learner_shards=N``: each SGD step's minibatch split by trajectory into N shards, whose
forward and backward passes run at the same time on N threads of the learner process, one
torch thread each; their gradients are summed, weighted, into one optimizer step.

Why not N torch (OpenMP) threads: on a small CPU box the learner shares its cores with the
actors. OpenMP splits every kernel evenly and waits at its end, so when the OS gives one
learner thread's core to an actor, the other learner thread waits too, hundreds of times per
update. Shards wait for each other once per step, and while one waits the actor and the other
shard keep both cores busy (docs/performance.md, ``learner_shards``).

The weighted sum is the gradient of the whole minibatch's loss: for a mean over valid steps
each shard's loss is weighed by its share of the valid steps, for a sum by 1. What is computed
per shard: ``algo.normalize_advantages`` normalises within each shard, as with ``learners=N``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor, nn

from impala_gpu.rl.losses import LossOutput

# What ``loss_stats`` holds: the loss and its terms (weighted like the loss), then means over
# valid steps (weighted by each shard's share of them). STAT_NAMES less grad_norm and nonfinite.
LOSS_TERMS = ("total_loss", "pg_loss", "baseline_loss", "entropy_loss")
VALID_MEANS = (
    "entropy",
    "clipped_rho_fraction",
    "clipped_pg_rho_fraction",
    "mean_rho",
    "mean_abs_log_rho",
    "kl_behavior_target",
)
LOSS_STATS = LOSS_TERMS + VALID_MEANS

# One shard's step: its trajectories' indices [b] -> its loss (with graph) and what to keep.
ShardLoss = Callable[[Tensor], tuple[LossOutput, Tensor]]


def loss_stats(loss: LossOutput) -> Tensor:
    """``[len(LOSS_STATS)]``, in that order, detached, fp32."""
    return torch.stack(
        [
            loss.total.detach(),
            loss.pg_loss,
            loss.baseline_loss,
            loss.entropy_loss,
            loss.entropy,
            loss.clipped_rho_fraction,
            loss.clipped_pg_rho_fraction,
            loss.mean_rho,
            loss.mean_abs_log_rho,
            loss.kl_behavior_target,
        ]
    ).float()


def shard_weights(num_valid: Sequence[float], reduction: str) -> tuple[list[float], list[float]]:
    """``(loss weights, valid-step fractions)`` of the shards with ``num_valid`` valid steps
    each: the loss weights make the weighted sum of the shards' losses the whole minibatch's
    loss (1 each for a sum; each shard's fraction of the valid steps for a mean)."""
    counts = [max(float(n), 1.0) for n in num_valid]
    fractions = [n / sum(counts) for n in counts]
    return ([1.0] * len(counts) if reduction == "sum" else fractions), fractions


class ShardThreads:
    """The N - 1 threads besides the caller's (which runs shard 0) of ``learner_shards=N``."""

    def __init__(self, count: int):
        if count < 2:
            raise ValueError(f"ShardThreads needs 2 or more shards, not {count}.")
        self.count = count
        # One torch thread per shard (the setting is process-wide: the caller's too).
        self.pool = ThreadPoolExecutor(
            count - 1,
            thread_name_prefix="learner-shard",
            initializer=torch.set_num_threads,
            initargs=(1,),
        )

    def backward(
        self,
        shard_loss: ShardLoss,
        B: int,
        params: list[nn.Parameter],
        reduction: str,
        grad_scale: float = 1.0,
    ) -> tuple[Tensor, Tensor]:
        """Run ``shard_loss`` on ``count`` contiguous slices of the ``B`` trajectories at once,
        and set each parameter's ``.grad`` to the weighted sum of the shards' gradients (times
        ``grad_scale``). Returns the minibatch's ``loss_stats`` and the shards' kept tensors
        concatenated along dim 1 (B), in trajectory order."""
        parts = torch.arange(B).chunk(self.count)

        def run(index: Tensor) -> tuple[LossOutput, Tensor, tuple[Tensor | None, ...]]:
            loss, kept = shard_loss(index)
            grads = torch.autograd.grad(loss.total, params, allow_unused=True)
            return loss, kept, grads

        futures = [self.pool.submit(run, index) for index in parts[1:]]
        results = [run(parts[0])] + [f.result() for f in futures]
        weights, fractions = shard_weights([r[0].num_valid.item() for r in results], reduction)
        for i, p in enumerate(params):
            p.grad = _weighted_sum([r[2][i] for r in results], weights, grad_scale)
        stats = [loss_stats(r[0]) for r in results]
        terms = len(LOSS_TERMS)
        combined = torch.cat(
            [
                sum(w * s[:terms] for w, s in zip(weights, stats, strict=True)),
                sum(f * s[terms:] for f, s in zip(fractions, stats, strict=True)),
            ]
        )
        return combined, torch.cat([r[1] for r in results], dim=1)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _weighted_sum(grads: list[Tensor | None], weights: list[float], scale: float) -> Tensor | None:
    present = [(g, w) for g, w in zip(grads, weights, strict=True) if g is not None]
    if not present:
        return None
    total = present[0][0] * (present[0][1] * scale)
    for g, w in present[1:]:
        total.add_(g, alpha=w * scale)
    return total
