"""Single and vector envs from ``EnvCfg``, their spec, and the seeds actors derive."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from impala_gpu.config import EnvCfg
from impala_gpu.envs.ids import ale_game_name, validate_env_id
from impala_gpu.envs.wrappers import AleReset, LifeLoss, _fire_action

VECTOR_BACKENDS = ("auto", "ale", "gymnasium")


@dataclass(frozen=True)
class EnvSpec:
    """What the rest of the system needs to know about an env, without holding one open."""

    id: str
    kind: str  # "atari" | "classic" | "minatar"
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int
    frames_per_step: int  # emulator frames per agent step (frame accounting)


def make_env(cfg: EnvCfg, seed: int | None = None, render_mode: str | None = None) -> gym.Env:
    """One env with the full preprocessing. Atari observations: uint8 ``[stack, 84, 84]``.

    Rewards are raw (unclipped): clipping happens where data enters the learner's ring, so that
    reported episode returns are the game's real score. An Atari env made here ends only at game
    over or truncation; ``env.episodic_life`` is applied by :func:`make_vector_env`.
    """
    kind = validate_env_id(cfg.id)
    if kind in ("classic", "minatar"):
        kwargs = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
        env = gym.make(cfg.id, render_mode=render_mode, **kwargs)
        if kind == "minatar":
            env = channels_first_float(env)
    else:
        env = gym.make(
            cfg.id,
            frameskip=1,  # AtariPreprocessing does the skipping (with max-pooling)
            repeat_action_probability=cfg.repeat_action_probability,
            full_action_space=cfg.full_action_space,
            max_num_frames_per_episode=cfg.max_episode_frames,
            render_mode=render_mode,
        )
        env = AleReset(env, noop_max=cfg.noop_max, fire=cfg.fire_reset)
        env = gym.wrappers.AtariPreprocessing(
            env,
            noop_max=0,  # AleReset does the no-ops, as ale-py does them
            frame_skip=cfg.frame_skip,
            screen_size=cfg.screen_size,
            terminal_on_life_loss=False,  # LifeLoss, on the vector env, handles lives
            grayscale_obs=True,
            scale_obs=False,
        )
        # Zero padding on reset, like ale-py's vector env.
        env = gym.wrappers.FrameStackObservation(
            env, stack_size=cfg.frame_stack, padding_type="zero"
        )
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def channels_first_float(env: gym.Env) -> gym.Env:
    """MinAtar's ``[10, 10, C]`` bool grid as ``[C, 10, 10]`` float32 0/1 (the CNNs take
    channels first; uint8 would be scaled by 1/255 as a screen is)."""
    h, w, c = env.observation_space.shape
    space = gym.spaces.Box(0.0, 1.0, (c, h, w), np.float32)
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.ascontiguousarray(obs.transpose(2, 0, 1), dtype=np.float32), space
    )


def resolve_vector_backend(cfg: EnvCfg) -> str:
    if cfg.vector_backend not in VECTOR_BACKENDS:
        raise ValueError(
            f"env.vector_backend={cfg.vector_backend!r} is not one of {VECTOR_BACKENDS}."
        )
    kind = validate_env_id(cfg.id)
    if cfg.vector_backend == "ale" and kind != "atari":
        raise ValueError(f"env.vector_backend=ale needs an Atari env, got env.id={cfg.id!r}.")
    if cfg.vector_backend == "auto":
        # ale-py's C++ vector env steps, preprocesses and stacks the frames in native threads,
        # outside the GIL and off the actor's Python loop; gymnasium's steps one env at a time.
        return "ale" if kind == "atari" else "gymnasium"
    return cfg.vector_backend


def make_vector_env(
    cfg: EnvCfg,
    num_envs: int,
    num_threads: int = 1,
    *,
    full_games: bool = False,
    render_mode: str | None = None,
    wrap_env=None,
) -> gym.vector.VectorEnv:
    """``num_envs`` envs stepped as one batch, NEXT_STEP autoreset. Seed via reset_vector_env.

    Atari envs report ``info["lives"]`` and ``info["life_loss"]`` (see :class:`LifeLoss`).
    ``full_games=True`` (evaluation) plays the training game but a life loss ends no episode.
    ``render_mode`` and ``wrap_env`` (applied to each sub-env, e.g. a video recorder) need the
    gymnasium backend: ale-py's vector env does not render.
    """
    backend = resolve_vector_backend(cfg)
    if backend == "ale":
        if render_mode is not None or wrap_env is not None:
            raise ValueError("render_mode/wrap_env need env.vector_backend=gymnasium.")
        from ale_py import AtariVectorEnv

        env = AtariVectorEnv(
            game=ale_game_name(cfg.id),
            num_envs=num_envs,
            num_threads=num_threads,
            frameskip=cfg.frame_skip,
            stack_num=cfg.frame_stack,
            img_height=cfg.screen_size,
            img_width=cfg.screen_size,
            grayscale=True,
            maxpool=True,
            noop_max=cfg.noop_max,
            # ale-py's own episodic_life resets the whole game on a life loss: LifeLoss instead.
            episodic_life=False,
            use_fire_reset=cfg.fire_reset,
            reward_clipping=False,
            repeat_action_probability=cfg.repeat_action_probability,
            full_action_space=cfg.full_action_space,
            max_num_frames_per_episode=cfg.max_episode_frames,
            autoreset_mode="NextStep",
        )
    else:

        def make_one() -> gym.Env:
            env = make_env(cfg, render_mode=render_mode)
            return wrap_env(env) if wrap_env is not None else env

        env = gym.vector.SyncVectorEnv(
            [make_one for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
    if validate_env_id(cfg.id) != "atari":
        return env
    # The episode structure is the training one either way; full games only drop the
    # life-loss terminations (FIRE after a life loss stays: the policy never learned it).
    episodic = cfg.episodic_life
    fire = _fire_action(env) if episodic and cfg.fire_reset else None
    return LifeLoss(env, terminate=episodic and not full_games, fire_action=fire)


def env_spec(cfg: EnvCfg) -> EnvSpec:
    """Shapes, dtype and action count of ``cfg``'s env (fails early on an unknown id)."""
    kind = validate_env_id(cfg.id)
    env = make_env(cfg)
    try:
        space = env.observation_space
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ValueError(
                f"env {cfg.id!r} has a non-discrete action space; IMPALA here needs Discrete."
            )
        return EnvSpec(
            id=cfg.id,
            kind=kind,
            obs_shape=tuple(space.shape),
            obs_dtype=np.dtype(space.dtype),
            num_actions=int(env.action_space.n),
            frames_per_step=cfg.frame_skip if kind == "atari" else 1,
        )
    finally:
        env.close()


def derive_seeds(run_seed: int, n: int, salt: int = 0) -> list[int]:
    """``n`` independent 31-bit seeds from ``run_seed``; SeedSequence keeps nearby seeds apart."""
    seq = np.random.SeedSequence([run_seed, salt])
    return [int(s.generate_state(1)[0] & 0x7FFFFFFF) for s in seq.spawn(n)]


def reset_vector_env(env: gym.vector.VectorEnv, seeds: list[int]) -> tuple[np.ndarray, dict]:
    """Reset every sub-env with its own seed (ale-py wants an array, gymnasium a list of ints)."""
    if isinstance(env.unwrapped, gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv):
        return env.reset(seed=[int(s) for s in seeds])
    return env.reset(seed=np.asarray(seeds, dtype=np.int64))
