"""``precision=``: fp32, or bf16 autocast of the forward passes (weights, gradients and
optimizer state stay fp32)."""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "bf16")


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {PRECISIONS}.")


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` (CPU or CUDA) for precision="bf16"; nothing for "fp32".

    Only forward passes go inside it: matmuls and convolutions run in bf16, weights, gradients
    and optimizer state stay fp32, and the loss is computed from fp32 casts of the outputs.
    """
    check_precision(precision)
    if precision == "fp32":
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
