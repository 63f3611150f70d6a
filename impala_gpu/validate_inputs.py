"""The checks ``validate`` did not have room for: the env's sizes, the seed, the model's and
the remaining scalar keys; and two checks of a command before Hydra makes its run dir: that
``run_dir`` can be written, and that ``resume`` names a checkpoint.

Each failure is a one-line ``ConfigError`` naming the key and the fix: before these checks,
``seed=-1`` and ``env.frame_skip=0`` failed with a traceback after the run dir existed.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from impala_gpu.config import AUTO, Config, ConfigError, require

# derive_seeds feeds the seed to numpy's SeedSequence (no negative numbers) and the algorithms
# to torch.manual_seed; 32 bits is the range every seeding API in the stack takes.
MAX_SEED = 2**32 - 1
# The Nature CNN (model=shallow) shrinks a side by 8/4, 4/2 and 3/1: below 36 pixels its last
# convolution has nothing left (models.policy.SMALL_GRID, where model=auto picks MinAtar's).
SHALLOW_MIN_SCREEN = 36
MIN_SCREEN = 3  # MinAtar's torso, model=auto's choice below 36: one 3x3 convolution


def _number(v: object) -> bool:
    """A finite int or float, not a bool (OmegaConf keeps a float field's value a float, but a
    Config built in Python may hold anything)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _at_least(key: str, v: object, least: float, fix: str) -> None:
    require(_number(v) and v >= least, f"{key}={v} must be >= {least:g}. Fix: {fix}.")


def validate_seed(cfg: Config) -> None:
    require(
        isinstance(cfg.seed, int) and 0 <= cfg.seed <= MAX_SEED,
        f"seed={cfg.seed} must be an integer in [0, {MAX_SEED}] (numpy's SeedSequence derives "
        "every actor's and env's seed from it, and takes no negative number). Fix: seed=0, or "
        "any other in that range.",
    )


def validate_env_keys(cfg: Config) -> None:
    """The env's sizes (``env.*``): each would otherwise fail inside the first env, after the
    run dir exists (``env.frame_skip=0``: ale-py's ValueError, with a traceback)."""
    env = cfg.env
    for key, least, default in (
        ("frame_skip", 1, 4),
        ("frame_stack", 1, 4),
        ("noop_max", 0, 30),
        ("max_episode_frames", 0, 108_000),
        ("max_episode_steps", 0, 0),
    ):
        v = getattr(env, key)
        _at_least(f"env.{key}", v, least, f"env.{key}={default} (the default)")
    least = SHALLOW_MIN_SCREEN if cfg.model.name == "shallow" else MIN_SCREEN
    why = " for model.name=shallow (the Nature CNN)" if least == SHALLOW_MIN_SCREEN else ""
    require(
        _number(env.screen_size) and env.screen_size >= least,
        f"env.screen_size={env.screen_size} must be >= {least}{why}. Fix: env.screen_size=84 "
        "(the default).",
    )
    p = env.repeat_action_probability
    require(
        _number(p) and 0.0 <= p <= 1.0,
        f"env.repeat_action_probability={p} must be a probability in [0, 1]. Fix: "
        "env.repeat_action_probability=0 (the IMPALA paper's) or 0.25 (ALE v5's sticky actions).",
    )


def validate_model_keys(cfg: Config) -> None:
    """The model's sizes and choices, before the shared-memory check builds the model (whose
    own errors would reach the user without a fix)."""
    from impala_gpu.models.policy import INIT_SCHEMES
    from impala_gpu.models.torsos import ACTIVATIONS

    model = cfg.model
    for key, default in (("hidden_size", 256), ("mlp_layers", 2), ("lstm_size", 256)):
        v = getattr(model, key)
        _at_least(f"model.{key}", v, 1, f"model.{key}={default} (the default)")
    require(
        model.init in INIT_SCHEMES,
        f"model.init={model.init!r} is not one of {INIT_SCHEMES}. Fix: model.init=torch (the "
        "layers' defaults) or model.init=orthogonal.",
    )
    require(
        model.activation in ACTIVATIONS,
        f"model.activation={model.activation!r} is not one of {tuple(ACTIVATIONS)}. Fix: "
        "model.activation=relu (the default) or elu.",
    )


