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

from dataclasses import dataclass
from typing import NamedTuple

import torch

from impala_gpu.rl import vtrace
from impala_gpu.rl.advantages import MomentsReduce, masked_sum, normalized
from impala_gpu.rl.distributions import kl_divergence, policy_entropy
from impala_gpu.rl.vtrace import VTraceReturns, assert_time_major

__all__ = [
    "CORRECTIONS",
    "PG_ADVANTAGES",
    "PPO_REFERENCES",
    "LossOptions",
    "LossOutput",
    "MomentsReduce",
    "Steps",
    "assert_time_major",
    "clipped_surrogate",
    "correction_name",
    "discounts_from_terminated",
    "impala_loss",
    "is1_advantages",
    "normalized",
    "nstep_advantages",
    "ppo_objective",
    "vtrace_advantages",
]

_REDUCTIONS = ("sum", "mean")

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


@dataclass(frozen=True)
class LossOptions:
    """What :func:`impala_loss` does besides its tensors; the learner builds it once from
    ``algo`` (``learning.learner.loss_options``), whose keys of the same names it mirrors."""

    baseline_cost: float = 0.5  # weight of 0.5 * (vs - V)^2
    entropy_cost: float = 0.01  # weight of the entropy bonus
    clip_rho_threshold: float | None = 1.0  # V-trace's rho-bar for the value targets
    clip_pg_rho_threshold: float | None = 1.0  # rho-bar of the pg advantages (is1, IMPACT)
    vtrace_lambda: float = 1.0  # V-trace's traces c_t = lambda * min(1, rho_t)
    # "sum" over time and batch (the paper, TorchBeast) or "mean" (each sum divided by the
    # number of valid steps, at least 1).
    reduction: str = "sum"
    correction: str | bool = "vtrace"  # one of CORRECTIONS (a legacy bool: True is vtrace)
    # Policy-gradient advantages scaled to mean 0, std 1 over the batch's valid steps (PPO,
    # Sample Factory), so the policy's signal keeps its size when rewards are rare.
    normalize_advantages: bool = False
    # > 0: PPO's clipped surrogate (``ppo_objective``) in place of the policy gradient, the
    # trust region that lets one batch serve several SGD steps (``algo.epochs``).
    ppo_clip: float = 0.0
    # With a reference anchor: no gradient from a step whose pi/mu already left
    # [1 - behavior_clip, 1 + behavior_clip] in its advantage's direction (``behavior_trust``).
    behavior_clip: float | None = None

    def __post_init__(self) -> None:
        if self.reduction not in _REDUCTIONS:
            raise ValueError(
                f"reduction must be one of {_REDUCTIONS}, got {self.reduction!r}. Fix: "
                "algo.reduction=sum or algo.reduction=mean."
            )
        object.__setattr__(self, "correction", correction_name(self.correction))


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
    behavior_clipped_fraction: torch.Tensor
    """Fraction of valid steps ``behavior_clip`` silenced (0 without it)."""
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


PPO_REFERENCES = ("behavior", "first_visit", "target")  # algo.ppo_reference


