"""Learner: the train step (forward, V-trace loss, backward, clipping, the optimizer step), the
optimizers and the learning-rate schedule. Batches come from ``learning.batcher``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from impala_gpu.channels.ring import STEP_FIELDS
from impala_gpu.config import AlgoCfg, Config, fresh_batch_size
from impala_gpu.envs import EnvSpec
from impala_gpu.learning.batcher import Batch
from impala_gpu.learning.optim import OPTIMIZERS, RMSpropTF
from impala_gpu.learning.shards import LOSS_STATS, ShardThreads, loss_stats
from impala_gpu.models import PolicyOutput, build_model
from impala_gpu.reporting import health
from impala_gpu.reporting.health import layer_grad_norms
from impala_gpu.rl.losses import (
    LossOutput,
    MomentsReduce,
    discounts_from_terminated,
    impala_loss,
)
from impala_gpu.speed import autocast, compile_model


def make_optimizer(model: nn.Module, algo: AlgoCfg) -> torch.optim.Optimizer:
    if algo.optimizer in ("rmsprop", "rmsprop_tf"):
        rmsprop = torch.optim.RMSprop if algo.optimizer == "rmsprop" else RMSpropTF
        return rmsprop(
            model.parameters(),
            lr=algo.learning_rate,
            alpha=algo.rmsprop_alpha,
            eps=algo.rmsprop_eps,
            momentum=algo.rmsprop_momentum,
        )
    if algo.optimizer == "adam":
        return torch.optim.Adam(
            model.parameters(),
            lr=algo.learning_rate,
            betas=(algo.adam_beta1, algo.adam_beta2),
            eps=algo.adam_eps,
        )
    raise ValueError(f"algo.optimizer={algo.optimizer!r} is not one of {OPTIMIZERS}.")


def lr_factor(cfg: Config, frames: int) -> float:
    """The learning rate's multiplier after ``frames`` frames: linear decay to 0 over
    ``algo.lr_decay_frames`` (0: over ``total_frames``, the paper's, which ties the schedule
    to the budget), or 1 for a constant schedule."""
    if cfg.algo.lr_schedule == "constant":
        return 1.0
    if cfg.algo.lr_schedule != "linear":
        raise ValueError(
            f"algo.lr_schedule={cfg.algo.lr_schedule!r} is not 'linear' or 'constant'."
        )
    horizon = cfg.algo.lr_decay_frames or cfg.total_frames
    return max(0.0, 1.0 - frames / max(1, horizon))


def make_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: Config, frames_per_update: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``lr_factor`` per update, as a torch scheduler (its state goes into checkpoints)."""
    lr_factor(cfg, 0)  # fail early on an unknown schedule
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda update: lr_factor(cfg, update * frames_per_update)
    )


