"""IMPALA actor-critic loss (policy gradient + baseline + entropy bonus) on V-trace targets.

Tensors are time-major ``[T, B, ...]``. ``valid[t, b] == False`` marks a
pseudo-transition that must contribute nothing: under gymnasium's NEXT_STEP
autoreset the step taken from an episode's final observation only produces the
next episode's reset observation. Such steps are masked by forcing ``rho = c = 0``
there, which makes the V-trace target at the step equal ``V(x_s)`` exactly; the
previous step then bootstraps from the value of the final observation (the right
thing for truncation; for termination its discount is already 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from impala_gpu.rl import vtrace

__all__ = [
    "CORRECTIONS",
    "LossOutput",
    "MomentsReduce",
    "clipped_surrogate",
    "correction_name",
    "discounts_from_terminated",
    "impala_loss",
]

_REDUCTIONS = ("sum", "mean")

# One share's advantage moments ``[3]`` (valid count, sum, sum of squares; float64) -> the same
# summed over every share of the minibatch, when a minibatch is split over threads
# (``learner_shards``) or processes (``learners``), so that every share normalises alike.
MomentsReduce = Callable[[torch.Tensor], torch.Tensor]
# Off-policy corrections (IMPALA paper, section 5.2.2, Table 2):
# - vtrace: V-trace targets and rho-weighted policy gradient (the paper's method);
# - none: importance weights dropped everywhere: n-step returns on possibly stale data;
# - is1: 1-step importance sampling: value targets as in none, the policy gradient at each step
#   weighted by that step's clipped ratio min(pg rho-bar, pi/mu), no traces.
CORRECTIONS = ("vtrace", "none", "is1")


def correction_name(correction: str | bool) -> str:
    """``algo.correction`` as one of CORRECTIONS. Configs from before the choice existed hold
    a bool: True was V-trace, False no correction."""
    if isinstance(correction, bool):
        return "vtrace" if correction else "none"
    if correction not in CORRECTIONS:
        raise ValueError(
            f"algo.correction={correction!r} is not one of {CORRECTIONS}. Fix: "
            "algo.correction=vtrace (V-trace), none (no importance weights) or is1 (1-step "
            "importance sampling)."
        )
    return correction


@dataclass
class LossOutput:
    """Result of :func:`impala_loss`.

    ``total`` carries gradient; every other field is a detached tensor (0-dim unless
    stated) so logging does not force a device sync. ``pg_loss + baseline_loss +
    entropy_loss == total`` (all already weighted by their costs and reduced).
    """

    total: torch.Tensor
    pg_loss: torch.Tensor
    baseline_loss: torch.Tensor
    entropy_loss: torch.Tensor
    entropy: torch.Tensor
    """Mean policy entropy per valid step (nats)."""
    clipped_rho_fraction: torch.Tensor
    """Fraction of valid steps whose true rho exceeds ``clip_rho_threshold``."""
    clipped_pg_rho_fraction: torch.Tensor
    """Fraction of valid steps whose true rho exceeds ``clip_pg_rho_threshold``."""
    mean_rho: torch.Tensor
    """Mean true importance ratio pi/mu over valid steps (1.0 when on-policy)."""
    mean_abs_log_rho: torch.Tensor
    """Mean ``|log pi(a_t)/mu(a_t)|`` over valid steps: how off-policy the taken actions are."""
    kl_behavior_target: torch.Tensor
    """Mean ``KL(mu || pi)`` over valid steps, over all actions (nats)."""
    advantage_mean: torch.Tensor
    """Mean pg advantage over valid steps."""
    vs_mean: torch.Tensor
    """Mean V-trace value target over valid steps."""
    num_valid: torch.Tensor
    """Number of valid steps (float)."""
    vs: torch.Tensor
    """V-trace value targets, ``[T, B]``."""
    pg_advantages: torch.Tensor
    """Policy-gradient advantages, ``[T, B]`` (0 at invalid steps)."""


def discounts_from_terminated(terminated_t: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-step discounts ``gamma * (1 - terminated_t)`` as float32 ``[T, B]``.

    Truncation must NOT be passed here: a truncated episode keeps discount ``gamma``
    and is handled by the ``valid`` mask of :func:`impala_loss`.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    return gamma * (~terminated_t.bool()).float()


def _masked_sum(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
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
    mean = _masked_sum(x, valid) / n
    var = _masked_sum((x - mean) ** 2, valid) / (n - 1).clamp(min=1)
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


def _checked_mask(
    target_logits_t: torch.Tensor,
    behavior_logits: torch.Tensor,
    values_t: torch.Tensor,
    valid: torch.Tensor,
    reduction: str,
) -> torch.Tensor:
    """``valid`` as a bool mask, after checking that the loss's inputs fit together."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if behavior_logits.shape != target_logits_t.shape:
        raise ValueError(
            "behavior_logits and target_logits_t must have the same shape, got "
            f"{tuple(behavior_logits.shape)} and {tuple(target_logits_t.shape)}"
        )
    if valid.shape != values_t.shape:
        raise ValueError(
            f"valid.shape {tuple(valid.shape)} must equal values_t.shape {tuple(values_t.shape)}"
        )
    if valid.is_floating_point():
        raise TypeError(f"valid must be a bool (or integer) mask, got dtype {valid.dtype}")
    return valid.bool()


