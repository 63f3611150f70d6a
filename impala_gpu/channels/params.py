"""Parameter store: the learner publishes its weights into flat shared tensors; actors copy them.

A seqlock guards each copy: the writer makes the sequence number odd, writes, then makes it even
again. A reader that saw an odd number, or a number that moved during its copy, retries, so an
actor never runs with a half-written copy.

``history`` > 1 keeps the last ``history`` versions (slot ``version % history``), which is what
the bounded-lag mode needs to hand an actor an exact, older version deterministically.

The learner's per-update publishes go through ``channels.publisher.ParamPublisher``, whose
thread is then the store's one writer: a CUDA learner doesn't wait for the copy to the host.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn


def flat_parameters(model: nn.Module, out: Tensor | None = None) -> Tensor:
    """All parameters as one vector ``[num_params]``, in logical (NCHW) element order whatever
    the memory format (``parameters_to_vector`` can't view channels_last weights).

    ``out``, a ``[num_params]`` tensor on the parameters' device, receives them instead of a new
    tensor (one kernel on CUDA, queued on the current stream like any other op).
    """
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()], out=out)


class ParamStore:
    def __init__(self, num_params: int, history: int = 1):
        self.history = history
        self.flat = torch.zeros(history, num_params).share_memory_()
        # seq[k]: seqlock counter of slot k; ver[k]: the version held by slot k (-1: none yet).
        self.seq = torch.zeros(history, dtype=torch.int64).share_memory_()
        self.ver = torch.full((history,), -1, dtype=torch.int64).share_memory_()
        self.latest = torch.full((1,), -1, dtype=torch.int64).share_memory_()

    @classmethod
    def for_model(cls, model: nn.Module, history: int = 1) -> ParamStore:
        return cls(sum(p.numel() for p in model.parameters()), history)

    @property
    def version(self) -> int:
        """The newest published version (-1 before the first publish)."""
        return int(self.latest[0])

    def publish(self, model: nn.Module, version: int) -> None:
        """Write ``model``'s weights as ``version`` (learner side; one writer)."""
        self.publish_flat(flat_parameters(model).detach(), version)

    def publish_flat(self, flat: Tensor, version: int) -> None:
        k = version % self.history
        self.seq[k] += 1  # odd: writing
        self.flat[k].copy_(flat)  # synchronous, also from CUDA: ParamPublisher calls it off-path
        self.ver[k] = version
        self.seq[k] += 1  # even: stable
        self.latest[0] = version

    def try_read(self, out: Tensor, version: int | None = None) -> int | None:
        """Copy a version into ``out`` (the latest when ``version`` is None).

        Returns the version copied, or None if that version is not (or no longer) held, or if a
        write was in progress (the caller retries).
        """
        v = self.version if version is None else version
        if v < 0:
            return None
        k = v % self.history
        s0 = int(self.seq[k])
        if s0 % 2 == 1 or int(self.ver[k]) != v:
            return None
        out.copy_(self.flat[k])
        if int(self.seq[k]) != s0:
            return None
        return v

    def read(
        self,
        out: Tensor,
        version: int | None = None,
        timeout: float | None = None,
        should_stop=None,
    ) -> int | None:
        """Like try_read, but waits (polling) until the version can be read.

        Returns None when ``should_stop()`` turns true or after ``timeout`` seconds (if given).
        """
        deadline = time.monotonic() + timeout if timeout is not None else float("inf")
        delay = 1e-4
        while True:
            got = self.try_read(out, version)
            if got is not None:
                return got
            if (should_stop is not None and should_stop()) or time.monotonic() > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)  # bounded lag waits on every update: wake up promptly


@torch.no_grad()
def load_flat_into(model: nn.Module, flat: Tensor) -> None:
    """Inverse of ``flat_parameters``; keeps each parameter's memory format."""
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.copy_(flat[offset : offset + n].view(p.shape))
        offset += n
    if offset != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} values, the model {offset}.")
