"""The fast paths against the plain path: bf16 autocast, torch.compile, tcmalloc re-exec."""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch
from leakcheck import read_events, read_metrics, run_cli
from ringdata import random_batch

from impala_gpu import speed
from impala_gpu.config import AlgoCfg, Config, ConfigError, EnvCfg, ModelCfg
from impala_gpu.learning.learner import STAT_NAMES, Batch, Learner
from impala_gpu.models import build_model
from impala_gpu.validate import validate_config

ATARI_OBS, ATARI_ACTIONS = (4, 84, 84), 6
LOSS_STATS = [STAT_NAMES.index(n) for n in ("total_loss", "pg_loss", "baseline_loss", "entropy")]


def one_update(model, batch: Batch, precision: str = "fp32"):
    """Stats and the parameter change of one plain-SGD update (the change is -lr * grad)."""
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    stats = Learner(model, opt, AlgoCfg(), precision).update(batch)
    delta = torch.cat(
        [(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)]
    )
    return stats, delta


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
    with torch.no_grad(), speed.autocast("cpu", "bf16"):
        out = model(obs, torch.zeros(1, 3, dtype=torch.bool), model.initial_state(3))
    assert out.logits.dtype == torch.bfloat16  # autocast did run the heads in bf16
    assert all(s.dtype == torch.float32 for s in out.core_state)  # the LSTM runs in fp32
    batch = random_batch(ATARI_OBS, ATARI_ACTIONS)
    batch.core_state = model.initial_state(batch.obs.shape[1])
    stats, _ = one_update(model, batch, "bf16")
    assert torch.isfinite(stats).all()


def test_compile_matches_eager():
    torch.manual_seed(0)
    model = build_model((4,), 2, ModelCfg(name="mlp", hidden_size=32))
    batch = random_batch((4,), 2, T=5, B=3)
    ref_stats, ref_delta = one_update(copy.deepcopy(model), batch)
    compiled = speed.compile_model(copy.deepcopy(model), True)
    assert list(compiled.state_dict()) == list(model.state_dict()), "checkpoint keys changed"
    stats, delta = one_update(compiled, batch)
    torch.testing.assert_close(stats, ref_stats, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(delta, ref_delta, rtol=1e-5, atol=1e-8)


def test_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match="precision='fp16'.*Fix: precision=auto"):
        validate_config(Config(env=EnvCfg(id="CartPole-v1"), precision="fp16"))


def test_learner_threads_one_rule_for_the_run_its_ranks_and_auto():
    assert speed.learner_threads("cpu", "fp32", 8, 2) == 8  # fp32 on CPU: every core
    assert speed.learner_threads("cpu", "bf16", 8, 2) == 6  # bf16 leaves the actors theirs
    assert speed.learner_threads("cuda", "fp32", 8, 2) == 2
    assert speed.learner_threads("cpu", "fp32", 8, 2, fixed=3) == 3  # the config's wins
    assert speed.learner_threads("cpu", "fp32", 8, 2, ranks=4) == 2  # shared among ranks
    assert speed.learner_threads("cpu", "bf16", 2, 2, ranks=2) == 1  # at least one each


# ------------------------------------------------------------------------------- tcmalloc
def fake_exec(calls):
    def execve(path, argv, env):
        calls.append((path, argv, env))

    return execve


def test_reexec_preloads_tcmalloc_and_keeps_the_command_line(monkeypatch):
    monkeypatch.delenv(speed.TCMALLOC_ENV, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    monkeypatch.setattr(speed, "find_tcmalloc", lambda: "/x/libtcmalloc_minimal.so.4")
    calls = []
    argv = ["python", "-m", "impala_gpu", "env=cartpole"]
    speed.reexec_with_tcmalloc(argv, execve=fake_exec(calls))
    [(path, new_argv, env)] = calls
    assert path == sys.executable
    assert new_argv == [sys.executable, "-m", "impala_gpu", "env=cartpole"]
    assert env["LD_PRELOAD"] == "/x/libtcmalloc_minimal.so.4:/opt/other.so"


@pytest.mark.parametrize("case", ["disabled", "already", "missing"])
def test_no_reexec(monkeypatch, case):
    monkeypatch.setattr(speed, "find_tcmalloc", lambda: None if case == "missing" else "/x/t.so")
    monkeypatch.delenv(speed.TCMALLOC_ENV, raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    if case == "disabled":
        monkeypatch.setenv(speed.TCMALLOC_ENV, "0")
    if case == "already":
        monkeypatch.setenv("LD_PRELOAD", "/x/libtcmalloc_minimal.so.4")
    calls = []
    speed.reexec_with_tcmalloc(["python", "-m", "impala_gpu"], execve=fake_exec(calls))
    assert calls == []


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
    want = (
        "tcmalloc" if speed.find_tcmalloc() and os.environ.get(speed.TCMALLOC_ENV) != "0" else None
    )
    if want:  # the CLI restarted itself under tcmalloc, and its actors inherited it
        assert start["allocator"] == "tcmalloc"
