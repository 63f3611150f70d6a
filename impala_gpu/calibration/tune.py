"""The tuner: the candidates' timings (from the cache, measuring what it lacks), their
predicted speeds (the algorithm's cost model), trials when the best are too close to rank,
and the choice. ``apply_auto`` is the CLI's one call, before any algorithm runs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Protocol

import torch

from impala_gpu.calibration.cache import (
    cache_path,
    cached_entry,
    cached_trials,
    entry_key,
    load_cache,
    save_cache,
    trial_key,
)
from impala_gpu.calibration.decision import Decision, write_decision
from impala_gpu.calibration.measure import (
    OtherLoad,
    time_env_step,
    time_learner_step,
    time_policy_step,
)
from impala_gpu.calibration.model import (
    TRIAL_MARGIN,
    Candidate,
    CostModel,
    Timings,
    Workload,
    alternatives,
    candidates,
    contenders,
    policy_timing,
    rank,
    timing_key,
)
from impala_gpu.calibration.trials import Train, trial_run
from impala_gpu.config import (
    AUTO,
    auto_keys,
    fresh_batch_size,
    least_bounded_lag,
    resolve_device,
    with_bounded_lag,
)
from impala_gpu.envs import env_spec
from impala_gpu.validate import check_values

# Other processes took more than this share of all cores while auto measured: the timings
# then measure the contention, not the candidates, and can rank them upside down
# (docs/performance.md). Measured again once; still noisy, they serve this run only and are
# never cached.
NOISY_SHARE = 0.25
MEASURE_TRIES = 2


class Tunable(Protocol):
    """What ``auto`` needs of an algorithm (``impala_gpu.algos.registry.Algorithm`` is one)."""

    @property
    def cost(self) -> CostModel: ...

    @property
    def train(self) -> Train: ...


def workload(cfg, device: torch.device) -> Workload:
    return Workload(
        device.type, os.cpu_count() or 1, cfg.unroll_length, cfg.batch_size, cfg.learner_threads
    )


def _noise_note(share: float, what: str, attempt: int) -> str:
    cores = os.cpu_count() or 1
    then = (
        "measuring again"
        if attempt < MEASURE_TRIES
        else "using them for this run only: not cached, so the next run measures again"
    )
    return (
        f"impala_gpu: auto: other processes used {share:.0%} of this machine's {cores} cores "
        f"while it measured {what} (more than {NOISY_SHARE:.0%}: noise); {then}."
    )


def _measure_missing(entry, cfg, spec, device, cost: CostModel, cands, w: Workload) -> bool:
    """Time what ``entry`` lacks for ``cands`` into it; True if anything was measured."""
    fresh = False
    for c in cands:
        learner, policy = cost.learner_timing(c, w), policy_timing(c)
        if timing_key(learner) not in entry["learner_step_s"]:
            step_s = time_learner_step(cfg, spec, device, *learner)
            entry["learner_step_s"][timing_key(learner)] = step_s
            fresh = True
        if timing_key(policy) not in entry["policy_step_s"]:
            entry["policy_step_s"][timing_key(policy)] = time_policy_step(cfg, spec, *policy)
            fresh = True
    if entry["env_step_s"] is None:
        entry["env_step_s"] = time_env_step(cfg)
        fresh = True
    return fresh


def _lacks(entry, cost: CostModel, cands, w: Workload) -> bool:
    """Whether ``entry`` lacks a timing ``_measure_missing`` would take for ``cands``."""
    for c in cands:
        if timing_key(cost.learner_timing(c, w)) not in entry["learner_step_s"]:
            return True
        if timing_key(policy_timing(c)) not in entry["policy_step_s"]:
            return True
    return entry["env_step_s"] is None


def _timings(entry) -> Timings:
    return Timings(entry["learner_step_s"], entry["policy_step_s"], entry["env_step_s"])


def timings_for(
    cfg, spec, device, cost: CostModel, cands: list[Candidate]
) -> tuple[Timings, bool, bool]:
    """The timings the candidates need: from the cache, measuring what is missing. Returns
    (timings, all cached, noisy). A measurement taken while other processes used more than
    ``NOISY_SHARE`` of the cores is taken again; still noisy, it serves this run only and is
    not cached (a cached figure is trusted by every later run, and by nothing else)."""
    path, key, w = cache_path(), entry_key(cfg, device), workload(cfg, device)
    cached = cached_entry(cfg, device)
    if _lacks(cached, cost, cands, w):  # seconds of silence otherwise: say what runs
        print(
            f"impala_gpu: auto: measuring this machine for {', '.join(auto_keys(cfg))} "
            f"(seconds, once per workload; cached in {path})",
            file=sys.stderr,
            flush=True,
        )
    for attempt in range(1, MEASURE_TRIES + 1):
        entry = json.loads(json.dumps(cached))  # a copy: a noisy attempt adds nothing to it
        with OtherLoad() as load:
            fresh = _measure_missing(entry, cfg, spec, device, cost, cands, w)
        if not fresh:
            return _timings(entry), True, False
        if load.share <= NOISY_SHARE:
            break
        print(_noise_note(load.share, "its timings", attempt), file=sys.stderr, flush=True)
    else:
        return _timings(entry), False, True
    entry["other_cpu_share"] = round(load.share, 3)  # what else ran while this was measured
    entry["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    stored = load_cache(path)  # another job may have written meanwhile
    stored[key] = {**entry, "trial_steps_per_s": stored.get(key, {}).get("trial_steps_per_s", {})}
    save_cache(path, stored)
    return _timings(entry), False, False


def trials_for(
    cfg, device, preds: dict[Candidate, float], train: Train
) -> tuple[dict[Candidate, float], bool]:
    """End-to-end agent steps per second of the ``contenders`` (from the cache, running the
    missing ones with ``train``), or {} when the prediction alone decides. Returns (trials,
    all cached)."""
    close = contenders(preds)
    if len(close) < 2 or cfg.auto_trial_s <= 0:
        return {}, True
    path, key = cache_path(), entry_key(cfg, device)
    done = dict(cached_entry(cfg, device).get("trial_steps_per_s", {}))
    missing = [c for c in close if trial_key(c, cfg) not in done]
    if missing:
        names = ", ".join(c.short() for c in close)
        print(
            f"impala_gpu: auto: {names} are predicted within {TRIAL_MARGIN:.0%} of each other; "
            f"running each for {cfg.auto_trial_s:g} s to choose (once: cached in {path})",
            file=sys.stderr,
            flush=True,
        )
        with OtherLoad() as load:
            for c in missing:
                done[trial_key(c, cfg)] = trial_run(train, cfg, c, cfg.auto_trial_s)
        if load.share > NOISY_SHARE:  # the tuning hint quotes cached trials: never noise
            print(_noise_note(load.share, "its trials", MEASURE_TRIES), file=sys.stderr)
            return {c: done[trial_key(c, cfg)] for c in close}, False
        stored = load_cache(path)
        entry = stored.get(key)
        if entry is not None:  # trials are kept beside cached (quiet) timings only
            entry["trial_steps_per_s"] = {**entry.get("trial_steps_per_s", {}), **done}
            save_cache(path, stored)
    return {c: done[trial_key(c, cfg)] for c in close}, not missing


def resolve_auto(cfg, algo: Tunable):
    """``cfg`` with every ``auto`` replaced by what this machine measured to be fastest for
    ``algo``, and the Decision (None when nothing was auto). Idempotent: a resolved config
    comes back as is."""
    check_values(cfg)
    if not auto_keys(cfg):
        return with_bounded_lag(cfg), None
    device = resolve_device(cfg.device)
    if algo.cost.cpu_only:
        device = torch.device("cpu")
    spec = env_spec(cfg.env)
    cands = candidates(cfg, os.cpu_count() or 1, algo.cost)
    t, cached, noisy = timings_for(cfg, spec, device, algo.cost, cands)
    w = workload(cfg, device)
    preds = {c: algo.cost.predict(c, t, w) for c in cands}
    trials, trials_cached = trials_for(cfg, device, preds, algo.train)
    chosen = rank(trials or preds)
    decision = Decision(
        chosen,
        preds,
        spec.frames_per_step,
        cached and trials_cached,
        str(cache_path()),
        trials,
        noisy=noisy,
    )
    resolved = dataclasses.replace(
        cfg,
        precision=chosen.precision,
        num_actors=chosen.num_actors,
        envs_per_actor=chosen.envs_per_actor,
    )
    return with_bounded_lag(resolved), decision


def lag_note(asked, cfg) -> str | None:
    """What the console says of ``cfg``'s exact lag: the value ``auto`` gave it, or a warning
    when a fixed one makes actors wait for the learner; None when there is nothing to say."""
    lag, least = cfg.bounded_lag, least_bounded_lag(cfg)
    if not lag or cfg.algo.name == "a3c":  # off, or 0: synchronous, every actor waits by design
        return None
    actors = f"{cfg.num_actors} actor{'s' * (cfg.num_actors != 1)}"
    sizes = f"{actors} x {cfg.envs_per_actor} envs, batch_size={cfg.batch_size}"
    if asked.bounded_lag == AUTO:
        return f"auto (bounded_lag): bounded_lag={lag}, the least at which no actor waits ({sizes})"
    if lag < least and cfg.algo.name != "a2c":  # A2C waits on purpose: its barrier
        free = lag * fresh_batch_size(cfg) // cfg.envs_per_actor
        return (
            f"warning: bounded_lag={lag} with {sizes}: while the learner computes an update at "
            f"most {free} of the {cfg.num_actors} actors can step; the rest wait for it. Fix: "
            f"bounded_lag=auto ({least} here), or a batch_size of "
            f"{cfg.envs_per_actor * math.ceil(cfg.num_actors / lag)} for lag {lag}."
        )
    return None


def apply_auto(cfg, algo: Tunable, run_dir: str | Path | None = None, check=None):
    """``resolve_auto``, saying in one line what was chosen and why (and in ``auto.json``).
    ``check(resolved)``, when given, runs before ``auto.json`` is written, so a config that
    cannot run leaves no file behind."""
    keys, asked = auto_keys(cfg), cfg
    cfg, decision = resolve_auto(cfg, algo)
    if decision is not None:
        print(f"impala_gpu: {decision.describe(keys)}", file=sys.stderr, flush=True)
    note = lag_note(asked, cfg)
    if note is not None:
        print(f"impala_gpu: {note}", file=sys.stderr, flush=True)
    if check is not None:
        check(cfg)
    if decision is not None and run_dir is not None:
        write_decision(decision, keys, run_dir)
    return cfg


def measured_alternatives(cfg, device: torch.device) -> dict[Candidate, float] | None:
    """For the tuning hint, during a run: agent steps per second of this config and its
    ``alternatives`` as ``auto``'s real trials ran them end to end on this machine, from the
    cache. Never the micro-benchmarks' prediction: taken under load, that can be off by an
    order of magnitude. None when fewer than two of them, or not this config, were run: the
    hint then suggests none."""
    out = cached_trials(cfg, device, alternatives(cfg, os.cpu_count() or 1))  # measures nothing
    current = Candidate(cfg.precision, cfg.num_actors, cfg.envs_per_actor)
    return out if current in out and len(out) >= 2 else None
