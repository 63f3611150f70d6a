"""What a config's open values come to on this machine: the learner's device (``auto``,
``cuda:N``) and the trajectory ring's slot count (``num_slots=0``). The learners, the checks
and ``auto`` all resolve them here, so they agree."""

from __future__ import annotations

import dataclasses
import math
import os

import torch

from impala_gpu.config.errors import require
from impala_gpu.config.schema import AUTO, Config, fresh_batch_size


def visible_devices() -> str:
    """The devices a config may name here, e.g. ``cpu, cuda:0 (NVIDIA H100 80GB HBM3)``, with
    ``CUDA_VISIBLE_DEVICES`` when it is set (it hides the rest)."""
    names = ["cpu"]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for i in range(count):
        try:
            names.append(f"cuda:{i} ({torch.cuda.get_device_name(i)})")
        except (RuntimeError, AssertionError):  # a driver that cannot name it
            names.append(f"cuda:{i}")
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    return ", ".join(names) + (f" (CUDA_VISIBLE_DEVICES={mask!r})" if mask is not None else "")


def resolve_device(device: str) -> torch.device:
    """``auto``: cuda when present, else cpu. ``cuda`` without CUDA is an error, not a fallback,
    and so is ``cuda:N`` past the last visible GPU (it would fail later, at ``.to(device)``)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            parsed = torch.device("cpu")  # not a CUDA device string: the error below
        require(
            parsed.type == "cuda",
            f"device={device!r} is not one of auto, cpu, cuda, cuda:N. Fix: device=cuda:0.",
        )
        require(
            torch.cuda.is_available(),
            f"device={device} but CUDA is not available (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda}; devices here: {visible_devices()}). Fix: "
            "device=auto or device=cpu, or install a CUDA build of torch.",
        )
        count = torch.cuda.device_count()
        require(
            parsed.index is None or parsed.index < count,
            f"device={device} but this machine has {count} visible CUDA device(s): "
            f"{visible_devices()}. Fix: device=cuda:{count - 1} or lower (or device=cuda, the "
            "first), or make that GPU visible (CUDA_VISIBLE_DEVICES).",
        )
        return parsed
    require(
        device == "cpu",
        f"device={device!r} is not one of auto, cpu, cuda, cuda:N. Fix: device=auto (cuda when "
        "present, else cpu).",
    )
    return torch.device("cpu")


def _count(v: int | str) -> int:
    """An actor or env count, with ``auto`` as its least possible value (1): what can be
    checked before the calibration chooses it."""
    return 1 if v == AUTO else int(v)


def min_num_slots(cfg: Config) -> int:
    """Fewest slots that cannot deadlock: a batch being collected plus one unroll per actor
    (an ``auto`` count as 1, its least, so the check can run before the calibration)."""
    return cfg.batch_size + _count(cfg.num_actors) * _count(cfg.envs_per_actor)


def resolve_num_slots(cfg: Config) -> int:
    """``num_slots``, or the auto size for 0 (an ``auto`` count as 1, its least, as in
    ``min_num_slots``; a resolved config has none)."""
    if cfg.num_slots:
        return cfg.num_slots
    lag = resolve_bounded_lag(cfg)
    ahead = (lag + 2) if lag is not None else 2
    # Room for every env to run one unroll ahead while batches are assembled.
    return ahead * cfg.batch_size + 2 * _count(cfg.num_actors) * _count(cfg.envs_per_actor)


def least_bounded_lag(cfg: Config) -> int:
    """The least exact lag at which no actor waits for the learner (an ``auto`` count as 1).

    Under ``bounded_lag=K`` unroll ``g`` lands in update ``u = g*E // B`` and acts with version
    ``u - K`` (``acting.actor.bounded_lag_version``), so while the learner computes update
    ``u - K + 1`` only the unrolls of the next ``K`` batches, ``K*B/E`` of them, may step. All
    ``N`` actors step at once only if that is at least ``N``: ``K >= ceil(N*E / B)``. With
    ``K = 1`` and 15 actors of 16 envs at ``B = 16``, 2 of the 15 step and 13 wait.
    """
    envs = _count(cfg.num_actors) * _count(cfg.envs_per_actor)
    return max(1, math.ceil(envs / max(fresh_batch_size(cfg), 1)))


def resolve_bounded_lag(cfg: Config) -> int | None:
    """``bounded_lag`` as the run uses it: ``auto`` is ``least_bounded_lag`` under the local
    runtime, and off (None) under Ray, whose unrolls arrive in network order."""
    if cfg.bounded_lag != AUTO:
        return cfg.bounded_lag
    return None if cfg.runtime == "ray" else least_bounded_lag(cfg)


def with_bounded_lag(cfg: Config) -> Config:
    """``cfg`` with ``bounded_lag=auto`` replaced by ``resolve_bounded_lag`` for the counts
    ``cfg`` holds (``cfg`` itself when it has no ``auto`` lag)."""
    if cfg.bounded_lag != AUTO:
        return cfg
    return dataclasses.replace(cfg, bounded_lag=resolve_bounded_lag(cfg))
