"""Up-front checks: every impossible config fails before any process starts, naming the key
and the fix."""

from __future__ import annotations

import dataclasses
import math

import torch

from impala_gpu.config import (
    AUTO,
    Config,
    ConfigError,
    auto_keys,
    fresh_batch_size,
    min_num_slots,
    resolve_bounded_lag,
    resolve_device,
    visible_devices,
)
from impala_gpu.config import require as _require
from impala_gpu.envs import resolve_vector_backend, validate_env_id
from impala_gpu.learning.distributed import learners_on_this_box
from impala_gpu.learning.optim import OPTIMIZERS
from impala_gpu.models import MODEL_NAMES
from impala_gpu.reporting.logger import WANDB_MODES
from impala_gpu.resources import validate_shared_memory
from impala_gpu.rl.losses import PPO_REFERENCES, correction_name
from impala_gpu.speed.precision import PRECISIONS
from impala_gpu.validate_inputs import validate_inputs, validate_runtime
from impala_gpu.validate_sizes import validate_env_counts, validate_memory

ALGO_NAMES = ("impala", "impala_nocorrection", "a2c", "a3c")  # algos.registry's names


def check_values(cfg: Config) -> None:
    """``auto`` or a valid value for each of ``AUTO_KEYS``, else a ConfigError naming the fix."""
    if cfg.precision != AUTO and cfg.precision not in PRECISIONS:
        raise ConfigError(
            f"precision={cfg.precision!r} is not one of {(AUTO, *PRECISIONS)}. Fix: "
            "precision=auto (measured here), fp32 or bf16."
        )
    for key in ("num_actors", "envs_per_actor"):
        v = getattr(cfg, key)
        if v != AUTO and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(
                f"{key}={v!r} must be a positive integer or auto. Fix: {key}=auto or {key}=2."
            )
    lag = cfg.bounded_lag
    if lag not in (None, AUTO) and (isinstance(lag, bool) or not isinstance(lag, int) or lag < 0):
        raise ConfigError(
            f"bounded_lag={lag!r} must be an integer >= 0, auto or null. Fix: bounded_lag=auto "
            "(the least exact lag at which no actor waits), or bounded_lag=null (off)."
        )


def validate_replay(cfg: Config) -> None:
    p, capacity = cfg.replay.proportion, cfg.replay.capacity
    _require(
        0.0 <= p < 1.0,
        f"replay.proportion={p} must be in [0, 1): the fraction of each batch taken from the "
        "replay buffer. Fix: replay.proportion=0 (off) or e.g. 0.5 (the paper's).",
    )
    if p > 0:
        _require(
            capacity >= 1,
            f"replay.capacity={capacity} must be >= 1 trajectories. Fix: replay.capacity=1000.",
        )
        _require(
            fresh_batch_size(cfg) >= 1,
            f"replay.proportion={p} with batch_size={cfg.batch_size} leaves no fresh trajectory "
            "in a batch. Fix: a lower proportion or a larger batch_size.",
        )
        _require(
            cfg.algo.name in ("impala", "impala_nocorrection"),
            f"replay.proportion={p} with algo={cfg.algo.name}: {cfg.algo.name} learns on fresh, "
            "on-policy data only (no importance weights to correct replayed data). Fix: "
            "replay.proportion=0, or algo=impala / algo=impala_nocorrection.",
        )