def validate_algo_extras(cfg: Config) -> None:
    """V-trace's and the optimizers' constants that ``validate.validate_numbers`` leaves."""
    algo = cfg.algo
    for key in ("clip_rho_threshold", "clip_pg_rho_threshold"):
        v = getattr(algo, key)
        require(
            v is None or (_number(v) and v > 0),
            f"algo.{key}={v} must be > 0, or null (no clipping). Fix: algo.{key}=1.0 (the "
            "paper's).",
        )
    for key, default in (
        ("vtrace_lambda", "1.0"),
        ("rmsprop_alpha", "0.99"),
        ("rmsprop_momentum", "0"),
        ("adam_beta1", "0.9"),
        ("adam_beta2", "0.999"),
    ):
        v = getattr(algo, key)
        high = 1.0 if key == "vtrace_lambda" else 1.0 - 1e-12  # a beta of 1 never forgets
        require(
            _number(v) and 0.0 <= v <= high,
            f"algo.{key}={v} must be in [0, 1{']' if key == 'vtrace_lambda' else ')'}. Fix: "
            f"algo.{key}={default} (the default).",
        )
    for key, default in (("rmsprop_eps", "0.01"), ("adam_eps", "1e-8")):
        v = getattr(algo, key)
        require(
            _number(v) and v > 0,
            f"algo.{key}={v} must be > 0 (it keeps a division finite). Fix: algo.{key}="
            f"{default} (the default).",
        )


def validate_run_keys(cfg: Config) -> None:
    """The run's budgets, timeouts and reporting keys."""
    require(
        cfg.algo.name != "a3c" or cfg.device in ("auto", "cpu"),
        f"device={cfg.device}, but A3C is Hogwild on CPU: every worker updates one shared CPU "
        "model without a lock. Fix: device=cpu (or auto).",
    )  # algos.a3c.train says so too, but only once the run dir exists
    require(
        cfg.target_return is None or _number(cfg.target_return),
        f"target_return={cfg.target_return} must be a finite number or null (no target). "
        "Fix: target_return=null.",
    )
    for key, least, fix in (
        ("learner_threads", 0, "learner_threads=0 (auto)"),
        ("max_nonfinite_updates", 1, "max_nonfinite_updates=10 (the default)"),
        ("max_actor_restarts", 0, "max_actor_restarts=20 (the default)"),
        ("checkpoint.every_frames", 0, "checkpoint.every_frames=0 (off)"),
        ("checkpoint.every_minutes", 0, "checkpoint.every_minutes=10 (the default; 0: off)"),
        ("checkpoint.keep_last", 1, "checkpoint.keep_last=3 (the default)"),
        ("health.max_states", 1, "health.max_states=256 (the default)"),
        ("health.warmup_updates", 0, "health.warmup_updates=1000 (the default)"),
    ):
        owner, _, name = key.rpartition(".")
        v = getattr(getattr(cfg, owner) if owner else cfg, name)
        _at_least(key, v, least, fix)
    for key, fix in (
        ("actor_timeout_s", "actor_timeout_s=60 (the default)"),
        ("wandb.init_timeout", "wandb.init_timeout=30 (the default)"),
    ):
        owner, _, name = key.rpartition(".")
        v = getattr(getattr(cfg, owner) if owner else cfg, name)
        require(_number(v) and v > 0, f"{key}={v} must be > 0 seconds. Fix: {fix}.")


def validate_runtime(cfg: Config) -> None:
    """``runtime`` and its ``ray.*`` keys."""
    require(
        cfg.runtime in ("local", "ray"),
        f"runtime={cfg.runtime!r} is not one of ('local', 'ray'). Fix: runtime=local (actor "
        "processes on this box) or runtime=ray (Ray actors, here or on a cluster).",
    )
    if cfg.runtime != "ray":
        return
    require(
        cfg.algo.name in ("impala", "impala_nocorrection"),
        f"runtime=ray with algo={cfg.algo.name}: only IMPALA's actors run on Ray. Fix: "
        "runtime=local, or algo=impala.",
    )
    require(
        cfg.bounded_lag in (None, AUTO),
        "runtime=ray can't give bounded_lag's guarantee: remote unrolls arrive in network "
        "order, not round-robin. Fix: bounded_lag=null, or runtime=local.",
    )
    ray_cfg = cfg.ray
    require(
        ray_cfg.object_store_mb >= 80,
        f"ray.object_store_mb={ray_cfg.object_store_mb}: Ray needs at least about 80 MB. Fix: "
        "ray.object_store_mb=512 (the default).",
    )
    require(
        ray_cfg.num_cpus_per_actor > 0,
        f"ray.num_cpus_per_actor={ray_cfg.num_cpus_per_actor} must be > 0. Fix: "
        "ray.num_cpus_per_actor=1.",
    )
    require(
        ray_cfg.inflight_per_actor >= 1,
        f"ray.inflight_per_actor={ray_cfg.inflight_per_actor} must be >= 1. Fix: "
        "ray.inflight_per_actor=2.",
    )
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            'runtime=ray needs Ray, which is not installed. Fix: pip install -e ".[ray]" (or '
            "pip install 'ray>=2.40'), or runtime=local."
        ) from None


