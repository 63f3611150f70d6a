"""Shared-memory trajectory ring.

One preallocated shared tensor per field, shaped ``[num_slots, T+1, ...]``. A slot holds one
env's unroll of T transitions (T+1 observations: the last one is the first of the next unroll,
so the learner can bootstrap). Slot *indices* travel between processes through queues (a free
and a full queue per actor); trajectories never go through a pipe.

Per index t of a slot (dm_env / TorchBeast convention, "what the env said at t, what the agent
did at t"):

=============  =========================  ====================================================
field          dtype, shape               meaning
=============  =========================  ====================================================
obs            env dtype, [*obs_shape]    observation o_t (uint8 frames for Atari)
reward         float32                    reward received on arriving at o_t (clipped if asked)
terminated     bool                       o_t is a terminal state (its value is 0)
truncated      bool                       o_t is the true final obs of a time-limited episode
first          bool                       o_t starts an episode (LSTM state resets here)
action         int64                      a_t, the action taken at o_t
logits         float32, [A]               the behaviour policy's logits at o_t
=============  =========================  ====================================================

plus, per slot: ``version`` (the behaviour policy's version, int64), ``actor``, ``unroll`` and
``env_index`` (who wrote it, which of its unrolls, which of its envs) and, with an LSTM,
``core_h``/``core_c`` [lstm] (the core state before o_0).

Because every vector env here autoresets on the NEXT step, a truncated episode's final
observation is stored like any other observation; the learner bootstraps from its value and
masks the following pseudo-transition (final obs -> reset obs). With ``env.episodic_life`` a
lost life is ``terminated`` too, but the game goes on: the next observation comes from real play
(``first`` is set there) and the transition into it is masked like a reset.

Lifetime: tensors are created with ``share_memory_()`` under torch's ``file_descriptor``
strategy, which unlinks each segment from ``/dev/shm`` right after creating it. The memory lives
exactly as long as some process holds it, so no exit path, not even SIGKILL, can leak a segment.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from multiprocessing import connection as mp_connection

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import Tensor

STEP_FIELDS = ("obs", "reward", "terminated", "truncated", "first", "action", "logits")


@dataclass(frozen=True)
class RingSpec:
    num_slots: int
    unroll_length: int  # T
    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    num_actions: int
    lstm_size: int = 0  # 0: no core state stored

    def field_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        s, t1 = self.num_slots, self.unroll_length + 1
        shapes = {
            "obs": ((s, t1, *self.obs_shape), self.obs_dtype),
            "reward": ((s, t1), torch.float32),
            "terminated": ((s, t1), torch.bool),
            "truncated": ((s, t1), torch.bool),
            "first": ((s, t1), torch.bool),
            "action": ((s, t1), torch.int64),
            "logits": ((s, t1, self.num_actions), torch.float32),
            "version": ((s,), torch.int64),
            "actor": ((s,), torch.int64),
            "unroll": ((s,), torch.int64),
            "env_index": ((s,), torch.int64),
        }
        if self.lstm_size:
            shapes["core_h"] = ((s, self.lstm_size), torch.float32)
            shapes["core_c"] = ((s, self.lstm_size), torch.float32)
        return shapes

    def nbytes(self) -> int:
        return sum(
            int(np.prod(shape)) * torch.empty((), dtype=dt).element_size()
            for shape, dt in self.field_shapes().values()
        )


def numpy_to_torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros((), dtype=dtype)).dtype


def ring_spec(cfg, spec, num_slots: int) -> RingSpec:
    """The ring layout of a run (``cfg``: its Config, ``spec``: its EnvSpec) with ``num_slots``
    slots: the learner's ring, or one actor's unroll of E slots (``runtime=ray``)."""
    return RingSpec(
        num_slots=num_slots,
        unroll_length=cfg.unroll_length,
        obs_shape=spec.obs_shape,
        obs_dtype=numpy_to_torch_dtype(spec.obs_dtype),
        num_actions=spec.num_actions,
        lstm_size=cfg.model.lstm_size if cfg.model.use_lstm else 0,
    )


class TrajectoryRing:
    """The ring's tensors and its index queues. Picklable to spawn/forkserver children.

    Each actor has its own free queue, filled by the learner's :class:`SlotManager`, so the
    learner always knows which slots a given actor holds and can take them back if it dies;
    and its own full queue, so a process killed mid-write can't jam the others.
    Queue items are ``(slot, generation)``: reclaiming a slot bumps its generation, so an item
    a dying actor left behind in the full queue is recognised as stale and dropped.
    """

    def __init__(
        self, spec: RingSpec, num_actors: int = 1, ctx: mp.context.BaseContext | None = None
    ):
        ctx = ctx or mp.get_context("spawn")
        self.spec = spec
        self.ctx = ctx
        self.fields: dict[str, Tensor] = {
            name: torch.zeros(shape, dtype=dt).share_memory_()
            for name, (shape, dt) in spec.field_shapes().items()
        }
        self.free_queues = [ctx.Queue() for _ in range(num_actors)]
        # One full queue per actor too: an actor SIGKILLed while its feeder thread holds a
        # queue's write lock leaves that lock held forever, so no queue may be shared.
        self.full_queues = [ctx.Queue() for _ in range(num_actors)]
        self._next = 0

    def __getattr__(self, name: str) -> Tensor:
        fields = self.__dict__.get("fields")
        if fields is not None and name in fields:
            return fields[name]
        raise AttributeError(name)

    # -- actor side ----------------------------------------------------------------------
    def acquire(self, actor: int, timeout: float | None = None) -> tuple[int, int] | None:
        """A free ``(slot, generation)`` handed to ``actor``, or None after ``timeout`` s."""
        try:
            return self.free_queues[actor].get(timeout=timeout)
        except queue.Empty:
            return None

    def commit(self, actor: int, item: tuple[int, int]) -> None:
        """Hand a written slot to the learner."""
        self.full_queues[actor].put(item)

    # -- learner side --------------------------------------------------------------------
    def take(self, timeout: float | None = None) -> tuple[int, int] | None:
        """A full ``(slot, generation)`` from any actor, or None after ``timeout`` seconds."""
        queues = list(self.full_queues)  # the supervisor may swap one in meanwhile
        ready = {id(r) for r in mp_connection.wait([q._reader for q in queues], timeout)}
        n = len(queues)
        for k in range(n):  # round-robin, so no actor is starved
            q = queues[(self._next + k) % n]
            if id(q._reader) in ready:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    continue
                self._next = (self._next + k + 1) % n
                return item
        return None

    def occupancy(self) -> float:
        """Fraction of slots full and waiting for the learner (approximate, from qsize)."""
        try:
            return sum(q.qsize() for q in self.full_queues) / self.spec.num_slots
        except NotImplementedError:  # macOS
            return float("nan")

    def close(self) -> None:
        """Drop the queues' feeder threads so the owner can exit promptly."""
        for q in (*self.free_queues, *self.full_queues):
            q.cancel_join_thread()
            q.close()


