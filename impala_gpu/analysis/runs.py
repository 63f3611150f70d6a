"""Load training runs and Hydra sweeps into pandas DataFrames (read-only, pure)."""

from __future__ import annotations

import gzip
import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
LAG_HIST_FILE = "lag_hist.json"
ERROR_FILE = "error.txt"
EVENTS_FILE = "events.jsonl"
MACHINE_FILE = "machine.json"  # {"cpu_model": ...}: the CPU of a run whose events lack it

#: Per-run columns ``load_sweep`` derives from each run's config (the rest come from metrics).
RUN_COLUMNS = (
    "run",
    "algo",
    "env",
    "seed",
    "refresh_every",
    "correction",
    "bounded_lag",
    "replay",
    "failed",
)

#: Metric columns the tables and plots read. Missing ones are added as NaN (e.g. a3c logs no
#: learner_busy), so callers never need to test for a column's presence.
METRIC_COLUMNS = (
    "frames",
    "agent_steps",
    "elapsed_s",
    "frames_per_s",
    "learner_busy",
    "learner_wait",
    "learner_overhead",
    "episode_return",
    "episode_length",
    "policy_lag_mean",
    "policy_lag_p95",
    "policy_lag_max",
    "replay_lag_mean",
    "mean_abs_log_rho",
    "kl_behavior_target",
)

#: Swept override keys whose value a ``RUN_COLUMNS`` column already holds (read from the
#: resolved config, typed): grouping by the key groups by that column.
OVERRIDE_COLUMNS = {
    "algo": "algo",
    "env": "env",
    "seed": "seed",
    "refresh_every": "refresh_every",
    "algo.correction": "correction",
    "bounded_lag": "bounded_lag",
    "replay.proportion": "replay",
}

#: The algos that share IMPALA's asynchronous pipeline: the V-trace ablation compares these.
IMPALA_ALGOS = ("impala", "impala_nocorrection")


@dataclass(frozen=True)
class Run:
    """One run directory, loaded.

    Attributes:
        path: the run directory.
        config: the resolved config as a nested plain dict.
        metrics: one row per ``metrics.jsonl`` line; JSON nulls are NaN; every name in
            ``METRIC_COLUMNS`` is present.
        lag_hist: ``{"bins": [...], "counts": [...]}`` from ``lag_hist.json``, or None when the
            file is absent or unreadable.
        failed: ``error.txt`` is present (the point raised; its metrics may be partial).
        error: the text of ``error.txt``, or None.
    """

    path: Path
    config: dict[str, Any]
    metrics: pd.DataFrame
    lag_hist: dict[str, list[float]] | None
    failed: bool
    error: str | None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def overrides(self) -> dict[str, str]:
        """The overrides its sweep point was run with, from its directory name."""
        return overrides(self.name)

    def get(self, dotted: str, default: Any = None) -> Any:
        """The config's value at ``dotted`` (``"algo.learning_rate"``), or ``default``."""
        return _get(self.config, dotted, default)

    @property
    def algo(self) -> str:
        return str(_get(self.config, "algo.name", "unknown"))

    @property
    def env(self) -> str:
        return str(_get(self.config, "env.id", "unknown"))

    @property
    def seed(self) -> int | None:
        seed = _get(self.config, "seed", None)
        return None if seed is None else int(seed)

    @property
    def refresh_every(self) -> int:
        # Runs from before refresh_every existed refreshed weights on every update.
        return int(_get(self.config, "refresh_every", 1) or 1)

    @property
    def bounded_lag(self) -> int:
        """The exact policy lag the run imposed (``bounded_lag``), or -1 when it imposed none."""
        lag = _get(self.config, "bounded_lag", None)
        return -1 if lag is None else int(lag)

    @property
    def replay(self) -> float:
        """``replay.proportion``: the replayed fraction of each batch (0 for older runs)."""
        return float(_get(self.config, "replay.proportion", 0.0) or 0.0)

    @property
    def correction(self) -> str:
        """The learner's off-policy correction: vtrace, none or is1 (``rl/losses.py``)."""
        if self.algo == "impala_nocorrection":
            return "none"
        # Older configs lack the key (only plain impala corrected by default then) or hold a
        # bool (True: V-trace).
        value = _get(self.config, "algo.correction", self.algo == "impala")
        if isinstance(value, bool):
            return "vtrace" if value else "none"
        return str(value)