def validate_sample_reuse(cfg: Config) -> None:
    """``algo.epochs``, ``algo.minibatches`` and ``algo.ppo_clip``."""
    algo = cfg.algo
    for key in ("epochs", "minibatches"):
        v = getattr(algo, key)
        _require(v >= 1, f"algo.{key}={v} must be >= 1. Fix: algo.{key}=1 (no sample reuse).")
    _require(
        algo.ppo_clip >= 0,
        f"algo.ppo_clip={algo.ppo_clip} must be >= 0. Fix: algo.ppo_clip=0 (V-trace's policy "
        "gradient) or e.g. 0.1 (PPO's clipped surrogate).",
    )
    share = cfg.batch_size // max(1, cfg.learners)
    _require(
        algo.minibatches <= share,
        f"algo.minibatches={algo.minibatches} is more than the {share} trajectories each "
        f"learner gets per batch (batch_size={cfg.batch_size}, learners={cfg.learners}). Fix: "
        f"algo.minibatches<={share}, or a larger batch_size.",
    )
    _require(
        algo.ppo_reference in PPO_REFERENCES,
        f"algo.ppo_reference={algo.ppo_reference!r} is not one of {PPO_REFERENCES}. Fix: "
        "algo.ppo_reference=first_visit (clip against the policy that first trained on the "
        "trajectory), target (against a copy of the learner refreshed every "
        "algo.target_interval updates) or behavior (against the actor's policy).",
    )
    _require(
        isinstance(algo.target_interval, int) and algo.target_interval >= 1,
        f"algo.target_interval={algo.target_interval!r} must be an integer >= 1 (updates "
        "between refreshes of ppo_reference=target's copy). Fix: algo.target_interval=1.",
    )
    if algo.behavior_clip is not None:
        _require(
            algo.behavior_clip > 0 and algo.ppo_clip > 0 and algo.ppo_reference != "behavior",
            f"algo.behavior_clip={algo.behavior_clip} with ppo_clip={algo.ppo_clip}, "
            f"ppo_reference={algo.ppo_reference}: it bounds pi/mu beside a clip anchored at the "
            "learner's own logits, so it needs a bound > 0, ppo_clip > 0 and ppo_reference="
            "first_visit or target (with the behavior reference, ppo_clip already bounds pi/mu). "
            "Fix: algo.behavior_clip=null, or e.g. algo.behavior_clip=0.5 algo.ppo_clip=0.1 "
            "algo.ppo_reference=first_visit.",
        )
    if algo.epochs > 1 or algo.minibatches > 1:
        _require(
            algo.name in ("impala", "impala_nocorrection"),
            f"algo.epochs={algo.epochs}, algo.minibatches={algo.minibatches} with "
            f"algo={algo.name}: sample reuse is IMPALA's (A2C's barrier and A3C's workers "
            "take one step per rollout). Fix: algo.epochs=1 algo.minibatches=1, or algo=impala.",
        )


def validate_learners(cfg: Config) -> None:
    """``learners=N``: data-parallel learners, each on its share of every batch."""
    n = cfg.learners
    _require(n >= 1, f"learners={n} must be >= 1. Fix: learners=1 (one learner process).")
    local, key = learners_on_this_box(cfg)  # learners, or torchrun's processes per node
    if local > 1 and resolve_device(cfg.device).type == "cuda":
        # learning.distributed puts rank r on GPU r % device_count and joins with NCCL (the
        # backend on CUDA), which cannot run two ranks on one GPU: the first collective fails.
        gpus = torch.cuda.device_count()
        _require(
            local <= gpus,
            f"{key} on device={cfg.device}: every learner is an NCCL rank that needs a GPU of "
            f"its own, and this machine has {gpus} visible ({visible_devices()}). Fix: "
            f"{'learners' if key.startswith('learners') else '--nproc-per-node'}={gpus}, or "
            "device=cpu (the gloo backend: the learners share the CPU).",
        )
    if n == 1:
        return
    _require(
        cfg.algo.name in ("impala", "impala_nocorrection"),
        f"learners={n} with algo={cfg.algo.name}: only IMPALA's learner is data-parallel. Fix: "
        "learners=1, or algo=impala.",
    )
    _require(
        cfg.batch_size % n == 0,
        f"batch_size={cfg.batch_size} does not split into learners={n} equal shares. Fix: "
        f"batch_size={max(1, cfg.batch_size // n) * n} (a multiple of learners).",
    )
    _require(
        cfg.learner_timeout_s > 0,
        f"learner_timeout_s={cfg.learner_timeout_s} must be > 0. Fix: learner_timeout_s=300.",
    )


