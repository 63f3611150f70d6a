"""Network health: is the policy network still alive, and does it still look at the screen?

Three signals, measured by the learner each log interval (``reporting.health_watch`` judges
them and warns):

- ``dead/<layer>``: the fraction of a ReLU layer's units that are zero for every state of a
  sample of the current batch. A dead unit passes no gradient to its inputs, so it stays dead;
  on near-constant Atari frames whole layers die within the first updates.
- ``logit_spread``: how much the policy's logits vary across those states (per-state centred
  logits, standard deviation over states, mean over actions). Near 0, the policy plays the same
  way whatever is on the screen, whatever the loss says.
- ``grad_norm/<layer>``: the L2 norm of each layer's gradient (weights and bias, before
  clipping), averaged over the updates of the interval. A layer whose gradient has vanished has
  stopped learning.

Layers are named as a reader would name them: ``conv1..3`` and ``fc`` for the Nature CNN,
``s<i>.conv`` / ``s<i>.b<j>.conv<k>`` for the IMPALA ResNet, ``fc<i>`` for the MLP, and
``lstm``, ``policy``, ``value``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Layer:
    """One named layer: its parameters' module, and the activation that follows it (if its
    output passes through a ReLU of its own; None for heads, residual outputs, tanh)."""

    name: str
    module: nn.Module
    activation: nn.Module | None


def named_layers(policy: nn.Module) -> list[Layer]:
    """The policy's layers in forward order (see the module docstring for the names)."""
    layers = list(policy.torso.health_layers())
    if policy.lstm is not None:
        layers.append(Layer("lstm", policy.lstm, None))
    layers += [Layer("policy", policy.policy_head, None), Layer("value", policy.value_head, None)]
    return layers


def grad_groups(policy: nn.Module) -> tuple[list[str], list[list[nn.Parameter]]]:
    """Names and parameter lists of every layer, for :func:`layer_grad_norms`."""
    layers = named_layers(policy)
    return [f"grad_norm/{la.name}" for la in layers], [
        list(la.module.parameters()) for la in layers
    ]


def layer_grad_norms(groups: list[list[nn.Parameter]]) -> Tensor:
    """L2 norm of each group's gradients, ``[len(groups)]`` (0 for a group with no grad)."""
    norms = []
    for params in groups:
        grads = [p.grad.detach().float() for p in params if p.grad is not None]
        if grads:
            norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
        else:
            norms.append(torch.zeros(()))
    return torch.stack([n.to(norms[0].device) for n in norms])


def dead_fraction(activations: Tensor) -> float:
    """Fraction of units never positive across a batch. ``activations [N, *unit_shape]``: every
    entry of ``unit_shape`` (a channel at one position, or one fc unit) is a unit."""
    alive = (activations > 0).flatten(1).any(dim=0)
    return 1.0 - alive.float().mean().item()


def logit_spread(logits: Tensor) -> float:
    """How much the policy depends on the state. ``logits [N, A]`` over N states -> the
    standard deviation over states of the per-state centred logits, averaged over actions.
    0 means the same action distribution in every state."""
    if logits.shape[0] < 2:
        return float("nan")
    centred = logits.float() - logits.float().mean(dim=-1, keepdim=True)
    return centred.std(dim=0).mean().item()


@torch.no_grad()
def measure(
    policy: nn.Module,
    obs: Tensor,
    first: Tensor,
    core_state: tuple[Tensor, ...] = (),
    max_states: int = 256,
) -> dict[str, float]:
    """Dead fractions and logit spread on up to ``max_states`` states of a time-major batch.

    ``obs [T, B, ...]``, ``first [T, B]``, ``core_state`` as the policy's (each ``[B, H]``).
    Whole columns (envs) are taken so that an LSTM core sees its sequences in order.
    """
    T, B = obs.shape[:2]
    b = max(1, min(B, max_states // T))
    captured: dict[str, Tensor] = {}
    hooks = []
    for layer in named_layers(policy):
        if layer.activation is not None:
            hooks.append(layer.activation.register_forward_hook(_capture(layer.name, captured)))
    was_training = policy.training
    policy.eval()
    try:
        out = policy(obs[:, :b], first[:, :b], tuple(s[:b] for s in core_state))
    finally:
        for h in hooks:
            h.remove()
        policy.train(was_training)
    result = {f"dead/{name}": dead_fraction(a) for name, a in captured.items()}
    result["logit_spread"] = logit_spread(out.logits.reshape(T * b, -1))
    return result


def _capture(name: str, into: dict[str, Tensor]):
    def hook(_module, _inputs, output):
        into[name] = output.detach()

    return hook
