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
step is real play from the same game."""

from __future__ import annotations

from impala_gpu.envs.factory import (
    VECTOR_BACKENDS,
    EnvSpec,
    derive_seeds,
    env_spec,
    make_env,
    make_vector_env,
    reset_vector_env,
    resolve_vector_backend,
)
from impala_gpu.envs.ids import CLASSIC_IDS, ale_game_name, atari_ids, validate_env_id
from impala_gpu.envs.wrappers import AleReset, LifeLoss

__all__ = [
    "CLASSIC_IDS",
    "VECTOR_BACKENDS",
    "EnvSpec",
    "atari_ids",
    "validate_env_id",
    "ale_game_name",
    "AleReset",
    "make_env",
    "resolve_vector_backend",
    "LifeLoss",
    "make_vector_env",
    "env_spec",
    "derive_seeds",
    "reset_vector_env",
]
