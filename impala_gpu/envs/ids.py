"""Env ids: the Atari games ale-py registers, classic control, the optional extras (LunarLander
through gymnasium's box2d extra, MinAtar), and typo help."""

from __future__ import annotations

import difflib

import gymnasium as gym

CLASSIC_IDS = ("CartPole-v1", "CartPole-v0", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3")
MINATAR_GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
MINATAR_IDS = tuple(f"MinAtar/{g}-v1" for g in MINATAR_GAMES)  # v1: the minimal action set
# The ids that need an optional extra: the module they import, and how to install it.
EXTRAS = {
    "LunarLander-v3": ("Box2D", "box2d"),
    **{i: ("minatar", "minatar") for i in MINATAR_IDS},
}


def require_extra(env_id: str) -> None:
    """Import what ``env_id`` needs, or fail saying which extra installs it."""
    if env_id not in EXTRAS:
        return
    module, extra = EXTRAS[env_id]
    try:
        __import__(module)
    except ImportError as e:
        raise ModuleNotFoundError(
            f"env.id={env_id} needs the {module!r} package ({e}). Fix: pip install -e "
            f'".[{extra}]" (or bash scripts/setup.sh, which installs every extra).'
        ) from None
    if module == "minatar":
        from minatar.gym import register_envs

        if MINATAR_IDS[0] not in gym.registry:
            register_envs()


def _register_ale() -> None:
    import ale_py

    gym.register_envs(ale_py)


def atari_ids() -> list[str]:
    """The ALE ``*-v5`` ids registered in gymnasium (``ALE/Pong-v5``, ...)."""
    _register_ale()
    return sorted(k for k in gym.registry if k.startswith("ALE/") and k.endswith("-v5"))


def _is_atari_id(env_id: str) -> bool:
    return env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4")


PRESETS = "env=pong, env=breakout, env=cartpole, env=lunarlander, env=minatar_breakout"


def supported_text(atari_games: bool = False) -> str:
    """The ids this project runs, on one line; every ALE game by name when ``atari_games``
    (the id looked like an Atari one), else their count."""
    games = [i.removeprefix("ALE/").removesuffix("-v5") for i in atari_ids()]
    atari = ", ".join(games) if atari_games else f"{len(games)} games, e.g. Pong, Breakout"
    return f"{', '.join(CLASSIC_IDS + MINATAR_IDS)}, and ALE/<Game>-v5 for any ALE game ({atari})"


def unsupported_reason(env_id: str) -> str | None:
    """Why a gymnasium id this project does not run is not supported, or None when gymnasium
    has no such id. The policy is categorical (discrete actions) over a vector or an image,
    so the spaces say it; an env that does not start (a missing extra) says so instead."""
    if env_id not in gym.registry:
        return None
    spec = gym.spec(env_id)
    if "ale_py" in str(spec.entry_point):  # an ALE id in another spelling (Pong-v4)
        return "this project runs ALE games as ALE/<Game>-v5 (or <Game>NoFrameskip-v4)"
    try:
        env = gym.make(env_id)
    except Exception as e:  # a missing extra (mujoco, box2d) or a broken install
        return f"it does not start here ({type(e).__name__}: {str(e).splitlines()[0]})"
    try:
        obs, act = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(act, gym.spaces.Discrete):
        return (
            f"its actions are continuous ({act}), and the policy here is a categorical "
            "distribution over discrete actions"
        )
    if not isinstance(obs, gym.spaces.Box):
        return (
            f"its observations are discrete or structured ({obs}), and the models here take a "
            "vector (mlp) or an image (CNN)"
        )
    return "it has no preprocessing and model recipe here (not one of the ids tested)"


def _ale_v5_id(env_id: str) -> str | None:
    """``ALE/<Game>-v5`` for an ALE game registered under another spelling (``Pong-v4``,
    ``PongDeterministic-v4``), or None."""
    if env_id not in gym.registry or "ale_py" not in str(gym.spec(env_id).entry_point):
        return None
    name = env_id.split("/")[-1].split("-")[0]
    for suffix in ("NoFrameskip", "Deterministic"):
        name = name.removesuffix(suffix)
    v5 = f"ALE/{name}-v5"
    return v5 if v5 in gym.registry else None


def _unknown_env_error(env_id: str) -> ValueError:
    """One line: an unsupported gymnasium id says why; an unknown one gets "did you mean"."""
    valid = list(CLASSIC_IDS) + list(MINATAR_IDS) + atari_ids()
    reason = unsupported_reason(env_id)
    # A real but unsupported id only gets a near twin (MountainCarContinuous: MountainCar).
    scores = {
        c: difflib.SequenceMatcher(None, env_id, c).ratio()
        for c in difflib.get_close_matches(env_id, valid, n=3, cutoff=0.7 if reason else 0.5)
    }
    close = [c for c, r in scores.items() if r >= max(scores.values()) - 0.1]
    v5 = _ale_v5_id(env_id)
    close = [v5] if v5 else close
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    fix = f"env.id={close[0]}, or a preset: {PRESETS}" if close else f"a preset: {PRESETS}"
    what = (
        f"env.id={env_id} is a gymnasium env this project does not support: {reason}."
        if reason
        else f"Unknown env id {env_id!r} (config key env.id).{hint}"
    )
    return ValueError(
        f"{what} Supported: {supported_text(_is_atari_id(env_id))}. Fix: {fix}, or "
        "env.id=ALE/<Game>-v5."
    )


def validate_env_id(env_id: str) -> str:
    """Return the kind of ``env_id`` ("atari", "classic" or "minatar"); raise a clear error if
    unknown, or if the optional extra it needs is missing."""
    if env_id in CLASSIC_IDS:
        require_extra(env_id)
        return "classic"
    if env_id in MINATAR_IDS:
        require_extra(env_id)
        return "minatar"
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
