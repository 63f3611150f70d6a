"""Trajectory ring: bit-exact round trip across processes, and whole slot accounting."""

from __future__ import annotations

import zlib

import torch
import torch.multiprocessing as mp

from impala_gpu.ring import RingSpec, TrajectoryRing

SPEC = RingSpec(
    num_slots=6,
    unroll_length=5,
    obs_shape=(2, 3, 3),
    obs_dtype=torch.uint8,
    num_actions=3,
    lstm_size=4,
)


def pattern(producer: int, n: int, name: str, like: torch.Tensor) -> torch.Tensor:
    """Deterministic content for one slot's field, unique per (producer, n)."""
    g = torch.Generator().manual_seed(producer * 100_003 + n * 7 + zlib.crc32(name.encode()) % 1000)
    if like.dtype == torch.bool:
        return torch.rand(like.shape, generator=g) > 0.5
    if like.dtype == torch.uint8:
        return torch.randint(0, 256, like.shape, generator=g, dtype=torch.uint8)
    if like.dtype == torch.int64:
        return torch.randint(-(2**40), 2**40, like.shape, generator=g)
    return torch.randn(like.shape, generator=g)


def produce(ring: TrajectoryRing, producer: int, count: int) -> None:
    for n in range(count):
        slot = ring.acquire(timeout=30)
        assert slot is not None
        for name, t in ring.fields.items():
            t[slot] = pattern(producer, n, name, t[slot])
        ring.actor[slot] = producer
        ring.unroll[slot] = n
        ring.commit(slot)


def test_round_trip_across_processes_is_bit_exact_and_loses_no_slot():
    ctx = mp.get_context("spawn")
    ring = TrajectoryRing(SPEC, ctx)
    producers, per_producer = 3, 40
    procs = [ctx.Process(target=produce, args=(ring, i, per_producer)) for i in range(producers)]
    for p in procs:
        p.start()
    seen = set()
    try:
        for _ in range(producers * per_producer):
            slot = ring.take(timeout=60)
            assert slot is not None, "a producer stalled: slots were lost"
            producer, n = int(ring.actor[slot]), int(ring.unroll[slot])
            assert (producer, n) not in seen, "the same unroll was delivered twice"
            seen.add((producer, n))
            for name, t in ring.fields.items():
                if name in ("actor", "unroll"):
                    continue
                assert torch.equal(t[slot], pattern(producer, n, name, t[slot])), name
            ring.release(slot)
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        assert len(seen) == producers * per_producer
        assert ring.take(timeout=0.2) is None, "a slot was handed out twice"
        free = [ring.acquire(timeout=1) for _ in range(SPEC.num_slots)]
        assert sorted(free) == list(range(SPEC.num_slots)), "slot accounting is not whole"
        assert ring.acquire(timeout=0.2) is None
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        ring.close()


def test_fields_have_final_dtypes_and_layout():
    ring = TrajectoryRing(SPEC)
    try:
        assert ring.obs.shape == (6, 6, 2, 3, 3) and ring.obs.dtype == torch.uint8
        assert ring.logits.shape == (6, 6, 3) and ring.logits.dtype == torch.float32
        assert ring.action.dtype == torch.int64
        assert ring.terminated.dtype == torch.bool and ring.truncated.dtype == torch.bool
        assert ring.core_h.shape == (6, 4)
        assert all(t.is_shared() for t in ring.fields.values())
        assert SPEC.nbytes() == sum(t.numel() * t.element_size() for t in ring.fields.values())
    finally:
        ring.close()