class SlotManager:
    """Learner-side slot accounting: every slot is either held by one actor (queued for it or
    being written) or by the learner (full, or being gathered). Thread-safe."""

    def __init__(self, ring: TrajectoryRing):
        self.ring = ring
        n = ring.spec.num_slots
        self.generation = [0] * n
        self.owner = [-1] * n  # actor index, or -1: the learner has it
        self.lock = threading.Lock()
        self.stale_dropped = 0
        self.retired_queues: list = []
        for slot in range(n):
            self.give(slot)

    def held_by(self, actor: int) -> list[int]:
        with self.lock:
            return [s for s, o in enumerate(self.owner) if o == actor]

    def give(self, slot: int) -> None:
        """Hand a free slot to the actor holding the fewest (keeps them evenly supplied)."""
        with self.lock:
            counts = [0] * len(self.ring.free_queues)
            for o in self.owner:
                if o >= 0:
                    counts[o] += 1
            actor = counts.index(min(counts))
            self.generation[slot] += 1
            self.owner[slot] = actor
            self.ring.free_queues[actor].put((slot, self.generation[slot]))

    def accept(self, item: tuple[int, int]) -> int | None:
        """The slot of a full-queue item, or None (and counted) if it went stale."""
        slot, gen = item
        with self.lock:
            if gen != self.generation[slot] or self.owner[slot] < 0:
                self.stale_dropped += 1
                return None
            self.owner[slot] = -1
            return slot

    def reclaim(self, actor: int, fresh_free, fresh_full) -> int:
        """Take back every slot of a dead actor; its replacement gets fresh queues (the old
        ones may hold items nobody will read, or a lock the dead process held). Returns how
        many slots came back."""
        with self.lock:
            old = (self.ring.free_queues[actor], self.ring.full_queues[actor])
            self.ring.free_queues[actor] = fresh_free
            self.ring.full_queues[actor] = fresh_full
            slots = [s for s, o in enumerate(self.owner) if o == actor]
            for s in slots:
                self.generation[s] += 1  # anything of it still in flight is now stale
                self.owner[s] = -1
        # Keep the old queue referenced: an actor still starting up may be unpickling it, and
        # garbage-collecting it here would unlink its semaphores under that actor's feet.
        self.retired_queues.extend(old)
        for s in slots:
            self.give(s)
        return len(slots)