def policy_entropy(logits_t: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax policy ``[T, B, A] -> [T, B]``, in fp32."""
    log_policy = F.log_softmax(logits_t.float(), dim=-1)
    # Clamping keeps p * log p finite (0, not NaN) for actions masked with -inf logits.
    log_policy_finite = log_policy.clamp(min=torch.finfo(log_policy.dtype).min)
    return -(log_policy.exp() * log_policy_finite).sum(dim=-1)


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(p) || softmax(q))`` ``[T, B, A] -> [T, B]``, in fp32."""
    log_p = F.log_softmax(p_logits.float(), dim=-1)
    log_q = F.log_softmax(q_logits.float(), dim=-1)
    # 0 * log 0 is 0: clamp so masked (-inf) actions give 0, not NaN.
    low = torch.finfo(log_p.dtype).min
    return (log_p.exp() * (log_p.clamp(min=low) - log_q.clamp(min=low))).sum(dim=-1)


PPO_REFERENCES = ("behavior", "first_visit")  # algo.ppo_reference


def impala_loss(
    target_logits_t: torch.Tensor,
    values_t: torch.Tensor,
    bootstrap_value: torch.Tensor,
    behavior_logits: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    valid: torch.Tensor,
    *,
    baseline_cost: float = 0.5,
    entropy_cost: float = 0.01,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
    reduction: str = "sum",
    correction: str | bool = "vtrace",
    normalize_advantages: bool = False,
    ppo_clip: float = 0.0,
    reference_logits: torch.Tensor | None = None,
    advantage_moments: MomentsReduce | None = None,
) -> LossOutput:
    """IMPALA loss with V-trace targets.

    Args:
        target_logits_t: Learner policy logits ``[T, B, A]`` (with gradient).
        values_t: Learner values ``V(x_t)`` ``[T, B]`` (with gradient).
        bootstrap_value: ``V(x_T)`` ``[B]``; used as a constant (no gradient).
        behavior_logits: Actor policy logits ``[T, B, A]``.
        actions: Actions taken ``[T, B]`` int.
        rewards: ``[T, B]``.
        discounts: ``gamma * (1 - terminated_t)`` ``[T, B]``.
        valid: ``[T, B]`` bool (or 0/1 integer); False = pseudo-transition to ignore.
        baseline_cost: Weight of ``0.5 * (vs - V)^2``.
        entropy_cost: Weight of the entropy bonus.
        clip_rho_threshold, clip_pg_rho_threshold, lambda_: V-trace parameters.
        reduction: ``"sum"`` over time and batch (paper / TorchBeast default) or
            ``"mean"`` (each sum divided by the number of valid steps, at least 1).
        correction: ``"vtrace"``; ``"none"`` ablates importance weighting (``rho = 1`` at
            every valid step: plain n-step / lambda-returns on possibly stale data);
            ``"is1"`` keeps those uncorrected value targets and weights each step's
            policy-gradient advantage by ``min(clip_pg_rho_threshold, rho_t)``. A bool means
            vtrace (True) or none (False).
        normalize_advantages: Scale the policy-gradient advantages to mean 0 and standard
            deviation 1 over the batch's valid steps (PPO, Sample Factory), so the policy's
            signal keeps its size when rewards are rare; the value targets are unchanged.
        ppo_clip: 0 keeps V-trace's policy gradient. ``epsilon > 0`` replaces it with PPO's
            clipped surrogate ``min(r_t A_t, clip(r_t, 1 - epsilon, 1 + epsilon) A_t)`` on the
            ratio ``r_t = pi(a_t|x_t) / mu(a_t|x_t)`` to the behaviour policy and the
            advantage ``A_t = r_t + gamma_t vs_{t+1} - V(x_t)`` (APPO): the trust region
            that lets one batch serve several SGD steps (``algo.epochs``).
        reference_logits: With ``ppo_clip``, clip the ratio to these logits ``[T, B, A]``
            instead of the behaviour's, and weight each step by the truncated importance
            weight ``min(clip_pg_rho_threshold, pi_ref / mu)`` (IMPACT's target network). An
            actor's policy is already several SGD steps behind when its data arrives, so a
            ratio to it starts outside the trust region and clipping silences those steps.
        advantage_moments: With ``normalize_advantages``, when this batch is one share of a
            minibatch split over threads or processes: sums the shares' advantage moments,
            so the normalisation is the whole minibatch's (see ``MomentsReduce``).

    Returns:
        :class:`LossOutput`.
    """
    valid = _checked_mask(target_logits_t, behavior_logits, values_t, valid, reduction)
    correction = correction_name(correction)

    target_action_log_probs = vtrace.action_log_probs(target_logits_t, actions)
    with torch.no_grad():
        behavior_action_log_probs = vtrace.action_log_probs(behavior_logits.detach(), actions)
        true_log_rhos = target_action_log_probs.detach() - behavior_action_log_probs
        vtraced = correction == "vtrace"
        log_rhos = true_log_rhos if vtraced else torch.zeros_like(true_log_rhos)
        # rho = c = 0 at invalid steps zeroes their delta and cuts the trace there; where()
        # keeps NaN from garbage logits at those steps out of exp().
        log_rhos = torch.where(valid, log_rhos, torch.full_like(log_rhos, float("-inf")))

    vs, pg_advantages = vtrace.from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values_t,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        # is1 applies its own clipped ratio below, once.
        clip_pg_rho_threshold=None if correction == "is1" else clip_pg_rho_threshold,
        lambda_=lambda_,
    )

    if correction == "is1":
        pg_advantages = _clipped_rhos(true_log_rhos, valid, clip_pg_rho_threshold) * pg_advantages
    if ppo_clip > 0:
        pg_advantages = _one_step_advantages(vs, rewards, discounts, values_t, bootstrap_value)
    if normalize_advantages:
        pg_advantages = normalized(pg_advantages, valid, reduce=advantage_moments)
    values_f = values_t.float()
    if ppo_clip > 0:
        if reference_logits is None:
            anchor_log_probs, weights = behavior_action_log_probs, None
        else:
            with torch.no_grad():
                anchor_log_probs = vtrace.action_log_probs(reference_logits.detach(), actions)
                weights = _clipped_rhos(
                    anchor_log_probs - behavior_action_log_probs, valid, clip_pg_rho_threshold
                )
        surrogate = clipped_surrogate(
            # 0 at invalid steps: their behaviour logits may be garbage, and a NaN there
            # would reach the gradient through exp() even where the sum masks it out.
            torch.where(
                valid,
                target_action_log_probs - anchor_log_probs,
                torch.zeros_like(anchor_log_probs),
            ),
            pg_advantages,
            ppo_clip,
        )
        pg_sum = -_masked_sum(surrogate if weights is None else weights * surrogate, valid)
    else:
        pg_sum = -_masked_sum(target_action_log_probs * pg_advantages, valid)
    baseline_sum = 0.5 * _masked_sum((vs - values_f) ** 2, valid)

    entropy_sum = _masked_sum(policy_entropy(target_logits_t), valid)
    with torch.no_grad():
        kl_t = kl_divergence(behavior_logits, target_logits_t.detach())

    num_valid = valid.sum().float()
    denom = num_valid.clamp(min=1.0)
    scale = denom if reduction == "mean" else torch.ones_like(denom)

    pg_loss = pg_sum / scale
    baseline_loss = baseline_cost * baseline_sum / scale
    entropy_loss = -entropy_cost * entropy_sum / scale
    total = pg_loss + baseline_loss + entropy_loss

    return _loss_output(
        total,
        (pg_loss, baseline_loss, entropy_loss),
        num_valid,
        entropy_sum,
        true_log_rhos,
        kl_t,
        vs,
        pg_advantages,
        valid,
        (clip_rho_threshold, clip_pg_rho_threshold),
    )


