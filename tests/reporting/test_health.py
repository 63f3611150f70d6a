"""Network-health telemetry: dead units, logit spread, per-layer gradient norms, warnings."""

from __future__ import annotations

import pytest
import torch

from impala_gpu.config import ModelCfg
from impala_gpu.models import build_model
from impala_gpu.reporting import health

OBS = (4, 84, 84)


def _frames(T=5, B=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (T, B, *OBS), dtype=torch.uint8, generator=g)
    return obs, torch.zeros(T, B, dtype=torch.bool)


def test_dead_fraction_counts_units_never_positive():
    acts = torch.tensor([[0.0, 1.0, 0.0, -2.0], [0.0, 0.0, 3.0, -1.0]])  # [N=2, units=4]
    assert health.dead_fraction(acts) == pytest.approx(0.5)  # units 0 and 3
    conv = torch.zeros(3, 2, 2, 2)  # [N, C, H, W]: 8 units
    conv[1, 0, 1, 1] = 1.0
    assert health.dead_fraction(conv) == pytest.approx(7 / 8)


def test_logit_spread_is_zero_for_a_state_independent_policy():
    same = torch.tensor([[1.0, 2.0, 3.0]]).repeat(10, 1)
    assert health.logit_spread(same) == pytest.approx(0.0, abs=1e-7)
    shifted = same + torch.arange(10.0).unsqueeze(1)  # a per-state shift is the same policy
    assert health.logit_spread(shifted) == pytest.approx(0.0, abs=1e-6)
    varied = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    # centred logits: [-.5, .5] and [.5, -.5]; std over 2 states = sqrt(0.5) per action
    assert health.logit_spread(varied) == pytest.approx(0.5**0.5)


def test_known_dead_units_are_found():
    model = build_model(OBS, 6, ModelCfg(name="shallow"))
    fc = model.torso.fc[0]
    with torch.no_grad():
        fc.bias[:192] = -1e6  # 192 of 256 fc units can never fire
        model.policy_head.weight.zero_()  # and the policy ignores the screen
    m = health.measure(model, *_frames())
    assert m["dead/fc"] >= 0.75
    assert m["logit_spread"] == pytest.approx(0.0, abs=1e-7)
    watch = health.HealthWatch(0.5, 0.05, warmup_updates=10, smoothing=1.0)
    warnings = watch.check(m, updates=100)
    assert any("fc" in w and "dead" in w for w in warnings)
    assert any("barely depends on its input" in w for w in warnings)
    assert watch.check(m, updates=101) == []  # said once, not every log line


def test_healthy_model_raises_no_warning():
    torch.manual_seed(0)
    model = build_model(OBS, 6, ModelCfg(name="shallow", init="orthogonal"))
    with torch.no_grad():
        model.policy_head.weight.mul_(100)  # a policy that looks at the screen
    m = health.measure(model, *_frames())
    assert set(m) == {"dead/conv1", "dead/conv2", "dead/conv3", "dead/fc", "logit_spread"}
    assert max(v for k, v in m.items() if k.startswith("dead/")) < 0.5
    assert m["logit_spread"] > 0.05
    assert health.HealthWatch(warmup_updates=0).check(m, updates=10) == []


def test_warning_waits_for_warmup_and_rearms_after_recovery():
    watch = health.HealthWatch(min_logit_spread=0.05, warmup_updates=100, smoothing=1.0)
    flat = {"logit_spread": 0.01}
    assert watch.check(flat, updates=50) == []  # a fresh policy is uniform by design
    assert len(watch.check(flat, updates=150)) == 1
    assert watch.check({"logit_spread": 0.07}, updates=160) == []  # hovering: not recovered
    assert watch.check(flat, updates=170) == []
    assert watch.check({"logit_spread": 0.2}, updates=200) == []  # clearly recovered
    assert len(watch.check(flat, updates=250)) == 1  # trouble again: said again
    dead = health.HealthWatch(dead_warn=0.5, smoothing=1.0)
    assert len(dead.check({"dead/fc": 0.51}, 0)) == 1
    assert dead.check({"dead/fc": 0.49}, 0) == [] and dead.check({"dead/fc": 0.52}, 0) == []


@pytest.mark.parametrize("name,use_lstm", [("shallow", False), ("resnet", False), ("mlp", True)])
def test_every_layer_is_named_and_measured(name, use_lstm):
    obs_shape = (4,) if name == "mlp" else OBS
    model = build_model(obs_shape, 3, ModelCfg(name=name, use_lstm=use_lstm, hidden_size=32))
    names, groups = health.grad_groups(model)
    assert sum(len(g) for g in groups) == len(list(model.parameters()))  # each param once
    T, B = 3, 4
    obs = torch.rand(T, B, *obs_shape) if name == "mlp" else _frames(T, B)[0]
    out = model(obs, torch.zeros(T, B, dtype=torch.bool), model.initial_state(B))
    out.logits.sum().backward()
    norms = health.layer_grad_norms(groups)
    flat = [
        torch.cat([(p.grad if p.grad is not None else 0 * p).flatten() for p in g]) for g in groups
    ]
    expected = [torch.linalg.vector_norm(f) for f in flat]
    torch.testing.assert_close(norms, torch.stack(expected), rtol=1e-4, atol=1e-6)
    assert norms[names.index("grad_norm/value")] == 0  # the value head got no gradient here
    m = health.measure(model, obs, torch.zeros(T, B, dtype=torch.bool), model.initial_state(B))
    assert "logit_spread" in m


def test_orthogonal_init_matches_the_recipe():
    model = build_model(OBS, 6, ModelCfg(name="shallow", init="orthogonal"))
    w = model.torso.fc[0].weight  # [256, 3136]: orthonormal rows scaled by sqrt(2)
    torch.testing.assert_close(w @ w.T, 2.0 * torch.eye(256), atol=1e-4, rtol=0)
    p = model.policy_head.weight
    torch.testing.assert_close(p @ p.T, 1e-4 * torch.eye(6), atol=1e-7, rtol=0)
    assert all(m.bias.abs().max() == 0 for m in (model.torso.fc[0], model.value_head))
    with pytest.raises(ValueError, match="model.init"):
        build_model(OBS, 6, ModelCfg(init="xavier"))


def test_warnings_judge_a_moving_average():
    watch = health.HealthWatch(dead_warn=0.5, smoothing=0.3)
    assert watch.check({"dead/fc": 0.3}, 0) == []
    assert watch.check({"dead/fc": 0.9}, 0) == []  # one noisy line: the average is 0.48
    warned = [watch.check({"dead/fc": 0.9}, 0) for _ in range(5)]
    assert [len(w) for w in warned] == [1, 0, 0, 0, 0]  # then 0.61: warned once, then quiet
