"""The learner's threads: one rule for the run, its ranks and ``auto``."""

from __future__ import annotations

from impala_gpu.speed.threads import learner_threads


def test_learner_threads_one_rule_for_the_run_its_ranks_and_auto():
    assert learner_threads("cpu", "fp32", 8, 2) == 8  # fp32 on CPU: every core
    assert learner_threads("cpu", "bf16", 8, 2) == 6  # bf16 leaves the actors theirs
    assert learner_threads("cuda", "fp32", 8, 2) == 2
    assert learner_threads("cpu", "fp32", 8, 2, fixed=3) == 3  # the config's wins
    assert learner_threads("cpu", "fp32", 8, 2, ranks=4) == 2  # shared among ranks
    assert learner_threads("cpu", "bf16", 2, 2, ranks=2) == 1  # at least one each
