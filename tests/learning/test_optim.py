"""RMSprop with TensorFlow semantics, against a hand computation of its first two updates."""

from __future__ import annotations

import math

import pytest
import torch

from impala_gpu.config import AlgoCfg
from impala_gpu.learning.optim import RMSpropTF, make_optimizer


def _two_steps(opt_factory, grads):
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = opt_factory([w])
    for g in grads:
        w.grad = torch.tensor(g)
        opt.step()
    return w.detach()


def test_two_steps_by_hand():
    lr, alpha, eps = 0.1, 0.9, 0.01
    g1, g2 = [0.5, -3.0], [1.0, 2.0]
    w = _two_steps(lambda p: RMSpropTF(p, lr=lr, alpha=alpha, eps=eps), [g1, g2])
    expected = []
    for w0, a, b in zip([1.0, -2.0], g1, g2, strict=True):
        ms1 = alpha * 1.0 + (1 - alpha) * a * a  # the mean square starts at 1
        w1 = w0 - lr * a / math.sqrt(ms1 + eps)  # eps inside the root
        ms2 = alpha * ms1 + (1 - alpha) * b * b
        expected.append(w1 - lr * b / math.sqrt(ms2 + eps))
    torch.testing.assert_close(w, torch.tensor(expected))


def test_two_steps_with_momentum_by_hand():
    lr, alpha, eps, mu = 0.1, 0.9, 0.01, 0.5
    a, b = 2.0, -1.0
    w = _two_steps(
        lambda p: RMSpropTF(p, lr=lr, alpha=alpha, eps=eps, momentum=mu), [[a, a], [b, b]]
    )
    ms1 = alpha + (1 - alpha) * a * a
    m1 = lr * a / math.sqrt(ms1 + eps)
    ms2 = alpha * ms1 + (1 - alpha) * b * b
    m2 = mu * m1 + lr * b / math.sqrt(ms2 + eps)
    assert w[0].item() == pytest.approx(1.0 - m1 - m2, rel=1e-6)


def test_first_update_is_small_unlike_torch_rmsprop():
    """Why it matters: torch's first step is ~lr/sqrt(1-alpha) = 10x lr in every coordinate."""
    g = [[1e-3, 1e-3]]
    tf = _two_steps(lambda p: RMSpropTF(p, lr=1e-3, alpha=0.99, eps=0.01), g)
    pt = _two_steps(lambda p: torch.optim.RMSprop(p, lr=1e-3, alpha=0.99, eps=1e-5), g)
    start = torch.tensor([1.0, -2.0])
    assert (start - tf).abs().max() < 1e-5
    assert (start - pt).abs().max() > 5e-3


def test_config_selects_it():
    model = torch.nn.Linear(2, 2)
    opt = make_optimizer(model, AlgoCfg(optimizer="rmsprop_tf", rmsprop_eps=0.1))
    assert isinstance(opt, RMSpropTF) and opt.param_groups[0]["eps"] == 0.1
    with pytest.raises(ValueError, match="rmsprop_tf"):
        make_optimizer(model, AlgoCfg(optimizer="sgd"))
