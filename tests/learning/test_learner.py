"""Tests for impala_gpu.learning.learner's sample reuse: minibatches and SGD passes."""

from __future__ import annotations

import pytest
import torch

from impala_gpu.config import AlgoCfg, Config, ConfigError, EnvCfg, ModelCfg
from impala_gpu.learning import learner
from impala_gpu.learning.batcher import Batch
from impala_gpu.models import build_model
from impala_gpu.validate import validate_config

T, B, OBS, A = 4, 6, 3, 2


def make_batch(seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    shape = (T + 1, B)
    return Batch(
        obs=torch.randn((*shape, OBS), generator=g),
        reward=torch.randn(shape, generator=g),
        terminated=torch.zeros(shape, dtype=torch.bool),
        truncated=torch.zeros(shape, dtype=torch.bool),
        first=torch.zeros(shape, dtype=torch.bool),
        action=torch.randint(0, A, shape, generator=g),
        logits=torch.randn((*shape, A), generator=g),
    )


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model((OBS,), A, ModelCfg(name="mlp", hidden_size=8))


def test_minibatch_takes_the_indexed_trajectories() -> None:
    batch = make_batch()
    sub = learner.minibatch(batch, torch.tensor([4, 1]))
    assert sub.obs.shape == (T + 1, 2, OBS)
    torch.testing.assert_close(sub.obs[:, 0], batch.obs[:, 4])
    torch.testing.assert_close(sub.logits[:, 1], batch.logits[:, 1])
    torch.testing.assert_close(sub.action[:, 0], batch.action[:, 4])


def sgd(model: torch.nn.Module, algo: AlgoCfg) -> learner.Learner:
    return learner.Learner(model, learner.make_optimizer(model, algo), algo)


def spy_steps(monkeypatch) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """Each SGD step's (trajectory keys, clip anchor, returned logits), and its stats."""
    calls: list = []
    real = learner.Learner.sgd_step

    def spy(self, batch, reference=None, *rest):
        stats, logits = real(self, batch, reference, *rest)
        calls.append((batch.obs[0, :, 0].clone(), reference, logits, stats))
        return stats, logits

    monkeypatch.setattr(learner.Learner, "sgd_step", spy)
    return calls


def flat_weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_one_pass_one_minibatch_is_one_sgd_step() -> None:
    algo = AlgoCfg(optimizer="adam", learning_rate=1e-2, reduction="mean")
    weights = []
    for update in (lambda lrn, b: lrn.sgd_step(b), lambda lrn, b: lrn.update(b)):
        model = make_model()
        update(sgd(model, algo), make_batch())
        weights.append(flat_weights(model))
    torch.testing.assert_close(weights[0], weights[1])


def test_first_visit_anchors_each_trajectory_at_its_first_epoch_logits(monkeypatch) -> None:
    calls = spy_steps(monkeypatch)
    algo = AlgoCfg(
        optimizer="adam",
        learning_rate=1e-2,
        reduction="mean",
        epochs=2,
        minibatches=2,
        ppo_clip=0.1,
        ppo_reference="first_visit",
    )
    sgd(make_model(), algo).update(make_batch())
    first = {float(k): logits[:, j] for key, _, logits, _ in calls[:2] for j, k in enumerate(key)}
    assert all(reference is None for _, reference, _, _ in calls[:2])
    for key, reference, logits, _ in calls[2:]:
        for j, k in enumerate(key):
            torch.testing.assert_close(reference[:, j], first[float(k)])
            assert not torch.allclose(logits[:, j], first[float(k)])  # the weights moved


def test_target_network_holds_its_snapshot_for_interval_updates(monkeypatch) -> None:
    calls = spy_steps(monkeypatch)
    algo = AlgoCfg(
        optimizer="adam",
        learning_rate=1e-2,
        reduction="mean",
        minibatches=2,
        ppo_clip=0.1,
        ppo_reference="target",
        target_interval=3,
    )
    model = make_model()
    lrn, batch = sgd(model, algo), make_batch()
    snapshots = []  # the model's own logits on the batch before each update
    for _ in range(5):
        with torch.no_grad():
            out = model(batch.obs, batch.first, batch.core_state)
        snapshots.append(out.logits)
        lrn.update(batch)
    anchors = [ref for key, ref, *_ in calls]  # [T+1, B/2, A] per step, 2 steps per update
    keys = [key for key, *_ in calls]
    for update, refreshed in enumerate([0, 0, 0, 3, 3]):
        for step in (2 * update, 2 * update + 1):
            index = [int((batch.obs[0, :, 0] == k).nonzero()) for k in keys[step]]
            torch.testing.assert_close(anchors[step], snapshots[refreshed][:, index])
    assert not torch.allclose(snapshots[0], snapshots[2])  # the learner moved meanwhile


def test_a_target_refreshed_every_update_is_the_first_visit_anchor_of_one_step() -> None:
    weights = []
    for reference in ("first_visit", "target"):
        algo = AlgoCfg(
            optimizer="adam",
            learning_rate=1e-2,
            reduction="mean",
            normalize_advantages=True,
            ppo_clip=0.1,
            ppo_reference=reference,
        )
        model = make_model()
        lrn, batch = sgd(model, algo), make_batch()
        for _ in range(3):
            lrn.update(batch)
        weights.append(flat_weights(model))
    torch.testing.assert_close(weights[0], weights[1])


@pytest.mark.parametrize("reference", ["behavior", "first_visit", "target"])
def test_epochs_times_minibatches_steps_over_every_trajectory(monkeypatch, reference) -> None:
    calls = spy_steps(monkeypatch)
    algo = AlgoCfg(
        optimizer="adam",
        reduction="mean",
        epochs=3,
        minibatches=2,
        ppo_clip=0.1,
        ppo_reference=reference,
    )
    batch = make_batch()
    stats = sgd(make_model(), algo).update(batch)
    seen = [key for key, *_ in calls]
    assert len(seen) == 6 and all(len(s) == B // 2 for s in seen)
    for epoch in range(3):  # each pass covers the batch once, in a shuffled order
        covered = torch.cat(seen[2 * epoch : 2 * epoch + 2]).sort().values
        torch.testing.assert_close(covered, batch.obs[0, :, 0].sort().values)
    assert stats.shape == (len(learner.STAT_NAMES),) and torch.isfinite(stats).all()


@pytest.mark.parametrize(
    ("algo", "match"),
    [
        (AlgoCfg(epochs=0), r"algo.epochs=0 must be >= 1.*Fix"),
        (AlgoCfg(minibatches=7), r"algo.minibatches=7 is more than the 6 trajectories.*Fix"),
        (AlgoCfg(ppo_clip=-0.1), r"algo.ppo_clip=-0.1 must be >= 0.*Fix"),
        (AlgoCfg(name="a3c", epochs=4), r"sample reuse is IMPALA's.*Fix"),
        (AlgoCfg(ppo_reference="target", target_interval=0), r"target_interval=0 must be.*Fix"),
        (AlgoCfg(ppo_reference="lagged"), r"ppo_reference='lagged' is not one of.*Fix"),
        (AlgoCfg(ppo_clip=0.1, behavior_clip=0.5), r"behavior_clip=0.5 .*behavior: .*Fix"),
        (AlgoCfg(behavior_clip=0.5, ppo_reference="first_visit"), r"ppo_clip=0.0.*Fix"),
        (AlgoCfg(ppo_clip=0.1, ppo_reference="target", behavior_clip=0), r"bound > 0.*Fix"),
    ],
)
def test_impossible_sample_reuse_is_refused(algo: AlgoCfg, match: str) -> None:
    cfg = Config(
        env=EnvCfg(id="CartPole-v1"),
        algo=algo,
        precision="fp32",
        num_actors=1,
        envs_per_actor=4,
        batch_size=B,
    )
    with pytest.raises(ConfigError, match=match):
        validate_config(cfg)


def test_input_stats_take_every_fourth_step_after_the_carried_one_of_fresh_trajectories() -> None:
    from impala_gpu.models.normalize import ObsNormalizer

    torch.manual_seed(0)
    cfg = ModelCfg(name="shallow", hidden_size=8, normalize_input=True)
    model = build_model((4, 84, 84), A, cfg)
    T1, n = 10, 3  # obs [T+1, B]: steps 1, 5 and 9 count
    g = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (T1, n, 4, 84, 84), generator=g, dtype=torch.uint8)
    batch = Batch(
        obs=obs,
        reward=torch.zeros(T1, n),
        terminated=torch.zeros(T1, n, dtype=torch.bool),
        truncated=torch.zeros(T1, n, dtype=torch.bool),
        first=torch.zeros(T1, n, dtype=torch.bool),
        action=torch.zeros(T1, n, dtype=torch.int64),
        logits=torch.zeros(T1, n, A),
        replayed=torch.tensor([False, True, False]),
    )
    learner.absorb_input_stats(model, batch, replays=True)
    expected = ObsNormalizer((4, 84, 84))
    expected.update(obs[[1, 5, 9]][:, [0, 2]])
    assert model.obs_norm.count.item() == pytest.approx(expected.count.item())
    torch.testing.assert_close(model.obs_norm.mean, expected.mean)
    torch.testing.assert_close(model.obs_norm.var, expected.var)


def _full_forward_gradients(model, batch: Batch, algo: AlgoCfg) -> list[torch.Tensor]:
    """The loss's gradient from one forward pass over all T+1 steps, as the SGD step did
    before it left the bootstrap observation out of backward."""
    out = model(batch.obs, batch.first, batch.core_state)
    logits, values = out.logits, out.value
    reference = logits.detach()[:-1] if algo.ppo_clip > 0 else None
    loss = learner.batch_loss(
        batch, learner.loss_options(algo), algo.discount, logits[:-1], values[:-1], values[-1],
        reference,
    )  # fmt: skip
    model.zero_grad()
    loss.total.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("lstm", [False, True])
@pytest.mark.parametrize("ppo_clip", [0.0, 0.1])
def test_the_bootstrap_step_leaves_the_gradient_as_a_full_forward_gives_it(lstm, ppo_clip):
    algo = AlgoCfg(
        optimizer="adam",
        learning_rate=0.0,  # the step keeps the weights: the gradient is what is compared
        reduction="mean",
        grad_norm_clip=0.0,
        normalize_advantages=True,
        ppo_clip=ppo_clip,
        ppo_reference="first_visit",
    )
    torch.manual_seed(0)
    model = build_model((OBS,), A, ModelCfg(name="mlp", hidden_size=8, use_lstm=lstm, lstm_size=8))
    batch = make_batch()
    batch.first[2, 1] = True  # an episode starts inside the unroll, and one on o_T
    batch.first[T, 3] = True
    batch.terminated[1, 1] = batch.terminated[T, 3] = True
    if lstm:
        g = torch.Generator().manual_seed(1)
        batch.core_state = (torch.randn(B, 8, generator=g), torch.randn(B, 8, generator=g))
    expected = _full_forward_gradients(model, batch, algo)
    _, kept = sgd(model, algo).sgd_step(batch)
    for p, want in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, want)
    # The kept logits cover o_T too (the anchors' layout, [T+1, B, A]) and are the policy's.
    with torch.no_grad():
        full = model(batch.obs, batch.first, batch.core_state).logits
    torch.testing.assert_close(kept, full)


