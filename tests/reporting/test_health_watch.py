"""Network-health warnings, on real measurements and on made-up ones: said once per episode of
trouble, after the warm-up, judged on a moving average."""

from __future__ import annotations

import pytest
import torch

from impala_gpu.config import ModelCfg
from impala_gpu.models import build_model
from impala_gpu.reporting.health_watch import HealthWatch
from impala_gpu.telemetry import health

OBS = (4, 84, 84)


def _frames(T=5, B=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (T, B, *OBS), dtype=torch.uint8, generator=g)
    return obs, torch.zeros(T, B, dtype=torch.bool)


def test_known_dead_units_are_found():
    model = build_model(OBS, 6, ModelCfg(name="shallow"))
    fc = model.torso.fc[0]
    with torch.no_grad():
        fc.bias[:192] = -1e6  # 192 of 256 fc units can never fire
        model.policy_head.weight.zero_()  # and the policy ignores the screen
    m = health.measure(model, *_frames())
    assert m["dead/fc"] >= 0.75
    assert m["logit_spread"] == pytest.approx(0.0, abs=1e-7)
    watch = HealthWatch(0.5, 0.05, warmup_updates=10, smoothing=1.0)
    warnings = watch.check(m, updates=100)
    assert any("fc" in w and "dead" in w for w in warnings)
    assert any("barely depends on its input" in w for w in warnings)
    assert watch.check(m, updates=101) == []  # said once, not every log line


def test_healthy_model_raises_no_warning():
    torch.manual_seed(0)
    model = build_model(OBS, 6, ModelCfg(name="shallow", init="orthogonal"))
    with torch.no_grad():
        model.policy_head.weight.mul_(100)  # a policy that looks at the screen
    m = health.measure(model, *_frames())
    assert set(m) == {"dead/conv1", "dead/conv2", "dead/conv3", "dead/fc", "logit_spread"}
    assert max(v for k, v in m.items() if k.startswith("dead/")) < 0.5
    assert m["logit_spread"] > 0.05
    assert HealthWatch(warmup_updates=0).check(m, updates=10) == []


def test_warning_waits_for_warmup_and_rearms_after_recovery():
    watch = HealthWatch(min_logit_spread=0.05, warmup_updates=100, smoothing=1.0)
    flat = {"logit_spread": 0.01}
    assert watch.check(flat, updates=50) == []  # a fresh policy is uniform by design
    assert len(watch.check(flat, updates=150)) == 1
    assert watch.check({"logit_spread": 0.07}, updates=160) == []  # hovering: not recovered
    assert watch.check(flat, updates=170) == []
    assert watch.check({"logit_spread": 0.2}, updates=200) == []  # clearly recovered
    assert len(watch.check(flat, updates=250)) == 1  # trouble again: said again
    dead = HealthWatch(dead_warn=0.5, smoothing=1.0)
    assert len(dead.check({"dead/fc": 0.51}, 0)) == 1
    assert dead.check({"dead/fc": 0.49}, 0) == [] and dead.check({"dead/fc": 0.52}, 0) == []


def test_warnings_judge_a_moving_average():
    watch = HealthWatch(dead_warn=0.5, smoothing=0.3)
    assert watch.check({"dead/fc": 0.3}, 0) == []
    assert watch.check({"dead/fc": 0.9}, 0) == []  # one noisy line: the average is 0.48
    warned = [watch.check({"dead/fc": 0.9}, 0) for _ in range(5)]
    assert [len(w) for w in warned] == [1, 0, 0, 0, 0]  # then 0.61: warned once, then quiet
