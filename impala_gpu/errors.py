"""``ConfigError``, in a module of its own: ``validate`` and the checks it calls
(``validate_inputs``, ``validate_sizes``, ``overrides``) all raise it, and none of them may
import another at load time in a cycle. ``impala_gpu.validate`` re-exports it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix. The CLI prints
    it as one line, ``impala_gpu: ConfigError: ...``, with no traceback."""


def require(ok: bool, msg: str) -> None:
    """Raise ``ConfigError(msg)`` unless ``ok``."""
    if not ok:
        raise ConfigError(msg)
