"""Environment factory: Atari (ale-py) with IMPALA/DeepMind preprocessing, and classic control.

Every vector env made here uses gymnasium's NEXT_STEP autoreset: the step that ends an episode
returns the episode's true final observation, and the following step returns the next
episode's first observation (its action is ignored, its reward is 0). The actors rely on this
to bootstrap truncated episodes from the real final observation.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from impala_gpu.config import EnvCfg

CLASSIC_IDS = ("CartPole-v1", "CartPole-v0", "Acrobot-v1", "MountainCar-v0")
VECTOR_BACKENDS = ("auto", "ale", "gymnasium")


@dataclass(frozen=True)
class EnvSpec:
    """What the rest of the system needs to know about an env, without holding one open."""

    id: str
    kind: str  # "atari" | "classic"
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int
    frames_per_step: int  # emulator frames per agent step (frame accounting)


def _register_ale() -> None:
    import ale_py

    gym.register_envs(ale_py)


def atari_ids() -> list[str]:
    """The ALE ``*-v5`` ids registered in gymnasium (``ALE/Pong-v5``, ...)."""
    _register_ale()
    return sorted(k for k in gym.registry if k.startswith("ALE/") and k.endswith("-v5"))


def _is_atari_id(env_id: str) -> bool:
    return env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4")


def _unknown_env_error(env_id: str) -> ValueError:
    valid = list(CLASSIC_IDS) + atari_ids()
    close = difflib.get_close_matches(env_id, valid, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    atari = [i.removeprefix("ALE/").removesuffix("-v5") for i in atari_ids()]
    return ValueError(
        f"Unknown env id {env_id!r} (config key env.id).{hint}\n"
        f"Valid ids: {', '.join(CLASSIC_IDS)}, and ALE/<Game>-v5 for any ALE game: "
        f"{', '.join(atari)}.\n"
        "Fix: pick a preset (env=pong, env=breakout, env=cartpole) or set env.id=ALE/<Game>-v5."
    )


def validate_env_id(env_id: str) -> str:
    """Return the kind of ``env_id`` ("atari" or "classic"); raise a clear error if unknown."""
    if env_id in CLASSIC_IDS:
        return "classic"
    if _is_atari_id(env_id):
        _register_ale()
        if env_id in gym.registry:
            return "atari"
    raise _unknown_env_error(env_id)


def ale_game_name(env_id: str) -> str:
    """``ALE/MontezumaRevenge-v5`` -> ``montezuma_revenge``: the ROM name of ale-py's vector env.

    Read from the gymnasium registration (CamelCase does not invert: ``TicTacToe3D``)."""
    _register_ale()
    game = gym.spec(env_id).kwargs.get("game")
    if game is None:
        raise ValueError(f"env.id={env_id!r} is not an ALE game.")
    return game


def make_env(cfg: EnvCfg, seed: int | None = None, render_mode: str | None = None) -> gym.Env:
    """One env with the full preprocessing. Atari observations: uint8 ``[stack, 84, 84]``.

    Rewards are raw (unclipped): clipping happens where data enters the learner's ring, so that
    reported episode returns are the game's real score.
    """
    kind = validate_env_id(cfg.id)
    if kind == "classic":
        kwargs = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
        env = gym.make(cfg.id, render_mode=render_mode, **kwargs)
    else:
        env = gym.make(
            cfg.id,
            frameskip=1,  # AtariPreprocessing does the skipping (with max-pooling)
            repeat_action_probability=cfg.repeat_action_probability,
            full_action_space=cfg.full_action_space,
            max_num_frames_per_episode=cfg.max_episode_frames,
            render_mode=render_mode,
        )
        env = gym.wrappers.AtariPreprocessing(
            env,
            noop_max=cfg.noop_max,
            frame_skip=cfg.frame_skip,
            screen_size=cfg.screen_size,
            terminal_on_life_loss=cfg.episodic_life,
            grayscale_obs=True,
            scale_obs=False,
        )
        env = gym.wrappers.FrameStackObservation(env, stack_size=cfg.frame_stack)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def resolve_vector_backend(cfg: EnvCfg) -> str:
    if cfg.vector_backend not in VECTOR_BACKENDS:
        raise ValueError(
            f"env.vector_backend={cfg.vector_backend!r} is not one of {VECTOR_BACKENDS}."
        )
    kind = validate_env_id(cfg.id)
    if cfg.vector_backend == "ale" and kind != "atari":
        raise ValueError(f"env.vector_backend=ale needs an Atari env, got env.id={cfg.id!r}.")
    if cfg.vector_backend == "auto":
        # ale-py's C++ vector env preprocesses and stacks in native threads: ~1.4x faster here.
        return "ale" if kind == "atari" else "gymnasium"
    return cfg.vector_backend


def make_vector_env(cfg: EnvCfg, num_envs: int, num_threads: int = 1) -> gym.vector.VectorEnv:
    """``num_envs`` envs stepped as one batch, NEXT_STEP autoreset. Seed via reset_vector_env."""
    backend = resolve_vector_backend(cfg)
    if backend == "ale":
        from ale_py import AtariVectorEnv

        return AtariVectorEnv(
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
            episodic_life=cfg.episodic_life,
            reward_clipping=False,
            repeat_action_probability=cfg.repeat_action_probability,
            full_action_space=cfg.full_action_space,
            max_num_frames_per_episode=cfg.max_episode_frames,
            autoreset_mode="NextStep",
        )
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(cfg) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )


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
    if isinstance(env, gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv):
        return env.reset(seed=[int(s) for s in seeds])
    return env.reset(seed=np.asarray(seeds, dtype=np.int64))
