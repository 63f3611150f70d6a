"""Batcher: a thread that turns full ring slots into time-major device batches.

It gathers ``batch_size`` slots into a staging batch (pinned memory on CUDA), starts the
host-to-device copy on a side stream, and frees the slots at once. Two buffers alternate, so
the next batch is assembled while the current one trains.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from impala_gpu.channels.ring import STEP_FIELDS, SlotManager, TrajectoryRing
from impala_gpu.learning.replay import ReplayBuffer


@dataclass
class Batch:
    """Time-major learner batch on the learner's device. Step fields are ``[T+1, B, ...]``."""

    obs: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    first: Tensor
    action: Tensor
    logits: Tensor
    core_state: tuple[Tensor, ...] = ()  # (h, c) [B, H] each, or ()
    versions: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))  # [B], CPU
    replayed: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))  # [B], CPU


def _alloc_batch(ring: TrajectoryRing, B: int, device: torch.device, pin: bool) -> Batch:
    def alloc(name: str) -> Tensor:
        src = ring.fields[name]
        shape = (src.shape[1], B, *src.shape[2:])
        return torch.empty(shape, dtype=src.dtype, device=device, pin_memory=pin)

    core = ()
    if "core_h" in ring.fields:
        h = ring.fields["core_h"].shape[1]
        core = tuple(torch.empty(B, h, device=device, pin_memory=pin) for _ in ("core_h", "core_c"))
    return Batch(**{n: alloc(n) for n in STEP_FIELDS}, core_state=core)


