"""``auto`` for precision, num_actors and envs_per_actor: the prediction by hand, the choice,
the cache, and a real calibration on CartPole."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from impala_gpu import calibration as cal
from impala_gpu.algos.costs import A2C_COST, A3C_COST, IMPALA_COST
from impala_gpu.algos.registry import algorithm
from impala_gpu.calibration import Candidate, Timings, Workload, rank
from impala_gpu.config import Config, ConfigError, EnvCfg, ModelCfg
from impala_gpu.validate import validate_config

T, B = 20, 32
TIMINGS = Timings(
    learner_step_s={"fp32/2/32": 0.32, "bf16/1/32": 1.0, "fp32/1/32": 0.6, "fp32/1/16": 0.3},
    policy_step_s={"fp32/32": 0.008, "fp32/16": 0.005, "bf16/32": 0.006},
    env_step_s=0.0002,
)
IMPALA = algorithm("impala")


def cpu(cores: int, threads: int, B: int = B) -> Workload:
    """A CPU learner's workload, its threads fixed as ``threads`` (learner_threads)."""
    return Workload("cpu", cores, T, B, threads)


def test_impala_on_a_cpu_is_the_slowest_of_learner_actors_and_shared_cores():
    c = Candidate("fp32", 1, 32)
    # learner 640/0.32 = 2000; actor 32/(32*0.0002+0.008) = 2222; cores: 2/(2*0.32/640 + 0.00045)
    expected = min(2000.0, 1 / 0.00045, 2 / (2 * 0.32 / 640 + 0.00045))
    got = IMPALA_COST.predict(c, TIMINGS, cpu(cores=2, threads=2))
    assert got == pytest.approx(expected) and got == pytest.approx(1379.3, rel=1e-3)


def test_a_slow_bf16_learner_bounds_its_candidate():
    got = IMPALA_COST.predict(Candidate("bf16", 1, 32), TIMINGS, cpu(2, threads=1))
    assert got == pytest.approx(640 / 1.0)  # the learner's own rate is the tightest limit


def test_a_cuda_learner_leaves_the_actors_all_cores_but_one():
    t = Timings({"fp32/2/32": 0.01}, {"fp32/16": 0.005}, 0.0002)
    got = IMPALA_COST.predict(Candidate("fp32", 4, 16), t, Workload("cuda", 16, T, B, 2))
    per_step = (16 * 0.0002 + 0.005) / 16
    assert got == pytest.approx(min(640 / 0.01, 4 / per_step, 15 / per_step))


def test_a2c_alternates_acting_and_learning_on_a_batch_of_every_env():
    got = A2C_COST.predict(Candidate("fp32", 2, 16), TIMINGS, cpu(2, threads=2, B=99))
    assert got == pytest.approx(T * 32 / (T * (16 * 0.0002 + 0.005) + 0.32))


def test_a3c_workers_act_and_learn_on_one_core_each():
    got = A3C_COST.predict(Candidate("fp32", 2, 16), TIMINGS, cpu(2, threads=2))
    assert got == pytest.approx(2 * T * 16 / (T * (16 * 0.0002 + 0.005) + 0.3))


def test_rank_prefers_the_fastest_and_breaks_near_ties_toward_fp32_then_fewer_processes():
    fast = {Candidate("fp32", 2, 16): 1000.0, Candidate("bf16", 1, 32): 1500.0}
    assert rank(fast) == Candidate("bf16", 1, 32)
    near = {
        Candidate("bf16", 1, 32): 1010.0,
        Candidate("fp32", 2, 16): 1000.0,
        Candidate("fp32", 1, 32): 995.0,
    }
    assert rank(near) == Candidate("fp32", 1, 32)


def test_candidates_keep_explicit_values_and_32_envs_in_all():
    cfg = Config(env=EnvCfg(id="CartPole-v1"))
    got = cal.candidates(cfg, 2, IMPALA_COST)
    assert {(c.num_actors, c.envs_per_actor) for c in got} == {(1, 32), (2, 16)}
    assert {c.precision for c in got} == {"fp32", "bf16"}
    cfg = Config(env=EnvCfg(id="CartPole-v1"), precision="fp32", num_actors=3)
    assert cal.candidates(cfg, 8, IMPALA_COST) == [Candidate("fp32", 3, 11)]
    a3c = Config(env=EnvCfg(id="CartPole-v1"), envs_per_actor=4)
    assert {c.num_actors for c in cal.candidates(a3c, 6, A3C_COST)} == {6}  # a worker per core


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"num_actors": "many"}, "num_actors='many' must be a positive integer or auto"),
        ({"envs_per_actor": 0}, "envs_per_actor=0 must be a positive integer or auto"),
        ({"precision": "fp16"}, "precision='fp16' is not one of ('auto', 'fp32', 'bf16')"),
    ],
)
def test_bad_values_fail_naming_the_key_and_the_fix(overrides, key):
    with pytest.raises(ConfigError, match="Fix:") as e:
        cal.resolve_auto(Config(env=EnvCfg(id="CartPole-v1"), **overrides), IMPALA)
    assert key in str(e.value)