def validate_learner_shards(cfg: Config) -> None:
    """``learner_shards=N``: each SGD step split by trajectory over N threads of a CPU learner."""
    n = cfg.learner_shards
    _require(n >= 1, f"learner_shards={n} must be >= 1. Fix: learner_shards=1 (no split).")
    if n == 1:
        return
    _require(
        cfg.algo.name != "a3c",
        f"learner_shards={n} with algo=a3c: A3C's workers each learn on one thread and have "
        "no central learner to split. Fix: learner_shards=1, or algo=impala.",
    )
    _require(
        cfg.learners == 1,
        f"learner_shards={n} with learners={cfg.learners}: choose one way to split the batch. "
        "Fix: learner_shards=1 (data-parallel processes), or learners=1 (threads).",
    )
    _require(
        cfg.learner_threads in (0, 1),
        f"learner_shards={n} with learner_threads={cfg.learner_threads}: each shard runs on one "
        f"torch thread, so the learner uses {n} threads. Fix: learner_threads=0, or "
        "learner_shards=1 to split each kernel over learner_threads threads instead.",
    )
    _require(
        resolve_device(cfg.device).type == "cpu",
        f"learner_shards={n} on device={cfg.device}: a GPU learner launches kernels and has "
        "no cores to share. Fix: learner_shards=1 (or device=cpu).",
    )
    per_step = cfg.batch_size // cfg.algo.minibatches
    _require(
        n <= per_step,
        f"learner_shards={n} is more than the {per_step} trajectories of each SGD step "
        f"(batch_size={cfg.batch_size} / algo.minibatches={cfg.algo.minibatches}). Fix: "
        f"learner_shards<={per_step}.",
    )


def validate_model_for_env(cfg: Config) -> None:
    """A CNN on a vector env is most often the Atari recipe (the default env's, or a Pong
    preset's) kept under env.id=CartPole-v1: say which env group brings the right recipe."""
    kind = validate_env_id(cfg.env.id)
    fix = (
        "Fix: env=cartpole or env=lunarlander, without a preset (each brings its family's "
        "recipe, conf/recipe/; env.id=... on top changes the task)"
    )
    _require(
        kind != "classic" or cfg.model.name not in ("shallow", "resnet", "minatar"),
        f"model.name={cfg.model.name} needs image observations, and env.id={cfg.env.id} has "
        f"vectors: env.id alone, or a preset, keeps the recipe it came with. {fix}, or "
        "model=mlp.",
    )
    _require(
        cfg.model.normalize_input is False or kind != "classic",
        f"model.normalize_input=true normalises screen pixels, and env.id={cfg.env.id} has "
        f"vectors. {fix}, or model.normalize_input=false.",
    )


def _finite(v: float) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def validate_numbers(cfg: Config) -> None:
    """The scalar hyperparameters and budgets no run can use (a negative learning rate, a
    discount above 1, an unknown W&B mode): none depends on ``auto``."""
    algo = cfg.algo
    _require(
        _finite(algo.learning_rate) and algo.learning_rate > 0,
        f"algo.learning_rate={algo.learning_rate} must be a finite number > 0. Fix: e.g. "
        "algo.learning_rate=6e-4 (the default).",
    )
    _require(
        _finite(algo.discount) and 0.0 <= algo.discount <= 1.0,
        f"algo.discount={algo.discount} must be in [0, 1]. Fix: e.g. algo.discount=0.99.",
    )
    for key in ("entropy_cost", "baseline_cost", "grad_norm_clip"):
        v = getattr(algo, key)
        _require(
            _finite(v) and v >= 0,
            f"algo.{key}={v} must be a finite number >= 0. Fix: algo.{key}=0 (off) or its "
            "default (impala_gpu/config/schema.py).",
        )
    _require(
        cfg.wandb.mode in WANDB_MODES,
        f"wandb.mode={cfg.wandb.mode!r} is not one of {WANDB_MODES}. Fix: wandb.mode=offline "
        "(the default), online or disabled.",
    )
    for key in ("max_seconds", "auto_trial_s"):
        v = getattr(cfg, key)
        _require(_finite(v) and v >= 0, f"{key}={v} must be >= 0. Fix: {key}=0 (off).")
    _require(
        _finite(cfg.log_interval_s) and cfg.log_interval_s > 0,
        f"log_interval_s={cfg.log_interval_s} must be > 0. Fix: log_interval_s=5 (the default).",
    )


def _whole_unrolls_fix(cfg: Config, fresh: int) -> str:
    """bounded_lag's fix: a batch_size that is a multiple of envs_per_actor when one near the
    given size exists; when envs_per_actor is larger than the batch, fewer envs (a batch of
    100000 trajectories was once offered for envs_per_actor=100000)."""
    envs = cfg.envs_per_actor
    if envs > fresh:
        return f"envs_per_actor={fresh} (or a divisor of {fresh}), or bounded_lag=null"
    return (
        f"batch_size={max(1, cfg.batch_size // envs) * envs} (with replay: a batch_size whose "
        f"fresh part is a multiple of {envs})"
    )


