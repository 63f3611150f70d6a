"""``ConfigError``: what every layer raises for a value that cannot work, from a learner's
device to a resumed checkpoint, so it lives on the bottom floor beside the schema."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix. The CLI prints
    it as one line, ``impala_gpu: ConfigError: ...``, with no traceback."""


def require(ok: bool, msg: str) -> None:
    """Raise ``ConfigError(msg)`` unless ``ok``."""
    if not ok:
        raise ConfigError(msg)
