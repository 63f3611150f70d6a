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

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "RECURSIONS",
    "VTraceFromLogitsReturns",
    "VTraceReturns",
    "action_log_probs",
    "assert_time_major",
    "backward_recursion",
    "clipped",
    "from_importance_weights",
    "from_logits",
    "recursion_for",
    "td_errors",
]

# How the backward recursion runs: "auto" picks by device (``recursion_for``); "loop" and
# "blocked" force one (tests compare them on any device).
RECURSIONS = ("auto", "loop", "blocked")
# Steps per block of the blocked path: its [L, L, N] matrices cost L x the loop's flops and
# memory, which a GPU does not notice at L=128 (T=64, B=256: 4 MB); T > L takes T/L blocks.
BLOCK = 128


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
    recursion: str = "auto",
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
        recursion: How the backward recursion over T runs (:func:`backward_recursion`):
            ``"auto"`` (by device), ``"loop"`` or ``"blocked"``.

    Returns:
        :class:`VTraceReturns` with float32 ``vs`` and ``pg_advantages`` of shape
        ``[T, B, ...]``. Neither carries gradient.

    Raises:
        ValueError: on rank/shape mismatches, negative thresholds, ``lambda_``
            outside ``[0, 1]`` or an unknown ``recursion``.
    """
    _check_shapes(log_rhos, discounts, rewards, values, bootstrap_value)
    _check_recursion(recursion)
    _check_threshold("clip_rho_threshold", clip_rho_threshold)
    _check_threshold("clip_pg_rho_threshold", clip_pg_rho_threshold)
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_ must be in [0, 1], got {lambda_}")

    with torch.no_grad():
        # Low-precision accumulation over T steps loses too much accuracy; always use fp32.
        rhos = torch.exp(log_rhos.detach().float())
        discounts, rewards = discounts.detach().float(), rewards.detach().float()
        values, bootstrap_value = values.detach().float(), bootstrap_value.detach().float()
        vs = _targets(
            rhos,
            discounts,
            rewards,
            values,
            bootstrap_value,
            clip_rho_threshold,
            lambda_,
            recursion,
        )
        # The advantages on the targets, as rlax's vtrace_td_error_and_advantage on its vtrace.
        pg_advantages = clipped(rhos, clip_pg_rho_threshold) * td_errors(
            vs, rewards, discounts, values, bootstrap_value
        )
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def _targets(
    rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    rho_bar: float | None,
    lambda_: float,
    recursion: str,
) -> torch.Tensor:
    """V-trace's value targets ``vs [T, B, ...]`` from fp32 ratios ``rhos`` and step inputs."""
    deltas = clipped(rhos, rho_bar) * td_errors(values, rewards, discounts, values, bootstrap_value)
    cs = lambda_ * rhos.clamp(max=1.0)
    # vs_t - V(x_t) = delta_t + gamma_t c_t (vs_{t+1} - V(x_{t+1})), backwards from T: a
    # Python loop on the CPU, blocked matmuls on a GPU (recursion_for says why).
    return backward_recursion(deltas, discounts * cs, recursion) + values