def impala_loss(
    target_logits_t: torch.Tensor,
    values_t: torch.Tensor,
    bootstrap_value: torch.Tensor,
    behavior_logits: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    valid: torch.Tensor,
    options: LossOptions,
    *,
    reference_logits: torch.Tensor | None = None,
    advantage_moments: MomentsReduce | None = None,
) -> LossOutput:
    """IMPALA's loss: policy gradient, baseline and entropy bonus on V-trace targets; the
    correction's advantages (``PG_ADVANTAGES``), then PPO's surrogate or the plain gradient.

    Args:
        target_logits_t: Learner policy logits ``[T, B, A]`` (with gradient).
        values_t: Learner values ``V(x_t)`` ``[T, B]`` (with gradient).
        bootstrap_value: ``V(x_T)`` ``[B]``; used as a constant (no gradient).
        behavior_logits: Actor policy logits ``[T, B, A]``.
        actions, rewards: ``[T, B]``; discounts: ``gamma * (1 - terminated_t)`` ``[T, B]``.
        valid: ``[T, B]`` bool (or 0/1 integer); False = pseudo-transition to ignore.
        options: :class:`LossOptions`.
        reference_logits: With ``ppo_clip``, the clip's anchor ``[T, B, A]`` in place of the
            behaviour's (IMPACT's target network; see :func:`ppo_objective`).
        advantage_moments: With ``normalize_advantages``, when this batch is one share of a
            minibatch split over threads or processes: sums the shares' advantage moments,
            so the normalisation is the whole minibatch's (see ``MomentsReduce``).
    """
    steps = Steps(rewards, discounts, values_t, bootstrap_value, valid)
    steps = _checked(steps, target_logits_t, behavior_logits, reference_logits, actions)
    valid = steps.valid
    pi_log_probs = vtrace.action_log_probs(target_logits_t, actions)  # with gradient
    with torch.no_grad():
        mu_log_probs = vtrace.action_log_probs(behavior_logits.detach(), actions)
        log_rhos = pi_log_probs.detach() - mu_log_probs
        reference = None  # IMPACT's anchor
        if reference_logits is not None:
            reference = vtrace.action_log_probs(reference_logits.detach(), actions)
    vs, advantages = PG_ADVANTAGES[options.correction](log_rhos, steps, options)
    if options.ppo_clip > 0:  # the surrogate applies its own ratio
        advantages = vtrace.td_errors(vs, rewards, discounts, values_t, bootstrap_value)
    if options.normalize_advantages:
        advantages = normalized(advantages, valid, reduce=advantage_moments)
    if options.ppo_clip > 0:
        objective = ppo_objective(pi_log_probs, mu_log_probs, advantages, valid, options, reference)
    else:
        objective = pi_log_probs * advantages
    sums = (
        -masked_sum(objective, valid),
        value_term(vs, values_t, valid),
        entropy_term(target_logits_t, valid),
    )
    logits = (behavior_logits, target_logits_t)
    return _loss_output(sums, options, valid, logits, log_rhos, vs, advantages)


class Steps(NamedTuple):
    """A batch's time-major step inputs to the loss's targets."""

    rewards: torch.Tensor  # r_t [T, B]
    discounts: torch.Tensor  # gamma_t [T, B]: 0 where x_{t+1} is terminal
    values: torch.Tensor  # V(x_t) [T, B]
    bootstrap_value: torch.Tensor  # V(x_T) [B], a constant
    valid: torch.Tensor  # [T, B] bool: False at pseudo-transitions


def vtrace_advantages(
    log_rhos_t: torch.Tensor, steps: Steps, options: LossOptions
) -> VTraceReturns:
    """``correction=vtrace`` (the paper's method): V-trace's targets ``vs [T, B]`` and its
    policy-gradient advantages ``min(pg rho-bar, rho_t) (r_t + gamma_t vs_{t+1} - V(x_t))``,
    both from the true ratios ``log_rhos_t [T, B]``."""
    return _vtrace(log_rhos_t, steps, options, options.clip_pg_rho_threshold)


def nstep_advantages(log_rhos_t: torch.Tensor, steps: Steps, options: LossOptions) -> VTraceReturns:
    """``correction=none``: the ratios dropped (rho = 1 at every valid step), so ``vs`` are
    n-step (lambda-) returns on possibly stale data, and the advantages V-trace's with rho 1."""
    return _vtrace(torch.zeros_like(log_rhos_t), steps, options, options.clip_pg_rho_threshold)


def is1_advantages(log_rhos_t: torch.Tensor, steps: Steps, options: LossOptions) -> VTraceReturns:
    """``correction=is1``, 1-step importance sampling (the paper's section 5.2.2): the targets
    of ``none``, and each step's advantage weighted once by its ``min(pg rho-bar, rho_t)``."""
    vs, advantages = _vtrace(torch.zeros_like(log_rhos_t), steps, options, None)
    weights = _clipped_rhos(log_rhos_t, steps.valid, options.clip_pg_rho_threshold)
    return VTraceReturns(vs, weights * advantages)


# algo.correction -> its (vs, pg advantages) [T, B] from the true log ratios.
PG_ADVANTAGES = {"vtrace": vtrace_advantages, "none": nstep_advantages, "is1": is1_advantages}
assert tuple(PG_ADVANTAGES) == CORRECTIONS


def _vtrace(
    log_rhos_t: torch.Tensor, steps: Steps, options: LossOptions, pg_rho_bar: float | None
) -> VTraceReturns:
    with torch.no_grad():
        # rho = c = 0 at invalid steps zeroes their delta and cuts the trace there; where()
        # keeps NaN from garbage logits at those steps out of exp().
        masked = torch.where(steps.valid, log_rhos_t, torch.full_like(log_rhos_t, float("-inf")))
    return vtrace.from_importance_weights(
        masked, steps.discounts, steps.rewards, steps.values, steps.bootstrap_value,
        options.clip_rho_threshold, pg_rho_bar, options.vtrace_lambda,
    )  # fmt: skip


