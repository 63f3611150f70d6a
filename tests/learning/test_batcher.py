"""The Batcher on CPU: ring slots in, time-major batches out, in take order; every slot given
back; too-stale unrolls dropped and freed; bounded-lag batches in exact global order."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.multiprocessing as mp
from ringdata import SPEC, batches_from_ring, expected_batch

from impala_gpu.channels.ring import RingSpec, SlotManager, TrajectoryRing
from impala_gpu.learning.batcher import Batcher

SMALL = RingSpec(
    num_slots=8, unroll_length=3, obs_shape=(2,), obs_dtype=torch.float32, num_actions=2
)


def test_batches_are_time_major_in_take_order_and_free_every_slot():
    B, pairs = 3, 3
    batches = batches_from_ring(SPEC, "cpu", B, pairs)
    assert len(batches) == 2 * pairs
    for i, got in enumerate(batches):
        want = expected_batch(SPEC, B, i)
        assert got["obs"].shape == (SPEC.unroll_length + 1, B, *SPEC.obs_shape)  # [T+1, B, ...]
        for name in want:
            assert torch.equal(got[name], want[name]), f"batch {i}: {name}"


def _write(ring: TrajectoryRing, unrolls: list[tuple[int, int, int]]) -> None:
    """Commit one unroll per (version, unroll, env_index), marking its reward with its position
    in ``unrolls``."""
    for n, (version, unroll, env) in enumerate(unrolls):
        item = ring.acquire(0, timeout=10)
        assert item is not None, "the ring ran out of free slots"
        slot = item[0]
        ring.reward[slot] = float(n)
        ring.version[slot] = version
        ring.unroll[slot] = unroll
        ring.env_index[slot] = env
        ring.commit(0, item)


def _run(batcher_kwargs: dict, unrolls: list[tuple[int, int, int]], num_batches: int, B: int):
    ring = TrajectoryRing(SMALL, 1, mp.get_context("spawn"))
    slots = SlotManager(ring)
    batcher = Batcher(ring, slots, B, torch.device("cpu"), **batcher_kwargs)
    producer = threading.Thread(target=_write, args=(ring, unrolls), daemon=True)
    producer.start()
    batcher.start()
    order, versions = [], []
    try:
        for _ in range(num_batches):
            got = batcher.get(timeout=30)
            assert got is not None, "no batch in 30 s"
            k, batch = got
            order.append(batch.reward[0].tolist())  # step 0 of every trajectory, [B]
            versions.append(batch.versions.tolist())
            batcher.done(k)
        producer.join(timeout=10)
        assert sorted(slots.held_by(0)) == list(range(SMALL.num_slots)), "a slot was not freed"
    finally:
        batcher.stop()
        ring.close()
    assert batcher.error is None
    return order, versions, batcher


def test_too_stale_unrolls_are_dropped_counted_and_freed():
    # Learner at version 10, max lag 2: versions 5 and 7 are too stale; 8, 9, 10 are kept.
    unrolls = [(v, 0, 0) for v in (10, 5, 9, 7, 8, 10, 5, 5, 9, 10)]
    order, versions, batcher = _run(
        {"learner_version": lambda: 10, "max_policy_lag": 2}, unrolls, num_batches=2, B=3
    )
    assert order == [[0.0, 2.0, 4.0], [5.0, 8.0, 9.0]]  # positions of the fresh unrolls
    assert versions == [[10, 9, 8], [10, 9, 10]]
    assert batcher.dropped_stale == 4


@pytest.mark.parametrize("n", [1, 2])
def test_bounded_lag_batches_come_in_exact_global_order(n):
    """Batch u holds global unrolls [u*n, (u+1)*n) of every env, unroll-major, whatever order
    the slots arrive in."""
    E = 2
    arrive = [(1, 0), (0, 1), (1, 1), (0, 0), (3, 1), (2, 0), (3, 0), (2, 1)]  # (unroll, env)
    unrolls = [(0, g, j) for g, j in arrive]
    B = n * E
    order, _, _ = _run(
        {"learner_version": lambda: 0, "ordered_unrolls_per_batch": n, "envs_per_actor": E},
        unrolls,
        num_batches=len(arrive) // B,
        B=B,
    )
    position = {key: float(i) for i, key in enumerate(arrive)}
    want = [(g, j) for g in range(len(arrive) // E) for j in range(E)]
    assert sum(order, []) == [position[key] for key in want]
