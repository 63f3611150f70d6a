"""Structured configs: one dataclass per Hydra group, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` extend these schemas, so a wrong type or an unknown key fails
with Hydra's own error naming the key (``Key 'lrr' not in 'AlgoCfg'``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class EnvCfg:
    id: str = MISSING  # gymnasium id, e.g. "ALE/Pong-v5" or "CartPole-v1"
    frame_skip: int = 4  # Atari: emulator frames per agent step (max-pooled over the last 2)
    frame_stack: int = 4  # Atari: stacked 84x84 grayscale frames per observation
    screen_size: int = 84  # Atari: square observation side
    noop_max: int = 30  # Atari: 0..noop_max-1 no-op frames on reset (ale-py's count; 0 disables)
    episodic_life: bool = False  # Atari: a life loss ends the training episode (not the game)
    fire_reset: bool = True  # Atari: press FIRE on reset (and after a life loss if episodic_life)
    clip_rewards: bool = True  # clip rewards to [-1, 1] in the learner's data (returns stay raw)
    repeat_action_probability: float = 0.0  # sticky actions; IMPALA's paper used 0
    full_action_space: bool = False  # Atari: all 18 actions instead of the minimal set
    max_episode_frames: int = 108_000  # Atari: truncate after this many emulator frames (30 min)
    max_episode_steps: int = 0  # classic control: override the registered TimeLimit (0 keeps it)
    vector_backend: str = "auto"  # auto | ale | gymnasium: who batches an actor's envs


@dataclass
class ModelCfg:
    name: str = "auto"  # auto (by observation: shallow, minatar or mlp) | shallow | resnet | mlp
    hidden_size: int = 256  # width of the torso's final layer (and of the MLP's layers)
    mlp_layers: int = 2  # mlp only: number of hidden layers
    use_lstm: bool = False  # add an LSTM core between torso and heads
    lstm_size: int = 256  # LSTM hidden size
    channels_last: bool = True  # CNNs: NHWC memory format (faster on CPU: docs/performance.md)
    init: str = "torch"  # torch (layer defaults) | orthogonal (gain sqrt2; heads 0.01, 1; bias 0)
    separate_value: bool = False  # the value head gets its own torso (SB3's MlpPolicy); no LSTM
    activation: str = "relu"  # CNN torsos: relu | elu (ELU units cannot die; rl_games' Atari nets)
    normalize_input: bool = False  # images: per-pixel running mean/std (learner-updated), clip 5


@dataclass
class AlgoCfg:
    name: str = "impala"  # impala | impala_nocorrection | a2c | a3c
    discount: float = 0.99  # gamma
    baseline_cost: float = 0.5  # weight of the value loss
    entropy_cost: float = 0.01  # weight of the entropy bonus
    clip_rho_threshold: float | None = 1.0  # rho-bar in V-trace (None: no clipping)
    clip_pg_rho_threshold: float | None = 1.0  # pg rho-bar in V-trace (None: no clipping)
    vtrace_lambda: float = 1.0  # lambda in the V-trace traces c_s = lambda * min(1, rho_s)
    correction: Any = (
        "vtrace"  # vtrace | none (no importance weights) | is1 (1-step IS: rho-weighted pg)
    )
    normalize_advantages: bool = False  # pg advantages to mean 0, std 1 per batch (PPO, SF)
    epochs: int = 1  # SGD passes over each batch (sample reuse; > 1 wants ppo_clip > 0)
    minibatches: int = 1  # each pass splits the batch's B trajectories into this many steps
    ppo_clip: float = 0.0  # > 0: PPO's clipped surrogate on pi/mu with V-trace targets (APPO)
    ppo_reference: str = "behavior"  # ppo_clip's ratio to: mu (behavior) | pi at first_visit
    # | target: IMPACT's target network, a copy of the learner refreshed every target_interval
    target_interval: int = 1  # ppo_reference=target: updates between the target's refreshes
    # With first_visit or target: no gradient from a step whose pi/mu already left
    # [1 - c, 1 + c] in its advantage's direction (a trust region around the actor's policy)
    behavior_clip: float | None = None
    reduction: str = "sum"  # sum (the paper, TorchBeast) | mean: how loss terms are reduced
    optimizer: str = "rmsprop"  # rmsprop (PyTorch's) | rmsprop_tf (TF's: the paper's) | adam
    learning_rate: float = 6e-4  # initial learning rate
    lr_schedule: str = "linear"  # linear decay to 0 over lr_decay_frames | constant
    lr_decay_frames: int = 0  # linear: frames to decay over (0: total_frames, the paper's)
    rmsprop_alpha: float = 0.99  # RMSprop smoothing constant
    rmsprop_eps: float = 0.01  # RMSprop epsilon (outside the sqrt in rmsprop, inside in _tf)
    rmsprop_momentum: float = 0.0  # RMSprop momentum
    adam_eps: float = 1e-8  # Adam epsilon
    adam_beta1: float = 0.9  # Adam beta1
    adam_beta2: float = 0.999  # Adam beta2
    grad_norm_clip: float = 40.0  # clip the global gradient norm to this (0 disables)


@dataclass
class WandbCfg:
    mode: str = "offline"  # offline | online | disabled
    project: str = "impala_gpu"  # W&B project
    entity: str | None = None  # W&B entity (team or user); None uses the default
    group: str | None = None  # W&B group; None derives it from the sweep when there is one
    job_type: str | None = None  # W&B job type; None derives it from the algo
    tags: list[str] = field(default_factory=list)  # extra W&B tags
    init_timeout: float = 30.0  # seconds before an unreachable online init falls back to offline


@dataclass
class ReplayCfg:
    proportion: float = 0.0  # fraction of each batch sampled from the replay buffer (0: off)
    capacity: int = 1000  # trajectories the FIFO buffer holds (CPU memory, learner process)


@dataclass
class CheckpointCfg:
    every_frames: int = 0  # save every N frames (0: off)
    every_minutes: float = 10.0  # save every N minutes of wall-clock (0: off)
    keep_last: int = 3  # periodic checkpoints kept (plus best.pt, the best mean return)


@dataclass
class HealthCfg:
    enabled: bool = True  # measure dead units, logit spread and per-layer grad norms each log
    max_states: int = 256  # states of the current batch the dead-unit and spread checks use
    dead_warn: float = 0.5  # warn when more than this fraction of a layer's units is dead
    min_logit_spread: float = 0.05  # warn when the logits vary less than this across states
    warmup_updates: int = 1000  # ... but only after this many updates (the init is uniform)


@dataclass
class RayCfg:
    """``runtime=ray``: actors as Ray actors, on this box or a cluster (README, "Cluster")."""

    address: str | None = None  # a running cluster ("host:port" or "auto"); None: start Ray here
    node_ip_address: str | None = None  # this driver's address on the cluster (None: Ray's pick)
    object_store_mb: int = 512  # object store cap when Ray starts here (it takes /dev/shm)
    num_cpus_per_actor: float = 1.0  # Ray CPUs each actor reserves (placement across nodes)
    inflight_per_actor: int = 2  # unroll requests queued per actor: it steps while one travels


AUTO = "auto"
AUTO_KEYS = ("precision", "num_actors", "envs_per_actor")  # what impala_gpu.calibration chooses
AUTO_TRIAL_ENV = "IMPALA_GPU_AUTO_TRIAL_S"


def auto_keys(cfg: Any) -> list[str]:
    """The ``AUTO_KEYS`` that ``cfg`` still leaves to ``auto``."""
    return [k for k in AUTO_KEYS if getattr(cfg, k) == AUTO]


def auto_trial_default() -> float:
    """``auto_trial_s``'s default: ``$IMPALA_GPU_AUTO_TRIAL_S`` (the test suite sets 0), else 8."""
    return float(os.environ.get(AUTO_TRIAL_ENV, 8.0))