def ppo_objective(
    pi_log_probs_t: torch.Tensor,
    mu_log_probs_t: torch.Tensor,
    advantages_t: torch.Tensor,
    valid: torch.Tensor,
    options: LossOptions,
    reference_log_probs_t: torch.Tensor | None = None,
) -> torch.Tensor:
    """PPO's clipped surrogate per step ``[T, B]``, to be maximised (:func:`clipped_surrogate`
    with ``options.ppo_clip``), on the ratio of pi to an anchor: the behaviour policy mu
    (APPO), or ``reference_log_probs_t`` (IMPACT's target network) with each step weighted by
    the truncated ratio ``min(pg rho-bar, pi_ref / mu)``. An actor's policy is already several
    SGD steps behind when its data arrives, so a ratio to it starts outside the trust region
    and clipping silences those steps; the reference starts inside it. With
    ``options.behavior_clip``, steps :func:`behavior_trust` marks give no gradient."""
    if reference_log_probs_t is None:
        anchor, weights = mu_log_probs_t, None
    else:
        anchor = reference_log_probs_t
        weights = _clipped_rhos(anchor - mu_log_probs_t, valid, options.clip_pg_rho_threshold)
    # 0 at invalid steps: their behaviour logits may be garbage, and a NaN there would reach
    # the gradient through exp() even where the sum masks it out.
    log_ratio = torch.where(valid, pi_log_probs_t - anchor, torch.zeros_like(anchor))
    surrogate = clipped_surrogate(log_ratio, advantages_t, options.ppo_clip)
    if options.behavior_clip is not None:
        log_rhos = pi_log_probs_t.detach() - mu_log_probs_t
        trust = behavior_trust(log_rhos, advantages_t, options.behavior_clip)
        weights = trust if weights is None else weights * trust
    return surrogate if weights is None else weights * surrogate


@torch.no_grad()
def behavior_trust(
    log_rhos_t: torch.Tensor, advantages_t: torch.Tensor, bound: float
) -> torch.Tensor:
    """``[T, B] -> [T, B]``: 0 where ``rho = pi/mu = exp(log_rhos_t)`` has already left
    ``[1 - bound, 1 + bound]`` in the direction the step's advantage pushes it (above with
    ``A > 0``, below with ``A < 0``), 1 elsewhere. PPO's clip, relative to the actor's policy
    and loose: the first-visit anchor bounds each update's move, not the sum of the moves
    since the actor acted, so a stale advantage would go on pushing pi past where its
    evidence was gathered."""
    rhos = torch.exp(log_rhos_t)
    past = ((advantages_t > 0) & (rhos > 1.0 + bound)) | ((advantages_t < 0) & (rhos < 1.0 - bound))
    return (~past).to(advantages_t.dtype)