def test_an_unresolved_auto_never_reaches_the_runtime():
    with pytest.raises(ConfigError, match="resolve_auto"):
        validate_config(Config(env=EnvCfg(id="CartPole-v1"), model=ModelCfg(name="mlp")))


def test_explicit_values_are_not_measured(tmp_path, monkeypatch):
    monkeypatch.setenv(cal.CACHE_ENV, str(tmp_path))
    cfg = Config(env=EnvCfg(id="CartPole-v1"), precision="fp32", num_actors=2, envs_per_actor=4)
    assert cal.resolve_auto(cfg, IMPALA) == (cfg, None)
    assert not (tmp_path / "calibration.json").exists()


@pytest.fixture
def quiet(monkeypatch):
    """Count this machine as quiet whatever else runs (the suite shares CI boxes): for the
    tests of the cache itself. The noise rule has its own test, beside a real CPU hog."""
    monkeypatch.setattr(cal.tune, "NOISY_SHARE", 1.0)


def test_cartpole_calibrates_once_then_starts_from_the_cache(tmp_path, monkeypatch, capsys, quiet):
    monkeypatch.setenv(cal.CACHE_ENV, str(tmp_path / "cache"))
    cfg = Config(env=EnvCfg(id="CartPole-v1"), model=ModelCfg(name="mlp", hidden_size=32))
    first = cal.apply_auto(cfg, IMPALA, tmp_path / "run")
    line = capsys.readouterr().err
    assert "auto (precision, num_actors, envs_per_actor)" in line and "measured now" in line
    assert first.precision in ("fp32", "bf16") and first.num_actors * first.envs_per_actor == 32
    cache = json.loads((tmp_path / "cache" / "calibration.json").read_text())
    (entry,) = cache.values()
    assert entry["env_step_s"] > 0 and all(v > 0 for v in entry["learner_step_s"].values())
    assert set(entry["policy_step_s"]) == {"fp32/16", "fp32/32", "bf16/16", "bf16/32"}
    decision = json.loads((tmp_path / "run" / "auto.json").read_text())
    assert decision["chosen"]["precision"] == first.precision
    assert len(decision["predicted_frames_per_s"]) == 4

    again = cal.apply_auto(cfg, IMPALA, tmp_path / "run")
    assert "cached" in capsys.readouterr().err
    assert (again.precision, again.num_actors, again.envs_per_actor) == (
        first.precision,
        first.num_actors,
        first.envs_per_actor,
    )
    assert cal.resolve_auto(again, IMPALA) == (again, None)  # idempotent
    # No trial ran (auto_trial_s=0 in the suite): the hint has no end-to-end figure to quote,
    # and the micro-benchmark's prediction is never quoted.
    assert cal.measured_alternatives(again, torch.device("cpu")) is None


def test_a_new_library_version_or_cpu_measures_again(tmp_path, monkeypatch, capsys, quiet):
    monkeypatch.setenv(cal.CACHE_ENV, str(tmp_path / "cache"))
    cfg = Config(env=EnvCfg(id="CartPole-v1"), model=ModelCfg(name="mlp", hidden_size=32))
    cal.apply_auto(cfg, IMPALA, tmp_path / "run")
    assert "measured now" in capsys.readouterr().err
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".next")
    cal.apply_auto(cfg, IMPALA, tmp_path / "run")
    assert "measured now" in capsys.readouterr().err
    monkeypatch.setattr(cal.cache, "cpu_model", lambda: "Another CPU (family 6 model 1; avx2)")
    cal.apply_auto(cfg, IMPALA, tmp_path / "run")
    assert "measured now" in capsys.readouterr().err
    cache = json.loads((tmp_path / "cache" / "calibration.json").read_text())
    assert len(cache) == 3, list(cache)


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: {model}
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 avx512f {flags}

