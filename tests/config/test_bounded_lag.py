"""``bounded_lag=auto``: the least exact lag at which no actor waits, checked against a
simulation of the schedule the actors and the learner follow under ``bounded_lag=K``."""

from __future__ import annotations

import dataclasses

import pytest

from impala_gpu.acting.actor import bounded_lag_version
from impala_gpu.config import (
    AUTO,
    Config,
    ConfigError,
    least_bounded_lag,
    resolve_bounded_lag,
    resolve_num_slots,
)
from impala_gpu.validate import check_values, require_resolved


def actor_idle_share(actors: int, envs: int, batch: int, lag: int, updates: int = 1000) -> float:
    """The share of the actors' time spent waiting for a policy version, in a run where an
    unroll takes 1 s and an update 90% of the time that keeps up with the actors (the learner
    is not the limit: only the lag bound can hold an actor back for long). Actor j's n-th
    unroll is global unroll ``n*actors + j``; it starts once the actor is free and version
    ``bounded_lag_version(g)`` is published; update u starts once the learner is free and
    batch u (its ``batch // envs`` unrolls) is written."""
    per_batch = batch // envs
    learner_s = 0.9 * per_batch / actors
    published = [0.0]  # published[v]: when version v (v updates done) became readable
    actor_free = [0.0] * actors
    waited, written = 0.0, []
    for g in range(updates * per_batch):
        j = g % actors
        version = bounded_lag_version(g, envs, batch, lag)
        start = max(actor_free[j], published[version])
        waited += start - actor_free[j]
        actor_free[j] = start + 1.0
        written.append(actor_free[j])
        if len(written) % per_batch == 0:  # batch u is complete: update u runs
            published.append(max(published[-1], max(written[-per_batch:])) + learner_s)
    return waited / max(actor_free) / actors


@pytest.mark.parametrize(
    ("actors", "envs", "batch"),
    [(1, 16, 16), (2, 16, 16), (15, 16, 16), (4, 8, 16), (3, 16, 32), (8, 4, 32), (5, 2, 4)],
)
def test_least_bounded_lag_is_the_least_at_which_no_actor_waits(actors, envs, batch):
    cfg = Config(num_actors=actors, envs_per_actor=envs, batch_size=batch)
    least = least_bounded_lag(cfg)
    idle = actor_idle_share(actors, envs, batch, least)
    assert idle - actor_idle_share(actors, envs, batch, least + 8) < 0.01  # more lag buys nothing
    if least > 1:  # one less and every actor waits for an update once per unroll
        assert actor_idle_share(actors, envs, batch, least - 1) - idle > 0.03


def test_the_issue_example_fifteen_actors_at_lag_one_mostly_wait():
    # 15 actors of 16 envs, batch 16, lag 1: one actor steps while the learner updates.
    assert actor_idle_share(15, 16, 16, 1) > 0.8
    assert least_bounded_lag(Config(num_actors=15, envs_per_actor=16, batch_size=16)) == 15


def test_auto_counts_and_ray():
    cfg = Config(num_actors=AUTO, envs_per_actor=16, batch_size=16, bounded_lag=AUTO)
    assert resolve_bounded_lag(cfg) == 1  # an auto count as its least, 1
    assert resolve_bounded_lag(dataclasses.replace(cfg, runtime="ray")) is None
    assert resolve_bounded_lag(dataclasses.replace(cfg, bounded_lag=None)) is None
    assert resolve_bounded_lag(dataclasses.replace(cfg, bounded_lag=3)) == 3
    fixed = dataclasses.replace(cfg, num_actors=4, bounded_lag=4)
    auto = dataclasses.replace(fixed, bounded_lag=AUTO)
    assert resolve_num_slots(auto) == resolve_num_slots(fixed)


@pytest.mark.parametrize("bad", [-1, 1.5, "soon", True])
def test_a_bad_bounded_lag_names_the_fix(bad):
    with pytest.raises(ConfigError, match="bounded_lag=auto"):
        check_values(Config(num_actors=1, envs_per_actor=1, bounded_lag=bad))


def test_an_unresolved_auto_lag_does_not_reach_the_runtime():
    with pytest.raises(ConfigError, match="bounded_lag=auto reached the runtime"):
        require_resolved(Config(precision="fp32", num_actors=1, envs_per_actor=1, bounded_lag=AUTO))
