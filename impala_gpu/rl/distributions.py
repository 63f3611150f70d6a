"""Softmax policies over discrete actions: entropy and KL divergence, time-major
``[T, B, A] -> [T, B]``, in fp32 whatever the logits' precision."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["kl_divergence", "policy_entropy"]


def policy_entropy(logits_t: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax policy ``[T, B, A] -> [T, B]``, in fp32."""
    log_policy = F.log_softmax(logits_t.float(), dim=-1)
    # Clamping keeps p * log p finite (0, not NaN) for actions masked with -inf logits.
    log_policy_finite = log_policy.clamp(min=torch.finfo(log_policy.dtype).min)
    return -(log_policy.exp() * log_policy_finite).sum(dim=-1)


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(p) || softmax(q))`` ``[T, B, A] -> [T, B]``, in fp32."""
    log_p = F.log_softmax(p_logits.float(), dim=-1)
    log_q = F.log_softmax(q_logits.float(), dim=-1)
    # 0 * log 0 is 0: clamp so masked (-inf) actions give 0, not NaN.
    low = torch.finfo(log_p.dtype).min
    return (log_p.exp() * (log_p.clamp(min=low) - log_q.clamp(min=low))).sum(dim=-1)