STAT_NAMES = (
    "total_loss",
    "pg_loss",
    "baseline_loss",
    "entropy_loss",
    "entropy",
    "grad_norm",
    "clipped_rho_fraction",
    "clipped_pg_rho_fraction",
    "mean_rho",
    "mean_abs_log_rho",
    "kl_behavior_target",
    "nonfinite",
)
_GRAD_NORM = STAT_NAMES.index("grad_norm")
assert STAT_NAMES == LOSS_STATS[:_GRAD_NORM] + ("grad_norm",) + LOSS_STATS[_GRAD_NORM:] + (
    "nonfinite",
)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    algo: AlgoCfg,
    precision: str = "fp32",
    grad_groups: list[list[nn.Parameter]] | None = None,
    grad_scale: float = 1.0,
    reference_logits: Tensor | None = None,
    keep_logits: list[Tensor] | None = None,
    shards: ShardThreads | None = None,
    moments_reduce: MomentsReduce | None = None,
) -> Tensor:
    """One update on ``batch``. Returns the detached stats in STAT_NAMES order (one tensor,
    so reading them costs one device sync), followed, when ``grad_groups`` is given, by each
    group's gradient norm before clipping (``health.layer_grad_norms``).

    ``precision="bf16"`` runs the forward pass under bf16 autocast; V-trace and the loss are
    computed from fp32 casts of the logits and values, and backward runs outside autocast.
    ``grad_scale`` multiplies the loss before backward (data-parallel learners with a summed
    loss, ``learning.distributed``); the reported loss is unscaled. ``reference_logits``
    ``[T+1, B, A]``: the policy ``ppo_clip`` clips against (see ``impala_loss``); the step's
    own detached logits ``[T+1, B, A]`` are appended to ``keep_logits`` when it is given.
    ``shards`` (``learner_shards`` > 1): forward and backward split by trajectory over threads.
    ``moments_reduce``: this batch is one rank's share of the minibatch (``learners`` > 1);
    sums the ranks' advantage moments (``impala_loss``'s ``advantage_moments``).
    """

    def shard_loss(index: Tensor | None, reduce: MomentsReduce | None) -> tuple[LossOutput, Tensor]:
        share = batch if index is None else minibatch(batch, index)
        reference = reference_logits
        if reference is not None and index is not None:
            reference = reference.index_select(1, index.to(reference.device))
        return step_loss(model, share, algo, precision, reference, reduce)

    optimizer.zero_grad(set_to_none=True)
    if shards is None:
        loss, kept = shard_loss(None, moments_reduce)
        (loss.total * grad_scale if grad_scale != 1.0 else loss.total).backward()
        loss_terms = loss_stats(loss)
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        B = batch.obs.shape[1]
        loss_terms, kept = shards.backward(shard_loss, B, params, algo.reduction, grad_scale)
    layer_norms = layer_grad_norms(grad_groups) if grad_groups else None
    max_norm = algo.grad_norm_clip if algo.grad_norm_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    finite = torch.isfinite(grad_norm) & torch.isfinite(loss_terms[0])
    # A NaN/inf step is skipped, never applied: one sync, paid anyway when stats are read.
    if bool(finite):
        optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
    at = _GRAD_NORM  # STAT_NAMES is LOSS_STATS with grad_norm at `at` and nonfinite last
    stats = torch.cat(
        [
            loss_terms[:at],
            grad_norm.detach().float().reshape(1),
            loss_terms[at:],
            (~finite).float().reshape(1),
        ]
    )
    if keep_logits is not None:
        keep_logits.append(kept)
    return stats if layer_norms is None else torch.cat([stats, layer_norms.to(stats.device)])


def step_loss(
    model: nn.Module,
    batch: Batch,
    algo: AlgoCfg,
    precision: str,
    reference_logits: Tensor | None = None,
    moments_reduce: MomentsReduce | None = None,
) -> tuple[LossOutput, Tensor]:
    """The loss of ``batch`` (its graph kept for backward) and the policy's detached logits
    on all its steps ``[T+1, B, A]``. ``reference_logits [T+1, B, A]`` and ``moments_reduce``
    as in ``train_step``."""
    out, bootstrap = forward_with_bootstrap(model, batch, precision)
    logits, values = out.logits.float(), out.value.float()  # [T, B, A], [T, B]
    if reference_logits is not None:
        reference_logits = reference_logits[:-1]  # kept as [T+1]; step T is never read
    elif algo.ppo_clip > 0 and algo.ppo_reference == "first_visit":
        reference_logits = logits.detach()  # the first visit: its own anchor, ratio 1
    bootstrap_value = bootstrap.value[0].float()
    loss = batch_loss(
        batch, algo, logits, values, bootstrap_value, reference_logits, moments_reduce
    )
    return loss, torch.cat([out.logits.detach(), bootstrap.logits])


def batch_loss(
    batch: Batch,
    algo: AlgoCfg,
    logits_t: Tensor,
    values_t: Tensor,
    bootstrap_value: Tensor,
    reference_logits_t: Tensor | None = None,
    moments_reduce: MomentsReduce | None = None,
) -> LossOutput:
    """``impala_loss`` on ``batch`` (step fields ``[T+1, B]``, the ring's layout) with the
    policy's ``logits_t [T, B, A]``, ``values_t [T, B]`` and ``bootstrap_value`` ``V(o_T)
    [B]``; ``reference_logits_t [T, B, A]``: what ``ppo_clip`` clips against, if not mu."""
    return impala_loss(
        target_logits_t=logits_t,
        values_t=values_t,
        bootstrap_value=bootstrap_value,
        behavior_logits=batch.logits[:-1],
        actions=batch.action[:-1],
        rewards=batch.reward[1:],
        discounts=discounts_from_terminated(batch.terminated[1:], algo.discount),
        # The step out of a final observation only leads to the next episode's reset obs.
        valid=~(batch.terminated[:-1] | batch.truncated[:-1]),
        baseline_cost=algo.baseline_cost,
        entropy_cost=algo.entropy_cost,
        clip_rho_threshold=algo.clip_rho_threshold,
        clip_pg_rho_threshold=algo.clip_pg_rho_threshold,
        lambda_=algo.vtrace_lambda,
        reduction=algo.reduction,
        correction=algo.correction,
        normalize_advantages=algo.normalize_advantages,
        ppo_clip=algo.ppo_clip,
        reference_logits=reference_logits_t,
        advantage_moments=moments_reduce,
    )


