"""bf16 autocast against fp32: the same update to within bf16's rounding, fp32 weights, and a
run that learns."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from leakcheck import read_events, read_metrics, run_cli
from ringdata import ATARI_ACTIONS, ATARI_OBS, LOSS_STATS, one_update, random_batch

from impala_gpu.config import Config, ConfigError, EnvCfg, ModelCfg
from impala_gpu.models import build_model
from impala_gpu.speed.precision import autocast
from impala_gpu.speed.tcmalloc import TCMALLOC_ENV, find_tcmalloc
from impala_gpu.validate import validate_config


@pytest.mark.parametrize("name", ["shallow", "resnet"])
def test_bf16_update_matches_fp32(name):
    torch.manual_seed(0)
    model = build_model(ATARI_OBS, ATARI_ACTIONS, ModelCfg(name=name, hidden_size=64))
    batch = random_batch(ATARI_OBS, ATARI_ACTIONS)
    ref_stats, ref_delta = one_update(copy.deepcopy(model), batch, "fp32")
    bf_stats, bf_delta = one_update(copy.deepcopy(model), batch, "bf16")
    # bf16 keeps 8 bits of mantissa: the loss agrees to about 1%, the update's direction to
    # well within a degree or two.
    torch.testing.assert_close(bf_stats[LOSS_STATS], ref_stats[LOSS_STATS], rtol=3e-2, atol=3e-2)
    cosine = torch.nn.functional.cosine_similarity(bf_delta, ref_delta, dim=0)
    assert cosine > 0.99, f"bf16 update direction differs from fp32: cosine {cosine:.4f}"
    norm_ratio = bf_delta.norm() / ref_delta.norm()
    assert 0.95 < norm_ratio < 1.05
    assert not torch.equal(bf_delta, ref_delta), "bf16 autocast did not change anything"


def test_bf16_keeps_weights_and_grads_fp32():
    model = build_model(ATARI_OBS, ATARI_ACTIONS, ModelCfg(name="shallow", hidden_size=64))
    stats, _ = one_update(model, random_batch(ATARI_OBS, ATARI_ACTIONS), "bf16")
    assert stats.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_bf16_lstm_core_state_stays_fp32():
    model = build_model(ATARI_OBS, ATARI_ACTIONS, ModelCfg(name="shallow", use_lstm=True))
    obs = torch.randint(0, 256, (1, 3, *ATARI_OBS), dtype=torch.uint8)
    with torch.no_grad(), autocast("cpu", "bf16"):
        out = model(obs, torch.zeros(1, 3, dtype=torch.bool), model.initial_state(3))
    assert out.logits.dtype == torch.bfloat16  # autocast did run the heads in bf16
    assert all(s.dtype == torch.float32 for s in out.core_state)  # the LSTM runs in fp32
    batch = random_batch(ATARI_OBS, ATARI_ACTIONS)
    batch.core_state = model.initial_state(batch.obs.shape[1])
    stats, _ = one_update(model, batch, "bf16")
    assert torch.isfinite(stats).all()


def test_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="precision='fp16'.*Fix: precision=auto"):
        validate_config(Config(env=EnvCfg(id="CartPole-v1"), precision="fp16"))


@pytest.mark.slow
def test_bf16_cartpole_run_learns_and_reports_its_setup(tmp_path):
    run_dir = tmp_path / "bf16"
    run_cli(
        run_dir,
        "experiment=cartpole_impala",
        "precision=bf16",
        "total_frames=200000",
        "log_interval_s=2",
    )
    metrics = read_metrics(run_dir)
    assert metrics[-1]["episode_return"] > 75, [m["episode_return"] for m in metrics]
    start = read_events(run_dir)[0]
    assert start["event"] == "start" and start["precision"] == "bf16"
    want = "tcmalloc" if find_tcmalloc() and os.environ.get(TCMALLOC_ENV) != "0" else None
    if want:  # the CLI restarted itself under tcmalloc, and its actors inherited it
        assert start["allocator"] == "tcmalloc"
