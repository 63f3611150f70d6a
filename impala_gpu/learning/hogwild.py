"""Hogwild (Recht et al. 2011) as A3C uses it: one model and one optimizer in shared memory,
stepped by several processes without a lock.

``make_shared_optimizer`` creates ``learner.make_optimizer``'s optimizer with its statistics
already in shared memory, so every process reads and updates the same running averages (the
paper's shared RMSprop); ``HogwildStep`` is the optimizer a worker's ``Learner.update`` steps;
``cloned`` and ``load_shared_optimizer_state`` take the shared state to and from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from impala_gpu.config import AlgoCfg, ConfigError
from impala_gpu.learning.optim import RMSpropTF, make_optimizer

# Per-parameter state tensors torch's own lazy init would create (besides "step").
_STATE_BUFFERS: dict[type, Callable[[dict], list[str]]] = {
    torch.optim.RMSprop: lambda g: (
        ["square_avg"]
        + (["momentum_buffer"] if g["momentum"] > 0 else [])
        + (["grad_avg"] if g["centered"] else [])
    ),
    torch.optim.Adam: lambda g: (
        ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if g["amsgrad"] else [])
    ),
}


def make_shared_optimizer(model: nn.Module, algo: AlgoCfg) -> torch.optim.Optimizer:
    """``make_optimizer``'s RMSprop/Adam with its statistics created now, in shared memory.

    torch creates optimizer state lazily on the first ``step``, which would give each worker a
    private copy. Created here (before the workers are spawned, which pickle the optimizer by
    shared-memory handle) every worker reads and updates the same running averages and the same
    ``step`` count, as in the paper's shared RMSprop. ``model`` must already be shared.
    """
    optimizer = make_optimizer(model, algo)
    if isinstance(optimizer, RMSpropTF):  # its square average starts at 1, not 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                for t in optimizer.init_state(p, group).values():
                    t.share_memory_()
        return optimizer
    buffers = _STATE_BUFFERS[type(optimizer)]
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            # Scalar float "step" on the CPU, like torch's own (non-capturable, non-fused) init.
            state["step"] = torch.zeros(()).share_memory_()
            for name in buffers(group):
                state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state[name].share_memory_()
    return optimizer


def load_shared_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """``optimizer.load_state_dict`` that keeps its state tensors: each saved buffer is copied
    into the shared one the workers hold, so they go on reading the same memory."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(saved["state"]) != len(params):
        raise ConfigError(
            f"the checkpoint's optimizer has state for {len(saved['state'])} parameters, this "
            f"model has {len(params)}. Fix: resume with the config the run was trained with."
        )
    for i, p in enumerate(params):
        for name, value in saved["state"][i].items():
            optimizer.state[p][name].copy_(value)
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        group.update({k: v for k, v in saved_group.items() if k != "params"})


def cloned(obj: Any) -> Any:
    """A copy of a (nested) state dict's tensors, taken now: the workers may go on writing the
    shared ones while a checkpoint is being written."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: cloned(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [cloned(v) for v in obj]
    return obj


class HogwildStep:
    """The optimizer a worker's ``Learner`` steps: ``zero_grad`` clears the local model's grads,
    ``step`` hands them to the shared model and steps the shared optimizer (no lock: Hogwild).

    Assigning ``shared.grad = local.grad`` only changes this process's view of the shared
    parameters: the gradient itself is never copied or shared.
    """

    def __init__(self, local: nn.Module, shared: nn.Module, optimizer: torch.optim.Optimizer):
        self.local, self.shared = local, shared
        self.pairs = list(zip(local.parameters(), shared.parameters(), strict=True))
        self.optimizer = optimizer
        # Model and optimizer must arrive in one pickle (one Process's args), which keeps the
        # optimizer's params the very objects we set .grad on; else its step would skip them all.
        opt_params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if opt_params != {id(p) for p in shared.parameters()}:
            raise RuntimeError("the shared optimizer does not hold the shared model's parameters")

    def pull(self) -> None:
        """Copy the shared weights (and buffers) into the local model."""
        self.local.load_state_dict(self.shared.state_dict())

    def zero_grad(self, set_to_none: bool = True) -> None:
        for local, _ in self.pairs:
            local.grad = None

    def step(self) -> None:
        for local, shared in self.pairs:
            shared.grad = local.grad
        self.optimizer.step()
