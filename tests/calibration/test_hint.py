"""The auto-tuning hint: which side bounds the run, and what this machine measured would help."""

from __future__ import annotations

from impala_gpu.calibration import Candidate
from impala_gpu.calibration.hint import diagnose
from impala_gpu.config import Config


def window(busy: float, wait: float, actor_idle: float) -> dict[str, float]:
    return {"learner_busy": busy, "learner_wait": wait, "actor_idle": actor_idle}


def cfg(precision="fp32", num_actors=2, envs_per_actor=16, **kw) -> Config:
    return Config(precision=precision, num_actors=num_actors, envs_per_actor=envs_per_actor, **kw)


# Two boxes, as measured: bf16 faster on box A, 2.8x slower on box B (agent steps per second).
BOX_A = {
    Candidate("fp32", 2, 16): 1550.0,
    Candidate("fp32", 1, 32): 1700.0,
    Candidate("bf16", 2, 16): 1900.0,
    Candidate("bf16", 1, 32): 2075.0,
}
BOX_B = {
    Candidate("fp32", 2, 16): 1300.0,
    Candidate("fp32", 1, 32): 1330.0,
    Candidate("bf16", 2, 16): 470.0,
    Candidate("bf16", 1, 32): 480.0,
}


def test_learner_bound_suggests_what_this_machine_measured_faster():
    hint = diagnose(window(0.99, 0.0, 0.29), cfg(), cores=2, device_type="cpu", alternatives=BOX_A)
    assert hint.bound == "learner"
    assert hint.suggestions[:2] == ["precision=bf16", "num_actors=1 envs_per_actor=32"]
    assert "(measured end to end on this machine: 1.34x faster)" in hint.suggestions
    assert "LD_PRELOAD=<libtcmalloc_minimal.so.4>" in hint.suggestions
    assert "99%" in hint.describe() and "29%" in hint.describe()


def test_no_bf16_where_this_machine_measured_it_slower():
    hint = diagnose(window(0.99, 0.0, 0.29), cfg(), 2, "cpu", "tcmalloc", alternatives=BOX_B)
    assert hint.bound == "learner"
    assert not any("bf16" in s for s in hint.suggestions)
    assert hint.suggestions == []  # 1x32 is only 2% faster there: below the 5% bar


def test_without_measurements_nothing_is_guessed():
    hint = diagnose(window(0.99, 0.0, 0.3), cfg(), cores=2, device_type="cpu")
    assert hint.suggestions == ["LD_PRELOAD=<libtcmalloc_minimal.so.4>"]
    hint = diagnose(window(0.5, 0.45, 0.0), cfg(), cores=2, device_type="cpu")
    assert hint.bound == "actors" and hint.suggestions == []


def test_already_the_fastest_gets_no_suggestion():
    best = cfg(precision="bf16", num_actors=1, envs_per_actor=32)
    hint = diagnose(window(0.99, 0.0, 0.3), best, 2, "cpu", "tcmalloc", alternatives=BOX_A)
    assert hint.bound == "learner" and hint.suggestions == []


def test_learner_bound_on_cuda_suggests_a_bigger_batch():
    hint = diagnose(window(0.97, 0.01, 0.4), cfg("bf16"), 16, "cuda", "tcmalloc")
    assert hint.bound == "learner"
    assert "batch_size=64" in hint.suggestions
    assert not any(s.startswith("num_actors") for s in hint.suggestions)


def test_starved_learner_is_actor_bound_and_gets_more_actors_when_measured():
    measured = {Candidate("fp32", 4, 8): 900.0, Candidate("fp32", 8, 4): 1600.0}
    hint = diagnose(window(0.4, 0.55, 0.0), cfg(num_actors=4, envs_per_actor=8), 16, "cuda",
                    alternatives=measured)  # fmt: skip
    assert hint.bound == "actors"
    assert hint.suggestions[0] == "num_actors=8 envs_per_actor=4"
    assert "55%" in hint.reason


def test_neither_side_waiting_much_is_balanced():
    hint = diagnose(window(0.93, 0.05, 0.02), cfg(), 2, "cpu", alternatives=BOX_A)
    assert hint.bound == "balanced" and hint.suggestions == []
    assert hint.as_event()["event"] == "tuning_hint"
