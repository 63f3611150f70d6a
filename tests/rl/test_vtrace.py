"""Tests for impala_gpu.rl.vtrace against an independent brute-force evaluation of the paper."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from impala_gpu.rl import vtrace

# float32 implementation vs float64 reference.
RTOL = 1e-5
ATOL = 1e-4


def brute_force_vtrace(
    log_rhos: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    clip_rho_threshold: float | None,
    clip_pg_rho_threshold: float | None,
    lambda_: float,
) -> tuple[np.ndarray, np.ndarray]:
    """O(T^2) direct evaluation of eq. (1) of Espeholt et al. 2018 (with lambda), float64.

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t.
    """
    log_rhos, discounts, rewards, values, bootstrap_value = (
        np.asarray(a, dtype=np.float64)
        for a in (log_rhos, discounts, rewards, values, bootstrap_value)
    )
    T = rewards.shape[0]
    rhos = np.exp(log_rhos)
    rho_bar = np.inf if clip_rho_threshold is None else clip_rho_threshold
    pg_rho_bar = np.inf if clip_pg_rho_threshold is None else clip_pg_rho_threshold
    cs = lambda_ * np.minimum(1.0, rhos)

    def value_at(t: int) -> np.ndarray:
        return bootstrap_value if t == T else values[t]

    vs = np.zeros_like(values)
    for s in range(T):
        v_s = values[s].copy()
        for t in range(s, T):
            coef = np.ones_like(values[0])
            for i in range(s, t):
                coef = coef * discounts[i] * cs[i]
            delta_t = np.minimum(rho_bar, rhos[t]) * (
                rewards[t] + discounts[t] * value_at(t + 1) - values[t]
            )
            v_s = v_s + coef * delta_t
        vs[s] = v_s

    pg_advantages = np.zeros_like(values)
    for s in range(T):
        vs_next = bootstrap_value if s == T - 1 else vs[s + 1]
        pg_advantages[s] = np.minimum(pg_rho_bar, rhos[s]) * (
            rewards[s] + discounts[s] * vs_next - values[s]
        )
    return vs, pg_advantages


def random_inputs(rng: np.random.Generator, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Random float32 V-trace inputs with discount zeros in mid-sequence."""
    T = shape[0]
    discounts = rng.uniform(0.5, 1.0, size=shape)
    discounts[T // 2] = 0.0  # an episode end in the middle, every batch entry
    discounts[rng.uniform(size=shape) < 0.15] = 0.0
    return {
        "log_rhos": rng.uniform(-2.5, 2.5, size=shape).astype(np.float32),
        "discounts": discounts.astype(np.float32),
        "rewards": rng.normal(size=shape).astype(np.float32),
        "values": rng.normal(size=shape).astype(np.float32),
        "bootstrap_value": rng.normal(size=shape[1:]).astype(np.float32),
    }


def to_torch(inputs: dict[str, np.ndarray], requires_grad: bool = False) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v, requires_grad=requires_grad) for k, v in inputs.items()}


@pytest.mark.parametrize("shape", [(7, 1), (7, 5), (6, 2, 3)], ids=["B1", "B5", "extra_dim"])
@pytest.mark.parametrize("lambda_", [1.0, 0.9, 0.0])
@pytest.mark.parametrize(
    "clip_rho_threshold, clip_pg_rho_threshold",
    [(1.0, 1.0), (3.7, 2.2), (None, None)],
    ids=["clip1", "clip3.7_2.2", "noclip"],
)
def test_from_importance_weights_matches_brute_force(
    shape: tuple[int, ...],
    lambda_: float,
    clip_rho_threshold: float | None,
    clip_pg_rho_threshold: float | None,
) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((shape, lambda_, clip_rho_threshold)).encode()))
    inputs = random_inputs(rng, shape)
    expected_vs, expected_pg = brute_force_vtrace(
        **inputs,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )
    out = vtrace.from_importance_weights(
        **to_torch(inputs),
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
    )
    assert out.vs.shape == shape and out.pg_advantages.shape == shape
    assert out.vs.dtype == torch.float32 and out.pg_advantages.dtype == torch.float32
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=RTOL, atol=ATOL)


