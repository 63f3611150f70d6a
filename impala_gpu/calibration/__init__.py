"""``auto`` for ``precision``, ``num_actors`` and ``envs_per_actor``: measured on this machine.

Which precision and how many actor processes run fastest depends on the CPU's instruction
sets, its cores and the workload, so no fixed default fits (docs/performance.md, "Defaults
that measure the machine"). The first run of a workload times, on synthetic data, what a run
spends its time on (a few seconds; ``measure``): the learner's update at ``[T, B]`` in each
precision with the threads the run would give it, one actor's policy step for its ``E`` envs,
and the raw vector env. From these each algorithm's cost model (``model.CostModel``, stated in
``impala_gpu/algos/costs.py``) predicts every candidate's agent steps per second, and the
fastest wins. Where the predictions cannot tell the best apart (within ``TRIAL_MARGIN``, about
the model's own error), each of them runs for real for ``auto_trial_s`` seconds (``trials``)
and the fastest run wins. Timings and trials are cached per machine, library versions and
workload (``cache``), so later runs start at once; but not when other processes used more than
``tune.NOISY_SHARE`` of the cores meanwhile (``measure.OtherLoad``): that is measured again,
and if still noisy serves one run only. The tuning hint quotes only the trials' end-to-end
figures, never a prediction. An explicit value always wins; what ``auto`` chose goes into the
run's ``config.yaml`` (so a run repeats exactly) and ``auto.json`` (why, ``decision``).

The modules, each one job: ``model`` (the pure arithmetic), ``measure`` (micro-benchmarks),
``cache`` (the machine's cache file), ``trials`` (short real runs), ``decision`` (what was
chosen, and why), ``tune`` (all of it, for a config and an algorithm), ``hint`` (during a run:
actor- or learner-bound, and what the trials say would help). The CLI calls
``apply_auto`` once, before any algorithm runs; a train function never resolves ``auto``.
"""

from impala_gpu.calibration.cache import CACHE_ENV, cache_path, cpu_model
from impala_gpu.calibration.decision import Decision
from impala_gpu.calibration.measure import OtherLoad, busy_cpu_s, time_learner_step
from impala_gpu.calibration.model import (
    Candidate,
    CostModel,
    Timings,
    Workload,
    candidates,
    contenders,
    rank,
)
from impala_gpu.calibration.trials import trial_run
from impala_gpu.calibration.tune import apply_auto, measured_alternatives, resolve_auto

__all__ = [
    "CACHE_ENV",
    "Candidate",
    "CostModel",
    "Decision",
    "OtherLoad",
    "Timings",
    "Workload",
    "apply_auto",
    "busy_cpu_s",
    "cache_path",
    "candidates",
    "contenders",
    "cpu_model",
    "measured_alternatives",
    "rank",
    "resolve_auto",
    "time_learner_step",
    "trial_run",
]