def value_term(vs_t: torch.Tensor, values_t: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The baseline's loss ``0.5 * sum (vs_t - V(x_t))^2`` over the valid steps of ``[T, B]``
    (gradient into the values only: the targets ``vs_t`` are constants)."""
    return 0.5 * masked_sum((vs_t - values_t.float()) ** 2, valid)


def entropy_term(logits_t: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The policy's entropy ``[T, B, A] -> []`` summed over the valid steps (nats), in fp32:
    the bonus, which the loss subtracts."""
    return masked_sum(policy_entropy(logits_t), valid)


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
def _clipped_rhos(
    log_rhos: torch.Tensor, valid: torch.Tensor, threshold: float | None
) -> torch.Tensor:
    """``min(threshold, exp(log_rhos))`` ``[T, B]``; 0 at invalid steps (their logits may be
    garbage)."""
    rhos = torch.exp(torch.where(valid, log_rhos, torch.full_like(log_rhos, float("-inf"))))
    return vtrace.clipped(rhos, threshold)


def _checked(
    steps: Steps,
    target_logits_t: torch.Tensor,
    behavior_logits: torch.Tensor,
    reference_logits: torch.Tensor | None,
    actions: torch.Tensor,
) -> Steps:
    """``steps`` with ``valid`` as a bool mask, after checking that the loss's inputs are
    time-major and fit together: logits ``[T, B, A]``, per-step inputs ``[T, B]``, and the
    bootstrap value ``[B]``."""
    logits = {"target_logits_t": target_logits_t, "behavior_logits": behavior_logits}
    if reference_logits is not None:
        logits["reference_logits"] = reference_logits
    per_step = {"actions": actions, **steps._asdict()}
    bootstrap_value = per_step.pop("bootstrap_value")
    assert_time_major("[T, B, A]", **logits)
    assert_time_major("[T, B]", **per_step)
    assert_time_major("[B]", bootstrap_value=bootstrap_value)
    shape = target_logits_t.shape  # [T, B, A]
    for name, x in {**logits, **per_step, "bootstrap_value": bootstrap_value}.items():
        expected = {3: shape, 2: shape[:2], 1: shape[1:2]}[x.dim()]
        if x.shape != expected:
            raise ValueError(
                f"{name}.shape {tuple(x.shape)} must be {tuple(expected)}, as target_logits_t's "
                f"[T, B, A] = {tuple(shape)} says. Fix: pass the same T steps of B trajectories."
            )
    if steps.valid.is_floating_point():
        raise TypeError(
            f"valid must be a bool (or integer) mask, got dtype {steps.valid.dtype}. Fix: "
            "pass valid.bool()."
        )
    return steps._replace(valid=steps.valid.bool())


def _loss_output(
    sums: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    options: LossOptions,
    valid: torch.Tensor,
    logits: tuple[torch.Tensor, torch.Tensor],
    *diagnosed: torch.Tensor,
) -> LossOutput:
    """The terms' ``sums`` (policy gradient, baseline, entropy) weighted by their costs and
    reduced (``total`` keeps its graph), and the diagnostics (``_diagnostics``) of the
    behaviour and target ``logits`` and of ``diagnosed``."""
    pg_sum, baseline_sum, entropy_sum = sums
    num_valid = valid.sum().float()
    denom = num_valid.clamp(min=1.0)
    scale = denom if options.reduction == "mean" else torch.ones_like(denom)
    pg_loss = pg_sum / scale
    baseline_loss = options.baseline_cost * baseline_sum / scale
    entropy_loss = -options.entropy_cost * entropy_sum / scale
    return LossOutput(
        total=pg_loss + baseline_loss + entropy_loss,
        pg_loss=pg_loss.detach(),
        baseline_loss=baseline_loss.detach(),
        entropy_loss=entropy_loss.detach(),
        entropy=entropy_sum.detach() / denom,
        num_valid=num_valid,
        **_diagnostics(options, valid, denom, logits, *diagnosed),
    )


@torch.no_grad()
def _diagnostics(
    options: LossOptions,
    valid: torch.Tensor,
    denom: torch.Tensor,
    logits: tuple[torch.Tensor, torch.Tensor],
    true_log_rhos: torch.Tensor,
    vs: torch.Tensor,
    pg_advantages: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """``LossOutput``'s means over the ``denom`` valid steps of the behaviour and target
    ``logits [T, B, A]`` and the ``[T, B]`` others. The ratio diagnostics use the true ratios
    whatever the correction, to show staleness."""
    rhos = torch.exp(true_log_rhos)
    kl_t = kl_divergence(logits[0], logits[1].detach())  # KL(mu || pi)

    def valid_mean(x: torch.Tensor) -> torch.Tensor:
        return masked_sum(x, valid) / denom

    def clipped_fraction(threshold: float | None) -> torch.Tensor:
        if threshold is None:
            return torch.zeros((), device=rhos.device)
        return valid_mean((rhos > threshold).float())

    behavior_clipped = torch.zeros((), device=rhos.device)
    if options.behavior_clip is not None and options.ppo_clip > 0:
        trust = behavior_trust(true_log_rhos, pg_advantages, options.behavior_clip)
        behavior_clipped = valid_mean(1.0 - trust)
    return {
        "clipped_rho_fraction": clipped_fraction(options.clip_rho_threshold),
        "clipped_pg_rho_fraction": clipped_fraction(options.clip_pg_rho_threshold),
        "behavior_clipped_fraction": behavior_clipped,
        "mean_rho": valid_mean(rhos),
        "mean_abs_log_rho": valid_mean(true_log_rhos.abs()),
        "kl_behavior_target": valid_mean(kl_t),
        "advantage_mean": valid_mean(pg_advantages),
        "vs_mean": valid_mean(vs),
        "vs": vs,
        "pg_advantages": pg_advantages,
    }
