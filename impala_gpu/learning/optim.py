"""RMSprop as TensorFlow defines it: the optimizer of the IMPALA paper and scalable_agent.

PyTorch's ``torch.optim.RMSprop`` differs on two counts (SB3's ``RMSpropTFLike`` and timm's
``RMSpropTF`` exist for the same reason):

- the running mean square starts at 0, so the first updates divide by ``sqrt(0.01 g^2)`` and are
  up to 10x the learning rate in every coordinate at once;
- epsilon is added outside the square root.

TensorFlow starts the mean square at 1 and adds epsilon inside the root::

    ms  <- alpha * ms + (1 - alpha) * g^2           (ms_0 = 1)
    mom <- momentum * mom + lr * g / sqrt(ms + eps)
    w   <- w - mom
"""

from __future__ import annotations

import torch
from torch import nn
from torch.optim import Optimizer

from impala_gpu.config import AlgoCfg, Config

OPTIMIZERS = ("rmsprop", "rmsprop_tf", "adam")  # algo.optimizer


class RMSpropTF(Optimizer):
    """TensorFlow-semantics RMSprop (``tf.compat.v1.train.RMSPropOptimizer``, centered=False)."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 0.1, momentum=0.0):
        for name, v in (("lr", lr), ("alpha", alpha), ("eps", eps), ("momentum", momentum)):
            if v < 0:
                raise ValueError(f"RMSpropTF: {name} must be >= 0, got {v}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, momentum=momentum))

    def init_state(self, p: torch.Tensor, group: dict) -> dict:
        """Create ``p``'s state now (A3C shares it between processes before the first step)."""
        state = self.state[p]
        state["step"] = torch.zeros(())
        state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
        if group["momentum"] > 0:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, alpha, eps, momentum = group["lr"], group["alpha"], group["eps"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p] if self.state[p] else self.init_state(p, group)
                state["step"] += 1
                square_avg = state["square_avg"]
                square_avg.mul_(alpha).addcmul_(p.grad, p.grad, value=1 - alpha)
                step = p.grad / square_avg.add(eps).sqrt_()
                if momentum > 0:
                    buf = state["momentum_buffer"]
                    buf.mul_(momentum).add_(step, alpha=lr)
                    p.sub_(buf)
                else:
                    p.sub_(step, alpha=lr)
        return loss


# Where torch's fused Adam kernels exist.
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def make_optimizer(model: nn.Module, algo: AlgoCfg) -> torch.optim.Optimizer:
    if algo.optimizer in ("rmsprop", "rmsprop_tf"):
        rmsprop = torch.optim.RMSprop if algo.optimizer == "rmsprop" else RMSpropTF
        return rmsprop(
            model.parameters(),
            lr=algo.learning_rate,
            alpha=algo.rmsprop_alpha,
            eps=algo.rmsprop_eps,
            momentum=algo.rmsprop_momentum,
        )
    if algo.optimizer == "adam":
        device = next(model.parameters()).device
        return torch.optim.Adam(
            model.parameters(),
            lr=algo.learning_rate,
            betas=(algo.adam_beta1, algo.adam_beta2),
            eps=algo.adam_eps,
            # Fused Adam takes ``found_inf``: a non-finite step is skipped on the device,
            # without the host reading a flag (``learner.masked_step``).
            fused=device.type in FUSED_ADAM_DEVICES,
        )
    raise ValueError(f"algo.optimizer={algo.optimizer!r} is not one of {OPTIMIZERS}.")


def lr_factor(cfg: Config, frames: int) -> float:
    """The learning rate's multiplier after ``frames`` frames: linear decay to 0 over
    ``algo.lr_decay_frames`` (0: over ``total_frames``, the paper's, which ties the schedule
    to the budget), or 1 for a constant schedule."""
    if cfg.algo.lr_schedule == "constant":
        return 1.0
    if cfg.algo.lr_schedule != "linear":
        raise ValueError(
            f"algo.lr_schedule={cfg.algo.lr_schedule!r} is not 'linear' or 'constant'."
        )
    horizon = cfg.algo.lr_decay_frames or cfg.total_frames
    return max(0.0, 1.0 - frames / max(1, horizon))


def make_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: Config, frames_per_update: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``lr_factor`` per update, as a torch scheduler (its state goes into checkpoints)."""
    lr_factor(cfg, 0)  # fail early on an unknown schedule
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda update: lr_factor(cfg, update * frames_per_update)
    )