@dataclass
class Config:
    env: EnvCfg = field(default_factory=EnvCfg)
    model: ModelCfg = field(default_factory=ModelCfg)
    algo: AlgoCfg = field(default_factory=AlgoCfg)
    wandb: WandbCfg = field(default_factory=WandbCfg)
    checkpoint: CheckpointCfg = field(default_factory=CheckpointCfg)
    health: HealthCfg = field(default_factory=HealthCfg)
    replay: ReplayCfg = field(default_factory=ReplayCfg)
    ray: RayCfg = field(default_factory=RayCfg)

    total_frames: int = 50_000_000  # stop after this many emulator frames (agent steps x skip)
    max_seconds: float = 0.0  # also stop after this much wall-clock time (0: no limit)
    target_return: float | None = None  # also stop once the last 100 episodes' mean reaches this
    num_actors: Any = "auto"  # actor processes (int); auto: the count this machine ran fastest
    envs_per_actor: Any = "auto"  # envs each actor steps as one batch (int); auto: 32 in all
    unroll_length: int = 20  # T: transitions per trajectory (slots hold T+1 observations)
    batch_size: int = 32  # B: trajectories per learner update
    num_slots: int = 0  # trajectory ring slots; 0 = auto (room for every env plus 2 batches)
    device: str = "auto"  # auto (cuda when present) | cpu | cuda | cuda:N
    seed: int = 0  # run seed; actors and envs derive their own seeds from it
    publish_interval: int = 1  # publish learner weights to actors every N updates
    max_policy_lag: int = 0  # drop trajectories staler than this many updates (0: keep all)
    refresh_every: int = 1  # refresh interval K: reload weights once K updates behind (lag cycles)
    # K: every sample has lag exactly K updates, deterministic (None: off); auto: the least K at
    # which no actor waits for the learner, ceil(actors x envs / batch) (config.least_bounded_lag)
    bounded_lag: Any = None
    learner_threads: int = 0  # learner torch threads; 0: auto (speed.learner_threads)
    # CPU learner: split each SGD step's minibatch into N shards run at once on N threads, one
    # torch thread each (learning.shards); 1: no split, learner_threads share every kernel
    learner_shards: int = 1
    precision: str = "auto"  # auto | fp32 | bf16 (autocast forward passes); auto: measured here
    # auto: seconds of a real run for each candidate the timings cannot tell apart (0: none);
    # once per machine and workload, cached. Default from IMPALA_GPU_AUTO_TRIAL_S, else 8.
    auto_trial_s: float = field(default_factory=lambda: auto_trial_default())
    compile: bool = False  # torch.compile the learner's model (slower first updates)
    log_interval_s: float = 5.0  # seconds between metric lines
    progress: bool = True  # live console progress line
    tensorboard: bool = True  # TensorBoard event files in the run dir (tensorboard --logdir)
    run_dir: str | None = None  # where metrics.jsonl and config.yaml go; None: Hydra's output dir
    learners: int = 1  # data-parallel learner processes (torch.distributed); each trains on B/N
    learner_timeout_s: float = 300.0  # a learner rank silent this long fails the run (N > 1)
    runtime: str = "local"  # where IMPALA's actors run: local (processes) | ray (Ray actors)
    start_method: str = "spawn"  # multiprocessing start method for actors: spawn | forkserver
    resume: str | None = None  # a run dir or checkpoint .pt to continue, in its own run dir
    max_nonfinite_updates: int = 10  # consecutive NaN/inf updates (skipped) before the run stops
    actor_timeout_s: float = 60.0  # an actor silent this long is hung (starting up: >= 120 s)
    max_actor_restarts: int = 20  # actor replacements allowed per run before it stops (crash loop)


