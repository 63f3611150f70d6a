"""Policy networks. One interface for all of them::

    out = policy(obs_t, first_t, core_state)   # time-major
    out.logits [T, B, A], out.value [T, B], out.core_state (same structure as core_state)

``obs_t`` may be uint8 (Atari frames): the model scales it to [0, 1] itself, on its own device,
so nobody upstream converts anything. ``first_t`` [T, B] bool marks the first observation of an
episode; the LSTM core (when enabled) resets its state there."""

from __future__ import annotations

from impala_gpu.models.policy import (
    INIT_SCHEMES,
    MODEL_NAMES,
    CoreState,
    Policy,
    PolicyOutput,
    build_model,
    init_weights,
    resolve_model_name,
)
from impala_gpu.models.torsos import (
    ImpalaTorso,
    InputConv,
    MinAtarTorso,
    MLPTorso,
    NatureTorso,
    ResidualBlock,
)

__all__ = [
    "CoreState",
    "MODEL_NAMES",
    "INIT_SCHEMES",
    "PolicyOutput",
    "InputConv",
    "NatureTorso",
    "ResidualBlock",
    "ImpalaTorso",
    "MinAtarTorso",
    "MLPTorso",
    "Policy",
    "init_weights",
    "resolve_model_name",
    "build_model",
]