def require_resolved(cfg: Config) -> None:
    """No ``auto`` left in ``cfg``: what a train function needs before it builds anything."""
    check_values(cfg)
    unresolved = auto_keys(cfg) + (["bounded_lag"] if cfg.bounded_lag == AUTO else [])
    if unresolved:
        raise ConfigError(
            f"{unresolved[0]}=auto reached the runtime unresolved. Fix: set "
            f"{' '.join(f'{k}=...' for k in unresolved)} by hand, or resolve auto first, as the "
            "CLI does: impala_gpu.calibration.resolve_auto(cfg, algorithm(cfg.algo.name)) "
            "(algorithm: impala_gpu.algos.registry)."
        )


def validate_fixed(cfg: Config) -> None:
    """The checks of keys that neither ``auto`` nor an algorithm's run config changes (none of
    ``RESOLVED_KEYS``): their verdict holds for the config that finally runs."""
    _require(
        cfg.algo.name in ALGO_NAMES,
        f"algo.name={cfg.algo.name!r} is not one of {ALGO_NAMES}. Fix: algo=impala (or "
        "another of those).",
    )
    try:  # the env module's own ValueErrors (they name env.id and the fix): as ConfigErrors,
        # so the checks before Hydra's run dir and the sweep's first point stop on them too
        validate_env_id(cfg.env.id)
        resolve_vector_backend(cfg.env)
    except ConfigError:
        raise
    except (ValueError, ImportError) as e:  # ImportError: an optional extra not installed
        raise ConfigError(str(e)) from None
    for key in ("unroll_length", "total_frames"):
        v = getattr(cfg, key)
        _require(v > 0, f"{key}={v} must be positive. Fix: {key}=<a positive integer>.")
    v = cfg.publish_interval
    _require(v >= 1, f"publish_interval={v} must be >= 1. Fix: publish_interval=1 (every update).")
    validate_inputs(cfg)  # seed, env.*, model.*, the rest of algo.* and the run's keys
    validate_numbers(cfg)
    _require(
        cfg.model.name in MODEL_NAMES,
        f"model.name={cfg.model.name!r} is not one of {MODEL_NAMES}. Fix: model=auto.",
    )
    validate_model_for_env(cfg)
    algo = cfg.algo
    for key, value, allowed in (
        ("algo.optimizer", algo.optimizer, OPTIMIZERS),
        ("algo.lr_schedule", algo.lr_schedule, ("linear", "constant")),
        ("algo.reduction", algo.reduction, ("sum", "mean")),
    ):
        _require(
            value in allowed, f"{key}={value!r} is not one of {allowed}. Fix: {key}={allowed[0]}."
        )
    _require(
        algo.lr_decay_frames >= 0,
        f"algo.lr_decay_frames={algo.lr_decay_frames} must be >= 0. Fix: algo.lr_decay_frames=0 "
        "(decay over total_frames).",
    )
    _require(
        cfg.start_method in ("spawn", "forkserver"),
        f"start_method={cfg.start_method!r} is not spawn or forkserver. Fix: start_method=spawn.",
    )
    resolve_device(cfg.device)


def validate_num_slots(cfg: Config) -> None:
    _require(
        cfg.num_slots >= 0, f"num_slots={cfg.num_slots} must be >= 0. Fix: num_slots=0 (auto)."
    )
    if cfg.num_slots:
        need = min_num_slots(cfg)
        least = "; auto counted as 1" if AUTO in (cfg.num_actors, cfg.envs_per_actor) else ""
        _require(
            cfg.num_slots >= need,
            f"num_slots={cfg.num_slots} cannot hold batch_size={cfg.batch_size} plus one unroll "
            f"per env ({cfg.num_actors} actors x {cfg.envs_per_actor} envs{least}): that needs "
            f">= {need}. Fix: num_slots=0 (auto) or num_slots>={need}, or lower batch_size.",
        )


