"""Experience replay: the FIFO buffer, the batch's fresh/replayed split, behaviour logits and
versions kept, and the replayed data's lag reported apart."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from leakcheck import read_metrics, run_cli
from ringdata import SPEC, pattern, produce

from impala_gpu.channels.ring import STEP_FIELDS, SlotManager, TrajectoryRing
from impala_gpu.config import AlgoCfg, Config, ConfigError, EnvCfg, ReplayCfg, fresh_batch_size
from impala_gpu.learning.batcher import Batcher, _alloc_batch
from impala_gpu.learning.replay import ReplayBuffer
from impala_gpu.telemetry.window import Telemetry
from impala_gpu.validate import validate_config


def _batch_of(ring: TrajectoryRing, B: int, marks: list[float]):
    """A CPU batch whose trajectory b has every field filled with ``marks[b]``."""
    batch = _alloc_batch(ring, B, torch.device("cpu"), False)
    for b, m in enumerate(marks):
        for name in STEP_FIELDS:
            getattr(batch, name)[:, b] = m
        for state in batch.core_state:
            state[b] = m
    batch.versions = torch.tensor([int(m) for m in marks])
    return batch


def test_fifo_keeps_the_newest_capacity_trajectories_with_their_logits_and_versions():
    ring = TrajectoryRing(SPEC, 1, mp.get_context("spawn"))
    try:
        buf = ReplayBuffer(_alloc_batch(ring, 2, torch.device("cpu"), False), capacity=3)
        for first in (1.0, 3.0, 5.0):  # adds trajectories 1..6, two at a time
            buf.add(_batch_of(ring, 2, [first, first + 1]), range(2))
        assert (buf.size, buf.added) == (3, 6)
        held = sorted(buf.versions.tolist())
        assert held == [4, 5, 6], "the three oldest (1, 2, 3) were evicted first"
        out = _batch_of(ring, 4, [0.0] * 4)
        positions = buf.sample(400)
        assert set(positions.tolist()) == {0, 1, 2}  # uniform over what it holds
        counts = np.bincount(positions.numpy(), minlength=3)
        assert counts.min() > 90, counts
        versions = buf.write(out, range(1, 4), positions[:3])
        for b, v in zip(range(1, 4), versions.tolist(), strict=True):
            assert torch.all(out.logits[:, b] == v) and torch.all(out.obs[:, b] == v)
            assert torch.all(out.core_state[0][b] == v)
        assert torch.all(out.logits[:, 0] == 0), "columns outside the write are untouched"
    finally:
        ring.close()


@pytest.mark.parametrize("B, proportion, fresh", [(8, 0.5, 4), (8, 0.3, 6), (5, 0.0, 5)])
def test_the_fresh_part_of_a_batch(B, proportion, fresh):
    cfg = Config(batch_size=B, replay=ReplayCfg(proportion=proportion))
    assert fresh_batch_size(cfg) == fresh


def test_batches_mix_fresh_ring_trajectories_with_replayed_ones():
    B, fresh, n_batches = 6, 4, 5
    ring = TrajectoryRing(SPEC, 1, mp.get_context("spawn"))
    slots = SlotManager(ring)
    batcher = Batcher(
        ring, slots, B, torch.device("cpu"), lambda: 0, fresh_batch_size=fresh, replay_capacity=8
    )
    producer = threading.Thread(target=produce, args=(ring, 0, fresh * n_batches), daemon=True)
    producer.start()
    batcher.start()
    seen: list[torch.Tensor] = []  # logits of every fresh trajectory so far
    try:
        for i in range(n_batches):
            got = batcher.get(timeout=30)
            assert got is not None
            k, batch = got
            assert batch.replayed.tolist() == [False] * fresh + [True] * (B - fresh)
            for b in range(fresh):  # fresh: the ring's unrolls in take order
                n = i * fresh + b
                want = pattern(0, n, "logits", torch.empty(SPEC.unroll_length + 1, 3))
                assert torch.equal(batch.logits[:, b], want)
                seen.append(want)
            for b in range(fresh, B):  # replayed: one of the (last 8) fresh ones, intact
                assert any(torch.equal(batch.logits[:, b], s) for s in seen[-8:])
            assert len(batch.versions) == B
            batcher.done(k)
        producer.join(timeout=10)
        assert sorted(slots.held_by(0)) == list(range(SPEC.num_slots)), "a slot was not freed"
    finally:
        batcher.stop()
        ring.close()
    assert batcher.error is None


def test_replayed_lag_is_reported_apart_from_the_fresh_lag():
    tele = Telemetry(("x",), cuda=False)
    tele.add_update(np.zeros(1), np.array([1, 1, 2]), 10, 10, replay_lags=np.array([30, 50]))
    m, hist = tele.flush()
    assert m["policy_lag_mean"] == pytest.approx(4 / 3) and m["policy_lag_max"] == 2
    assert m["replay_lag_mean"] == 40 and m["replay_lag_max"] == 50
    assert hist["policy_lag_hist"] == [1.0, 1.0, 2.0]
    assert tele.lag_histogram()["counts"] == [0, 2, 1]  # fresh only


@pytest.mark.parametrize("algo", ["a2c", "a3c"])
def test_a2c_and_a3c_reject_replay(algo):
    cfg = Config(
        env=EnvCfg(id="CartPole-v1"),
        algo=AlgoCfg(name=algo),
        precision="fp32",
        num_actors=2,
        envs_per_actor=4,
        replay=ReplayCfg(proportion=0.5),
    )
    with pytest.raises(ConfigError, match=f"replay.proportion=0.5 with algo={algo}.*Fix"):
        validate_config(cfg)


@pytest.mark.parametrize("proportion", [1.0, -0.1])
def test_a_proportion_outside_0_1_is_rejected(proportion):
    cfg = Config(env=EnvCfg(id="CartPole-v1"), precision="fp32", num_actors=1, envs_per_actor=4)
    cfg.replay.proportion = proportion
    with pytest.raises(ConfigError, match=r"must be in \[0, 1\)"):
        validate_config(cfg)


def test_cartpole_with_half_replay_counts_only_fresh_frames(tmp_path):
    run_dir = tmp_path / "replay"
    run_cli(
        run_dir,
        "env=cartpole",
        "num_actors=1",
        "envs_per_actor=4",
        "batch_size=8",
        "unroll_length=10",
        "total_frames=4000",  # 100 updates of 4 fresh x 10 steps
        "replay.proportion=0.5",
        "replay.capacity=64",
        "log_interval_s=0.3",
    )
    metrics = read_metrics(run_dir)
    assert metrics[-1]["frames"] == 4000 and metrics[-1]["updates"] == 100
    late = metrics[-1]
    assert late["replay_lag_mean"] > late["policy_lag_mean"]  # replayed data is older
