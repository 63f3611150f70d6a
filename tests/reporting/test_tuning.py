"""The auto-tuning hint: which side bounds the run, and what to try."""

from __future__ import annotations

from impala_gpu.config import Config
from impala_gpu.reporting.tuning import diagnose


def window(busy: float, wait: float, actor_idle: float) -> dict[str, float]:
    return {"learner_busy": busy, "learner_wait": wait, "actor_idle": actor_idle}


def test_busy_learner_with_idle_actors_is_learner_bound_on_two_cores():
    hint = diagnose(window(0.99, 0.0, 0.29), Config(), cores=2, device_type="cpu")
    assert hint.bound == "learner"
    assert hint.suggestions[0] == "precision=bf16"
    assert "num_actors=1 envs_per_actor=32" in hint.suggestions  # same 32 envs, one process
    assert "LD_PRELOAD=<libtcmalloc_minimal.so.4>" in hint.suggestions
    assert "99%" in hint.describe() and "29%" in hint.describe()


def test_learner_bound_suggestions_drop_what_is_already_on():
    cfg = Config(precision="bf16", compile=True, num_actors=1, envs_per_actor=32)
    hint = diagnose(window(0.99, 0.0, 0.3), cfg, cores=2, device_type="cpu", allocator="tcmalloc")
    assert hint.bound == "learner" and hint.suggestions == []


def test_learner_bound_on_cuda_suggests_a_bigger_batch():
    hint = diagnose(window(0.97, 0.01, 0.4), Config(precision="bf16"), 16, "cuda", "tcmalloc")
    assert hint.bound == "learner"
    assert "batch_size=64" in hint.suggestions
    assert not any(s.startswith("num_actors") for s in hint.suggestions)


def test_starved_learner_is_actor_bound_and_gets_the_free_cores():
    hint = diagnose(window(0.4, 0.55, 0.0), Config(num_actors=4), cores=16, device_type="cuda")
    assert hint.bound == "actors"
    assert hint.suggestions[0] == "num_actors=15"  # one core stays with the CUDA learner
    assert "55%" in hint.reason


def test_actor_bound_without_spare_cores_suggests_faster_inference_only():
    hint = diagnose(window(0.5, 0.45, 0.0), Config(), cores=2, device_type="cpu")
    assert hint.bound == "actors" and hint.suggestions == ["precision=bf16"]


def test_neither_side_waiting_much_is_balanced():
    hint = diagnose(window(0.93, 0.05, 0.02), Config(), cores=2, device_type="cpu")
    assert hint.bound == "balanced" and hint.suggestions == []
    assert hint.as_event()["event"] == "tuning_hint"
