"""Upper bounds: sizes no run can start with on this machine. ``validate`` already checks the
least values and that the trajectory ring fits ``/dev/shm`` (``resources``); here, how many
envs an actor can step, and whether the run's processes, envs, ring and replay fit the memory
the machine has available.

``experiment=cartpole_impala envs_per_actor=100000`` was accepted: it showed no progress for
75 s, then hung on Ctrl-C. It now fails at once, naming the bound and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from impala_gpu.config import AUTO, Config, ConfigError, require, resolve_num_slots
from impala_gpu.resources import (
    PARAM_BYTES,
    cached_env_spec,
    model_num_params,
    shared_memory_need,
    size_text,
)

# An actor steps its envs one after another and must send its first unroll within
# acting.pool.STARTUP_GRACE_S (120 s) or it counts as hung. An Atari step (4 frames and the
# preprocessing) takes about 0.5 ms on one core, so 1024 envs x 64 steps (the Pong recipe's
# unroll) is ~33 s: a 4x margin. Past that, more actors scale where more envs per actor wait.
MAX_ENVS_PER_ACTOR = 1024

MIB = 2**20
# Private memory of one process that imports torch, gymnasium and ale-py (measured: 154 MiB
# on Linux, torch 2.x): each actor, each learner rank.
PROCESS_BYTES = 160 * MIB
# One env's memory in an actor, measured over 64-1000 envs and rounded up: an ALE emulator
# with its frame buffers 1.6 MiB, a MinAtar game 280 KiB, LunarLander (Box2D) 120 KiB,
# CartPole 6 KiB (classic control is counted as LunarLander, the largest).
ENV_BYTES = {"atari": 2 * MIB, "minatar": 320 * 1024, "classic": 128 * 1024}
# The learner's model lives 4 times: weights, gradients, and the optimizer's two moments.
LEARNER_MODEL_COPIES = 4
MEMINFO = "/proc/meminfo"


def _count(v: int | str) -> int:
    return 1 if v == AUTO else int(v)


def validate_env_counts(cfg: Config) -> None:
    """``envs_per_actor`` at most ``MAX_ENVS_PER_ACTOR`` (``auto`` chooses far fewer)."""
    envs = cfg.envs_per_actor
    if envs == AUTO or not isinstance(envs, int):
        return  # check_values names a wrong type
    per_actor = max(1, MAX_ENVS_PER_ACTOR // max(1, _count(cfg.num_actors)))
    require(
        envs <= MAX_ENVS_PER_ACTOR,
        f"envs_per_actor={envs} is more than the {MAX_ENVS_PER_ACTOR} envs one actor can "
        "step: it steps them one after another, and its first unroll (unroll_length="
        f"{cfg.unroll_length} steps of every env) must arrive within the 120 s an actor has "
        f"to start. Fix: envs_per_actor=auto, or envs_per_actor<={MAX_ENVS_PER_ACTOR} (e.g. "
        f"{min(per_actor, 32)}) with more num_actors.",
    )


def mem_available_bytes(path: str = MEMINFO) -> int | None:
    """``MemAvailable`` of ``/proc/meminfo``: what new allocations can take without swapping;
    None where there is no such file (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class MemoryNeed:
    """What a run's processes take, by part (bytes)."""

    processes: int  # actors and learner ranks, PROCESS_BYTES each
    envs: int  # every actor's envs
    models: int  # each actor's copy of the weights, and the learner's model and optimizer
    ring: int  # the trajectory ring and the parameter store (shared memory is memory too)
    replay: int  # the replay buffer's trajectories (learner process)

    @property
    def total(self) -> int:
        return self.processes + self.envs + self.models + self.ring + self.replay


def memory_need(cfg: Config) -> MemoryNeed:
    """An estimate of the memory ``cfg``'s run takes (``auto`` counts as 1, its least, so it
    can be checked before the calibration). Remote Ray actors take theirs elsewhere."""
    spec = cached_env_spec(cfg)
    actors = _count(cfg.num_actors)
    envs = actors * _count(cfg.envs_per_actor)
    local = not (cfg.runtime == "ray" and cfg.ray.address)  # actors on this machine
    model = model_num_params(cfg, spec) * PARAM_BYTES
    ring = replay = 0
    if cfg.algo.name != "a3c":  # A3C's workers share one model, and there is no ring
        need = shared_memory_need(cfg, resolve_num_slots(cfg))
        ring = need.total
        if cfg.replay.proportion > 0:
            replay = cfg.replay.capacity * need.slot_bytes
    return MemoryNeed(
        processes=((actors if local else 0) + cfg.learners) * PROCESS_BYTES,
        envs=envs * ENV_BYTES.get(spec.kind, ENV_BYTES["atari"]) if local else 0,
        models=(actors if local else 0) * model + cfg.learners * LEARNER_MODEL_COPIES * model,
        ring=ring,
        replay=replay,
    )


def validate_memory(cfg: Config) -> None:
    """The run fits in the memory this machine has available now. The estimate errs low (it
    leaves out Python's and torch's caches), so a config it rejects cannot run here: past
    ``MemAvailable`` the kernel's OOM killer ends an actor or the learner mid-run."""
    free = mem_available_bytes()
    if free is None:
        return
    try:
        need = memory_need(cfg)
    except ValueError as e:  # the env module's own (they name env.id and the fix)
        raise ConfigError(str(e)) from None
    if need.total <= free:
        return
    actors, envs = _count(cfg.num_actors), _count(cfg.envs_per_actor)
    parts = {
        f"{actors} actor and {cfg.learners} learner processes": need.processes,
        f"{actors * envs} envs": need.envs,
        "models": need.models,
        f"the trajectory ring (num_slots={cfg.num_slots or 'auto'})": need.ring,
        f"replay (replay.capacity={cfg.replay.capacity})": need.replay,
    }
    shown = ", ".join(f"{name} {size_text(b)}" for name, b in parts.items() if b)
    raise ConfigError(
        f"num_actors={cfg.num_actors} x envs_per_actor={cfg.envs_per_actor} (num_slots="
        f"{cfg.num_slots}, batch_size={cfg.batch_size}, unroll_length={cfg.unroll_length}) "
        f"need about {size_text(need.total)} of memory ({shown}), and this machine has "
        f"{size_text(free)} available (MemAvailable, {MEMINFO}). Fix: "
        f"{_memory_fix(cfg, need, free)}, or free memory."
    )


def _memory_fix(cfg: Config, need: MemoryNeed, free: int) -> str:
    """The change that shrinks the largest part of ``need`` enough, where one key does."""
    actors = _count(cfg.num_actors)
    per_actor = (need.processes + need.envs + need.models) / max(1, actors)  # ~, learner's too
    largest = max(("actors", need.processes + need.envs), ("ring", need.ring),
                  ("replay", need.replay), key=lambda p: p[1])[0]  # fmt: skip
    if largest == "actors":
        fit = int((free - (need.total - actors * per_actor)) // per_actor)
        if fit < 1:
            return "fewer num_actors and envs_per_actor"
        each = _mib(per_actor)
        return f"num_actors={fit} or fewer (each takes about {each}), or fewer envs_per_actor"
    slot = shared_memory_need(cfg, 1).slot_bytes
    if largest == "ring":
        fit = int((free - (need.total - need.ring)) // slot)
        shown = f"num_slots={fit} or fewer, " if cfg.num_slots and fit > 0 else ""
        return f"{shown}a smaller batch_size or unroll_length ({_mib(slot)} a slot)"
    fit = int((free - (need.total - need.replay)) // slot)
    return f"replay.capacity={max(1, fit)} or fewer ({_mib(slot)} a trajectory)"


def _mib(n: float) -> str:
    return size_text(int(n))
