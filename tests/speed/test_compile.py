"""``torch.compile`` against the eager model: the same update, the same checkpoint keys."""

from __future__ import annotations

import copy

import torch
from ringdata import one_update, random_batch

from impala_gpu.config import ModelCfg
from impala_gpu.models import build_model
from impala_gpu.speed.compile import compile_model


def test_compile_matches_eager():
    torch.manual_seed(0)
    model = build_model((4,), 2, ModelCfg(name="mlp", hidden_size=32))
    batch = random_batch((4,), 2, T=5, B=3)
    ref_stats, ref_delta = one_update(copy.deepcopy(model), batch)
    compiled = compile_model(copy.deepcopy(model), True)
    assert list(compiled.state_dict()) == list(model.state_dict()), "checkpoint keys changed"
    stats, delta = one_update(compiled, batch)
    torch.testing.assert_close(stats, ref_stats, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(delta, ref_delta, rtol=1e-5, atol=1e-8)