def overrides(run: str | os.PathLike[str]) -> dict[str, str]:
    """The overrides in a sweep point's directory name (Hydra's sweep subdir here is
    ``<job num>_<override_dirname>``): ``3_compare_cell=a3c,seed=0`` -> ``{"compare_cell":
    "a3c", "seed": "0"}``. Values are strings as typed; a name without ``=`` gives ``{}``.
    Accepts a path or a ``load_sweep`` ``run`` label (its last part is the directory)."""
    name = Path(run).name
    name = name.split("_", 1)[1] if name.split("_", 1)[0].isdigit() and "_" in name else name
    return dict(kv.split("=", 1) for kv in name.split(",") if "=" in kv)


def _get(config: dict[str, Any], dotted: str, default: Any) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``, or ``default`` when any level is missing."""
    node: Any = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def run_machine(run_dir: str | os.PathLike[str]) -> tuple[str, str]:
    """(CPU, learner device) a run recorded: its ``events.jsonl`` start events' ``cpu_model``
    (or ``cpu``) and ``device`` fields, else the CPU in its ``machine.json`` (for runs from
    before the start event named it); "not recorded" when neither names the CPU. A run resumed
    on another machine lists each, joined by " + "."""
    run_dir = Path(run_dir)
    cpus: list[str] = []
    devices: list[str] = []
    events = run_dir / EVENTS_FILE
    if events.is_file():
        for line in events.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if not isinstance(event, dict) or event.get("event") != "start":
                continue
            cpu = event.get("cpu_model") or event.get("cpu")
            if cpu and cpu not in cpus:
                cpus.append(str(cpu))
            if event.get("device") and event["device"] not in devices:
                devices.append(str(event["device"]))
    stamp = run_dir / MACHINE_FILE
    if not cpus and stamp.is_file():
        info = json.loads(stamp.read_text())
        cpu = info.get("cpu_model") or info.get("cpu")
        if cpu:
            cpus.append(str(cpu))
    return (" + ".join(cpus) or "not recorded", " + ".join(devices) or "?")


def find_runs(root: str | os.PathLike[str], *, include_failed: bool = False) -> list[Path]:
    """Every directory under ``root`` (recursively, ``root`` included) that is a run.

    A run holds ``metrics.jsonl`` and ``config.yaml``. With ``include_failed``, a directory
    holding ``config.yaml`` and ``error.txt`` but no metrics (a point that failed before its
    first log line) counts too. Hydra's ``.hydra/`` folders hold a config.yaml but no metrics,
    so they never match. Sorted, so sweeps load in a stable order.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no such directory: {root}")
    found = []
    # os.walk lists a symlinked root (e.g. multirun/latest) but does not follow links below it.
    for dirpath, _dirnames, filenames in os.walk(root):
        names = set(filenames)
        if CONFIG_FILE not in names:
            continue
        has_metrics = METRICS_FILE in names or METRICS_FILE + ".gz" in names
        if has_metrics or (include_failed and ERROR_FILE in names):
            found.append(Path(dirpath))
    return sorted(found)


def latest_sweep(root: str | os.PathLike[str]) -> Path:
    """The newest sweep under a Hydra ``multirun/`` folder.

    A sweep is a directory whose children are runs; Hydra names them ``<date>/<time>``, so
    the newest is the last by path below ``root``. Returns ``root`` itself when its runs sit
    directly in it (it already is a sweep, or a symlink to one) or when it holds no runs.
    """
    root = Path(root)
    parents = {p.parent for p in find_runs(root, include_failed=True)} if root.is_dir() else set()
    if not parents or root in parents:
        return root
    return max(parents, key=lambda p: p.relative_to(root).as_posix())


