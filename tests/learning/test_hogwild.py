"""Hogwild's shared optimizer (A3C): it steps like torch's own, its statistics live in shared
memory and load back in place, and a worker's step lands on the shared model."""

from __future__ import annotations

import copy

import pytest
import torch

from impala_gpu.config import AlgoCfg, ConfigError, ModelCfg
from impala_gpu.learning.hogwild import (
    HogwildStep,
    cloned,
    load_shared_optimizer_state,
    make_shared_optimizer,
)
from impala_gpu.learning.optim import make_optimizer
from impala_gpu.models import build_model

MLP = ModelCfg(name="mlp", hidden_size=128)


def algo(name: str = "adam", **kw) -> AlgoCfg:
    return AlgoCfg(optimizer=name, learning_rate=1e-3, lr_schedule="constant", **kw)


def loss(model, x):
    out = model(x, torch.zeros(x.shape[:2], dtype=torch.bool))
    return out.logits.square().sum() + out.value.sum()


@pytest.mark.parametrize("name", ["rmsprop", "adam", "rmsprop_tf"])
def test_shared_optimizer_matches_torch_and_lives_in_shared_memory(name):
    torch.manual_seed(0)
    shared = build_model((4,), 2, MLP)
    plain = copy.deepcopy(shared)
    shared.share_memory()
    opt_shared = make_shared_optimizer(shared, algo(name, rmsprop_momentum=0.9))
    opt_plain = make_optimizer(plain, algo(name, rmsprop_momentum=0.9))
    for state in opt_shared.state.values():
        assert state and all(t.is_shared() for t in state.values())
    for _ in range(3):
        x = torch.randn(1, 5, 4)
        for model, opt in ((shared, opt_shared), (plain, opt_plain)):
            opt.zero_grad()
            loss(model, x).backward()
            opt.step()
    for a, b in zip(shared.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if name != "rmsprop_tf":
        for p in shared.parameters():
            assert opt_shared.state[p]["step"].item() == 3


def test_shared_optimizer_state_loads_in_place():
    torch.manual_seed(0)
    model = build_model((4,), 2, MLP).share_memory()
    optimizer = make_shared_optimizer(model, algo())
    shared = {id(t) for st in optimizer.state.values() for t in st.values()}
    saved = cloned(optimizer.state_dict())
    for st in saved["state"].values():
        for t in st.values():
            t.add_(3.0)
    load_shared_optimizer_state(optimizer, saved)
    for st in optimizer.state.values():
        for t in st.values():
            assert id(t) in shared and t.is_shared()
            assert torch.all(t == 3.0) if t.dim() == 0 else torch.all(t >= 3.0)


def test_optimizer_state_of_another_model_is_refused():
    small = build_model((4,), 2, ModelCfg(name="mlp", hidden_size=8)).share_memory()
    saved = cloned(make_shared_optimizer(small, algo()).state_dict())
    saved["state"].pop(0)
    with pytest.raises(ConfigError, match="state for .* parameters.*Fix:"):
        load_shared_optimizer_state(make_shared_optimizer(small, algo()), saved)


def test_cloned_is_a_copy_taken_now():
    state = {"a": torch.zeros(2), "b": [torch.ones(1)], "n": 3}
    copied = cloned(state)
    state["a"].add_(1.0)
    state["b"][0].add_(1.0)
    assert torch.equal(copied["a"], torch.zeros(2)) and torch.equal(copied["b"][0], torch.ones(1))
    assert copied["n"] == 3


def test_a_hogwild_step_moves_the_shared_model_by_the_local_gradient():
    torch.manual_seed(0)
    shared = build_model((4,), 2, MLP).share_memory()
    reference = copy.deepcopy(shared)
    local = build_model((4,), 2, MLP)  # other weights until it pulls the shared ones
    step = HogwildStep(local, shared, make_shared_optimizer(shared, algo()))
    step.pull()
    assert all(
        torch.equal(a, b) for a, b in zip(local.parameters(), shared.parameters(), strict=True)
    )
    x = torch.randn(1, 5, 4)
    step.zero_grad()
    loss(local, x).backward()
    step.step()
    ref_opt = make_optimizer(reference, algo())
    ref_opt.zero_grad()
    loss(reference, x).backward()
    ref_opt.step()
    for a, b in zip(shared.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The local copy is untouched until the next pull.
    assert any(
        not torch.equal(a, b) for a, b in zip(local.parameters(), shared.parameters(), strict=True)
    )
    with pytest.raises(RuntimeError, match="does not hold the shared model's parameters"):
        HogwildStep(local, shared, make_optimizer(reference, algo()))