def test_every_pass_takes_minibatches_steps_when_they_do_not_divide_the_batch(monkeypatch) -> None:
    # B=6 in 4 minibatches: 2, 2, 1, 1 trajectories (chunk() would make 3 steps of 2)
    calls = spy_steps(monkeypatch)
    algo = AlgoCfg(optimizer="adam", learning_rate=1e-2, reduction="mean", epochs=2, minibatches=4)
    batch = make_batch()
    stats = sgd(make_model(), algo).update(batch)
    seen = [key.tolist() for key, *_ in calls]
    assert sorted(len(s) for s in seen) == [1, 1, 1, 1, 2, 2, 2, 2]
    for epoch in (seen[:4], seen[4:]):  # each pass visits every trajectory once
        assert sorted(x for s in epoch for x in s) == sorted(batch.obs[0, :, 0].tolist())
    torch.testing.assert_close(stats, torch.stack([c[3] for c in calls]).mean(0))


def test_loss_options_are_algos_keys_of_the_same_names() -> None:
    from impala_gpu.rl.losses import LossOptions

    assert learner.loss_options(AlgoCfg()) == LossOptions()  # the same defaults
    algo = AlgoCfg(
        baseline_cost=0.25,
        entropy_cost=0.02,
        clip_rho_threshold=None,
        clip_pg_rho_threshold=2.0,
        vtrace_lambda=0.9,
        reduction="mean",
        correction=False,
        normalize_advantages=True,
        ppo_clip=0.1,
    )
    options = learner.loss_options(algo)
    for name in LossOptions.__dataclass_fields__:
        expected = "none" if name == "correction" else getattr(algo, name)
        assert getattr(options, name) == expected, name
    model = build_model((4,), 2, ModelCfg(name="mlp", hidden_size=8))
    lrn = learner.Learner(model, learner.make_optimizer(model, algo), algo)
    assert lrn.loss_options == options  # built once, with the learner