def validate_bounded_lag(cfg: Config) -> None:
    if resolve_bounded_lag(cfg) is None:  # off, or auto under Ray
        return
    fresh = fresh_batch_size(cfg)
    _require(
        cfg.envs_per_actor == AUTO or fresh % cfg.envs_per_actor == 0,
        f"bounded_lag needs the fresh part of each batch ({fresh} of batch_size="
        f"{cfg.batch_size}, replay.proportion={cfg.replay.proportion}) to be a multiple of "
        f"envs_per_actor ({cfg.envs_per_actor}), so each batch holds whole unrolls. Fix: "
        f"{_whole_unrolls_fix(cfg, fresh)}.",
    )
    _require(
        cfg.refresh_every == 1,
        "bounded_lag fixes each unroll's version itself; refresh_every can't be combined "
        "with it. Fix: refresh_every=1.",
    )
    _require(
        cfg.max_policy_lag == 0,
        "bounded_lag and max_policy_lag can't be combined: bounded lag never produces stale "
        "data to drop. Fix: max_policy_lag=0.",
    )


# What ``auto`` resolves (precision, num_actors, envs_per_actor) and what an algorithm derives
# from it for the config it runs (``algos.registry.Algorithm.runs``: A2C's synchronous batch).
RESOLVED_KEYS = (
    "precision",
    "num_actors",
    "envs_per_actor",
    "batch_size",
    "bounded_lag",
    "refresh_every",
    "max_policy_lag",
    "algo.correction",
)


def validate_resolved(cfg: Config, allow_auto: bool = False) -> None:
    """The checks that read one of ``RESOLVED_KEYS``: the sizes, the lag and the memory they
    take. ``allow_auto=True``: an ``auto`` count is checked at its least value (1)."""
    if allow_auto:
        check_values(cfg)
    else:
        require_resolved(cfg)
    v = cfg.batch_size
    _require(v > 0, f"batch_size={v} must be positive. Fix: batch_size=<a positive integer>.")
    validate_env_counts(cfg)  # upper bounds: before any message that derives a fix from them
    for key, least, fix in (
        ("refresh_every", 1, "1 (always fresh)"),
        ("max_policy_lag", 0, "0 (off)"),
    ):
        v = getattr(cfg, key)
        _require(v >= least, f"{key}={v} must be >= {least}. Fix: {key}={fix}.")
    validate_sample_reuse(cfg)
    try:
        correction_name(cfg.algo.correction)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    validate_num_slots(cfg)
    validate_replay(cfg)
    validate_bounded_lag(cfg)
    validate_runtime(cfg)
    validate_learners(cfg)
    validate_learner_shards(cfg)
    # Memory first: /dev/shm's size may exceed what the machine has, and its fix (the most
    # slots that fit) must fit both.
    validate_memory(cfg)  # processes, envs, ring and replay against MemAvailable
    if cfg.algo.name != "a3c":  # A3C's workers share a model, not a ring
        validate_shared_memory(cfg)


def validate_config(cfg: Config, allow_auto: bool = False) -> None:
    """Every check, each failure a ``ConfigError`` naming the key and the fix.

    ``allow_auto=True``: ``precision``, ``num_actors`` and ``envs_per_actor`` may still be
    ``auto``; what depends on them is checked at their least value (num_slots, memory) or left
    to ``validate_run_config``. The CLI runs it once, before Hydra makes the run dir (every
    point of a sweep before the first starts; a resumed run once its checkpoint is read), so an
    impossible value fails before the calibration, any process or any file.
    """
    validate_fixed(cfg)
    validate_resolved(cfg, allow_auto)


def changed_keys(a: object, b: object, prefix: str = "") -> set[str]:
    """The dotted keys whose values differ between two configs of one schema."""
    out: set[str] = set()
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(x) and dataclasses.is_dataclass(y):
            out |= changed_keys(x, y, f"{prefix}{f.name}.")
        elif x != y:
            out.add(prefix + f.name)
    return out


def validate_run_config(checked: Config, cfg: Config) -> None:
    """``cfg``, the config that runs (``auto`` resolved, the algorithm's ``runs`` applied), from
    ``checked``, which ``validate_config`` passed: its verdict stands for every key that did not
    change, so only the checks of ``RESOLVED_KEYS`` run again (none when nothing changed).
    Another changed key gets every check."""
    changed = changed_keys(checked, cfg)
    if changed - set(RESOLVED_KEYS):
        validate_config(cfg)
    elif changed:
        validate_resolved(cfg)
