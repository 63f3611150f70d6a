"""Tests for impala_gpu.learning.shards: a train step split by trajectory over threads takes
the step the whole minibatch takes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from impala_gpu.config import AlgoCfg, Config, ConfigError, EnvCfg, ModelCfg
from impala_gpu.learning import learner
from impala_gpu.learning.batcher import Batch
from impala_gpu.learning.shards import LOSS_STATS, ShardThreads, shard_weights
from impala_gpu.models import build_model
from impala_gpu.validate import validate_config

T, B, OBS, A = 6, 7, 3, 4


def make_batch(seed: int = 0) -> Batch:
    """Uneven episode ends, so the shards hold different numbers of valid steps."""
    g = torch.Generator().manual_seed(seed)
    shape = (T + 1, B)
    terminated = torch.rand(shape, generator=g) < 0.15
    truncated = (torch.rand(shape, generator=g) < 0.05) & ~terminated
    return Batch(
        obs=torch.randn((*shape, OBS), generator=g),
        reward=torch.randn(shape, generator=g),
        terminated=terminated,
        truncated=truncated,
        first=torch.roll(terminated | truncated, 1, 0),
        action=torch.randint(0, A, shape, generator=g),
        logits=torch.randn((*shape, A), generator=g),
    )


def make_model(lstm: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model((OBS,), A, ModelCfg(name="mlp", hidden_size=16, use_lstm=lstm))


def flat_weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.fixture
def threads():
    made: list[ShardThreads] = []

    def make(n: int) -> ShardThreads:
        made.append(ShardThreads(n))
        return made[-1]

    yield make
    for pool in made:
        pool.close()


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("count", [2, 3])
def test_a_sharded_step_is_the_whole_minibatch_step(threads, reduction, count, normalize) -> None:
    algo = AlgoCfg(
        optimizer="adam", learning_rate=0.1, reduction=reduction, normalize_advantages=normalize
    )
    results = []
    for shards in (None, threads(count)):
        model = make_model()
        lrn = learner.Learner(model, learner.make_optimizer(model, algo), algo, shards=shards)
        stats, kept = lrn.sgd_step(make_batch())
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((stats, grads, flat_weights(model), kept))
    (stats, grads, weights, kept), (s_stats, s_grads, s_weights, s_kept) = results
    torch.testing.assert_close(s_grads, grads, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s_weights, weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s_stats, stats, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s_kept, kept)
    assert grads.abs().sum() > 0


def test_a_sharded_lstm_step_carries_each_trajectorys_core_state(threads) -> None:
    algo = dataclasses.replace(AlgoCfg(), normalize_advantages=False, reduction="mean")
    grads = []
    for shards in (None, threads(2)):
        model = make_model(lstm=True)
        batch = dataclasses.replace(
            make_batch(), core_state=tuple(torch.randn_like(c) for c in model.initial_state(B))
        )
        lrn = learner.Learner(model, learner.make_optimizer(model, algo), algo, shards=shards)
        lrn.sgd_step(batch)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reference", ["first_visit", "target"])
def test_sample_reuse_with_anchors_matches_unsharded(threads, reference) -> None:
    algo = AlgoCfg(
        optimizer="adam",
        learning_rate=1e-2,
        reduction="mean",
        normalize_advantages=False,
        epochs=2,
        minibatches=2,
        ppo_clip=0.1,
        ppo_reference=reference,
    )
    weights = []
    for shards in (None, threads(2)):
        model = make_model()
        torch.manual_seed(3)  # the same minibatch order
        learner.Learner(model, learner.make_optimizer(model, algo), algo, shards=shards).update(
            make_batch()
        )
        weights.append(flat_weights(model))
    torch.testing.assert_close(weights[1], weights[0], rtol=1e-5, atol=1e-6)
    assert not torch.equal(weights[0], flat_weights(make_model()))


def test_a_failing_shard_raises_its_own_error_and_frees_the_others(threads) -> None:
    algo = AlgoCfg(normalize_advantages=True)
    model, pool = make_model(), threads(3)
    lrn = learner.Learner(model, learner.make_optimizer(model, algo), algo, shards=pool)
    real = learner.step_loss

    def second_shard_fails(model, batch, *args):
        if batch.obs.shape[1] == 2:  # B=7 over 3 shards: 3, 2, 2 trajectories
            raise RuntimeError("shard failed before its moments")
        return real(model, batch, *args)

    learner.step_loss, restore = second_shard_fails, real
    try:
        with pytest.raises(RuntimeError, match="shard failed"):  # not a broken barrier
            lrn.sgd_step(make_batch())
    finally:
        learner.step_loss = restore
    lrn.sgd_step(make_batch())


def test_shard_weights_against_counting_by_hand() -> None:
    weights, fractions = shard_weights([30, 10, 0], "mean")
    # a shard without valid steps counts as one, so nothing divides by zero
    assert fractions == pytest.approx([30 / 41, 10 / 41, 1 / 41])
    assert weights == fractions
    weights, fractions = shard_weights([30, 10], "sum")
    assert weights == [1.0, 1.0] and fractions == pytest.approx([0.75, 0.25])


def test_stat_names_are_the_loss_stats_plus_the_step_s_own() -> None:
    assert [n for n in learner.STAT_NAMES if n not in ("grad_norm", "nonfinite")] == list(
        LOSS_STATS
    )


def test_one_shard_is_not_a_split() -> None:
    with pytest.raises(ValueError, match="2 or more"):
        ShardThreads(1)


def _cfg(**kw) -> Config:
    base = dict(
        env=EnvCfg(id="CartPole-v1"),
        model=ModelCfg(name="mlp"),
        num_actors=1,
        envs_per_actor=2,
        batch_size=4,
        unroll_length=5,
        device="cpu",
        precision="fp32",
        learner_shards=2,
    )
    return Config(**{**base, **kw})


def test_learner_shards_validation_says_what_to_change() -> None:
    validate_config(_cfg())
    cases = [
        (dict(learner_shards=0), "must be >= 1"),
        (dict(learners=2), "learners=1 \\(threads\\)"),
        (dict(learner_threads=2), "learner_threads=0"),
        (dict(learner_shards=3, algo=AlgoCfg(minibatches=2)), "learner_shards<=2"),
        (dict(algo=AlgoCfg(name="a3c")), "algo=a3c"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            validate_config(_cfg(**overrides))


@pytest.mark.slow
def test_cartpole_trains_with_two_shards(tmp_path) -> None:
    from leakcheck import read_events, run_cartpole_and_check_it_learns

    # The CartPole recipe as it is: with normalised advantages it barely learns in 100K frames
    # with one shard or two (16.8 on a clean-clone CI run, against the bar of 22). That the
    # shards normalise over the whole minibatch is checked exactly above (sharded == unsharded).
    run_dir = run_cartpole_and_check_it_learns(tmp_path, "learner_shards=2")
    started = next(e for e in read_events(run_dir) if e.get("event") == "start")
    assert started["learner_shards"] == 2