def conf_dir() -> str:
    """Hydra's config tree (``config.yaml`` and the group folders): ``impala_gpu/conf`` in an
    installed wheel, which carries it (setup.py maps it there); else ``conf/`` beside the
    package, in a checkout or an editable install of one. The one place that looks."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(
        f"no Hydra config tree (conf/config.yaml) in {package} or beside it: a wheel built "
        "without conf/? Build it from a checkout with `pip wheel .`"
    )


def register_configs() -> None:
    """Register the schemas that ``conf/*.yaml`` extend (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(group="env", name="base_env", node=EnvCfg)
    cs.store(group="model", name="base_model", node=ModelCfg)
    cs.store(group="algo", name="base_algo", node=AlgoCfg)
    from omegaconf import OmegaConf

    # conf/config.yaml's hydra.run.dir: run_dir when given, else the dated dir under runs/.
    OmegaConf.register_new_resolver("impala_gpu.or", _first_set, replace=True)
    # The run dir's name carries the env that runs (env.id), not the env group it came from.
    OmegaConf.register_new_resolver("impala_gpu.short_env", short_env, replace=True)
    # conf/recipe/*.yaml: target_return from the env id that runs (STOP_RETURNS).
    OmegaConf.register_new_resolver("impala_gpu.stop_return", stop_return, replace=True)


# The mean return of the last 100 episodes at which an env family's recipe (conf/recipe/) stops
# a run, by env id. Keyed by the id, not the env group, so that env.id=ALE/SpaceInvaders-v5
# from env=pong does not inherit Pong's 18: an id not listed plays all of total_frames.
STOP_RETURNS: dict[str, float] = {
    "CartPole-v1": 475.0,  # gymnasium's reward_threshold (solved)
    "LunarLander-v3": 200.0,  # gymnasium's reward_threshold (solved)
    "ALE/Pong-v5": 18.0,  # a trained agent (21 is perfect): docs/results/pong.md
    "ALE/Breakout-v5": 100.0,  # experiment=breakout_impala's target: docs/results/breakout.md
}


def stop_return(env_id: str) -> float | None:
    """``STOP_RETURNS[env_id]``, None (no target) for an id not listed."""
    return STOP_RETURNS.get(env_id)


def short_env(env_id: str) -> str:
    """A short name for a gymnasium id: ``ALE/Pong-v5`` -> ``pong``, ``CartPole-v1`` ->
    ``cartpole``, ``MinAtar/Breakout-v1`` -> ``minatar_breakout`` (ALE is implied)."""
    namespace, _, name = env_id.rpartition("/")
    name = re.sub(r"-v\d+$", "", name).lower()
    return name if namespace in ("", "ALE") else f"{namespace.lower()}_{name}"


def _first_set(value: Any, default: Any) -> Any:
    """``value`` unless it is unset (None or empty), else ``default``."""
    return default if value in (None, "") else value


def to_container(cfg: Any) -> dict[str, Any]:
    """Resolved plain-dict view of a config (DictConfig or dataclass)."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.structured(cfg)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def save_config(cfg: Any, run_dir: str | Path) -> Path:
    """Write the resolved config beside the run's metrics (``run_dir/config.yaml``)."""
    from omegaconf import OmegaConf

    path = Path(run_dir) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    node = cfg if OmegaConf.is_config(cfg) else OmegaConf.structured(cfg)
    path.write_text(OmegaConf.to_yaml(node, resolve=True))
    return path


def fresh_batch_size(cfg: Config) -> int:
    """Trajectories per batch that come fresh from the actors (the rest are replayed): what
    an update consumes of the frame budget."""
    return cfg.batch_size - round(cfg.replay.proportion * cfg.batch_size)


def steps_per_update(cfg: Config) -> int:
    """New agent steps in one update of the central learner (IMPALA, A2C): T steps of each
    fresh trajectory (replayed steps were counted when they were fresh)."""
    return fresh_batch_size(cfg) * cfg.unroll_length


def frames_per_update(cfg: Config, frames_per_step: int) -> int:
    """Emulator frames in one update of the central learner (``steps_per_update`` times the
    env's ``frames_per_step``): what an update takes of ``total_frames`` and of the learning
    rate's decay."""
    return steps_per_update(cfg) * frames_per_step
