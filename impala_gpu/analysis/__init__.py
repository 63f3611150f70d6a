"""Load training runs and Hydra sweeps into pandas, and turn them into curves, tables and text.

A run directory holds ``config.yaml`` (the resolved config) and ``metrics.jsonl`` (one JSON
object per log interval); optionally ``lag_hist.json`` (the whole run's per-sample policy lag
histogram) and, for a failed sweep point, ``error.txt``. A sweep is any directory tree of run
directories, e.g. ``multirun/<date>/<time>/``.

Everything here is read-only and pure: functions take paths or DataFrames and return new ones.
Typical use (what the notebooks in ``notebooks/`` do)::

    df = load_sweep("multirun/2026-11-30/14-00-00")
    keys = summary_keys(df)  # algo, or the swept cells that tell runs apart (compare_cell)
    band = curves(df, x="frames", y="episode_return", by=keys)
    table = summary_table(df, threshold=475)
    print(conclusion(table))
"""

from impala_gpu.analysis.conclusions import CORRECTION_LABELS, conclusion, group_label
from impala_gpu.analysis.runs import (
    CONFIG_FILE,
    ERROR_FILE,
    IMPALA_ALGOS,
    LAG_HIST_FILE,
    METRIC_COLUMNS,
    METRICS_FILE,
    OVERRIDE_COLUMNS,
    RUN_COLUMNS,
    Run,
    find_runs,
    latest_sweep,
    load_run,
    load_runs,
    load_sweep,
    metrics_path,
    overrides,
    read_lag_hist,
    read_metrics,
    runs_frame,
)
from impala_gpu.analysis.study import (
    STUDY_KEYS,
    area_under_curve,
    bootstrap_ci,
    collapsed,
    decimals,
    interval,
    per_run,
    study_conclusion,
    study_table,
)
from impala_gpu.analysis.summaries import (
    curves,
    frames_to_threshold,
    lag_histograms,
    lag_summary,
    seconds_to_threshold,
    summary_keys,
    summary_table,
    swept_keys,
    threshold_times,
)

__all__ = [
    "CONFIG_FILE",
    "CORRECTION_LABELS",
    "ERROR_FILE",
    "IMPALA_ALGOS",
    "LAG_HIST_FILE",
    "METRICS_FILE",
    "METRIC_COLUMNS",
    "OVERRIDE_COLUMNS",
    "RUN_COLUMNS",
    "Run",
    "find_runs",
    "latest_sweep",
    "load_run",
    "load_runs",
    "load_sweep",
    "metrics_path",
    "overrides",
    "read_lag_hist",
    "read_metrics",
    "runs_frame",
    "STUDY_KEYS",
    "area_under_curve",
    "bootstrap_ci",
    "collapsed",
    "decimals",
    "interval",
    "per_run",
    "study_conclusion",
    "study_table",
    "conclusion",
    "curves",
    "frames_to_threshold",
    "group_label",
    "lag_histograms",
    "lag_summary",
    "seconds_to_threshold",
    "summary_keys",
    "summary_table",
    "swept_keys",
    "threshold_times",
]
