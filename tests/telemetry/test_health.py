"""Network-health measurements: dead units, logit spread, per-layer gradient norms."""

from __future__ import annotations

import pytest
import torch

from impala_gpu.config import ModelCfg
from impala_gpu.models import build_model
from impala_gpu.telemetry import health

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