def test_clipping_is_exercised_by_random_inputs() -> None:
    # Guards the parametrized test: the clip thresholds must actually bind on the data.
    inputs = random_inputs(np.random.default_rng(0), (7, 5))
    rhos = np.exp(inputs["log_rhos"])
    assert (rhos > 3.7).any() and (rhos < 1.0).any()
    assert ((rhos > 1.0) & (rhos < 2.2)).any()


def test_golden_on_policy() -> None:
    # T=2, B=1, rho=1, discount 0.9, lambda=1, r=[1, 2], V=[0.5, 1.0], bootstrap=2.0.
    # delta_0 = 1 + 0.9*1.0 - 0.5 = 1.4 ; delta_1 = 2 + 0.9*2.0 - 1.0 = 2.8
    # vs_1 = 1.0 + 2.8 = 3.8            (= r1 + 0.9*boot = 2 + 1.8)
    # vs_0 = 0.5 + 1.4 + 0.9*2.8 = 4.42 (= 1 + 0.9*2 + 0.81*2 = 1 + 1.8 + 1.62)
    # pg_0 = 1 + 0.9*vs_1 - 0.5 = 1 + 3.42 - 0.5 = 3.92 ; pg_1 = 2 + 0.9*2.0 - 1.0 = 2.8
    out = vtrace.from_importance_weights(
        log_rhos=torch.zeros(2, 1),
        discounts=torch.full((2, 1), 0.9),
        rewards=torch.tensor([[1.0], [2.0]]),
        values=torch.tensor([[0.5], [1.0]]),
        bootstrap_value=torch.tensor([2.0]),
    )
    torch.testing.assert_close(out.vs, torch.tensor([[4.42], [3.8]]))
    torch.testing.assert_close(out.pg_advantages, torch.tensor([[3.92], [2.8]]))


def test_golden_clipped() -> None:
    # Same as above but rho = [2, 0.5], rho_bar = pg_rho_bar = 1:
    # clipped rho = [1, 0.5], c = [1, 0.5]
    # delta_0 = 1 * 1.4 = 1.4 ; delta_1 = 0.5 * 2.8 = 1.4
    # vs_1 = 1.0 + 1.4 = 2.4 ; vs_0 = 0.5 + 1.4 + 0.9*1*1.4 = 3.16
    # pg_0 = 1 * (1 + 0.9*2.4 - 0.5) = 2.66 ; pg_1 = 0.5 * (2 + 0.9*2.0 - 1.0) = 1.4
    out = vtrace.from_importance_weights(
        log_rhos=torch.tensor([[math.log(2.0)], [math.log(0.5)]]),
        discounts=torch.full((2, 1), 0.9),
        rewards=torch.tensor([[1.0], [2.0]]),
        values=torch.tensor([[0.5], [1.0]]),
        bootstrap_value=torch.tensor([2.0]),
    )
    torch.testing.assert_close(out.vs, torch.tensor([[3.16], [2.4]]))
    torch.testing.assert_close(out.pg_advantages, torch.tensor([[2.66], [1.4]]))


def test_outputs_carry_no_gradient() -> None:
    inputs = to_torch(random_inputs(np.random.default_rng(1), (5, 3)), requires_grad=True)
    out = vtrace.from_importance_weights(**inputs)
    assert not out.vs.requires_grad
    assert not out.pg_advantages.requires_grad
    assert out.vs.grad_fn is None and out.pg_advantages.grad_fn is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_computed_in_float32(dtype: torch.dtype) -> None:
    inputs = random_inputs(np.random.default_rng(2), (6, 4))
    low = {k: torch.tensor(v).to(dtype) for k, v in inputs.items()}
    out = vtrace.from_importance_weights(**low)
    assert out.vs.dtype == torch.float32 and out.pg_advantages.dtype == torch.float32
    # Reference on the rounded inputs: any residual error is from fp32 arithmetic only.
    rounded = {k: v.float().numpy() for k, v in low.items()}
    expected_vs, expected_pg = brute_force_vtrace(
        **rounded, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, lambda_=1.0
    )
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=RTOL, atol=ATOL)


