"""Env ids: the Atari games ale-py registers, the classic-control ones, and typo help."""

from __future__ import annotations

import difflib

import gymnasium as gym

CLASSIC_IDS = ("CartPole-v1", "CartPole-v0", "Acrobot-v1", "MountainCar-v0")


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
