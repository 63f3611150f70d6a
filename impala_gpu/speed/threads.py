"""The learner's torch threads (``learner_threads=``): one rule, which the learner, its other
ranks and ``auto``'s timings all follow, so what ``auto`` measured is what the run gets."""

from __future__ import annotations


def default_learner_threads(device_type: str, precision: str, cores: int, num_actors: int) -> int:
    """torch threads for the learner when ``learner_threads=0``.

    A CUDA learner only launches kernels: 2. A CPU learner shares the cores with the actors,
    and on a small box it is the bottleneck. fp32 kernels scale with threads, so an fp32
    learner gets every core; bf16 kernels scale poorly, so a bf16 learner leaves the actors
    their cores. The measurements behind both: docs/performance.md (``learner_threads=0``).
    """
    if device_type == "cuda":
        return 2
    if precision == "bf16":
        return max(1, cores - num_actors)
    return cores


def learner_threads(
    device_type: str, precision: str, cores: int, num_actors: int, fixed: int = 0, ranks: int = 1
) -> int:
    """The torch threads of each learner rank: ``fixed`` (the config's ``learner_threads``) or,
    for 0, ``default_learner_threads``, divided among ``ranks`` data-parallel learners (at
    least 1 each)."""
    threads = fixed or default_learner_threads(device_type, precision, cores, num_actors)
    return max(1, threads // ranks)
