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


def _unknown_env_error(env_id: str) -> ValueError:
    valid = list(CLASSIC_IDS) + list(MINATAR_IDS) + atari_ids()
    close = difflib.get_close_matches(env_id, valid, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    atari = [i.removeprefix("ALE/").removesuffix("-v5") for i in atari_ids()]
    return ValueError(
        f"Unknown env id {env_id!r} (config key env.id).{hint}\n"
        f"Valid ids: {', '.join(CLASSIC_IDS + MINATAR_IDS)}, and ALE/<Game>-v5 for any ALE game: "
        f"{', '.join(atari)}.\n"
        "Fix: pick a preset (env=pong, env=breakout, env=cartpole, env=lunarlander, "
        "env=minatar_breakout) or set env.id=ALE/<Game>-v5."
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