def clipped(rhos: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """``min(threshold, rhos)``; ``rhos`` itself where ``threshold`` is None."""
    return rhos if threshold is None else rhos.clamp(max=threshold)


@torch.no_grad()
def td_errors(
    estimates: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
) -> torch.Tensor:
    """``r_t + gamma_t * estimates_{t+1} - V(x_t)`` ``[T, B, ...]`` in fp32, without gradient,
    with ``estimates_T = bootstrap_value [B, ...]``. With ``estimates = values`` these are the
    TD errors; with V-trace's targets ``vs``, its policy-gradient advantages before the ratio.
    """
    estimates_tp1 = torch.cat([estimates[1:], bootstrap_value.float().unsqueeze(0)], dim=0)
    return rewards.float() + discounts.float() * estimates_tp1 - values.float()


def _check_recursion(recursion: str) -> None:
    if recursion not in RECURSIONS:
        raise ValueError(f"recursion must be one of {RECURSIONS}, got {recursion!r}")


def recursion_for(device: torch.device) -> str:
    """The path ``"auto"`` takes on ``device``: ``"loop"`` on the CPU, ``"blocked"`` elsewhere.

    On the CPU a step of the loop is a few tiny ops with no launch cost, and T is tens of
    steps: the loop was measured faster than a scan there. On a GPU each of the loop's ops is
    a kernel launch (about 4 a step: 256 per SGD step at T=64) while the GPU sits idle between
    them; the blocked path is about a dozen launches whatever T is, up to ``BLOCK``. (The
    GPU side is a count of launches, not yet a timing: no GPU measured it here.)
    """
    return "loop" if device.type == "cpu" else "blocked"


def backward_recursion(
    deltas: torch.Tensor, decays: torch.Tensor, recursion: str = "auto"
) -> torch.Tensor:
    """``acc_t = deltas_t + decays_t * acc_{t+1}`` for t = T-1 .. 0, with ``acc_T = 0``.

    Args:
        deltas: ``[T, B, ...]``, time-major.
        decays: ``[T, B, ...]`` (V-trace's ``gamma_t c_t``), in ``[0, 1]`` for V-trace; zeros
            (episode ends, masked steps) cut the trace exactly on either path.
        recursion: ``"auto"`` (:func:`recursion_for` the tensors' device), ``"loop"`` or
            ``"blocked"``.

    Returns:
        ``acc``, ``[T, B, ...]`` in the inputs' dtype. The paths agree to rounding on finite
        inputs; a non-finite delta makes both non-finite, not always at the same steps (the
        blocked path's ``0 * inf`` reaches later steps of its block too).
    """
    _check_recursion(recursion)
    if recursion == "auto":
        recursion = recursion_for(deltas.device)
    if recursion == "loop":
        return _loop(deltas, decays)
    return _blocked(deltas, decays, BLOCK)


def _loop(deltas: torch.Tensor, decays: torch.Tensor) -> torch.Tensor:
    """One step at a time: T tiny ops, the fastest on the CPU."""
    out = torch.empty_like(deltas)
    acc = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        acc = deltas[t] + decays[t] * acc
        out[t] = acc
    return out


def _blocked(deltas: torch.Tensor, decays: torch.Tensor, block: int) -> torch.Tensor:
    """The recursion unrolled, ``acc_t = sum_{s>=t} (prod_{j=t}^{s-1} a_j) delta_s``, as one
    batched matmul per block of ``block`` steps, and a carry between blocks.

    The products are built with ``cumprod`` from each row's own start, never as a ratio of two
    cumulative products: a division would turn an underflow (long traces) into 0/0, and an
    exact zero (an episode end) into inf or nan. Here a zero decay stays an exact zero, and a
    product that underflows is 0, as the loop's repeated multiplication makes it.
    """
    T = deltas.shape[0]
    d = deltas.reshape(T, math.prod(deltas.shape[1:]))  # [T, N]; T = 0 too
    a = decays.reshape(d.shape)
    out = torch.empty_like(d)
    carry = torch.zeros_like(d[0])  # acc at the step after this block (acc_T = 0), [N]
    for end in range(T, 0, -block):
        start = max(0, end - block)
        n = end - start
        upper = torch.ones(n, n, dtype=torch.bool, device=d.device).triu().unsqueeze(-1)
        # prods[t, k] = prod_{j=t}^{k} a_j for k >= t (ones before row t's start): [n, n, N].
        prods = torch.where(upper, a[start:end].unsqueeze(0), 1.0).cumprod(dim=1)
        # weights[t, s] = prod_{j=t}^{s-1} a_j for s >= t (1 on the diagonal), 0 below it.
        ones = torch.ones_like(prods[:, :1])
        weights = torch.where(upper, torch.cat([ones, prods[:, :-1]], dim=1), 0.0)
        local = torch.einsum("tsn,sn->tn", weights, d[start:end])
        out[start:end] = local + prods[:, -1] * carry  # prods[t, -1]: the decay to the end
        carry = out[start]
    return out.reshape(deltas.shape)


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


def assert_time_major(layout: str, **tensors: torch.Tensor) -> None:
    """Raise a ValueError naming the first of ``tensors`` whose rank is not ``layout``'s:
    ``"[T, B]"``, ``"[T, B, A]"`` (time-major: T steps of B trajectories) or ``"[B]"``."""
    rank = layout.count(",") + 1
    for name, tensor in tensors.items():
        if tensor.dim() != rank:
            raise ValueError(
                f"{name} must be {layout} (time-major: T steps of B trajectories), got shape "
                f"{tuple(tensor.shape)}. Fix: pass it time-major, with no extra or missing dims."
            )


def _check_logits_and_actions(policy_logits: torch.Tensor, actions: torch.Tensor) -> None:
    assert_time_major("[T, B, A]", policy_logits=policy_logits)
    assert_time_major("[T, B]", actions=actions)
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
    **params: Any,
) -> VTraceFromLogitsReturns:
    """V-trace for softmax policies given behaviour (mu) and target (pi) logits: the log
    importance weights of the taken actions, then :func:`from_importance_weights` on them.

    Args:
        behavior_policy_logits: Actor logits, ``[T, B, A]``.
        target_policy_logits: Learner logits, ``[T, B, A]``.
        actions: Actions sampled from the behaviour policy, ``[T, B]`` int.
        discounts, rewards, values: ``[T, B]``.
        bootstrap_value: ``[B]``.
        **params: ``clip_rho_threshold``, ``clip_pg_rho_threshold``, ``lambda_`` and
            ``recursion``, as :func:`from_importance_weights` takes them (its defaults).

    Returns:
        :class:`VTraceFromLogitsReturns`; only ``target_action_log_probs`` has gradient.
    """
    assert_time_major(
        "[T, B, A]",
        behavior_policy_logits=behavior_policy_logits,
        target_policy_logits=target_policy_logits,
    )
    if behavior_policy_logits.shape != target_policy_logits.shape:
        raise ValueError(
            "behavior_policy_logits and target_policy_logits must have the same shape, got "
            f"{tuple(behavior_policy_logits.shape)} and {tuple(target_policy_logits.shape)}"
        )
    target_action_log_probs = action_log_probs(target_policy_logits, actions)
    behavior_action_log_probs = action_log_probs(behavior_policy_logits.detach(), actions)
    log_rhos = target_action_log_probs.detach() - behavior_action_log_probs
    returns = from_importance_weights(
        log_rhos, discounts, rewards, values, bootstrap_value, **params
    )
    return VTraceFromLogitsReturns(
        vs=returns.vs,
        pg_advantages=returns.pg_advantages,
        log_rhos=log_rhos,
        behavior_action_log_probs=behavior_action_log_probs,
        target_action_log_probs=target_action_log_probs,
    )
