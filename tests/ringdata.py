"""Ring test data: a small ring spec, and unrolls with deterministic content per (producer, n),
written the way actors write them (shared by the ring, batcher and CUDA tests); random learner
batches, and one plain-SGD update on them (the precision, compile and CUDA tests)."""

from __future__ import annotations

import threading
import zlib

import torch
import torch.multiprocessing as mp

from impala_gpu.channels.ring import STEP_FIELDS, RingSpec, SlotManager, TrajectoryRing
from impala_gpu.config import AlgoCfg
from impala_gpu.learning.batcher import Batch, Batcher
from impala_gpu.learning.learner import STAT_NAMES, Learner

ATARI_OBS, ATARI_ACTIONS = (4, 84, 84), 6
LOSS_STATS = [STAT_NAMES.index(n) for n in ("total_loss", "pg_loss", "baseline_loss", "entropy")]

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
        item = ring.acquire(producer, timeout=30)
        assert item is not None
        slot = item[0]
        for name, t in ring.fields.items():
            t[slot] = pattern(producer, n, name, t[slot])
        ring.actor[slot] = producer
        ring.unroll[slot] = n
        ring.commit(producer, item)


def snapshot(batch: Batch) -> dict[str, torch.Tensor]:
    """CPU copies of everything a batch holds (read on the current stream, as an update does)."""
    out = {name: getattr(batch, name).cpu().clone() for name in STEP_FIELDS}
    for i, t in enumerate(batch.core_state):
        out[f"core_{i}"] = t.cpu().clone()
    out["versions"] = batch.versions.cpu().clone()
    return out


def expected_batch(spec: RingSpec, B: int, index: int) -> dict[str, torch.Tensor]:
    """Batch ``index`` as test_ring.produce wrote it: unrolls index*B ... index*B + B - 1."""
    shapes = spec.field_shapes()

    def slot(n: int, name: str) -> torch.Tensor:
        shape, dtype = shapes[name]
        return pattern(0, n, name, torch.empty(shape[1:], dtype=dtype))

    ns = range(index * B, (index + 1) * B)
    out = {name: torch.stack([slot(n, name) for n in ns], dim=1) for name in STEP_FIELDS}
    if spec.lstm_size:
        out["core_0"] = torch.stack([slot(n, "core_h") for n in ns])
        out["core_1"] = torch.stack([slot(n, "core_c") for n in ns])
    out["versions"] = torch.stack([slot(n, "version") for n in ns])
    return out


def batches_from_ring(spec: RingSpec, device: str, B: int, pairs: int) -> list[dict]:
    """Run a producer thread and the real Batcher on ``device``; take the batches two at a
    time (both buffers held at once, some GPU work queued on each) and snapshot them."""
    ring = TrajectoryRing(spec, 1, mp.get_context("spawn"))
    slots = SlotManager(ring)
    producer = threading.Thread(target=produce, args=(ring, 0, 2 * pairs * B), daemon=True)
    batcher = Batcher(ring, slots, B, torch.device(device), learner_version=lambda: 0)
    if batcher.cuda:
        assert all(getattr(s, n).is_pinned() for s in batcher.staging for n in STEP_FIELDS)
        assert batcher.stream is not None
    out = []
    producer.start()
    batcher.start()
    try:
        for _ in range(pairs):
            held = []
            for _ in range(2):
                got = batcher.get(timeout=60)
                assert got is not None, "no batch from the ring in 60 s"
                k, batch = got
                assert batch.obs.device.type == torch.device(device).type
                # Work that reads the buffer on the train stream, as a train step would: the
                # next copy into this buffer must wait for it (train_done events).
                batch.obs.float().sum()
                held.append((k, batch))
            assert len({k for k, _ in held}) == 2, "both buffers must be in use at once"
            for k, batch in held:
                out.append(snapshot(batch))
                batcher.done(k)
        producer.join(timeout=30)
        # Every slot is back with the (only) actor: none leaked by the batcher.
        assert sorted(slots.held_by(0)) == list(range(spec.num_slots))
    finally:
        batcher.stop()
        ring.close()
    assert batcher.error is None
    return out


def random_batch(obs_shape, num_actions: int, T: int = 6, B: int = 4, seed: int = 0) -> Batch:
    """A learner batch of random content (not from a ring): time-major ``[T+1, B, ...]``."""
    g = torch.Generator().manual_seed(seed)
    image = len(obs_shape) == 3
    obs = (
        torch.randint(0, 256, (T + 1, B, *obs_shape), generator=g, dtype=torch.uint8)
        if image
        else torch.randn(T + 1, B, *obs_shape, generator=g)
    )
    terminated = torch.rand(T + 1, B, generator=g) < 0.1
    return Batch(
        obs=obs,
        reward=torch.randn(T + 1, B, generator=g),
        terminated=terminated,
        truncated=torch.zeros(T + 1, B, dtype=torch.bool),
        first=torch.roll(terminated, 1, 0),
        action=torch.randint(0, num_actions, (T + 1, B), generator=g),
        logits=torch.randn(T + 1, B, num_actions, generator=g),
    )


def one_update(model, batch: Batch, precision: str = "fp32"):
    """Stats and the parameter change of one plain-SGD update (the change is -lr * grad)."""
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    stats = Learner(model, opt, AlgoCfg(), precision).update(batch)
    delta = torch.cat(
        [(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)]
    )
    return stats, delta
