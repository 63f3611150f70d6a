"""``learner_shards=N``: each SGD step's minibatch split by trajectory into N shards, whose
forward and backward passes run at the same time on N threads of the learner process, one
torch thread each; their gradients are summed, weighted, into one optimizer step.

Why not N torch (OpenMP) threads: on a small CPU box the learner shares its cores with the
actors. OpenMP splits every kernel evenly and waits at its end, so when the OS gives one
learner thread's core to an actor, the other learner thread waits too, hundreds of times per
update. Shards wait for each other once per step, and while one waits the actor and the other
shard keep both cores busy (docs/performance.md, ``learner_shards``).

The weighted sum is the gradient of the whole minibatch's loss: for a mean over valid steps
each shard's loss is weighed by its share of the valid steps, for a sum by 1. With
``algo.normalize_advantages`` the shards also meet once mid-step, to sum their advantages'
moments, so each normalises by the whole minibatch's mean and standard deviation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor, nn

from impala_gpu.rl.losses import LossOutput, MomentsReduce

# What ``loss_stats`` holds: the loss and its terms (weighted like the loss), then means over
# valid steps (weighted by each shard's share of them). STAT_NAMES less grad_norm and nonfinite.
LOSS_TERMS = ("total_loss", "pg_loss", "baseline_loss", "entropy_loss")
VALID_MEANS = (
    "entropy",
    "clipped_rho_fraction",
    "clipped_pg_rho_fraction",
    "behavior_clipped_fraction",
    "mean_rho",
    "mean_abs_log_rho",
    "kl_behavior_target",
)
LOSS_STATS = LOSS_TERMS + VALID_MEANS

# One shard's step: its trajectories' indices [b] and the sum of the shards' advantage moments
# -> its loss (with graph) and what to keep.
ShardLoss = Callable[[Tensor, MomentsReduce], tuple[LossOutput, Tensor]]


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
            loss.behavior_clipped_fraction,
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
        parts = torch.arange(B).tensor_split(self.count)  # chunk() may give fewer
        moments = MomentsSum(self.count)

        def run(shard: int) -> tuple[LossOutput, Tensor, tuple[Tensor | None, ...]]:
            try:
                loss, kept = shard_loss(parts[shard], lambda m: moments.reduce(shard, m))
                grads = torch.autograd.grad(loss.total, params, allow_unused=True)
            except BaseException:
                moments.abort()  # the other shards must not wait for this one's moments
                raise
            return loss, kept, grads

        futures = [self.pool.submit(run, shard) for shard in range(1, self.count)]
        results = _all_or_first_error([lambda: run(0)] + [f.result for f in futures])
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


class MomentsSum:
    """``MomentsReduce`` for shards on threads: each shard hands in its moments ``[3]``, waits
    until every shard has, and gets their sum (in shard order, so the same on every shard)."""

    def __init__(self, count: int):
        self.parts: list[Tensor | None] = [None] * count
        self.barrier = threading.Barrier(count)

    def reduce(self, shard: int, moments: Tensor) -> Tensor:
        self.parts[shard] = moments
        self.barrier.wait()
        return torch.stack(self.parts).sum(0)  # type: ignore[arg-type]

    def abort(self) -> None:
        self.barrier.abort()


def _all_or_first_error(calls: list[Callable[[], tuple]]) -> list[tuple]:
    """Every call's result once all have returned; else the first error that is not another
    shard's broken barrier (which only says that some shard failed)."""
    results, errors = [], []
    for call in calls:
        try:
            results.append(call())
        except BaseException as error:
            errors.append(error)
    if errors:
        first = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        raise (first or errors)[0]
    return results


def _weighted_sum(grads: list[Tensor | None], weights: list[float], scale: float) -> Tensor | None:
    present = [(g, w) for g, w in zip(grads, weights, strict=True) if g is not None]
    if not present:
        return None
    total = present[0][0] * (present[0][1] * scale)
    for g, w in present[1:]:
        total.add_(g, alpha=w * scale)
    return total
