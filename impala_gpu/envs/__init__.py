"""Environment factory: Atari (ale-py) with IMPALA/DeepMind preprocessing, and classic control.

Every vector env made here uses gymnasium's NEXT_STEP autoreset: the step that ends an episode
returns the episode's true final observation, and the following step returns the next
episode's first observation (its action is ignored, its reward is 0). The actors rely on this
to bootstrap truncated episodes from the real final observation.

Both Atari backends play the same game: ale-py's reset (FIRE for one frame in games that have
FIRE, then up to ``noop_max - 1`` no-op frames, a zero-padded frame stack) is reproduced on the
gymnasium side, and lives are handled by one vector wrapper on top of either backend
(:class:`LifeLoss`): the emulator only ever resets at game over or truncation; with
``episodic_life`` a lost life ends the *training* episode (``terminated=True``) and the next
step is real play from the same game.
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


class AleReset(gym.Wrapper):
    """ale-py's vector-env reset, on a frameskip=1 ALE env: after ``reset_game``, FIRE for one
    frame (``fire`` and the game has FIRE), then ``U{0..noop_max-1}`` no-op frames minus that
    FIRE frame, drawn from the env's seeded ``np_random``. Rewards of these frames are dropped,
    as in ale-py."""

    def __init__(self, env: gym.Env, noop_max: int, fire: bool):
        super().__init__(env)
        self.noop_max = noop_max
        meanings = env.unwrapped.get_action_meanings()
        self.fire_action = meanings.index("FIRE") if fire and "FIRE" in meanings else None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        fire = self.fire_action is not None
        noops = int(self.env.unwrapped.np_random.integers(0, max(self.noop_max, 1))) - int(fire)
        actions = ([self.fire_action] if fire else []) + [0] * noops
        for action in actions:
            obs, _, terminated, truncated, step_info = self.env.step(action)
            info.update(step_info)
            if terminated or truncated:  # game over during the no-ops
                obs, info = self.env.reset()
        return obs, info


def make_env(cfg: EnvCfg, seed: int | None = None, render_mode: str | None = None) -> gym.Env:
    """One env with the full preprocessing. Atari observations: uint8 ``[stack, 84, 84]``.

    Rewards are raw (unclipped): clipping happens where data enters the learner's ring, so that
    reported episode returns are the game's real score. An Atari env made here ends only at game
    over or truncation; ``env.episodic_life`` is applied by :func:`make_vector_env`.
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


class LifeLoss(gym.vector.VectorWrapper):
    """Lives over whole games, the same on both backends (their sub-envs end only at game over
    or truncation). Every step's info gets ``life_loss``: this step lost a life and the game
    goes on.

    ``terminate``: such a step also says ``terminated=True`` (episodic life: the learner sees
    the end of a training episode, discount 0, and masks the step out of it). The game is not
    reset: the next step is real play from the same emulator state, with its real reward, and
    starts the next training episode. Only game over or truncation resets the game (NEXT_STEP
    autoreset, reward 0, as before).

    ``fire_action``: replaces the agent's action on the step after each life loss (FIRE, which
    relaunches the ball in Breakout), like ale-py's FIRE on reset. Set it only where that step
    is not trained on: with ``terminate`` (the step leaves a terminal observation, so the loss
    masks it and the replaced action never counts) or in evaluation of such a policy.
    """

    def __init__(self, env: gym.vector.VectorEnv, terminate: bool, fire_action: int | None):
        super().__init__(env)
        self.terminate, self.fire_action = terminate, fire_action
        self._lives = np.zeros(env.num_envs, dtype=np.int64)
        self._fire = np.zeros(env.num_envs, dtype=bool)

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._lives = np.asarray(info["lives"], dtype=np.int64).copy()
        self._fire[:] = False
        info["life_loss"] = np.zeros(self.num_envs, dtype=bool)
        return obs, info

    def step(self, actions):
        actions = np.asarray(actions)
        if self._fire.any():
            actions = np.where(self._fire, self.fire_action, actions).astype(actions.dtype)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        lives = np.asarray(info["lives"], dtype=np.int64)
        # A reset step (after game over or truncation) only ever raises the lives.
        life_loss = (lives < self._lives) & ~terminated & ~truncated
        self._lives = lives.copy()
        if self.fire_action is not None:
            self._fire = life_loss
        if self.terminate:
            terminated = terminated | life_loss
        info["life_loss"] = life_loss
        return obs, reward, terminated, truncated, info


def _fire_action(env: gym.vector.VectorEnv) -> int | None:
    """Index of FIRE in the env's action set, or None if the game has no FIRE."""
    base = env.unwrapped
    if isinstance(base, gym.vector.SyncVectorEnv):
        meanings = base.envs[0].unwrapped.get_action_meanings()
        return meanings.index("FIRE") if "FIRE" in meanings else None
    from ale_py import Action

    actions = list(base.ale.get_action_set())
    return actions.index(Action.FIRE) if Action.FIRE in actions else None


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
