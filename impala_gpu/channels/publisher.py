"""Weights published off the learner's critical path: ``ParamPublisher`` hands each version to
a thread that writes it into the shared ``ParamStore``, so a CUDA learner never waits for the
device-to-host copy.

``publish(model, version)``, on the learner's thread, takes a free slot and

1. flattens the weights into the slot's device buffer (``[num_params]``, the learner's device):
   one ``cat`` kernel on the current stream, queued after the update that produced the weights
   and before any later optimizer step can change them, so the version published is exactly
   the weights at the call;
2. on CUDA, queues the copy of that buffer into the slot's pinned host buffer on a side stream
   (which first waits for the current stream) and records an event; on CPU the device buffer
   is already the host buffer;
3. queues ``(slot, version)`` for the publisher thread, and returns.

The thread waits for the slot's event (it blocks, the learner doesn't) and writes the host
buffer into the store with its version: the store's seqlock, as before, keeps readers from
ever taking a half-written copy. Versions are written in publish order, never an older one
after a newer one.

Two modes, chosen by the store:

- latest only (``history == 1``): two slots. A publish that finds both taken replaces the
  version still pending (not yet started by the thread): actors only want the newest weights.
  ``publish`` never blocks.
- every version (``history > 1``, bounded lag): actors wait for exact versions, so each one is
  written, in order. ``history`` slots; ``publish`` blocks (back-pressure) only while that many
  versions are still unwritten.

An exception in the thread is re-raised in the learner by the next ``publish``, ``flush`` or
``close``. ``close`` writes what is pending and joins the thread; call it on every exit path.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from impala_gpu.channels.params import ParamStore, flat_parameters


@dataclass
class _Slot:
    """One version in flight: its snapshot on the learner's device and its host copy."""

    snapshot: Tensor  # [num_params] on the learner's device, written by publish
    host: Tensor  # [num_params] pinned host memory on CUDA; ``snapshot`` itself on CPU
    copied: torch.cuda.Event | None  # recorded on the side stream after snapshot -> host


class ParamPublisher:
    """Publishes learner weights into ``store`` from a thread (see the module docstring).

    One learner thread calls ``publish``/``flush``/``close``; nothing else writes to ``store``
    while the publisher is open.

    Args:
        store: the parameter store the actors read (``flat``: ``[history, num_params]``).
        device: the learner's device; the model passed to ``publish`` lives there.
        every_version: write every version in order (True) or only the newest (False).
            Default: True when the store keeps history (bounded lag), else False.
    """

    def __init__(
        self, store: ParamStore, device: torch.device | str, every_version: bool | None = None
    ):
        self.store = store
        self.device = torch.device(device)
        self.every_version = store.history > 1 if every_version is None else every_version
        self.cuda = self.device.type == "cuda"
        # The copies' own stream: queued behind the update, they overlap the next one.
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        depth = max(store.history, 1) if self.every_version else 2  # 2: one written, one waiting
        num_params, dtype = store.flat.shape[1], store.flat.dtype
        self._slots = [self._new_slot(num_params, dtype) for _ in range(depth)]
        self._free: deque[int] = deque(range(depth))
        self._pending: deque[tuple[int, int]] = deque()  # (slot, version), oldest first
        self._writing: int | None = None  # the slot the thread is writing into the store
        self._cond = threading.Condition()
        self._closing = False
        self._error: BaseException | None = None
        self._error_raised = False
        self.dropped = 0  # latest-only: versions replaced before the thread wrote them
        self._thread = threading.Thread(target=self._run, name="param-publisher", daemon=True)
        self._thread.start()

    def _new_slot(self, num_params: int, dtype: torch.dtype) -> _Slot:
        snapshot = torch.empty(num_params, dtype=dtype, device=self.device)
        if not self.cuda:
            return _Slot(snapshot, snapshot, None)
        # Pinned: a non_blocking device-to-host copy into pageable memory would be synchronous.
        # blocking=True: the thread sleeps in synchronize() rather than spinning on a CPU core.
        host = torch.empty(num_params, dtype=dtype, pin_memory=True)
        return _Slot(snapshot, host, torch.cuda.Event(blocking=True))

    # ----------------------------------------------------------------------- learner side
    def publish(self, model: nn.Module, version: int) -> None:
        """Publish ``model``'s weights (on ``device``) as ``version``; returns without waiting
        for the copy (every-version mode: blocks only while ``history`` versions are unwritten).

        Raises RuntimeError if the thread failed (from its exception), or after ``close``.
        """
        with self._cond:
            k = self._take_slot()
        # The slot is ours: the thread only reads slots that are pending or being written.
        slot = self._slots[k]
        if self.stream is None:
            flat_parameters(model, out=slot.snapshot)  # a synchronous copy on CPU
        else:
            current = torch.cuda.current_stream(self.device)
            # A replaced version's copy may still be reading the snapshot (a GPU-side wait; a
            # no-op for a slot the thread freed, and for an event never recorded).
            current.wait_event(slot.copied)
            flat_parameters(model, out=slot.snapshot)
            self.stream.wait_stream(current)  # copy the snapshot only once it is written
            with torch.cuda.stream(self.stream):
                slot.host.copy_(slot.snapshot, non_blocking=True)
                slot.copied.record(self.stream)
        with self._cond:
            self._pending.append((k, version))
            self._cond.notify_all()

    def _take_slot(self) -> int:
        """A slot free for the next version (the caller holds the lock)."""
        while True:
            self._raise_if_failed()
            if self._closing:
                raise RuntimeError("ParamPublisher.publish after close")
            if self._free:
                return self._free.popleft()
            if not self.every_version and self._pending:
                k, _ = self._pending.popleft()  # superseded before the thread got to it
                self.dropped += 1
                return k
            self._cond.wait()  # back-pressure: every slot holds an unwritten version

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every pending version is in the store (a test, a checkpoint that reads
        the store). Raises the thread's error, or TimeoutError after ``timeout`` seconds."""
        with self._cond:
            done = self._cond.wait_for(
                lambda: self._error is not None or (not self._pending and self._writing is None),
                timeout,
            )
            self._raise_if_failed()
            if not done:
                raise TimeoutError(f"parameter publisher: not flushed within {timeout} s")

    def close(self) -> None:
        """Write the pending versions, stop the thread and join it. Idempotent; call it on every
        exit path. Re-raises the thread's error if no earlier call did."""
        with self._cond:
            self._closing = True  # set first: even if the join below is interrupted, it ends
            self._cond.notify_all()
        self._thread.join()
        if self.stream is not None:
            # After a thread error, copies it never waited for may still be running: they must
            # end before the buffers they read and write can be freed (once, at close).
            self.stream.synchronize()
        with self._cond:
            if not self._error_raised:
                self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            self._error_raised = True
            raise RuntimeError("parameter publisher thread failed") from self._error

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------------ thread side
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closing:
                        self._cond.wait()
                    if not self._pending:  # closing, and everything is written
                        return
                    k, version = self._pending.popleft()
                    self._writing = k
                slot = self._slots[k]
                if slot.copied is not None:
                    slot.copied.synchronize()  # this thread waits for the copy, not the learner
                self.store.publish_flat(slot.host, version)
                with self._cond:
                    self._writing = None
                    self._free.append(k)
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the learner, never swallowed
            with self._cond:
                self._error = e
                self._cond.notify_all()
