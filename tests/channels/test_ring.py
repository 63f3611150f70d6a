"""Trajectory ring: bit-exact round trip across processes, and whole slot accounting."""

from __future__ import annotations

import time

import torch
import torch.multiprocessing as mp
from ringdata import SPEC, pattern, produce

from impala_gpu.channels.ring import SlotManager, TrajectoryRing


def hold_and_hang(ring: TrajectoryRing, producer: int) -> None:
    """Take slots, commit one, then hang holding the others (to be SIGKILLed)."""
    items = [ring.acquire(producer, timeout=30) for _ in range(2)]
    ring.commit(producer, items[0])
    time.sleep(600)


def test_round_trip_across_processes_is_bit_exact_and_loses_no_slot():
    ctx = mp.get_context("spawn")
    producers, per_producer = 3, 40
    ring = TrajectoryRing(SPEC, producers, ctx)
    slots = SlotManager(ring)
    procs = [ctx.Process(target=produce, args=(ring, i, per_producer)) for i in range(producers)]
    for p in procs:
        p.start()
    seen = set()
    try:
        for _ in range(producers * per_producer):
            item = ring.take(timeout=60)
            assert item is not None, "a producer stalled: slots were lost"
            slot = slots.accept(item)
            assert slot is not None
            producer, n = int(ring.actor[slot]), int(ring.unroll[slot])
            assert (producer, n) not in seen, "the same unroll was delivered twice"
            seen.add((producer, n))
            for name, t in ring.fields.items():
                if name in ("actor", "unroll"):
                    continue
                assert torch.equal(t[slot], pattern(producer, n, name, t[slot])), name
            slots.give(slot)
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        assert len(seen) == producers * per_producer
        assert ring.take(timeout=0.2) is None, "a slot was handed out twice"
        held = sorted(s for i in range(producers) for s in slots.held_by(i))
        assert held == list(range(SPEC.num_slots)), "slot accounting is not whole"
        assert slots.stale_dropped == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        ring.close()


def test_a_killed_producers_slots_are_reclaimed_and_its_leftovers_dropped():
    ctx = mp.get_context("spawn")
    ring = TrajectoryRing(SPEC, 2, ctx)
    slots = SlotManager(ring)
    victim = ctx.Process(target=hold_and_hang, args=(ring, 0))
    victim.start()
    try:
        first = ring.take(timeout=60)
        assert first is not None
        victim.kill()
        victim.join(timeout=10)
        reclaimed = slots.reclaim(0, ctx.Queue(), ctx.Queue())
        # 3 slots were given to producer 0; one was committed (and taken, but not accepted).
        assert reclaimed == 3
        assert slots.accept(first) is None, "an item of a reclaimed slot must be stale"
        assert slots.stale_dropped == 1
        held = sorted(slots.held_by(0) + slots.held_by(1))
        assert held == list(range(SPEC.num_slots))
        # The replacement gets fresh items with new generations through the new queue.
        fresh = [ring.acquire(0, timeout=10) for _ in range(len(slots.held_by(0)))]
        assert all(f is not None for f in fresh)
        # ... and commits through its own fresh full queue (the dead one's may be jammed).
        ring.commit(0, fresh[0])
        assert slots.accept(ring.take(timeout=30)) == fresh[0][0]
    finally:
        if victim.is_alive():
            victim.kill()
        ring.close()


def test_fields_have_final_dtypes_and_layout():
    ring = TrajectoryRing(SPEC, 1)
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