class Batcher(threading.Thread):
    """Feeds the train loop with ready batches; owns the staging and device buffers."""

    def __init__(
        self,
        ring: TrajectoryRing,
        slots: SlotManager,
        batch_size: int,
        device: torch.device,
        learner_version,  # () -> int
        max_policy_lag: int = 0,
        ordered_unrolls_per_batch: int = 0,  # bounded-lag: unrolls per batch, in global order
        envs_per_actor: int = 1,
        num_buffers: int = 2,
        fresh_batch_size: int | None = None,  # with replay: ring trajectories per batch
        replay_capacity: int = 0,
        seed: int = 0,
    ):
        super().__init__(name="batcher", daemon=True)
        self.ring, self.slots, self.B, self.device = ring, slots, batch_size, device
        self.cuda = device.type == "cuda"
        self.learner_version = learner_version
        self.max_policy_lag = max_policy_lag
        self.ordered = ordered_unrolls_per_batch
        self.E = envs_per_actor
        # With replay, each batch is `fresh` ring trajectories then `n_replay` replayed ones.
        self.fresh = batch_size if fresh_batch_size is None else fresh_batch_size
        self.n_replay = batch_size - self.fresh
        self.staging = [
            _alloc_batch(ring, batch_size, torch.device("cpu"), self.cuda)
            for _ in range(num_buffers)
        ]
        self.device_bufs = (
            [_alloc_batch(ring, batch_size, device, False) for _ in range(num_buffers)]
            if self.cuda
            else self.staging
        )
        self.replay = (
            ReplayBuffer(self.staging[0], replay_capacity, seed) if self.n_replay else None
        )
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.copy_done = [None] * num_buffers  # CUDA events: staging k may be reused
        self.train_done = [None] * num_buffers  # CUDA events: device buffer k may be overwritten
        self.free_bufs: queue.Queue[int] = queue.Queue()
        for k in range(num_buffers):
            self.free_bufs.put(k)
        self.ready: queue.Queue = queue.Queue()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.dropped_stale = 0
        self.gather_s = 0.0
        self._pending: dict[tuple[int, int], int] = {}
        self._next_batch = 0

    # -- producer side --------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    k = self.free_bufs.get(timeout=0.1)
                except queue.Empty:
                    continue
                slots = self._collect()
                if slots is None:
                    return
                t0 = time.perf_counter()
                self._fill(k, slots)
                self.gather_s += time.perf_counter() - t0
                self.ready.put((k, self.copy_done[k]))
        except BaseException as e:  # surfaced to the train loop by get()
            self.error = e
            self.ready.put(None)

    def _take_one(self) -> int | None:
        while not self.stop_event.is_set():
            item = self.ring.take(timeout=0.1)
            if item is not None:
                slot = self.slots.accept(item)  # None: written by an actor that since died
                if slot is not None:
                    return slot
        return None

    def _collect(self) -> list[int] | None:
        if self.ordered:
            return self._collect_ordered()
        slots: list[int] = []
        while len(slots) < self.fresh:
            slot = self._take_one()
            if slot is None:
                for s in slots:
                    self.slots.give(s)
                return None
            if self.max_policy_lag > 0:
                lag = self.learner_version() - int(self.ring.version[slot])
                if lag > self.max_policy_lag:
                    self.dropped_stale += 1
                    self.slots.give(slot)
                    continue
            slots.append(slot)
        return slots

    def _collect_ordered(self) -> list[int] | None:
        """Bounded-lag mode: batch u is exactly global unrolls [u*n, (u+1)*n), every env."""
        n = self.ordered
        want = [
            (g, j)
            for g in range(self._next_batch * n, (self._next_batch + 1) * n)
            for j in range(self.E)
        ]
        while not all(key in self._pending for key in want):
            slot = self._take_one()
            if slot is None:
                return None
            key = (int(self.ring.unroll[slot]), int(self.ring.env_index[slot]))
            self._pending[key] = slot
        self._next_batch += 1
        return [self._pending.pop(key) for key in want]

    def _fill(self, k: int, slots: list[int]) -> None:
        ring, stage = self.ring, self.staging[k]
        if self.cuda and self.copy_done[k] is not None:
            self.copy_done[k].synchronize()  # the previous H2D copy out of staging k is done
        idx, n = torch.tensor(slots), len(slots)
        for name in STEP_FIELDS:
            src, dst = ring.fields[name], getattr(stage, name)
            if name == "obs":
                for b, slot in enumerate(slots):  # contiguous per-slot reads, no temporary
                    dst[:, b].copy_(src[slot])
            else:
                dst[:, :n].copy_(src.index_select(0, idx).transpose(0, 1))
        if stage.core_state:
            stage.core_state[0][:n].copy_(ring.core_h.index_select(0, idx))
            stage.core_state[1][:n].copy_(ring.core_c.index_select(0, idx))
        stage.versions = ring.version.index_select(0, idx)
        stage.replayed = torch.zeros(self.B, dtype=torch.bool)
        if self.replay is not None:
            self._mix_in_replay(stage, n)
        if self.cuda:
            dev = self.device_bufs[k]
            with torch.cuda.stream(self.stream):
                if self.train_done[k] is not None:
                    self.stream.wait_event(self.train_done[k])
                for name in STEP_FIELDS:
                    getattr(dev, name).copy_(getattr(stage, name), non_blocking=True)
                for d, s in zip(dev.core_state, stage.core_state, strict=True):
                    d.copy_(s, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.stream)
            dev.versions, dev.replayed = stage.versions, stage.replayed
            self.copy_done[k] = ev
        # The ring slots are free as soon as their data is in staging (CPU) / the copy is issued.
        for slot in slots:
            self.slots.give(slot)

    def _mix_in_replay(self, stage: Batch, n_fresh: int) -> None:
        """The fresh trajectories join the FIFO; the rest of the batch is sampled from it."""
        assert self.replay is not None
        self.replay.add(stage, range(n_fresh))
        columns = range(n_fresh, self.B)
        versions = self.replay.write(stage, columns, self.replay.sample(len(columns)))
        stage.versions = torch.cat([stage.versions, versions])
        stage.replayed[n_fresh:] = True

    # -- consumer side --------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> tuple[int, Batch] | None:
        """Next ready batch (waiting for it), or None on timeout."""
        try:
            item = self.ready.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is None:
            raise RuntimeError("batcher thread failed") from self.error
        k, ev = item
        if ev is not None:
            torch.cuda.current_stream(self.device).wait_event(ev)
        return k, self.device_bufs[k]

    def done(self, k: int) -> None:
        """The train step no longer needs buffer k."""
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self.train_done[k] = ev
        self.free_bufs.put(k)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)