def forward_with_bootstrap(
    model: nn.Module, batch: Batch, precision: str
) -> tuple[PolicyOutput, PolicyOutput]:
    """The policy on steps ``0..T-1`` of ``batch`` (``[T, B]``, with gradient) and on the
    bootstrap observation ``o_T`` (``[1, B]``, without: V-trace uses ``V(o_T)`` as a constant
    and never reads step T's logits), so backward does not pass through a row whose gradient is
    zero: 1/(T+1) of it, a sixth at T=5. An LSTM core carries its state into ``o_T``."""
    with autocast(batch.obs.device, precision):
        out = model(batch.obs[:-1], batch.first[:-1], batch.core_state)
        with torch.no_grad():
            bootstrap = model(batch.obs[-1:], batch.first[-1:], out.core_state)
    return out, bootstrap


def minibatch(batch: Batch, index: Tensor) -> Batch:
    """The trajectories ``index`` ``[b]`` of ``batch``: step fields ``[T+1, b, ...]``."""
    on_device = index.to(batch.obs.device)
    steps = {name: getattr(batch, name).index_select(1, on_device) for name in STEP_FIELDS}
    core = tuple(c.index_select(0, on_device) for c in batch.core_state)
    return Batch(**steps, core_state=core, versions=batch.versions, replayed=batch.replayed)


# Every 4th step of an unroll: with a stack of 4 frames, those stacks hold each frame of the
# unroll once, so the statistics see what the full batch holds at a quarter of the cost (the
# full update took 9% of the default recipe's learner time: docs/results/pong.md).
INPUT_STATS_STRIDE = 4


def update_input_stats(model: nn.Module, batch: Batch) -> None:
    """Merge a fresh batch's frames into the policy's input statistics, if it keeps any
    (``model.normalize_input``); replayed frames were counted when they were fresh. Takes
    steps 1, 1 + ``INPUT_STATS_STRIDE``, ... of ``obs [T+1, B, ...]``: step 0 is the previous
    unroll's step T, counted with it."""
    policy = getattr(model, "module", model)  # DistributedDataParallel wraps the policy
    if getattr(policy, "obs_norm", None) is None:
        return
    obs = batch.obs[1::INPUT_STATS_STRIDE]  # [ceil(T / stride), B, *obs_shape]
    if batch.replayed.numel() and bool(batch.replayed.any()):
        fresh = (~batch.replayed).nonzero().flatten().to(obs.device)
        obs = obs.index_select(1, fresh)
    policy.obs_norm.update(obs)


def sgd_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    algo: AlgoCfg,
    precision: str = "fp32",
    grad_groups: list[list[nn.Parameter]] | None = None,
    grad_scale: float = 1.0,
    shards: ShardThreads | None = None,
    moments_reduce: MomentsReduce | None = None,
) -> Tensor:
    """``algo.epochs`` passes over ``batch``, each in ``algo.minibatches`` shuffled
    ``train_step``s over whole trajectories (PPO's sample reuse; each step recomputes V-trace
    with the current weights). Returns the steps' mean stats, in ``train_step``'s layout; the
    ``nonfinite`` entry is the fraction of steps skipped. ``shards``, ``moments_reduce``: as in
    ``train_step``."""
    update_input_stats(model, batch)
    if algo.epochs == 1 and algo.minibatches == 1:
        return train_step(
            model,
            optimizer,
            batch,
            algo,
            precision,
            grad_groups,
            grad_scale,
            shards=shards,
            moments_reduce=moments_reduce,
        )
    B = batch.obs.shape[1]
    # first_visit: each trajectory's logits when the first step of this batch trained on it
    # (the clip's anchor, so its ratio starts at 1 whatever the actor's lag).
    first_visit = algo.ppo_clip > 0 and algo.ppo_reference == "first_visit"
    anchors = torch.empty_like(batch.logits, dtype=torch.float32) if first_visit else None
    total = None
    for epoch in range(algo.epochs):
        for index in torch.randperm(B).tensor_split(algo.minibatches):  # chunk() may give fewer
            on_device = index.to(batch.obs.device)
            reference = None
            if anchors is not None and epoch > 0:
                reference = anchors.index_select(1, on_device)
            kept: list[Tensor] | None = [] if anchors is not None and epoch == 0 else None
            stats = train_step(
                model,
                optimizer,
                minibatch(batch, index),
                algo,
                precision,
                grad_groups,
                grad_scale,
                reference,
                kept,
                shards,
                moments_reduce,
            )
            if kept:
                anchors.index_copy_(1, on_device, kept[0].float())
            total = stats if total is None else total + stats
    return total / (algo.epochs * algo.minibatches)


