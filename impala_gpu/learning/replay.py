"""Experience replay as in the IMPALA paper (section 5.2.2): a FIFO buffer of whole trajectories
that each batch mixes in, uniformly sampled.

A replayed trajectory keeps its behaviour logits and the version that acted it, so V-trace
corrects it like any stale trajectory, and its (larger) lag is reported apart from the fresh
data's. The buffer lives in the learner's process, in CPU memory, in the batch layout; it is
not checkpointed (a resumed run refills it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from impala_gpu.channels.ring import STEP_FIELDS


class ReplayBuffer:
    """FIFO of at most ``capacity`` trajectories, each ``[T+1, ...]`` per step field, its core
    state before step 0 and its version; ``sample`` draws uniformly (with replacement)."""

    def __init__(self, like, capacity: int, seed: int = 0):
        """``like``: a batch (``learning.batcher.Batch``, ``[T+1, B, ...]`` fields) to copy
        the layout from."""
        if capacity < 1:
            raise ValueError(f"replay.capacity={capacity} must be >= 1")
        self.capacity = capacity
        self.steps = {
            name: torch.empty(
                (capacity, *getattr(like, name).shape[:1], *getattr(like, name).shape[2:]),
                dtype=getattr(like, name).dtype,
            )
            for name in STEP_FIELDS
        }
        self.core = tuple(torch.empty(capacity, h.shape[1]) for h in like.core_state)
        self.versions = torch.zeros(capacity, dtype=torch.int64)
        self.size = 0
        self.added = 0  # trajectories ever added; the oldest held is added - size
        self.generator = torch.Generator().manual_seed(seed)

    def add(self, batch, columns: range) -> None:
        """Append ``batch``'s trajectories ``columns`` (CPU), evicting the oldest when full."""
        for b in columns:
            k = self.added % self.capacity
            for name, store in self.steps.items():
                store[k].copy_(getattr(batch, name)[:, b])
            for store, state in zip(self.core, batch.core_state, strict=True):
                store[k].copy_(state[b])
            self.versions[k] = batch.versions[b]
            self.added += 1
            self.size = min(self.size + 1, self.capacity)

    def sample(self, n: int) -> Tensor:
        """``n`` buffer positions, uniform over what it holds."""
        if self.size == 0:
            raise RuntimeError("sample() on an empty replay buffer")
        return torch.randint(0, self.size, (n,), generator=self.generator)

    def write(self, batch, columns: range, positions: Tensor) -> Tensor:
        """Copy the trajectories at ``positions`` into ``batch``'s ``columns``; returns their
        versions ``[n]``."""
        for b, k in zip(columns, positions.tolist(), strict=True):
            for name, store in self.steps.items():
                getattr(batch, name)[:, b].copy_(store[k])
            for store, state in zip(self.core, batch.core_state, strict=True):
                state[b].copy_(store[k])
        return self.versions[positions]