def clipped_surrogate(
    log_ratio_t: torch.Tensor, advantages_t: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """PPO's clipped objective per step, ``[T, B] -> [T, B]``, to be maximised:
    ``min(r A, clip(r, 1 - epsilon, 1 + epsilon) A)`` with ``r = exp(log_ratio_t)``.
    Gradient flows through ``log_ratio_t`` only."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    # The clamp keeps a wildly off-policy step's ratio finite (it is clipped away anyway).
    ratio = torch.exp(log_ratio_t.clamp(max=20.0))
    advantages_t = advantages_t.detach()
    return torch.minimum(
        ratio * advantages_t, ratio.clamp(1.0 - epsilon, 1.0 + epsilon) * advantages_t
    )


@torch.no_grad()
def _one_step_advantages(
    vs: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    values_t: torch.Tensor,
    bootstrap_value: torch.Tensor,
) -> torch.Tensor:
    """``r_t + gamma_t vs_{t+1} - V(x_t)`` ``[T, B]``: V-trace's pg advantage without its
    ratio factor, which PPO's surrogate applies itself."""
    vs_tp1 = torch.cat([vs[1:], bootstrap_value.detach().float().unsqueeze(0)], dim=0)
    return rewards.float() + discounts.float() * vs_tp1 - values_t.detach().float()


@torch.no_grad()
def _clipped_rhos(
    log_rhos: torch.Tensor, valid: torch.Tensor, threshold: float | None
) -> torch.Tensor:
    """``min(threshold, exp(log_rhos))`` ``[T, B]``; 0 at invalid steps (their logits may be
    garbage)."""
    rhos = torch.exp(torch.where(valid, log_rhos, torch.full_like(log_rhos, float("-inf"))))
    return rhos if threshold is None else rhos.clamp(max=threshold)


@torch.no_grad()
def _loss_output(
    total: torch.Tensor,
    terms: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    num_valid: torch.Tensor,
    entropy_sum: torch.Tensor,
    true_log_rhos: torch.Tensor,
    kl_t: torch.Tensor,
    vs: torch.Tensor,
    pg_advantages: torch.Tensor,
    valid: torch.Tensor,
    thresholds: tuple[float | None, float | None],
) -> LossOutput:
    """The loss (``total`` keeps its graph), its terms and their diagnostics. The ratio
    diagnostics use the true ratios whatever the correction, to show staleness."""
    pg_loss, baseline_loss, entropy_loss = terms
    denom = num_valid.clamp(min=1.0)
    rhos = torch.exp(true_log_rhos)

    def valid_mean(x: torch.Tensor) -> torch.Tensor:
        return _masked_sum(x, valid) / denom

    def clipped_fraction(threshold: float | None) -> torch.Tensor:
        if threshold is None:
            return torch.zeros((), device=rhos.device)
        return valid_mean((rhos > threshold).float())

    return LossOutput(
        total=total,
        pg_loss=pg_loss.detach(),
        baseline_loss=baseline_loss.detach(),
        entropy_loss=entropy_loss.detach(),
        entropy=entropy_sum.detach() / denom,
        clipped_rho_fraction=clipped_fraction(thresholds[0]),
        clipped_pg_rho_fraction=clipped_fraction(thresholds[1]),
        mean_rho=valid_mean(rhos),
        mean_abs_log_rho=valid_mean(true_log_rhos.abs()),
        kl_behavior_target=valid_mean(kl_t),
        advantage_mean=valid_mean(pg_advantages),
        vs_mean=valid_mean(vs),
        num_valid=num_valid,
        vs=vs,
        pg_advantages=pg_advantages,
    )