_NONFINITE = STAT_NAMES.index("nonfinite")


class NonfiniteGuard:
    """Counts consecutive NaN/inf updates (``train_step`` skips them, so the weights stay
    good); ``limit`` in a row is a run that cannot go on."""

    def __init__(self, limit: int):
        self.limit, self.streak = limit, 0

    def tripped(self, stats: np.ndarray) -> bool:
        """Take one update's stats (STAT_NAMES order); True once the streak reaches the limit.
        With sample reuse an update is several steps: it counts when every one was skipped."""
        self.streak = self.streak + 1 if stats[_NONFINITE] >= 1.0 else 0
        return self.streak >= self.limit

    def error(self, saved: Path | None = None) -> FloatingPointError:
        kept = f"skipped, last good state saved to {saved}" if saved else "skipped"
        return FloatingPointError(
            f"{self.streak} consecutive updates had a non-finite loss or gradient ({kept}). "
            "Fix: lower algo.learning_rate, check rewards/observations for NaN, or raise "
            "max_nonfinite_updates."
        )


class Parallel(Protocol):
    """What the train step uses of ``learning.distributed.DataParallel`` (learners > 1, rank 0).
    A protocol, not an import: ``distributed`` builds its ranks' learners from this module."""

    model: nn.Module  # the DDP-wrapped model

    def share(self, batch: Batch) -> tuple[Batch, float]:
        """Hand every rank its share of ``batch``; returns this rank's and its loss scale."""
        ...

    def close(self) -> None: ...


@dataclass
class Learner:
    """The learning side: the model and what updates it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    grad_names: list[str]  # named layers whose gradient norms are reported (health)
    grad_groups: list | None  # their parameters (health.grad_groups), or None when health is off
    nonfinite: NonfiniteGuard
    parallel: Parallel | None = None  # learners > 1 (rank 0): DDP and the batch scatter
    shards: ShardThreads | None = None  # learner_shards > 1: each SGD step split over threads

    def close(self) -> None:
        """Stop the learner's threads and, with learners > 1, the other ranks."""
        if self.shards is not None:
            self.shards.close()
        if self.parallel is not None:
            self.parallel.close()

    def checkpoint_state(self) -> dict[str, Any]:
        """The learner's part of a checkpoint (``build_learner``'s ``restore`` loads it back)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }


def build_learner(
    cfg: Config,
    spec: EnvSpec,
    device: torch.device,
    restore: Callable[..., None] | None = None,
    data_parallel: Callable[..., Parallel] | None = None,
) -> Learner:
    """The model, optimizer, LR schedule and non-finite guard. A resumed run's
    ``restore(model, optimizer=, scheduler=)`` (``reporting.run.Resume.load``) loads them from
    its checkpoint before ``data_parallel(model, optimizer, scheduler)`` (learners > 1) hands
    them to the other ranks, so every rank starts from the checkpoint."""
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model).to(device)
    optimizer = make_optimizer(model, cfg.algo)
    compile_model(model, cfg.compile)
    frames_per_update = fresh_batch_size(cfg) * cfg.unroll_length * spec.frames_per_step
    scheduler = make_lr_scheduler(optimizer, cfg, frames_per_update)
    grad_names, grad_groups = health.grad_groups(model) if cfg.health.enabled else ([], None)
    guard = NonfiniteGuard(cfg.max_nonfinite_updates)
    if restore is not None:
        restore(model, optimizer=optimizer, scheduler=scheduler)
    parallel = data_parallel(model, optimizer, scheduler) if data_parallel is not None else None
    shards = ShardThreads(cfg.learner_shards) if cfg.learner_shards > 1 else None
    return Learner(model, optimizer, scheduler, grad_names, grad_groups, guard, parallel, shards)