def test_episode_split_invariance() -> None:
    """V-trace over a multi-episode sequence equals V-trace over each episode separately."""
    rng = np.random.default_rng(3)
    T, B = 12, 3
    inputs = random_inputs(rng, (T, B))
    discounts = rng.uniform(0.8, 1.0, size=(T, B)).astype(np.float32)
    # Episode ends (discount 0) at different places per batch entry, incl. t=0 and t=T-1.
    terminals = {0: [3, 7], 1: [0, 5, 6], 2: [11]}
    for b, ts in terminals.items():
        discounts[ts, b] = 0.0
    inputs["discounts"] = discounts
    full = vtrace.from_importance_weights(**to_torch(inputs))

    def split_run(discounts_np: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        vs = np.zeros((T, B), np.float32)
        pg = np.zeros((T, B), np.float32)
        for b, ts in terminals.items():
            start = 0
            for end in [*ts, T - 1]:
                if start > end:
                    continue
                seg = slice(start, end + 1)
                if end == T - 1:
                    bootstrap = inputs["bootstrap_value"][b]
                else:
                    # The next episode's first value; deliberately replaced by an arbitrary
                    # number, which is harmless only because discount_end == 0.
                    bootstrap = np.float32(1234.5)
                out = vtrace.from_importance_weights(
                    log_rhos=torch.tensor(inputs["log_rhos"][seg, b : b + 1]),
                    discounts=torch.tensor(discounts_np[seg, b : b + 1]),
                    rewards=torch.tensor(inputs["rewards"][seg, b : b + 1]),
                    values=torch.tensor(inputs["values"][seg, b : b + 1]),
                    bootstrap_value=torch.tensor([bootstrap]),
                )
                vs[seg, b] = out.vs[:, 0].numpy()
                pg[seg, b] = out.pg_advantages[:, 0].numpy()
                start = end + 1
        return vs, pg

    vs, pg = split_run(discounts)
    np.testing.assert_allclose(full.vs.numpy(), vs, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(full.pg_advantages.numpy(), pg, rtol=RTOL, atol=ATOL)

    # Negative control: without the zero discounts the episodes are coupled and the split
    # run (with its arbitrary bootstraps) must disagree, so the check above is not vacuous.
    coupled = discounts.copy()
    for b, ts in terminals.items():
        coupled[ts, b] = 0.9
    vs_bad, _ = split_run(coupled)
    assert not np.allclose(
        vtrace.from_importance_weights(**to_torch({**inputs, "discounts": coupled})).vs.numpy(),
        vs_bad,
        atol=1e-2,
    )


def test_negative_infinite_log_rho_masks_step() -> None:
    # rho = c = 0 at step k: vs_k == V(x_k) and the trace is cut there.
    inputs = to_torch(random_inputs(np.random.default_rng(4), (6, 2)))
    inputs["log_rhos"][3] = float("-inf")
    out = vtrace.from_importance_weights(**inputs)
    assert torch.isfinite(out.vs).all() and torch.isfinite(out.pg_advantages).all()
    torch.testing.assert_close(out.vs[3], inputs["values"][3])
    torch.testing.assert_close(out.pg_advantages[3], torch.zeros(2))


def _log_softmax_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_action_log_probs() -> None:
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(4, 3, 6)).astype(np.float32)
    actions = rng.integers(0, 6, size=(4, 3))
    out = vtrace.action_log_probs(torch.tensor(logits), torch.tensor(actions))
    expected = np.take_along_axis(_log_softmax_np(logits), actions[..., None], axis=-1)[..., 0]
    assert out.shape == (4, 3)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_from_logits() -> None:
    rng = np.random.default_rng(6)
    T, B, A = 8, 4, 5
    behavior_logits = rng.normal(size=(T, B, A)).astype(np.float32)
    target_logits = (2.0 * rng.normal(size=(T, B, A))).astype(np.float32)
    actions = rng.integers(0, A, size=(T, B))
    inputs = random_inputs(rng, (T, B))

    target_t = torch.tensor(target_logits, requires_grad=True)
    behavior_t = torch.tensor(behavior_logits, requires_grad=True)
    values_t = torch.tensor(inputs["values"], requires_grad=True)
    out = vtrace.from_logits(
        behavior_policy_logits=behavior_t,
        target_policy_logits=target_t,
        actions=torch.tensor(actions),
        discounts=torch.tensor(inputs["discounts"]),
        rewards=torch.tensor(inputs["rewards"]),
        values=values_t,
        bootstrap_value=torch.tensor(inputs["bootstrap_value"]),
        clip_rho_threshold=1.0,
        clip_pg_rho_threshold=1.0,
    )

    def gather(lp: np.ndarray) -> np.ndarray:
        return np.take_along_axis(lp, actions[..., None], axis=-1)[..., 0]

    target_lp = gather(_log_softmax_np(target_logits))
    behavior_lp = gather(_log_softmax_np(behavior_logits))
    log_rhos = target_lp - behavior_lp
    assert np.abs(log_rhos).max() > 0.5  # the two policies really differ

    np.testing.assert_allclose(out.target_action_log_probs.detach().numpy(), target_lp, atol=1e-5)
    np.testing.assert_allclose(out.behavior_action_log_probs.numpy(), behavior_lp, atol=1e-5)
    np.testing.assert_allclose(out.log_rhos.numpy(), log_rhos, atol=1e-5)

    expected_vs, expected_pg = brute_force_vtrace(
        log_rhos=log_rhos,
        discounts=inputs["discounts"],
        rewards=inputs["rewards"],
        values=inputs["values"],
        bootstrap_value=inputs["bootstrap_value"],
        clip_rho_threshold=1.0,
        clip_pg_rho_threshold=1.0,
        lambda_=1.0,
    )
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=RTOL, atol=ATOL)

    # Only the target log-probs carry gradient, and only into the target logits.
    assert out.target_action_log_probs.requires_grad
    for name in ("vs", "pg_advantages", "log_rhos", "behavior_action_log_probs"):
        assert not getattr(out, name).requires_grad, name
    out.target_action_log_probs.sum().backward()
    assert target_t.grad is not None and target_t.grad.abs().sum() > 0
    assert behavior_t.grad is None
    assert values_t.grad is None


