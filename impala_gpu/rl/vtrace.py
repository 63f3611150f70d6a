"""V-trace off-policy actor-critic targets (Espeholt et al. 2018, "IMPALA").

All tensors are time-major: ``[T, B, ...]`` where ``T`` is the unroll length and
``B`` the batch size. The public API mirrors DeepMind's scalable_agent and
TorchBeast (``from_importance_weights``, ``from_logits``) so that results can be
compared against those references.

V-trace targets are regression targets and advantage estimates: every tensor they
produce is detached. The only exception is ``target_action_log_probs`` returned by
``from_logits``, which the learner needs with gradient for the policy-gradient loss.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "VTraceFromLogitsReturns",
    "VTraceReturns",
    "action_log_probs",
    "from_importance_weights",
    "from_logits",
]


class VTraceReturns(NamedTuple):
    """Output of :func:`from_importance_weights`.

    Attributes:
        vs: V-trace value targets, ``[T, B, ...]`` float32, detached.
        pg_advantages: Policy-gradient advantages, ``[T, B, ...]`` float32, detached.
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor


class VTraceFromLogitsReturns(NamedTuple):
    """Output of :func:`from_logits`.

    Attributes:
        vs: V-trace value targets, ``[T, B]`` float32, detached.
        pg_advantages: Policy-gradient advantages, ``[T, B]`` float32, detached.
        log_rhos: ``log pi(a|x) - log mu(a|x)``, ``[T, B]`` float32, detached.
        behavior_action_log_probs: ``log mu(a|x)``, ``[T, B]`` float32, detached.
        target_action_log_probs: ``log pi(a|x)``, ``[T, B]`` float32, WITH gradient.
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor
    log_rhos: torch.Tensor
    behavior_action_log_probs: torch.Tensor
    target_action_log_probs: torch.Tensor


def _check_threshold(name: str, value: float | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{name} must be non-negative or None, got {value}")


def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets and advantages from log importance weights.

    Args:
        log_rhos: ``log(pi(a_t|x_t) / mu(a_t|x_t))``, ``[T, B, ...]``. ``-inf`` is
            allowed and yields ``rho = 0`` (used to mask out transitions).
        discounts: Per-step discounts ``gamma * (1 - terminated_t)``, ``[T, B, ...]``.
        rewards: ``r_t``, ``[T, B, ...]``.
        values: ``V(x_t)``, ``[T, B, ...]``.
        bootstrap_value: ``V(x_T)``, ``[B, ...]``.
        clip_rho_threshold: ``rho_bar`` for the value targets; ``None`` disables clipping.
        clip_pg_rho_threshold: ``rho_bar`` for the pg advantages; ``None`` disables it.
        lambda_: Trace mixing coefficient; ``c_t = lambda_ * min(1, rho_t)``.

    Returns:
        :class:`VTraceReturns` with float32 ``vs`` and ``pg_advantages`` of shape
        ``[T, B, ...]``. Neither carries gradient.

    Raises:
        ValueError: on rank/shape mismatches, negative thresholds or ``lambda_``
            outside ``[0, 1]``.
    """
    _check_shapes(log_rhos, discounts, rewards, values, bootstrap_value)
    _check_threshold("clip_rho_threshold", clip_rho_threshold)
    _check_threshold("clip_pg_rho_threshold", clip_pg_rho_threshold)
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_ must be in [0, 1], got {lambda_}")

    with torch.no_grad():
        # Low-precision accumulation over T steps loses too much accuracy; always use fp32.
        log_rhos = log_rhos.detach().float()
        discounts_t = discounts.detach().float()
        rewards_t = rewards.detach().float()
        values_t = values.detach().float()
        bootstrap_value = bootstrap_value.detach().float()

        rhos = torch.exp(log_rhos)
        clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
        cs = lambda_ * rhos.clamp(max=1.0)

        values_tp1 = torch.cat([values_t[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = clipped_rhos * (rewards_t + discounts_t * values_tp1 - values_t)

        # Backward recursion vs_t - V(x_t) = delta_t + gamma_t c_t (vs_{t+1} - V(x_{t+1})).
        # T is small (tens of steps), so a Python loop is cheaper than a scan kernel.
        vs_minus_v = torch.empty_like(deltas)
        acc = torch.zeros_like(bootstrap_value)
        for t in range(deltas.shape[0] - 1, -1, -1):
            acc = deltas[t] + discounts_t[t] * cs[t] * acc
            vs_minus_v[t] = acc
        vs = vs_minus_v + values_t

        vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        clipped_pg_rhos = (
            rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
        )
        pg_advantages = clipped_pg_rhos * (rewards_t + discounts_t * vs_tp1 - values_t)

    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def _check_shapes(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
) -> None:
    """Step inputs ``[T, B, ...]`` of one shape; ``bootstrap_value`` ``[B, ...]``."""
    rank = rewards.dim()
    if rank < 2:
        raise ValueError(f"rewards must have rank >= 2 ([T, B, ...]), got shape {rewards.shape}")
    for name, tensor in (("log_rhos", log_rhos), ("discounts", discounts), ("values", values)):
        if tensor.dim() != rank:
            raise ValueError(
                f"{name} must have the same rank as rewards ({rank}), "
                f"got {name}.shape={tuple(tensor.shape)}, rewards.shape={tuple(rewards.shape)}"
            )
        if tensor.shape != rewards.shape:
            raise ValueError(
                f"{name} must have the same shape as rewards, "
                f"got {name}.shape={tuple(tensor.shape)}, rewards.shape={tuple(rewards.shape)}"
            )
    if bootstrap_value.dim() != rank - 1:
        raise ValueError(
            f"bootstrap_value must have rank values.rank - 1 = {rank - 1}, "
            f"got bootstrap_value.shape={tuple(bootstrap_value.shape)}"
        )
    if bootstrap_value.shape != values.shape[1:]:
        raise ValueError(
            f"bootstrap_value.shape must equal values.shape[1:]={tuple(values.shape[1:])}, "
            f"got {tuple(bootstrap_value.shape)}"
        )


def _check_logits_and_actions(policy_logits: torch.Tensor, actions: torch.Tensor) -> None:
    if policy_logits.dim() != 3:
        raise ValueError(
            f"policy logits must have rank 3 ([T, B, A]), got shape {tuple(policy_logits.shape)}"
        )
    if actions.dim() != 2:
        raise ValueError(f"actions must have rank 2 ([T, B]), got shape {tuple(actions.shape)}")
    if policy_logits.shape[:2] != actions.shape:
        raise ValueError(
            f"policy logits [T, B] dims {tuple(policy_logits.shape[:2])} do not match "
            f"actions shape {tuple(actions.shape)}"
        )


def action_log_probs(policy_logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``log softmax(policy_logits)[a_t]`` for the taken actions.

    Args:
        policy_logits: Unnormalised logits, ``[T, B, A]``.
        actions: Integer action indices, ``[T, B]``.

    Returns:
        float32 log-probabilities ``[T, B]``; differentiable w.r.t. ``policy_logits``.
    """
    _check_logits_and_actions(policy_logits, actions)
    log_probs = F.log_softmax(policy_logits.float(), dim=-1)
    return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def from_logits(
    behavior_policy_logits: torch.Tensor,
    target_policy_logits: torch.Tensor,
    actions: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceFromLogitsReturns:
    """V-trace for softmax policies given behaviour (mu) and target (pi) logits.

    Args:
        behavior_policy_logits: Actor logits, ``[T, B, A]``.
        target_policy_logits: Learner logits, ``[T, B, A]``.
        actions: Actions sampled from the behaviour policy, ``[T, B]`` int.
        discounts, rewards, values: ``[T, B]``.
        bootstrap_value: ``[B]``.
        clip_rho_threshold, clip_pg_rho_threshold, lambda_: see
            :func:`from_importance_weights`.

    Returns:
        :class:`VTraceFromLogitsReturns`; only ``target_action_log_probs`` has gradient.
    """
    for name, logits in (
        ("behavior_policy_logits", behavior_policy_logits),
        ("target_policy_logits", target_policy_logits),
    ):
        if logits.dim() != 3:
            raise ValueError(
                f"{name} must have rank 3 ([T, B, A]), got shape {tuple(logits.shape)}"
            )
    if actions.dim() != 2:
        raise ValueError(f"actions must have rank 2 ([T, B]), got shape {tuple(actions.shape)}")
    if behavior_policy_logits.shape != target_policy_logits.shape:
        raise ValueError(
            "behavior_policy_logits and target_policy_logits must have the same shape, got "
            f"{tuple(behavior_policy_logits.shape)} and {tuple(target_policy_logits.shape)}"
        )

    target_action_log_probs = action_log_probs(target_policy_logits, actions)
    behavior_action_log_probs = action_log_probs(behavior_policy_logits.detach(), actions)
    log_rhos = target_action_log_probs.detach() - behavior_action_log_probs
    vtrace_returns = from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )
    return VTraceFromLogitsReturns(
        vs=vtrace_returns.vs,
        pg_advantages=vtrace_returns.pg_advantages,
        log_rhos=log_rhos,
        behavior_action_log_probs=behavior_action_log_probs,
        target_action_log_probs=target_action_log_probs,
    )