def validate_inputs(cfg: Config) -> None:
    """Every check of this module that reads only the config (no file, no machine)."""
    validate_seed(cfg)
    validate_env_keys(cfg)
    validate_model_keys(cfg)
    validate_algo_extras(cfg)
    validate_run_keys(cfg)


def validate_run_dir(run_dir: str | Path, key: str = "run_dir") -> None:
    """``run_dir`` is, or can be made, a folder this process writes: tried by making (and at
    once removing) a temporary folder in it or in its nearest existing parent, because a
    permission bit does not tell (root passes ``os.access`` on ``/proc``, where mkdir fails).
    Nothing is left behind either way. ``key=""``: the default ``./runs``, set by no key."""
    path = Path(run_dir).expanduser().absolute()
    given = f"{key}={run_dir}" if key else f"run_dir (unset, so {path})"
    fix = f"Fix: {key or 'run_dir'}=<a folder you can write>, e.g. run_dir=/tmp/runs/mine" + (
        ", or leave it unset (runs/<date>/<time>_<algo>_<env>)." if key else "."
    )
    require(not path.exists() or path.is_dir(), f"{given} is a file, not a folder. {fix}")
    parent = path
    while not parent.exists():
        parent = parent.parent
    try:
        Path(tempfile.mkdtemp(prefix=".impala_gpu_check_", dir=parent)).rmdir()
    except OSError as e:
        where = "it" if parent == path else f"its parent {parent}"
        raise ConfigError(
            f"{given} is not writable: {where} does not let this process make a folder "
            f"({e.strerror or e}). {fix}"
        ) from None


def validate_resume(resume: str) -> None:
    """``resume`` names a checkpoint file, or a run dir that holds one: checked before Hydra
    makes a run dir (it used to leave one behind, with a FileNotFoundError's traceback).
    Whether the file loads is for ``load_checkpoint``, which reads it once, later."""
    from impala_gpu.reporting.checkpoint import BEST, CKPT_DIR, list_checkpoints

    path = Path(resume).expanduser()
    require(
        path.exists(),
        f"resume={resume}: no such file or folder. Fix: resume=<a run dir that has saved a "
        "checkpoint, or its .pt file>, e.g. resume=runs/<date>/<time>_<algo>_<env>.",
    )
    if path.is_file():
        return
    if list_checkpoints(path) or (path / CKPT_DIR / BEST).is_file():
        return
    ran = [n for n in ("metrics.jsonl", "config.yaml") if (path / n).is_file()]
    what = (
        f"the run dir {path} has {' and '.join(ran)} but no checkpoint: the run stopped "
        "before its first save (a kill -9, or a crash; Ctrl-C and SIGTERM save one)"
        if ran
        else f"{path} is not a run dir: it has no config.yaml, metrics.jsonl or checkpoint"
    )
    raise ConfigError(
        f"resume={resume}: {what}; looked for {CKPT_DIR}/ckpt_*.pt and {CKPT_DIR}/{BEST}. "
        "Fix: start the run again without resume= (with run_dir= a new folder), or resume= a "
        "run dir that has saved a checkpoint (checkpoint.every_minutes sets how often)."
    )


def writable_target(run_dir: str | None, hydra_run_dir: object) -> tuple[str, str]:
    """The folder a fresh run will write (the key that set it, and its path): ``run_dir``
    when given, else Hydra's ``hydra.run.dir`` when it is a plain path; else the default,
    dated under ``./runs`` (key ``""``), so the check is of ``runs``."""
    if run_dir:
        return "run_dir", run_dir
    if isinstance(hydra_run_dir, str) and hydra_run_dir and "${" not in hydra_run_dir:
        return "hydra.run.dir", hydra_run_dir
    return "", os.path.join(os.getcwd(), "runs")
