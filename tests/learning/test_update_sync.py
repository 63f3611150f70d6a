"""``Learner.update`` never reads a device value on the host, and a non-finite step changes
nothing: on the CPU by counting the calls that would sync, on CUDA under sync debug mode."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from impala_gpu.cli import CONF_DIR
from impala_gpu.config import AlgoCfg, Config, ModelCfg, register_configs
from impala_gpu.envs import env_spec
from impala_gpu.learning import learner
from impala_gpu.learning.batcher import Batch
from impala_gpu.learning.optim import make_optimizer
from impala_gpu.models import build_model

# Each of these waits for the device when the tensor is on one.
HOST_READS = ("item", "__bool__", "tolist", "cpu", "numpy", "__int__", "__float__")


def default_recipe() -> Config:
    """The default command's config (``experiment=pong_impala``), precision fixed to fp32."""
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=["precision=fp32"]))
    assert isinstance(cfg, Config) and cfg.algo.epochs * cfg.algo.minibatches > 1
    cfg.batch_size = 8  # 4 minibatches of 2 trajectories: the recipe's steps, fewer frames
    return cfg


def pong_batch(cfg: Config, device: torch.device, T: int = 6) -> Batch:
    spec = env_spec(cfg.env)
    g = torch.Generator().manual_seed(0)
    B, shape = cfg.batch_size, (T + 1, cfg.batch_size)
    batch = Batch(
        obs=torch.randint(0, 256, (*shape, *spec.obs_shape), generator=g, dtype=torch.uint8),
        reward=torch.randn(shape, generator=g).sign(),
        terminated=torch.rand(shape, generator=g) < 0.05,
        truncated=torch.zeros(shape, dtype=torch.bool),
        first=torch.zeros(shape, dtype=torch.bool),
        action=torch.randint(0, spec.num_actions, shape, generator=g),
        logits=torch.randn((*shape, spec.num_actions), generator=g),
        versions=torch.zeros(B, dtype=torch.int64),
        replayed=torch.zeros(B, dtype=torch.bool),
    )
    fields = {n: getattr(batch, n).to(device) for n in ("obs", "reward", "terminated")}
    fields |= {n: getattr(batch, n).to(device) for n in ("truncated", "first", "action", "logits")}
    return Batch(**fields, versions=batch.versions, replayed=batch.replayed)


@contextlib.contextmanager
def counting_host_reads(monkeypatch):
    counts = dict.fromkeys(HOST_READS, 0)
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _real=real, **kwargs):
            counts[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield counts
    monkeypatch.undo()


def build(cfg: Config, device: torch.device) -> learner.Learner:
    return learner.build_learner(cfg, env_spec(cfg.env), device)


def test_an_update_of_the_default_recipe_reads_nothing_on_the_host(monkeypatch) -> None:
    cfg = default_recipe()
    lrn = build(cfg, torch.device("cpu"))
    assert lrn.grad_groups, "health's layer norms are part of the default update"
    batch = pong_batch(cfg, torch.device("cpu"))
    lrn.update(batch)  # warm-up: lazy optimizer state and one-time checks
    with counting_host_reads(monkeypatch) as counts:
        stats = lrn.update(batch)
    assert counts == dict.fromkeys(HOST_READS, 0)
    assert stats.shape[0] == len(learner.STAT_NAMES) + len(lrn.grad_names)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_update_on_cuda_never_syncs() -> None:
    cfg = default_recipe()
    device = torch.device("cuda")
    lrn = build(cfg, device)
    batch = pong_batch(cfg, device)
    lrn.update(batch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        stats = lrn.update(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(stats).all()


def _nan_batch(T: int = 4, B: int = 4) -> Batch:
    shape = (T + 1, B)
    return Batch(
        obs=torch.randn(*shape, 3),
        reward=torch.full(shape, float("nan")),
        terminated=torch.zeros(shape, dtype=torch.bool),
        truncated=torch.zeros(shape, dtype=torch.bool),
        first=torch.zeros(shape, dtype=torch.bool),
        action=torch.zeros(shape, dtype=torch.int64),
        logits=torch.zeros(*shape, 2),
    )


def _snapshot(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t.clone() for t in learner._state_tensors(opt)]


@pytest.mark.parametrize("name", ["adam", "rmsprop", "rmsprop_tf"])
def test_a_non_finite_step_changes_neither_weights_nor_optimizer_state(name) -> None:
    algo = AlgoCfg(optimizer=name, learning_rate=1e-2, reduction="mean")
    torch.manual_seed(0)
    model = build_model((3,), 2, ModelCfg(name="mlp", hidden_size=8))
    lrn = learner.Learner(model, make_optimizer(model, algo), algo)
    good = _nan_batch()
    good.reward.zero_()
    lrn.update(good)  # the state exists, and moved
    before = _snapshot(lrn.optimizer)
    stats = lrn.update(_nan_batch())
    assert stats[learner.STAT_NAMES.index("nonfinite")] == 1.0
    for now, then in zip(_snapshot(lrn.optimizer), before, strict=True):
        torch.testing.assert_close(now, then, equal_nan=False)


def test_the_device_path_of_masked_step_puts_back_what_a_step_changed() -> None:
    """What a device learner with a non-fused optimizer runs, here on CPU tensors: the step
    applies where the flag holds and is undone where it does not."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.RMSprop(model.parameters(), lr=0.1)
    for finite, moves in ((torch.tensor(False), False), (torch.tensor(True), True)):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        before = _snapshot(opt)
        learner._restoring_step(opt, finite)
        after = _snapshot(opt)
        changed = any(not torch.equal(a, b) for a, b in zip(after, before, strict=False))
        assert changed == moves
