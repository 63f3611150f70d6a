"""What this machine has, against what a config asks of it: ``/dev/shm`` for the ring and the
parameter store."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from impala_gpu.channels.ring import RingSpec, ring_spec
from impala_gpu.config import (
    Config,
    ConfigError,
    min_num_slots,
    resolve_bounded_lag,
    resolve_num_slots,
)
from impala_gpu.envs import EnvSpec, env_spec
from impala_gpu.models import build_model

# torch shares CPU tensors through shm_open (both sharing strategies), i.e. files on this
# tmpfs: an unlinked segment still counts against its size while a process maps it.
SHM_DIR = "/dev/shm"
PARAM_BYTES = 4  # ParamStore keeps float32 copies of the weights

_SPECS: dict[str, EnvSpec] = {}
_NUM_PARAMS: dict[str, int] = {}


def cached_env_spec(cfg: Config) -> EnvSpec:
    """``env_spec(cfg.env)``, made once per env config: it starts an env (a quarter second
    for Atari), and a sweep checks every point's config."""
    key = repr(cfg.env)
    if key not in _SPECS:
        _SPECS[key] = env_spec(cfg.env)
    return _SPECS[key]


def model_num_params(cfg: Config, spec: EnvSpec) -> int:
    """How many parameters the learner's model has: counted on the meta device (no memory,
    no initialisation: MinAtar's CNN has 28M), else on the CPU for a model whose constructor
    reads a tensor's value (the MLP's input size), which the meta device cannot give."""
    key = repr((spec.obs_shape, spec.num_actions, cfg.model))
    if key not in _NUM_PARAMS:
        try:
            with torch.device("meta"):
                model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
        except (RuntimeError, NotImplementedError):
            model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
        _NUM_PARAMS[key] = sum(p.numel() for p in model.parameters())
    return _NUM_PARAMS[key]


@dataclass(frozen=True)
class SharedMemoryNeed:
    """The shared memory a run's learner process allocates before any actor starts."""

    ring: RingSpec
    param_bytes: int  # the parameter store: ``history`` float32 copies of the weights

    @property
    def ring_bytes(self) -> int:
        return self.ring.nbytes()

    @property
    def slot_bytes(self) -> int:
        """One slot's share of the ring (every field's ``[T+1, ...]`` block)."""
        return replace(self.ring, num_slots=1).nbytes()

    @property
    def total(self) -> int:
        return self.ring_bytes + self.param_bytes


def shared_memory_need(cfg: Config, num_slots: int) -> SharedMemoryNeed:
    """The ring of ``num_slots`` slots and the parameter store of ``cfg``'s run
    (``algos.impala.DataPath.build`` allocates both)."""
    spec = cached_env_spec(cfg)
    lag = resolve_bounded_lag(cfg)
    history = (lag + 2) if lag is not None else 1
    params = history * model_num_params(cfg, spec) * PARAM_BYTES
    return SharedMemoryNeed(ring_spec(cfg, spec, num_slots), params)


def shm_free_bytes(path: str = SHM_DIR) -> int | None:
    """Bytes an unprivileged process may still allocate on ``path``; None where there is no
    such file system (macOS shares memory without one)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def size_text(n: int) -> str:
    """Bytes for a person: ``512.0 KiB``, ``1.3 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    raise AssertionError("unreachable")


def validate_shared_memory(cfg: Config) -> None:
    """The ring and the parameter store fit in ``/dev/shm`` (64 MiB in a default Docker
    container). A ring that does not fit fails at its first write, with SIGBUS, after the
    actors started: here it is a ConfigError before any process or file."""
    free = shm_free_bytes()
    if free is None:  # no /dev/shm here: nothing to measure
        return
    slots = resolve_num_slots(cfg)
    try:
        need = shared_memory_need(cfg, slots)
    except ValueError as e:  # the env module's own (they name env.id and the fix)
        raise ConfigError(str(e)) from None
    if need.total <= free:
        return
    shown = cfg.num_slots or f"0 (auto: {slots})"
    fits = (free - need.param_bytes) // need.slot_bytes  # the most slots there is room for
    least = min_num_slots(cfg)
    fixes = [f"num_slots={fits} (the most that fit)"] if fits >= least else []
    if not cfg.num_slots or fits < least:
        fixes.append(
            "fewer num_actors or envs_per_actor, or a smaller batch_size (they set how many "
            "slots it needs)"
        )
    fixes.append("a shorter unroll_length")
    fixes.append(
        f"{size_text(need.total - free)} more free in {SHM_DIR} (docker run --shm-size=..., "
        f"or mount -o remount,size=... {SHM_DIR})"
    )
    raise ConfigError(
        f"num_slots={shown} x unroll_length={cfg.unroll_length} (num_actors={cfg.num_actors} "
        f"x envs_per_actor={cfg.envs_per_actor}, batch_size={cfg.batch_size}) needs "
        f"{size_text(need.ring_bytes)} of shared memory for the trajectory ring "
        f"({size_text(need.slot_bytes)} a slot) plus {size_text(need.param_bytes)} for the "
        f"parameter store, and {SHM_DIR} has {size_text(free)} free. Fix: "
        f"{', '.join(fixes[:-1])}, or {fixes[-1]}."
    )