def _read_config(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    # OmegaConf's loader, not bare PyYAML: it reads floats such as 1e-08 as floats.
    node = OmegaConf.load(path)
    out = OmegaConf.to_container(node, resolve=False)
    return out if isinstance(out, dict) else {}


def metrics_path(run_dir: str | os.PathLike[str]) -> Path:
    """A run dir's metrics file: ``metrics.jsonl``, or ``metrics.jsonl.gz`` when only that is
    there (a run archived into the repo)."""
    plain = Path(run_dir) / METRICS_FILE
    gz = plain.with_name(METRICS_FILE + ".gz")
    return gz if not plain.exists() and gz.exists() else plain


def read_metrics(path: str | os.PathLike[str]) -> pd.DataFrame:
    """``metrics.jsonl`` (or a gzipped ``metrics.jsonl.gz``, as runs kept in the repo are) as a
    DataFrame: nulls become NaN, unparsable lines are skipped.

    A run killed mid-write can leave a truncated last line; dropping it keeps the rest usable.
    Every name in ``METRIC_COLUMNS`` is present (NaN when the run did not log it).
    """
    rows = []
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                rows.append(obj)
    df = pd.DataFrame.from_records(rows)
    for col in METRIC_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
    for col in df.columns:
        if df[col].isna().all():
            # An all-null column comes back as object dtype; make it float so math works.
            df[col] = df[col].astype("float64")
        elif df[col].dtype == object:
            try:
                df[col] = pd.to_numeric(df[col])
            except (TypeError, ValueError):
                pass  # a genuinely non-numeric field: keep it as is
    return df.reset_index(drop=True)


def read_lag_hist(path: str | os.PathLike[str]) -> dict[str, list[float]] | None:
    """``lag_hist.json`` as ``{"bins": [...], "counts": [...]}``, or None if absent or bad.

    ``bins`` is either one value per count (``counts[k]`` samples had lag ``bins[k]``) or the
    ``len(counts) + 1`` edges of the bins; ``lag_histograms`` handles both.
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text())
        bins = [float(b) for b in obj["bins"]]
        counts = [float(c) for c in obj["counts"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        warnings.warn(f"ignoring unreadable {path}: {e}", stacklevel=2)
        return None
    if len(bins) not in (len(counts), len(counts) + 1):
        warnings.warn(f"ignoring {path}: {len(bins)} bins for {len(counts)} counts", stacklevel=2)
        return None
    return {"bins": bins, "counts": counts}


def load_run(path: str | os.PathLike[str]) -> Run:
    """Load one run directory (see ``Run``). A failed point may lack ``metrics.jsonl``."""
    path = Path(path)
    metrics_file = metrics_path(path)
    metrics = read_metrics(metrics_file) if metrics_file.is_file() else _empty_metrics()
    error_path = path / ERROR_FILE
    error = error_path.read_text() if error_path.is_file() else None
    return Run(
        path=path,
        config=_read_config(path / CONFIG_FILE),
        metrics=metrics,
        lag_hist=read_lag_hist(path / LAG_HIST_FILE),
        failed=error is not None,
        error=error,
    )


def _empty_metrics() -> pd.DataFrame:
    return pd.DataFrame({col: pd.Series(dtype="float64") for col in METRIC_COLUMNS})


def load_runs(root: str | os.PathLike[str], *, include_failed: bool = False) -> list[Run]:
    """``load_run`` for every run under ``root``. Failed points are left out unless asked for:
    their partial curves would otherwise pull down their group's averages."""
    runs = [load_run(p) for p in find_runs(root, include_failed=include_failed)]
    return runs if include_failed else [r for r in runs if not r.failed]


def _run_label(run: Run, root: Path) -> str:
    # The directory name, made unique by its path below root when a tree holds several sweeps
    # (every sweep numbers its points from 0).
    try:
        rel = run.path.relative_to(root).as_posix()
    except ValueError:
        rel = run.name
    return run.name if rel in ("", ".") else rel


def runs_frame(runs: Iterable[Run], root: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """Long format: one row per metrics line of every run, with ``RUN_COLUMNS`` in front,
    then one column per swept override key that those do not hold (``compare_cell``,
    ``lag_cell``, ``lr``...: strings, NaN for runs without it; see ``overrides``)."""
    base = Path(root) if root is not None else None
    frames = []
    for run in runs:
        df = run.metrics.copy()
        info = {
            "run": _run_label(run, base) if base is not None else run.name,
            "algo": run.algo,
            "env": run.env,
            "seed": run.seed,
            "refresh_every": run.refresh_every,
            "correction": run.correction,
            "bounded_lag": run.bounded_lag,
            "replay": run.replay,
            "failed": run.failed,
        }
        # Then each swept override that no column above already holds (e.g. compare_cell).
        for key, value in run.overrides.items():
            if key not in OVERRIDE_COLUMNS and key not in info and key not in df.columns:
                info[key] = value
        for i, (key, value) in enumerate(info.items()):
            df.insert(i, key, value)
        frames.append(df)
    if not frames:
        empty = {c: pd.Series(dtype="object") for c in RUN_COLUMNS}
        return pd.DataFrame({**empty, **_empty_metrics().to_dict("series")})
    # Runs can log different metric sets (a3c vs impala); concat takes the union, NaN-filled.
    nonempty = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(nonempty, ignore_index=True)


def load_sweep(root: str | os.PathLike[str], *, include_failed: bool = False) -> pd.DataFrame:
    """Every run under ``root`` in long format: one row per metrics line.

    Columns: ``run`` (the run's directory name, prefixed by its path below ``root`` when the
    tree holds several sweeps), ``algo``, ``env``, ``seed``, ``refresh_every`` (1 for runs that
    predate it), ``correction``, ``bounded_lag`` (-1: none), ``replay`` (the replayed
    proportion), ``failed``, the swept override keys those do not hold (``runs_frame``), then
    the metric columns.
    """
    return runs_frame(load_runs(root, include_failed=include_failed), root)
