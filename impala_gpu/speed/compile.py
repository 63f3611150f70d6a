"""``compile=true``: ``torch.compile`` of the learner's model, which keeps the plain model's
parameter names, so checkpoints load either way."""

from __future__ import annotations

import torch


def compile_model(model: torch.nn.Module, enabled: bool) -> torch.nn.Module:
    """``torch.compile`` the model's forward in place (``nn.Module.compile``), so parameter
    names, ``state_dict`` keys and checkpoints stay those of the plain model. The first updates
    are slow while it compiles (seconds on CPU)."""
    if enabled:
        model.compile(dynamic=False)
    return model
