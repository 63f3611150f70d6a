"""Tests for impala_gpu.rl.losses: masking of pseudo-transitions, reductions, gradients."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from impala_gpu.rl import vtrace
from impala_gpu.rl.losses import (
    LossOptions,
    LossOutput,
    behavior_trust,
    discounts_from_terminated,
    impala_loss,
    ppo_objective,
)

GAMMA = 0.9
LOSS_FIELDS = ("total", "pg_loss", "baseline_loss", "entropy_loss")


def make_batch(
    seed: int, T: int = 8, B: int = 3, A: int = 4, on_policy: bool = False
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(T, B, A, generator=g)
    behavior_logits = (
        target_logits.clone() if on_policy else 1.5 * torch.randn(T, B, A, generator=g)
    )
    return {
        "target_logits_t": target_logits,
        "values_t": torch.randn(T, B, generator=g),
        "bootstrap_value": torch.randn(B, generator=g),
        "behavior_logits": behavior_logits,
        "actions": torch.randint(0, A, (T, B), generator=g),
        "rewards": torch.randn(T, B, generator=g),
        "discounts": torch.full((T, B), GAMMA),
        "valid": torch.ones(T, B, dtype=torch.bool),
    }


def run_loss(
    batch: dict[str, torch.Tensor], reference_logits: torch.Tensor | None = None, **kwargs: object
) -> LossOutput:
    return impala_loss(
        batch["target_logits_t"],
        batch["values_t"],
        batch["bootstrap_value"],
        batch["behavior_logits"],
        batch["actions"],
        batch["rewards"],
        batch["discounts"],
        batch["valid"],
        LossOptions(**kwargs),  # type: ignore[arg-type]
        reference_logits=reference_logits,
    )


def clone_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in batch.items()}


def test_truncation_bootstraps_from_final_observation() -> None:
    # Episode truncated at step k-1: x_k is the final observation, step k is the
    # pseudo-transition x_k -> reset obs x_{k+1} (valid[k] = False). discount[k-1] = gamma.
    T, B, k = 8, 2, 4
    batch = make_batch(0, T=T, B=B, on_policy=True)
    batch["valid"][k] = False
    # Make V(final obs) and V(reset obs) clearly different so a mix-up would show.
    batch["values_t"][k] = torch.tensor([3.0, -2.0])
    batch["values_t"][k + 1] = torch.tensor([-5.0, 7.0])
    out = run_loss(batch)
    r, v = batch["rewards"], batch["values_t"]

    torch.testing.assert_close(out.vs[k - 1], r[k - 1] + GAMMA * v[k])
    assert not torch.allclose(out.vs[k - 1], r[k - 1] + GAMMA * v[k + 1])
    # On-policy lambda=1 targets before k are discounted returns cut at the final obs.
    for s in range(k):
        expected = sum(GAMMA ** (t - s) * r[t] for t in range(s, k)) + GAMMA ** (k - s) * v[k]
        torch.testing.assert_close(out.vs[s], expected)
    torch.testing.assert_close(out.pg_advantages[k - 1], r[k - 1] + GAMMA * v[k] - v[k - 1])
    # The pseudo-transition itself: target == V, no advantage.
    torch.testing.assert_close(out.vs[k], v[k])
    torch.testing.assert_close(out.pg_advantages[k], torch.zeros(B))

    # The next episode (values/rewards/logits/actions from k+1 on, reward at k, bootstrap)
    # must not influence anything before k.
    other = clone_batch(batch)
    other["values_t"][k + 1 :] += 10.0
    other["rewards"][k:] -= 3.0
    other["bootstrap_value"] += 4.0
    other["target_logits_t"][k + 1 :] *= -2.0
    other["actions"][k:] = (other["actions"][k:] + 1) % 4
    out2 = run_loss(other)
    torch.testing.assert_close(out2.vs[:k], out.vs[:k])
    torch.testing.assert_close(out2.pg_advantages[:k], out.pg_advantages[:k])
    assert not torch.allclose(out2.vs[k + 1 :], out.vs[k + 1 :])


def test_termination_target_is_reward() -> None:
    T, B, k = 8, 2, 5
    batch = make_batch(1, T=T, B=B, on_policy=True)
    batch["discounts"][k - 1] = 0.0
    batch["valid"][k] = False
    out = run_loss(batch)
    r, v = batch["rewards"], batch["values_t"]
    torch.testing.assert_close(out.vs[k - 1], r[k - 1])
    torch.testing.assert_close(out.pg_advantages[k - 1], r[k - 1] - v[k - 1])
    torch.testing.assert_close(out.vs[k - 2], r[k - 2] + GAMMA * r[k - 1])


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("correction", ["vtrace", "none", "is1"])
def test_invalid_steps_contribute_nothing(reduction: str, correction: str) -> None:
    T, B, A = 8, 3, 4
    batch = make_batch(2, T=T, B=B, A=A)
    invalid = [(3, 0), (0, 1), (T - 1, 2)]
    for t, b in invalid:
        batch["valid"][t, b] = False
    kwargs = {"reduction": reduction, "correction": correction}
    out = run_loss(batch, **kwargs)

    other = clone_batch(batch)
    for t, b in invalid:
        other["actions"][t, b] = (other["actions"][t, b] + 1) % A
        other["behavior_logits"][t, b] = torch.tensor([50.0, -50.0, 0.0, 3.0])
        other["target_logits_t"][t, b] = torch.tensor([-7.0, 2.0, 9.0, 0.0])
        other["rewards"][t, b] += 100.0
        other["discounts"][t, b] = 0.0
    # Invalid last step of entry 2: step T-2 bootstraps from V(x_{T-1}), not the bootstrap.
    other["bootstrap_value"][2] += 100.0
    out2 = run_loss(other, **kwargs)
    for name in LOSS_FIELDS:
        torch.testing.assert_close(getattr(out2, name), getattr(out, name), msg=name)
    torch.testing.assert_close(out2.vs, out.vs)

    # Sanity: the same perturbation at a valid step does change the loss.
    other["rewards"][1, 0] += 1.0
    assert not torch.allclose(run_loss(other, **kwargs).total, out.total)

    # And no gradient reaches the policy at invalid steps.
    logits = batch["target_logits_t"].clone().requires_grad_(True)
    run_loss({**batch, "target_logits_t": logits}, **kwargs).total.backward()
    assert logits.grad is not None
    for t, b in invalid:
        assert torch.all(logits.grad[t, b] == 0)
    assert logits.grad[1, 0].abs().sum() > 0


def test_reduction_mean_is_sum_over_num_valid() -> None:
    batch = make_batch(3)
    batch["valid"][2, 1] = False
    batch["valid"][5, 0] = False
    num_valid = int(batch["valid"].sum())
    out_sum = run_loss(batch, reduction="sum")
    out_mean = run_loss(batch, reduction="mean")
    for name in LOSS_FIELDS:
        torch.testing.assert_close(getattr(out_mean, name), getattr(out_sum, name) / num_valid)
    assert float(out_sum.num_valid) == num_valid
    torch.testing.assert_close(out_mean.entropy, out_sum.entropy)


def test_all_invalid_is_zero_and_finite() -> None:
    batch = make_batch(4)
    batch["valid"][:] = False
    for reduction in ("sum", "mean"):
        out = run_loss(batch, reduction=reduction)
        for name in LOSS_FIELDS:
            assert float(getattr(out, name)) == 0.0, name
        for name in ("entropy", "mean_rho", "advantage_mean", "clipped_rho_fraction"):
            assert torch.isfinite(getattr(out, name)), name


def test_loss_components_match_reference() -> None:
    batch = make_batch(5)
    baseline_cost, entropy_cost = 0.25, 0.03
    out = run_loss(batch, baseline_cost=baseline_cost, entropy_cost=entropy_cost)
    ref = vtrace.from_logits(
        behavior_policy_logits=batch["behavior_logits"],
        target_policy_logits=batch["target_logits_t"],
        actions=batch["actions"],
        discounts=batch["discounts"],
        rewards=batch["rewards"],
        values=batch["values_t"],
        bootstrap_value=batch["bootstrap_value"],
    )
    torch.testing.assert_close(out.vs, ref.vs)
    torch.testing.assert_close(out.pg_advantages, ref.pg_advantages)

    logits = batch["target_logits_t"].double().numpy()
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    entropy = -(np.exp(log_p) * log_p).sum(-1)
    lp_a = np.take_along_axis(log_p, batch["actions"].numpy()[..., None], -1)[..., 0]
    vs, adv, v = ref.vs.double().numpy(), ref.pg_advantages.double().numpy(), batch["values_t"]
    expected = {
        "pg_loss": -(lp_a * adv).sum(),
        "baseline_loss": baseline_cost * 0.5 * ((vs - v.double().numpy()) ** 2).sum(),
        "entropy_loss": -entropy_cost * entropy.sum(),
    }
    expected["total"] = sum(expected.values())
    for name, value in expected.items():
        np.testing.assert_allclose(float(getattr(out, name)), value, rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(float(out.entropy), entropy.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(out.advantage_mean), adv.mean(), rtol=1e-5, atol=1e-6)


def test_rho_statistics() -> None:
    batch = make_batch(6, T=10, B=4)
    batch["valid"][4, 2] = False
    batch["valid"][0, 0] = False
    valid = batch["valid"].numpy()

    def logp(logits: torch.Tensor) -> np.ndarray:
        x = logits.double().numpy()
        lp = x - np.log(np.exp(x).sum(-1, keepdims=True))
        return np.take_along_axis(lp, batch["actions"].numpy()[..., None], -1)[..., 0]

    rhos = np.exp(logp(batch["target_logits_t"]) - logp(batch["behavior_logits"]))[valid]
    assert (rhos > 2.0).any() and (rhos < 1.0).any()

    out = run_loss(batch, clip_rho_threshold=1.0, clip_pg_rho_threshold=2.0)
    np.testing.assert_allclose(float(out.clipped_rho_fraction), (rhos > 1.0).mean(), rtol=1e-6)
    np.testing.assert_allclose(float(out.clipped_pg_rho_fraction), (rhos > 2.0).mean(), rtol=1e-6)
    np.testing.assert_allclose(float(out.mean_rho), rhos.mean(), rtol=1e-5)

    out_none = run_loss(batch, clip_rho_threshold=None, clip_pg_rho_threshold=None)
    assert float(out_none.clipped_rho_fraction) == 0.0
    assert float(out_none.clipped_pg_rho_fraction) == 0.0


def test_no_correction_equals_correction_on_policy() -> None:
    batch = make_batch(7, on_policy=True)
    batch["valid"][3, 1] = False
    with_corr = run_loss(batch, correction=True)
    without = run_loss(batch, correction=False)
    for name in (*LOSS_FIELDS, "vs", "pg_advantages"):
        torch.testing.assert_close(getattr(without, name), getattr(with_corr, name), msg=name)


def test_no_correction_ignores_behavior_policy() -> None:
    off = make_batch(8)
    off["valid"][2, 0] = False
    on = {**off, "behavior_logits": off["target_logits_t"].clone()}
    ablated = run_loss(off, correction=False)
    for name in (*LOSS_FIELDS, "vs", "pg_advantages"):
        torch.testing.assert_close(getattr(ablated, name), getattr(run_loss(on), name), msg=name)
    # ... whereas the corrected loss does depend on it.
    assert not torch.allclose(run_loss(off, correction=True).vs, ablated.vs)


def test_gradients_flow_to_target_logits_and_values_only() -> None:
    batch = make_batch(9)
    batch["valid"][1, 1] = False
    logits = batch["target_logits_t"].clone().requires_grad_(True)
    values = batch["values_t"].clone().requires_grad_(True)
    bootstrap = batch["bootstrap_value"].clone().requires_grad_(True)
    behavior = batch["behavior_logits"].clone().requires_grad_(True)
    out = run_loss(
        {
            **batch,
            "target_logits_t": logits,
            "values_t": values,
            "bootstrap_value": bootstrap,
            "behavior_logits": behavior,
        }
    )
    assert out.total.requires_grad and out.total.dim() == 0
    for name in ("pg_loss", "baseline_loss", "entropy_loss", "entropy", "vs", "pg_advantages"):
        assert not getattr(out, name).requires_grad, name
    out.total.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert logits.grad.abs().sum() > 0
    assert values.grad is not None and values.grad.abs().sum() > 0
    # Baseline gradient is exactly zero at the invalid step (its target equals V there).
    assert values.grad[1, 1] == 0
    assert bootstrap.grad is None and behavior.grad is None


def test_entropy_term_is_a_bonus() -> None:
    # Zero rewards and values make every advantage 0, so only the entropy term has
    # gradient; a descent step on the total must then increase the entropy.
    batch = make_batch(10, on_policy=True)
    for name in ("rewards", "values_t", "bootstrap_value"):
        batch[name].zero_()
    batch["target_logits_t"] = 5.0 * batch["target_logits_t"]
    batch["behavior_logits"] = batch["target_logits_t"].clone()
    logits = batch["target_logits_t"].clone().requires_grad_(True)
    out = run_loss({**batch, "target_logits_t": logits}, entropy_cost=1.0)
    assert float(out.entropy_loss) < 0
    torch.testing.assert_close(out.total.detach(), out.entropy_loss)
    out.total.backward()
    stepped = (logits - 0.1 * logits.grad).detach()
    after = run_loss({**batch, "target_logits_t": stepped}, entropy_cost=1.0)
    assert float(after.entropy) > float(out.entropy)


def test_low_precision_inputs() -> None:
    batch = make_batch(11)
    logits = batch["target_logits_t"].bfloat16().requires_grad_(True)
    values = batch["values_t"].bfloat16().requires_grad_(True)
    out = run_loss({**batch, "target_logits_t": logits, "values_t": values})
    assert out.total.dtype == torch.float32 and torch.isfinite(out.total)
    out.total.backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
    assert values.grad is not None


def test_unknown_reduction_raises() -> None:
    with pytest.raises(ValueError, match="reduction"):
        run_loss(make_batch(12), reduction="avg")


def test_float_valid_mask_raises() -> None:
    batch = make_batch(13)
    with pytest.raises(TypeError):
        run_loss({**batch, "valid": batch["valid"].float()})


def test_valid_shape_mismatch_raises() -> None:
    batch = make_batch(14)
    with pytest.raises(ValueError):
        run_loss({**batch, "valid": batch["valid"][:-1]})


def test_discounts_from_terminated() -> None:
    terminated = torch.tensor([[False, True], [True, False], [False, False]])
    out = discounts_from_terminated(terminated, 0.99)
    assert out.dtype == torch.float32 and out.shape == (3, 2)
    torch.testing.assert_close(out, torch.tensor([[0.99, 0.0], [0.0, 0.99], [0.99, 0.99]]))
    with pytest.raises(ValueError):
        discounts_from_terminated(terminated, 1.5)


def test_normalized_advantages_have_unit_scale_on_valid_steps():
    from impala_gpu.rl.losses import normalized

    g = torch.Generator().manual_seed(0)
    x = 3.0 + 5.0 * torch.randn(6, 4, generator=g)
    valid = torch.ones(6, 4, dtype=torch.bool)
    valid[2, 1] = valid[5, 3] = False
    x[2, 1] = float("nan")  # garbage at an invalid step must not leak
    y = normalized(x, valid)
    assert torch.isfinite(y).all() and y[2, 1] == 0 and y[5, 3] == 0
    assert y[valid].mean().abs() < 1e-6
    assert y[valid].std().item() == pytest.approx(1.0, abs=1e-5)
    torch.testing.assert_close(y[valid], (x[valid] - x[valid].mean()) / x[valid].std())


def test_normalized_over_shares_is_the_whole_minibatchs_normalisation():
    from impala_gpu.rl.losses import normalized

    g = torch.Generator().manual_seed(1)
    x = -2.0 + 4.0 * torch.randn(5, 7, generator=g)
    valid = torch.rand(5, 7, generator=g) > 0.2
    x[~valid] = float("nan")
    shares = [slice(0, 3), slice(3, 4), slice(4, 7)]  # uneven, as trajectories split
    given: list[torch.Tensor] = []

    def summed(moments: torch.Tensor) -> torch.Tensor:  # what the other shares hand in too
        given.append(moments)
        count, total, squares = [], [], []
        for s in shares:
            v = x[:, s][valid[:, s]].double()
            count.append(v.numel())
            total.append(v.sum())
            squares.append((v * v).sum())
        return torch.stack([torch.tensor(sum(count)).double(), sum(total), sum(squares)])

    whole = normalized(x, valid)
    for s in shares:
        part = normalized(x[:, s], valid[:, s], reduce=summed)
        torch.testing.assert_close(part, whole[:, s])
        # and not what the share alone would give
        assert not torch.allclose(part, normalized(x[:, s], valid[:, s]))
    assert [m.dtype for m in given] == [torch.float64] * 3
    assert given[1][0] == valid[:, 3].sum()  # each share hands in its own moments


def brute_force_uncorrected(batch: dict[str, torch.Tensor], pg_rho_bar: float | None, is1: bool):
    """``none`` and ``is1`` by plain loops: n-step returns ``vs_t = r_t + g_t * vs_{t+1}``
    (``V(x_t)`` at an invalid step, which cuts the trace; the bootstrap value after the last
    step); the pg advantage ``r_t + g_t * vs_{t+1} - V(x_t)``, times ``min(rho-bar, rho_t)`` for
    is1. Returns (vs, pg advantages, pg_loss, baseline_loss) summed over valid steps."""
    T, B = batch["values_t"].shape
    v = batch["values_t"].double().numpy()
    r, g = batch["rewards"].double().numpy(), batch["discounts"].double().numpy()
    valid, a = batch["valid"].numpy(), batch["actions"].numpy()

    def logp(logits):
        x = logits.double().numpy()
        lp = x - np.log(np.exp(x).sum(-1, keepdims=True))
        return np.take_along_axis(lp, a[..., None], -1)[..., 0]

    lp_pi, lp_mu = logp(batch["target_logits_t"]), logp(batch["behavior_logits"])
    vs, adv = np.zeros((T, B)), np.zeros((T, B))
    pg_loss = baseline_loss = 0.0
    for b in range(B):
        nxt = float(batch["bootstrap_value"][b])
        for t in reversed(range(T)):
            if not valid[t, b]:
                vs[t, b] = v[t, b]
            else:
                vs[t, b] = r[t, b] + g[t, b] * nxt
                adv[t, b] = vs[t, b] - v[t, b]
                if is1:
                    rho = np.exp(lp_pi[t, b] - lp_mu[t, b])
                    adv[t, b] *= rho if pg_rho_bar is None else min(pg_rho_bar, rho)
                pg_loss -= lp_pi[t, b] * adv[t, b]
                baseline_loss += 0.5 * (vs[t, b] - v[t, b]) ** 2
            nxt = vs[t, b]
    return vs, adv, pg_loss, baseline_loss


@pytest.mark.parametrize("correction", ["none", "is1"])
@pytest.mark.parametrize("pg_rho_bar", [1.5, None])
def test_none_and_is1_match_brute_force(correction: str, pg_rho_bar: float | None) -> None:
    batch = make_batch(11, T=9, B=4)
    batch["valid"][3, 1] = False
    batch["valid"][8, 2] = False
    batch["discounts"][5, 0] = 0.0  # a termination
    out = run_loss(batch, correction=correction, clip_pg_rho_threshold=pg_rho_bar, baseline_cost=1)
    vs, adv, pg_loss, baseline_loss = brute_force_uncorrected(
        batch, pg_rho_bar, correction == "is1"
    )
    np.testing.assert_allclose(out.vs.double().numpy(), vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.double().numpy(), adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(out.pg_loss), pg_loss, rtol=1e-5)
    np.testing.assert_allclose(float(out.baseline_loss), baseline_loss, rtol=1e-5)


def test_is1_differs_from_none_only_in_the_policy_gradient() -> None:
    batch = make_batch(12)
    none, is1 = run_loss(batch, correction="none"), run_loss(batch, correction="is1")
    torch.testing.assert_close(is1.vs, none.vs)
    torch.testing.assert_close(is1.baseline_loss, none.baseline_loss)
    assert not torch.allclose(is1.pg_loss, none.pg_loss)
    on = make_batch(12, on_policy=True)  # rho = 1: all three corrections agree
    for name in (*LOSS_FIELDS, "vs", "pg_advantages"):
        ref = getattr(run_loss(on, correction="vtrace"), name)
        for corr in ("none", "is1"):
            torch.testing.assert_close(getattr(run_loss(on, correction=corr), name), ref)


def test_correction_accepts_legacy_bools_and_names_the_fix() -> None:
    batch = make_batch(13)
    torch.testing.assert_close(run_loss(batch, correction=True).vs, run_loss(batch).vs)
    torch.testing.assert_close(
        run_loss(batch, correction=False).vs, run_loss(batch, correction="none").vs
    )
    with pytest.raises(ValueError, match="algo.correction='retrace'.*Fix: algo.correction=vtrace"):
        run_loss(batch, correction="retrace")


def test_off_policy_diagnostics_match_numpy() -> None:
    batch = make_batch(14, T=6, B=3)
    batch["valid"][2, 1] = False
    out = run_loss(batch)
    valid = batch["valid"].numpy()

    def log_softmax(x):
        x = x.double().numpy()
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp_mu, lp_pi = log_softmax(batch["behavior_logits"]), log_softmax(batch["target_logits_t"])
    a = batch["actions"].numpy()[..., None]
    log_rho = (np.take_along_axis(lp_pi, a, -1) - np.take_along_axis(lp_mu, a, -1))[..., 0]
    kl = (np.exp(lp_mu) * (lp_mu - lp_pi)).sum(-1)
    np.testing.assert_allclose(float(out.mean_abs_log_rho), np.abs(log_rho)[valid].mean(), 1e-5)
    np.testing.assert_allclose(float(out.kl_behavior_target), kl[valid].mean(), rtol=1e-5)
    on = run_loss(make_batch(14, on_policy=True))
    assert float(on.mean_abs_log_rho) == 0.0 and abs(float(on.kl_behavior_target)) < 1e-6


def brute_force_ppo_pg_sum(
    batch: dict[str, torch.Tensor], epsilon: float, reference: torch.Tensor | None = None
) -> float:
    """-sum_t min(r_t A_t, clip(r_t) A_t), with V-trace's vs from a plain numpy recursion and
    A_t = r_t + gamma vs_{t+1} - V(x_t). With ``reference`` logits: r_t = pi / pi_ref, and
    each step weighted by min(1, pi_ref / mu)."""
    logits = batch["target_logits_t"].double().numpy()
    mu_logits = batch["behavior_logits"].double().numpy()
    a = batch["actions"].numpy()
    rew, disc = batch["rewards"].double().numpy(), batch["discounts"].double().numpy()
    v, boot = batch["values_t"].double().numpy(), batch["bootstrap_value"].double().numpy()
    T, B = a.shape

    def logp(lg):
        lse = np.log(np.exp(lg).sum(-1))
        return np.take_along_axis(lg, a[..., None], -1)[..., 0] - lse

    ratio = np.exp(logp(logits) - logp(mu_logits))
    rho, c = np.minimum(1.0, ratio), np.minimum(1.0, ratio)
    vs = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            acc, prod = v[s, b], 1.0
            for t in range(s, T):
                v_tp1 = v[t + 1, b] if t + 1 < T else boot[b]
                acc += (
                    prod
                    * disc[s:t, b].prod()
                    * rho[t, b]
                    * (rew[t, b] + disc[t, b] * v_tp1 - v[t, b])
                )
                prod *= c[t, b]
            vs[s, b] = acc
    vs_tp1 = np.concatenate([vs[1:], boot[None]], 0)
    adv = rew + disc * vs_tp1 - v
    weight = np.ones_like(ratio)
    if reference is not None:
        ref_lp = logp(reference.double().numpy())
        weight = np.minimum(1.0, np.exp(ref_lp - logp(mu_logits)))
        ratio = np.exp(logp(logits) - ref_lp)
    surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - epsilon, 1 + epsilon) * adv)
    return float(-(weight * surrogate).sum())


def test_ppo_surrogate_matches_brute_force() -> None:
    batch = make_batch(3, T=6, B=3)
    out = run_loss(batch, ppo_clip=0.2, reduction="sum")
    assert out.pg_loss.item() == pytest.approx(brute_force_ppo_pg_sum(batch, 0.2), rel=1e-5)


def test_ppo_surrogate_against_a_reference_policy_matches_brute_force() -> None:
    batch = make_batch(6, T=6, B=3)
    g = torch.Generator().manual_seed(60)
    reference = batch["target_logits_t"].detach() + 0.3 * torch.randn(
        batch["target_logits_t"].shape, generator=g
    )
    out = run_loss(batch, ppo_clip=0.2, reduction="sum", reference_logits=reference)
    expected = brute_force_ppo_pg_sum(batch, 0.2, reference)
    assert out.pg_loss.item() == pytest.approx(expected, rel=1e-5)
    assert expected != pytest.approx(brute_force_ppo_pg_sum(batch, 0.2), rel=1e-3)


def test_ppo_surrogate_anchored_at_the_learner_has_the_truncated_is_gradient() -> None:
    # pi_ref = pi: r = 1, nothing clipped, and the gradient is V-trace's pg with
    # rho = min(1, pi/mu): the clip starts from the learner, however stale the actor.
    batch = make_batch(7, T=5, B=4)
    grads = []
    for kwargs in (
        {},
        {"ppo_clip": 0.1, "reference_logits": batch["target_logits_t"].detach().clone()},
    ):
        b = clone_batch(batch)
        b["target_logits_t"].requires_grad_(True)
        run_loss(b, reduction="sum", **kwargs).total.backward()
        grads.append(b["target_logits_t"].grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_ppo_surrogate_gradient_is_zero_where_the_ratio_is_clipped() -> None:
    # Far off-policy (ratios outside [0.9, 1.1]) the clipped branch is the min for A > 0 and
    # r > 1 + eps, or A < 0 and r < 1 - eps: those steps give the policy no gradient.
    batch = make_batch(4, T=5, B=4)
    logits = batch["target_logits_t"]
    out = run_loss(batch, ppo_clip=0.1, reduction="sum")
    log_pi = torch.log_softmax(logits, -1).gather(-1, batch["actions"][..., None])[..., 0]
    log_mu = torch.log_softmax(batch["behavior_logits"], -1).gather(
        -1, batch["actions"][..., None]
    )[..., 0]
    ratio = torch.exp(log_pi - log_mu)
    adv = out.pg_advantages
    clipped = ((adv > 0) & (ratio > 1.1)) | ((adv < 0) & (ratio < 0.9))
    assert clipped.any() and (~clipped).any()
    # Only the pg term differs between the two losses: compare with entropy off.
    batch["target_logits_t"] = logits.detach().clone().requires_grad_(True)
    run_loss(batch, ppo_clip=0.1, reduction="sum", entropy_cost=0.0).total.backward()
    grad = batch["target_logits_t"].grad
    assert torch.all(grad[clipped] == 0)
    assert torch.all(grad[~clipped].abs().sum(-1) > 0)


def test_ppo_surrogate_on_policy_has_the_plain_gradient() -> None:
    # r = 1: the surrogate's gradient is A * grad log pi, V-trace's pg with rho = 1.
    batch = make_batch(5, on_policy=True)
    grads = []
    for clip in (0.0, 0.2):
        b = clone_batch(batch)
        b["target_logits_t"].requires_grad_(True)
        run_loss(b, ppo_clip=clip, reduction="mean").total.backward()
        grads.append(b["target_logits_t"].grad)
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize(
    "name, bad, message",
    [
        ("rewards", lambda b: b["rewards"][:, 0], r"rewards must be \[T, B\].*got shape \(8,\)"),
        ("bootstrap_value", lambda b: b["values_t"], r"bootstrap_value must be \[B\]"),
        ("behavior_logits", lambda b: b["actions"], r"behavior_logits must be \[T, B, A\]"),
        ("actions", lambda b: b["actions"][1:], r"actions.shape \(7, 3\) must be \(8, 3\)"),
        ("discounts", lambda b: b["discounts"][:, :2], r"discounts.shape \(8, 2\) must be"),
    ],
)
def test_inputs_of_the_wrong_shape_are_named(name, bad, message) -> None:
    batch = make_batch(15)
    with pytest.raises(ValueError, match=message):
        run_loss({**batch, name: bad(batch)})


def test_reference_logits_of_the_wrong_shape_are_named() -> None:
    batch = make_batch(16)
    with pytest.raises(ValueError, match=r"reference_logits.shape \(8, 3, 5\) must be \(8, 3, 4\)"):
        run_loss(batch, ppo_clip=0.2, reference_logits=torch.zeros(8, 3, 5))


def test_loss_options_check_the_reduction_and_name_the_correction() -> None:
    assert LossOptions(correction=False).correction == "none"
    assert LossOptions(correction=True).correction == "vtrace"
    with pytest.raises(ValueError, match="Fix: algo.reduction=sum"):
        LossOptions(reduction="avg")
    with pytest.raises(dataclasses.FrozenInstanceError):
        LossOptions().ppo_clip = 0.1  # type: ignore[misc]


def test_ppo_objective_anchored_at_the_behaviour_as_a_reference_is_appos() -> None:
    # pi_ref = mu: the ratio is APPO's, and IMPACT's weight min(rho-bar, pi_ref / mu) is
    # min(rho-bar, 1) at valid steps, 0 at invalid ones.
    batch = make_batch(17)
    actions, valid = batch["actions"], batch["valid"]
    valid[2, 1] = False
    pi = vtrace.action_log_probs(batch["target_logits_t"], actions)
    mu = vtrace.action_log_probs(batch["behavior_logits"], actions)
    advantages = torch.randn(pi.shape, generator=torch.Generator().manual_seed(0))
    appo = ppo_objective(pi, mu, advantages, valid, LossOptions(ppo_clip=0.2))
    for rho_bar, weight in ((1.0, 1.0), (2.0, 1.0), (0.5, 0.5)):
        options = LossOptions(ppo_clip=0.2, clip_pg_rho_threshold=rho_bar)
        impact = ppo_objective(pi, mu, advantages, valid, options, mu)
        torch.testing.assert_close(impact[valid], weight * appo[valid])
        assert impact[2, 1] == 0


def test_behavior_trust_marks_only_steps_pushed_past_the_bound() -> None:
    rho = torch.tensor([[2.0, 2.0, 0.4, 0.4, 1.2, 0.8]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0, -1.0]])
    trust = behavior_trust(torch.log(rho), adv, 0.5)
    # Past 1.5 with A > 0 and below 0.5 with A < 0: silenced. Past it the other way (the
    # gradient pulls back towards mu) or inside the bound: kept.
    assert trust.tolist() == [[0.0, 1.0, 0.0, 1.0, 1.0, 1.0]]


def test_behavior_clip_silences_stale_pushes_and_keeps_the_rest() -> None:
    # First-visit anchor (reference = pi): the gradient is the truncated-IS one, except at
    # the steps behavior_trust marks, which give none; the fraction logged is theirs.
    batch = make_batch(18, T=6, B=4)
    reference = batch["target_logits_t"].detach().clone()
    grads, outs = [], []
    for bound in (None, 0.3):
        b = clone_batch(batch)
        b["target_logits_t"].requires_grad_(True)
        kwargs = {"ppo_clip": 0.1, "reduction": "sum", "entropy_cost": 0.0}
        out = run_loss(b, reference, behavior_clip=bound, **kwargs)
        out.total.backward()
        grads.append(b["target_logits_t"].grad)
        outs.append(out)
    pi = vtrace.action_log_probs(batch["target_logits_t"], batch["actions"])
    mu = vtrace.action_log_probs(batch["behavior_logits"], batch["actions"])
    marked = behavior_trust(pi - mu, outs[1].pg_advantages, 0.3) == 0
    marked &= batch["valid"]
    assert marked.any() and (~marked & batch["valid"]).any()
    assert torch.all(grads[1][marked] == 0) and torch.all(grads[0][marked].abs().sum(-1) > 0)
    torch.testing.assert_close(grads[1][~marked], grads[0][~marked])
    share = marked.sum() / batch["valid"].sum()
    assert outs[1].behavior_clipped_fraction.item() == pytest.approx(share.item())
    assert outs[0].behavior_clipped_fraction.item() == 0.0