@pytest.mark.parametrize(
    "behavior_shape, target_shape, actions_shape",
    [
        ((4, 3), (4, 3, 5), (4, 3)),
        ((4, 3, 5), (4, 3, 5, 1), (4, 3)),
        ((4, 3, 5), (4, 3, 5), (4, 3, 1)),
        ((4, 3, 5), (4, 3, 6), (4, 3)),
    ],
    ids=["behavior_rank2", "target_rank4", "actions_rank3", "logit_shape_mismatch"],
)
def test_from_logits_rank_errors(
    behavior_shape: tuple[int, ...], target_shape: tuple[int, ...], actions_shape: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError):
        vtrace.from_logits(
            behavior_policy_logits=torch.zeros(behavior_shape),
            target_policy_logits=torch.zeros(target_shape),
            actions=torch.zeros(actions_shape, dtype=torch.int64),
            discounts=torch.ones(4, 3),
            rewards=torch.zeros(4, 3),
            values=torch.zeros(4, 3),
            bootstrap_value=torch.zeros(3),
        )


@pytest.mark.parametrize(
    "override",
    [
        {"values": torch.zeros(5, 3, 1)},
        {"values": torch.zeros(5)},
        {"log_rhos": torch.zeros(5, 3, 1)},
        {"discounts": torch.zeros(5)},
        {"bootstrap_value": torch.zeros(5, 3)},
        {"bootstrap_value": torch.zeros(())},
        {"bootstrap_value": torch.zeros(4)},
        {"values": torch.zeros(5, 4)},
    ],
    ids=[
        "values_rank_high",
        "values_rank_low",
        "log_rhos_rank",
        "discounts_rank",
        "bootstrap_rank_high",
        "bootstrap_rank_low",
        "bootstrap_shape",
        "values_shape",
    ],
)
def test_from_importance_weights_shape_errors(override: dict[str, torch.Tensor]) -> None:
    kwargs = {
        "log_rhos": torch.zeros(5, 3),
        "discounts": torch.ones(5, 3),
        "rewards": torch.zeros(5, 3),
        "values": torch.zeros(5, 3),
        "bootstrap_value": torch.zeros(3),
        **override,
    }
    with pytest.raises(ValueError):
        vtrace.from_importance_weights(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [{"clip_rho_threshold": -1.0}, {"clip_pg_rho_threshold": -0.1}, {"lambda_": 1.5}],
)
def test_invalid_hyperparameters_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        vtrace.from_importance_weights(
            log_rhos=torch.zeros(5, 3),
            discounts=torch.ones(5, 3),
            rewards=torch.zeros(5, 3),
            values=torch.zeros(5, 3),
            bootstrap_value=torch.zeros(3),
            **kwargs,
        )