processor\t: 1
model\t\t: 999
"""


def test_cpus_with_one_name_but_other_speed_flags_are_told_apart():
    amx = cal.cpu_model(CPUINFO.format(model=167, flags="avx512_bf16 amx_bf16 amx_tile"))
    older = cal.cpu_model(CPUINFO.format(model=207, flags="avx512_vnni"))
    assert (
        amx == "Intel(R) Xeon(R) Processor (family 6 model 167; avx2 avx512f avx512_bf16 amx_bf16)"
    )
    assert older == "Intel(R) Xeon(R) Processor (family 6 model 207; avx2 avx512f avx512_vnni)"
    assert cal.cpu_model("model name\t: Some ARM core\n") == "Some ARM core"


def test_contenders_are_the_candidates_the_model_puts_within_the_margin():
    preds = {
        Candidate("fp32", 1, 32): 5100.0,
        Candidate("fp32", 2, 16): 4900.0,  # 4% below: the model cannot rank these two
        Candidate("bf16", 1, 32): 2600.0,
    }
    assert cal.contenders(preds) == [Candidate("fp32", 1, 32), Candidate("fp32", 2, 16)]
    assert cal.contenders({Candidate("fp32", 1, 32): 1.0}) == [Candidate("fp32", 1, 32)]


def test_close_candidates_are_decided_by_real_runs_once_then_from_the_cache(
    tmp_path, monkeypatch, capsys, quiet
):
    monkeypatch.setenv(cal.CACHE_ENV, str(tmp_path / "cache"))
    cfg = Config(
        env=EnvCfg(id="CartPole-v1"), model=ModelCfg(name="mlp", hidden_size=32), auto_trial_s=5
    )
    _, plain = cal.resolve_auto(dataclasses.replace(cfg, auto_trial_s=0), IMPALA)
    close = cal.contenders(plain.predictions)
    if len(close) < 2:  # force a near-tie so the trial path runs whatever this box measured
        other = next(c for c in plain.predictions if c != close[0])
        monkeypatch.setattr(cal.tune, "contenders", lambda preds: [close[0], other])
        close = [close[0], other]
    # The real run says the model's runner-up is the faster one.
    runs = []

    def fake_trial(train, cfg_, c, seconds):
        assert train is IMPALA.train  # the algorithm's own, passed in
        runs.append((c, seconds))
        return 2000.0 if c == close[1] else 1000.0

    monkeypatch.setattr(cal.tune, "trial_run", fake_trial)
    first = cal.apply_auto(cfg, IMPALA, tmp_path / "run")
    line = capsys.readouterr().err
    assert sorted(runs, key=str) == sorted([(c, 5) for c in close], key=str)
    assert (first.precision, first.num_actors, first.envs_per_actor) == (
        close[1].precision,
        close[1].num_actors,
        close[1].envs_per_actor,
    )
    assert "running each for 5 s" in line and "fastest in real runs" in line
    decision = json.loads((tmp_path / "run" / "auto.json").read_text())
    assert decision["trial_frames_per_s"][0]["frames_per_s"] == 2000.0

    runs.clear()
    again = cal.apply_auto(cfg, IMPALA, tmp_path / "run")
    assert runs == [] and "cached" in capsys.readouterr().err
    assert again == first
    # The tuning hint reads the trial's figure, not the model's, for the candidates it ran.
    alternatives = cal.measured_alternatives(again, torch.device("cpu"))
    assert alternatives[close[1]] == 2000.0 and alternatives[close[0]] == 1000.0


def test_a_trial_is_a_real_run_counted_after_its_start_up(tmp_path, capfd):
    cfg = Config(
        env=EnvCfg(id="CartPole-v1"),
        model=ModelCfg(name="mlp", hidden_size=16),
        unroll_length=10,
        batch_size=4,
        run_dir=str(tmp_path / "not_used"),
    )
    steps_per_s = cal.trial_run(IMPALA.train, cfg, Candidate("fp32", 2, 4), seconds=4.0)
    assert 100 < steps_per_s < 1e6
    assert not (tmp_path / "not_used").exists()
    # Its run dir, learner line and end-of-run summary are not the user's run: not shown.
    out, err = capfd.readouterr()
    assert "run finished" not in out + err and "run dir" not in out + err, out + err


def test_busy_cpu_s_reads_proc_stat():
    stat = "cpu  100 20 30 1000 50 5 5 40 0 0\ncpu0 1 2 3 4\n"
    assert cal.busy_cpu_s(stat) == pytest.approx(200 / os.sysconf("SC_CLK_TCK"))
    assert cal.busy_cpu_s("intr 1 2 3\n") is None


def _hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_a_calibration_beside_cpu_hogs_is_measured_again_and_never_cached(
    tmp_path, monkeypatch, capsys
):
    """Real CPU hogs, one per core, spin while auto measures: it notices, measures again,
    still sees them, and caches nothing, so no later run (nor the tuning hint) trusts it."""
    monkeypatch.setenv(cal.CACHE_ENV, str(tmp_path / "cache"))
    cfg = Config(
        env=EnvCfg(id="CartPole-v1"),
        model=ModelCfg(name="mlp", hidden_size=16),
        precision="fp32",
        num_actors=1,  # one candidate, small: a second or so per attempt
        batch_size=4,
        unroll_length=5,
    )
    from impala_gpu.envs import env_spec

    # First-call set-up (imports, torch's lazy init: seconds) before the hogs, to keep it short.
    cal.time_learner_step(cfg, env_spec(cfg.env), torch.device("cpu"), "fp32", 1, 4)
    hogs = _hogs(os.cpu_count() or 1)
    try:
        time.sleep(0.2)  # let them start spinning
        with cal.OtherLoad() as load:
            time.sleep(0.5)
        assert load.share > cal.tune.NOISY_SHARE  # the meter sees them ...
        resolved, decision = cal.resolve_auto(cfg, IMPALA)
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    err = capsys.readouterr().err
    assert err.count("other processes used") == cal.tune.MEASURE_TRIES, err  # ... and auto too
    assert "measuring again" in err and "not cached" in err
    assert resolved.envs_per_actor == 32 and decision.noisy and not decision.cached
    assert "not cached" in decision.describe(["envs_per_actor"])
    assert not (tmp_path / "cache" / "calibration.json").exists()
    assert cal.measured_alternatives(resolved, torch.device("cpu")) is None


def test_the_hint_quotes_real_trials_never_predictions(tmp_path, monkeypatch):
    """A cached entry whose timings predict bf16 30x faster, as a calibration under load once
    did, and no trials: the hint gets nothing. With trials it gets their figures only."""
    monkeypatch.setenv(cal.CACHE_ENV, str(tmp_path))
    cfg = Config(env=EnvCfg(id="CartPole-v1"), precision="fp32", num_actors=2, envs_per_actor=16)
    key = cal.cache.entry_key(cfg, torch.device("cpu"))
    entry = {
        "learner_step_s": {
            f"{p}/{t}/32": (1.0 if p == "fp32" else 0.03) for p in ("fp32", "bf16") for t in (1, 2)
        },  # fmt: skip
        "policy_step_s": {f"{p}/{e}": 0.001 for p in ("fp32", "bf16") for e in (16, 32)},
        "env_step_s": 1e-5,
    }
    cal.cache.save_cache(cal.cache_path(), {key: entry})
    assert cal.measured_alternatives(cfg, torch.device("cpu")) is None
    trials = {"fp32/2/16/32/0": 1000.0, "bf16/2/16/32/0": 1200.0}
    cal.cache.save_cache(cal.cache_path(), {key: {**entry, "trial_steps_per_s": trials}})
    alternatives = cal.measured_alternatives(cfg, torch.device("cpu"))
    assert alternatives == {Candidate("fp32", 2, 16): 1000.0, Candidate("bf16", 2, 16): 1200.0}


def test_sharded_learner_timings_have_their_own_entry():
    """A sharded update's timings (and trials) must not stand in for an unsharded one's: same
    ``learner_step_s`` keys (precision/threads/batch), different speed."""
    cfg = Config(env=EnvCfg(id="CartPole-v1"), precision="fp32", num_actors=2, envs_per_actor=16)
    cpu = torch.device("cpu")
    plain = cal.cache.entry_key(cfg, cpu)
    assert "learner_shards" not in plain  # caches written before the option still match
    cfg.learner_shards = 2
    assert cal.cache.entry_key(cfg, cpu) != plain


@pytest.mark.parametrize("epochs, minibatches", [(2, 1), (1, 4), (2, 4)])
def test_an_update_of_more_sgd_steps_has_its_own_entry(epochs, minibatches):
    """``learner_step_s`` times a whole update, epochs x minibatches SGD steps: pong_impala's
    2 x 4 timings must not stand in for paper_pong's 1 x 1 on the same machine."""
    cfg = Config(env=EnvCfg(id="CartPole-v1"), precision="fp32", num_actors=2, envs_per_actor=16)
    cpu = torch.device("cpu")
    one_step = cal.cache.entry_key(cfg, cpu)
    cfg.algo.epochs, cfg.algo.minibatches = epochs, minibatches
    assert cal.cache.entry_key(cfg, cpu) != one_step
