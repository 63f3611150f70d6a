"""Learner: one update of the policy on a batch from ``learning.batcher``, read top to bottom in
``Learner.update`` (epochs of minibatches) and ``Learner.sgd_step`` (forward, V-trace targets and
loss, backward, clip, step). Nothing in an update reads a device value on the host: the stats
stay on the device, a non-finite step is skipped on the device (``masked_step``) and minibatch
indices are drawn there, so a CUDA learner can queue update n+1 while update n runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from impala_gpu.channels.ring import STEP_FIELDS
from impala_gpu.config import AlgoCfg, Config, frames_per_update
from impala_gpu.envs import EnvSpec
from impala_gpu.learning.batcher import Batch
from impala_gpu.learning.optim import make_lr_scheduler, make_optimizer
from impala_gpu.learning.shards import LOSS_STATS, ShardThreads, loss_stats
from impala_gpu.models import PolicyOutput, build_model
from impala_gpu.rl.losses import (
    LossOptions,
    LossOutput,
    MomentsReduce,
    discounts_from_terminated,
    impala_loss,
)
from impala_gpu.speed.compile import compile_model
from impala_gpu.speed.precision import autocast
from impala_gpu.telemetry import health
from impala_gpu.telemetry.health import layer_grad_norms

STAT_NAMES = (
    "total_loss",
    "pg_loss",
    "baseline_loss",
    "entropy_loss",
    "entropy",
    "grad_norm",
    "clipped_rho_fraction",
    "clipped_pg_rho_fraction",
    "behavior_clipped_fraction",
    "mean_rho",
    "mean_abs_log_rho",
    "kl_behavior_target",
    "nonfinite",
)
_GRAD_NORM = STAT_NAMES.index("grad_norm")
assert STAT_NAMES == LOSS_STATS[:_GRAD_NORM] + ("grad_norm",) + LOSS_STATS[_GRAD_NORM:] + (
    "nonfinite",
)


def masked_step(optimizer: torch.optim.Optimizer, finite: Tensor) -> None:
    """``optimizer.step()`` where the 0-dim bool ``finite`` holds, and no change at all to the
    weights or the optimizer's state where it does not, without the host reading the flag.

    Fused Adam (the default recipe's, ``optim.make_optimizer``) skips a step on the device
    given ``found_inf``, as AMP's grad scaler has it do. Other optimizers: on the CPU the flag
    is already computed, so reading it waits for nothing; on a device the step runs and every
    tensor it changed is put back where the flag is false."""
    if getattr(optimizer, "_step_supports_amp_scaling", False) and _fused(optimizer):
        optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
        return
    if finite.device.type == "cpu":
        if bool(finite):
            optimizer.step()
        return
    _restoring_step(optimizer, finite)


def _restoring_step(optimizer: torch.optim.Optimizer, finite: Tensor) -> None:
    """The step, then every tensor it changed put back where ``finite`` is false."""
    before = _state_tensors(optimizer)
    saved = [t.clone() for t in before]
    optimizer.step()
    with torch.no_grad():
        for t, old in zip(before, saved, strict=True):
            t.copy_(torch.where(finite, t, old))


def _fused(optimizer: torch.optim.Optimizer) -> bool:
    return all(group.get("fused") for group in optimizer.param_groups)


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The parameters and the per-parameter state a step changes in place, on the device."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = [
        t
        for p in params
        for t in optimizer.state.get(p, {}).values()
        if isinstance(t, Tensor) and t.device == p.device
    ]
    return [p.data for p in params] + state


def step_stats(
    terms: Tensor, grad_norm: Tensor, finite: Tensor, layer_norms: Tensor | None
) -> Tensor:
    """One SGD step's stats in STAT_NAMES order (``terms``: ``loss_stats``), then each named
    layer's gradient norm; one tensor on the learner's device, so reading them is one copy."""
    at = _GRAD_NORM  # STAT_NAMES is LOSS_STATS with grad_norm at `at` and nonfinite last
    parts = [
        terms[:at],
        grad_norm.detach().float().reshape(1),
        terms[at:],
        (~finite).float().reshape(1),
    ]
    if layer_norms is not None:
        parts.append(layer_norms.to(terms.device))
    return torch.cat(parts)


def loss_options(algo: AlgoCfg) -> LossOptions:
    """``algo``'s options for ``impala_loss``: LossOptions's fields are AlgoCfg's keys of the
    same names."""
    return LossOptions(**{f.name: getattr(algo, f.name) for f in fields(LossOptions)})


def step_loss(
    model: nn.Module,
    batch: Batch,
    learner: Learner,
    reference_logits: Tensor | None = None,
    moments_reduce: MomentsReduce | None = None,
) -> tuple[LossOutput, Tensor]:
    """Forward, V-trace targets and loss of ``batch`` (step fields ``[T+1, b]``; the graph kept
    for backward) with ``learner``'s config, loss options and precision, and the policy's
    detached logits on all its steps ``[T+1, b, A]``. ``model``: the learner's, DDP-wrapped
    where it is; ``reference_logits [T+1, b, A]``: what ``ppo_clip`` clips against
    (``impala_loss``); ``moments_reduce``: this batch is one share of the minibatch, whose
    advantage moments it sums."""
    algo = learner.algo
    out, bootstrap = forward_with_bootstrap(model, batch, learner.precision)
    logits, values = out.logits.float(), out.value.float()  # [T, b, A], [T, b]
    if reference_logits is not None:
        reference_logits = reference_logits[:-1]  # kept as [T+1]; step T is never read
    elif algo.ppo_clip > 0 and algo.ppo_reference == "first_visit":
        reference_logits = logits.detach()  # the first visit: its own anchor, ratio 1
    bootstrap_value = bootstrap.value[0].float()
    loss = batch_loss(
        batch, learner.loss_options, algo.discount, logits, values, bootstrap_value,
        reference_logits, moments_reduce,
    )  # fmt: skip
    return loss, torch.cat([out.logits.detach(), bootstrap.logits])


def batch_loss(
    batch: Batch,
    options: LossOptions,
    discount: float,
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
        discounts=discounts_from_terminated(batch.terminated[1:], discount),
        # The step out of a final observation only leads to the next episode's reset obs.
        valid=~(batch.terminated[:-1] | batch.truncated[:-1]),
        options=options,
        reference_logits=reference_logits_t,
        advantage_moments=moments_reduce,
    )


def forward_with_bootstrap(
    model: Callable[..., PolicyOutput], batch: Batch, precision: str
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
    on_device = index.to(batch.obs.device)  # shards index on the host; a no-op otherwise
    steps = {name: getattr(batch, name).index_select(1, on_device) for name in STEP_FIELDS}
    core = tuple(c.index_select(0, on_device) for c in batch.core_state)
    return Batch(**steps, core_state=core, versions=batch.versions, replayed=batch.replayed)


# Every 4th step of an unroll: with a stack of 4 frames, those stacks hold each frame of the
# unroll once, so the statistics see what the full batch holds at a quarter of the cost (the
# full update took 9% of the default recipe's learner time: docs/results/pong.md).
INPUT_STATS_STRIDE = 4


def absorb_input_stats(model: nn.Module, batch: Batch, replays: bool = False) -> None:
    """Merge a fresh batch's frames into the policy's input statistics, if it keeps any
    (``model.normalize_input``); with ``replays``, the batch's replayed frames are left out
    (they were counted when they were fresh). Takes steps 1, 1 + ``INPUT_STATS_STRIDE``, ...
    of ``obs [T+1, B, ...]``: step 0 is the previous unroll's step T, counted with it."""
    obs_norm = getattr(model, "obs_norm", None)
    if obs_norm is None:
        return
    obs = batch.obs[1::INPUT_STATS_STRIDE]  # [ceil(T / stride), B, *obs_shape]
    if replays:
        fresh = (~batch.replayed).nonzero().flatten().to(obs.device)  # host-side metadata
        obs = obs.index_select(1, fresh)
    obs_norm.update(obs)


_NONFINITE = STAT_NAMES.index("nonfinite")


class NonfiniteGuard:
    """Counts consecutive NaN/inf updates (``masked_step`` skips them, so the weights stay
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


@dataclass
class TargetNetwork:
    """IMPACT's target network (Luo et al., 2020, "IMPACT: Importance Weighted Asynchronous
    Architectures with Clipped Target Networks"): the learner's weights and buffers as they were
    at its last refresh, every ``interval`` updates. With ``algo.ppo_reference=target`` the
    clip's ratio is pi / pi_target, weighted by min(rho-bar, pi_target / mu), so a batch
    several updates stale is clipped against a policy nearer its actors' than the learner's.
    A snapshot run through the learner's own module (``functional_call``), not a second
    module: it holds no optimizer state and follows ``model.compile``."""

    interval: int
    state: dict[str, Tensor] | None = None
    age: int = 0  # updates since the last refresh

    def logits(self, model: nn.Module, batch: Batch, precision: str) -> Tensor:
        """The target's logits on every step of ``batch`` (``[T+1, B, A]``, float32, no
        gradient), refreshed from ``model`` first when ``interval`` updates have passed (and
        at the first update, a resumed run's included)."""
        if self.state is None or self.age >= self.interval:
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            self.age = 0
        self.age += 1
        state = self.state

        def target(*args: Any) -> PolicyOutput:
            return torch.func.functional_call(model, state, args)

        with torch.no_grad():
            out, bootstrap = forward_with_bootstrap(target, batch, precision)
        return torch.cat([out.logits, bootstrap.logits]).float()


def target_network(algo: AlgoCfg) -> TargetNetwork | None:
    """The target network ``algo`` clips against, if any (``ppo_reference=target``)."""
    if algo.ppo_clip > 0 and algo.ppo_reference == "target":
        return TargetNetwork(algo.target_interval)
    return None


class Parallel(Protocol):
    """What an update uses of its learner rank's place in ``learners=N``
    (``learning.distributed.Ranks``). A protocol, not an import: ``distributed`` builds its
    ranks' learners from this module."""

    model: nn.Module  # the DDP-wrapped model

    def share(self, batch: Batch | None) -> tuple[Batch, float]:
        """This rank's share of rank 0's ``batch`` (None on the other ranks) and its loss
        scale."""
        ...

    def sync_input_stats(self, policy: nn.Module) -> None:
        """Rank 0's input statistics to every rank."""
        ...

    def sum_moments(self, moments: Tensor) -> Tensor: ...

    def mean(self, stats: Tensor) -> Tensor: ...

    def close(self) -> None: ...


@dataclass
class Learner:
    """The model and what updates it. ``update`` is the one place an update happens: for
    IMPALA's learner, each of its ``learners=N`` ranks, A3C's workers and the benchmarks."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    algo: AlgoCfg
    precision: str = "fp32"
    scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
    grad_names: list[str] = field(default_factory=list)  # layers whose grad norms are reported
    grad_groups: list | None = None  # their parameters (health.grad_groups); None: health off
    nonfinite: NonfiniteGuard = field(default_factory=lambda: NonfiniteGuard(10))
    parallel: Parallel | None = None  # learners > 1: DDP, the batch's shares, sums over ranks
    shards: ShardThreads | None = None  # learner_shards > 1: each SGD step split over threads
    absorbs_input_stats: bool = True  # False: the statistics are someone else's (A3C)
    replays: bool = False  # batches mix in replayed trajectories (replay.capacity > 0)
    loss_options: LossOptions = field(init=False)  # loss_options(algo), built once
    target: TargetNetwork | None = field(init=False)  # ppo_reference=target's anchor

    def __post_init__(self) -> None:
        self.loss_options = loss_options(self.algo)
        self.target = target_network(self.algo)

    def update(self, batch: Batch | None) -> Tensor:
        """One update on ``batch`` (step fields ``[T+1, B]``; None on a rank > 0 of
        ``learners=N``, which gets its share from rank 0): ``algo.epochs`` passes, each of
        ``algo.minibatches`` shuffled SGD steps over whole trajectories (PPO's sample reuse;
        each step recomputes V-trace with the current weights).

        Returns the steps' mean stats on the learner's device, in STAT_NAMES order, then the
        layers' gradient norms; ``nonfinite`` is the fraction of steps skipped. Nothing here
        waits for the device: the caller reads the stats when it needs them."""
        if batch is not None and self.absorbs_input_stats:
            absorb_input_stats(self.model, batch, self.replays)  # the whole batch, rank 0
        scale, reduce = 1.0, None
        if self.parallel is not None:  # DDP averages the ranks' gradients in backward
            batch, scale = self.parallel.share(batch)
            self.parallel.sync_input_stats(self.model)
            reduce = self.parallel.sum_moments
        stats = self.sgd_passes(batch, scale, reduce)
        return stats if self.parallel is None else self.parallel.mean(stats)

    def sgd_passes(
        self, batch: Batch, scale: float = 1.0, reduce: MomentsReduce | None = None
    ) -> Tensor:
        """``update``'s epochs of minibatches on ``batch``; their mean stats."""
        algo, B = self.algo, batch.obs.shape[1]
        targets = None  # [T+1, B, A]: the target network's logits, for the whole update
        if self.target is not None:
            targets = self.target.logits(self.model, batch, self.precision)
        if algo.epochs == 1 and algo.minibatches == 1:
            return self.sgd_step(batch, targets, scale, reduce)[0]
        # first_visit: each trajectory's logits when the first epoch trained on it (the clip's
        # anchor, so its ratio starts at 1 whatever the actor's lag).
        first_visit = algo.ppo_clip > 0 and algo.ppo_reference == "first_visit"
        anchors = torch.empty_like(batch.logits, dtype=torch.float32) if first_visit else None
        total = None
        for epoch in range(algo.epochs):
            # Drawn on the device: indices from the host would be a copy, and a sync, each.
            order = torch.randperm(B, device=batch.obs.device)
            for index in order.tensor_split(algo.minibatches):  # chunk() may give fewer
                reference = None
                if targets is not None:
                    reference = targets.index_select(1, index)
                elif anchors is not None and epoch > 0:
                    reference = anchors.index_select(1, index)
                stats, logits = self.sgd_step(minibatch(batch, index), reference, scale, reduce)
                if anchors is not None and epoch == 0:
                    anchors.index_copy_(1, index, logits.float())
                total = stats if total is None else total + stats
        return total / (algo.epochs * algo.minibatches)

    def sgd_step(
        self,
        batch: Batch,
        reference_logits: Tensor | None = None,
        scale: float = 1.0,
        reduce: MomentsReduce | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Forward, V-trace targets and loss, backward, clip and step on ``batch`` (step
        fields ``[T+1, b]``); a non-finite step changes nothing. ``reference_logits [T+1, b,
        A]``: the clip's anchor (``impala_loss``); ``scale`` multiplies the loss before
        backward (``learners=N``; the reported loss is unscaled). Returns the stats
        (``step_stats``) and the policy's detached logits ``[T+1, b, A]``."""
        model = self.model if self.parallel is None else self.parallel.model
        self.optimizer.zero_grad(set_to_none=True)
        if self.shards is None:
            loss, logits = step_loss(model, batch, self, reference_logits, reduce)
            (loss.total * scale if scale != 1.0 else loss.total).backward()
            terms = loss_stats(loss)
        else:
            terms, logits = self._shard_backward(batch, reference_logits, scale)
        layer_norms = layer_grad_norms(self.grad_groups) if self.grad_groups else None
        max_norm = self.algo.grad_norm_clip if self.algo.grad_norm_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        finite = torch.isfinite(grad_norm) & torch.isfinite(terms[0])
        masked_step(self.optimizer, finite)
        return step_stats(terms, grad_norm, finite, layer_norms), logits

    def _shard_backward(
        self, batch: Batch, reference_logits: Tensor | None, scale: float
    ) -> tuple[Tensor, Tensor]:
        """``learner_shards``: forward and backward of ``batch`` split by trajectory over the
        shard threads; the grads summed, weighted, into ``.grad``."""

        def shard_loss(index: Tensor, reduce: MomentsReduce) -> tuple[LossOutput, Tensor]:
            reference = reference_logits
            if reference is not None:
                reference = reference.index_select(1, index.to(reference.device))
            share = minibatch(batch, index)
            return step_loss(self.model, share, self, reference, reduce)

        params = [p for p in self.model.parameters() if p.requires_grad]
        assert self.shards is not None
        B = batch.obs.shape[1]
        return self.shards.backward(shard_loss, B, params, self.algo.reduction, scale)

    def close(self) -> None:
        """Stop the learner's threads and, with learners > 1, the other ranks."""
        if self.shards is not None:
            self.shards.close()
        if self.parallel is not None:
            self.parallel.close()

    def checkpoint_state(self) -> dict[str, Any]:
        """The learner's part of a checkpoint (``build_learner``'s ``restore`` loads it back)."""
        assert self.scheduler is not None
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
    ``restore(model, optimizer=, scheduler=)`` (``lifecycle.run.Resume.load``) loads them from
    its checkpoint before ``data_parallel(model, optimizer, scheduler)`` (learners > 1) hands
    them to the other ranks, so every rank starts from the checkpoint."""
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model).to(device)
    optimizer = make_optimizer(model, cfg.algo)
    compile_model(model, cfg.compile)
    scheduler = make_lr_scheduler(optimizer, cfg, frames_per_update(cfg, spec.frames_per_step))
    grad_names, grad_groups = health.grad_groups(model) if cfg.health.enabled else ([], None)
    if restore is not None:
        restore(model, optimizer=optimizer, scheduler=scheduler)
    parallel = data_parallel(model, optimizer, scheduler) if data_parallel is not None else None
    return Learner(
        model,
        optimizer,
        cfg.algo,
        cfg.precision,
        scheduler,
        grad_names,
        grad_groups,
        NonfiniteGuard(cfg.max_nonfinite_updates),
        parallel,
        ShardThreads(cfg.learner_shards) if cfg.learner_shards > 1 else None,
        replays=cfg.replay.capacity > 0,
    )