def test_td_errors_bootstrap_from_the_next_estimate() -> None:
    rng = np.random.default_rng(8)
    inputs = to_torch(random_inputs(rng, (6, 3)))
    r, g, v, boot = (inputs[k] for k in ("rewards", "discounts", "values", "bootstrap_value"))
    estimates = torch.tensor(rng.normal(size=(6, 3)).astype(np.float32))
    out = vtrace.td_errors(estimates, r, g, v.requires_grad_(True), boot)
    next_estimates = torch.cat([estimates[1:], boot[None]])
    torch.testing.assert_close(out, r + g * next_estimates - v.detach())
    assert not out.requires_grad
    # V-trace's advantages are these on vs, times the clipped ratios.
    vt = vtrace.from_importance_weights(**inputs, clip_pg_rho_threshold=1.3)
    rhos = inputs["log_rhos"].exp().clamp(max=1.3)
    torch.testing.assert_close(vt.pg_advantages, rhos * vtrace.td_errors(vt.vs, r, g, v, boot))


def test_from_logits_passes_vtraces_parameters_on() -> None:
    rng = np.random.default_rng(9)
    T, B, A = 6, 3, 4
    inputs = to_torch(random_inputs(rng, (T, B)))
    del inputs["log_rhos"]
    logits = [torch.tensor(rng.normal(size=(T, B, A)).astype(np.float32)) for _ in range(2)]
    actions = torch.tensor(rng.integers(0, A, size=(T, B)))
    params = {"clip_rho_threshold": None, "clip_pg_rho_threshold": 0.7, "lambda_": 0.8}
    out = vtrace.from_logits(*logits, actions, **inputs, **params)
    direct = vtrace.from_importance_weights(out.log_rhos, **inputs, **params)
    torch.testing.assert_close(out.vs, direct.vs)
    torch.testing.assert_close(out.pg_advantages, direct.pg_advantages)
    assert not torch.allclose(out.vs, vtrace.from_logits(*logits, actions, **inputs).vs)
    with pytest.raises(TypeError, match="clip_rho"):
        vtrace.from_logits(*logits, actions, **inputs, clip_rho=1.0)


def test_assert_time_major_names_the_tensor_and_its_layout() -> None:
    vtrace.assert_time_major("[T, B]", rewards=torch.zeros(4, 3), values=torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"values must be \[T, B\] .*got shape \(4, 3, 1\)"):
        vtrace.assert_time_major("[T, B]", rewards=torch.zeros(4, 3), values=torch.zeros(4, 3, 1))
    with pytest.raises(ValueError, match=r"bootstrap_value must be \[B\]"):
        vtrace.assert_time_major("[B]", bootstrap_value=torch.zeros(()))
