"""The analysis notebooks run headless, end to end, on tiny real sweeps made by the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from leakcheck import schema_defaults

pd = pytest.importorskip("pandas")

nbformat = pytest.importorskip("nbformat")
nbconvert_execute = pytest.importorskip("nbconvert.preprocessors")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"

# Seconds, not minutes: the point is that the notebooks run on what the CLI really writes.
TINY = (
    "env=cartpole",
    "model=mlp",
    "total_frames=3000",
    "batch_size=4",
    "unroll_length=10",
    "log_interval_s=0.2",
    "wandb.mode=disabled",
    "progress=false",
)
SWEEPS = {
    # compare_cartpole's grid at one seed, each cell with its own layout: two of its cells
    # (a3c, a3c_160) are the same algo, which the notebook must not pool.
    "baselines": ("experiment=compare_cartpole", "compare_cell=impala,a2c,a3c,a3c_160", "seed=0"),
    # The lag study's grid, shrunk: two lags, replay at lag 0, two corrections, one seed.
    "lag": (
        "num_actors=2",
        "envs_per_actor=2",
        "experiment=lag_study",
        "lag_cell=L0,L8,L0_replay",
        "algo.correction=vtrace,none",
        "seed=0",
    ),
}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both sweeps, run at once: a point spends most of its few seconds starting processes
    (imports), which two sweeps overlap well even on two cores."""
    root = tmp_path_factory.mktemp("sweeps")
    procs = {}
    for name, overrides in SWEEPS.items():
        cmd = [
            sys.executable,
            "-m",
            "impala_gpu",
            "-m",
            *schema_defaults(overrides),
            *overrides,
            *TINY,
        ]
        # A file, not a pipe: a sweep must never stall on output nobody is reading yet.
        with open(root / f"{name}.log", "w") as log:
            procs[name] = subprocess.Popen(
                [*cmd, f"hydra.sweep.dir={root / name}"],
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    try:
        for proc in procs.values():
            proc.wait(timeout=240)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name, proc in procs.items():
        log_text = (root / f"{name}.log").read_text()
        assert proc.returncode == 0, f"sweep {name} failed:\n{log_text[-4000:]}"
    return {name: root / name for name in SWEEPS}


def execute(notebook: str, monkeypatch: pytest.MonkeyPatch, *extra: str, **env: str):
    """Run every cell in a fresh kernel (which inherits ``env``) from the notebooks folder, as
    Jupyter would; a cell that raises fails the test with its traceback. ``extra``: code cells
    run after the notebook's own (to print what a test compares)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOKS / notebook, as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(src) for src in extra]
    ep = nbconvert_execute.ExecutePreprocessor(timeout=120, kernel_name="python3")
    ep.preprocess(nb, {"metadata": {"path": str(NOTEBOOKS)}})
    return nb


def outputs_of(nb) -> tuple[int, str]:
    """(number of PNG figures, all text) of an executed notebook, in cell order: what cells
    print, and the plain-text form of what they ``display`` (tables)."""
    figures, text = 0, []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", out
            data = out.get("data", {})
            if out.output_type == "stream":
                text.append(out.text)
            elif "image/png" in data:
                figures += 1
            elif "text/plain" in data:
                text.append(data["text/plain"] + "\n")
    return figures, "".join(text)


def test_committed_without_outputs() -> None:
    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path.name


# Printed after the notebook's cells: its CartPole summary table, as sweep_report's JSON has it.
TABLE_JSON = "TABLE_JSON "
PRINT_TABLE = (
    f"import json; print({TABLE_JSON!r} + "
    "json.dumps(tables['CartPole-v1'].to_dict(orient='records')))"
)
CELLS = ("impala", "a2c", "a3c", "a3c_160")


@pytest.fixture(scope="module")
def compare_baselines(sweeps: dict[str, Path]) -> tuple[int, str]:
    """The notebook run once on the compare sweep: (figures, text). A threshold the tiny
    runs reach, so the time-to-threshold path runs too."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        nb = execute(
            "compare_baselines.ipynb",
            monkeypatch,
            PRINT_TABLE,
            IMPALA_SWEEP_DIR=str(sweeps["baselines"]),
            IMPALA_THRESHOLD="5",
        )
    return outputs_of(nb)


@pytest.mark.slow
def test_compare_baselines(compare_baselines: tuple[int, str]) -> None:
    figures, text = compare_baselines
    assert figures >= 2  # return curves, throughput bars
    assert "grouped by: ['compare_cell']" in text
    assert "CartPole-v1: " in text and "was the fastest at" in text  # four cells compared
    # The summary table lists every cell; the conclusion names only the ones that stand out.
    table = text.split("CartPole-v1  (threshold: 5.0)")[1].split("CartPole-v1: ")[0]
    assert all(cell in table for cell in CELLS), table
    assert "needed the fewest frames" in text
    # The run-by-run table, at the env's milestones: the tiny runs pass 100, not 475.
    times = text.split("CartPole-v1: frames and seconds to [100.0, 475.0]")[1]
    assert all(cell in times for cell in CELLS), times


@pytest.mark.slow
def test_compare_baselines_table_is_sweep_reports(
    compare_baselines: tuple[int, str], sweeps: dict[str, Path], tmp_path: Path
) -> None:
    """The notebook groups as the README's figures do (``python -m benchmarks.sweep_report --by
    compare_cell``): one row per compare cell, the two A3C layouts apart, the same numbers."""
    _, text = compare_baselines
    line = next(ln for ln in text.splitlines() if ln.startswith(TABLE_JSON))
    notebook = pd.DataFrame(json.loads(line.removeprefix(TABLE_JSON)))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sweep_report", str(sweeps["baselines"]),
         "--threshold", "5", "--by", "compare_cell", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (report,) = tmp_path.glob("sweep_*.json")
    script = pd.DataFrame(json.loads(report.read_text())["table"])
    assert sorted(notebook["compare_cell"]) == sorted(CELLS) and set(notebook["runs"]) == {1}
    pd.testing.assert_frame_equal(notebook, script)


@pytest.mark.slow
def test_policy_lag(sweeps: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    nb = execute("policy_lag.ipynb", monkeypatch, IMPALA_LAG_SWEEP_DIR=str(sweeps["lag"]))
    figures, text = outputs_of(nb)
    assert figures >= 3  # curves per cell, return/diagnostics against lag, lag histograms
    assert (
        "corrections ['vtrace', 'none']; settings ['lag 0', 'lag 0, 50% replay', 'lag 8']" in text
    )
    assert "Mean final return over seeds, with 95% bootstrap intervals." in text
    assert "lag 8: V-trace" in text


@pytest.mark.slow
def test_policy_lag_without_histograms(
    sweeps: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Runs that wrote no lag_hist.json (older ones) fall back to the logged mean/p95/max."""
    copy = shutil.copytree(sweeps["lag"], tmp_path / "lag")
    for path in copy.glob("*/lag_hist.json"):
        path.unlink()
    nb = execute("policy_lag.ipynb", monkeypatch, IMPALA_LAG_SWEEP_DIR=str(copy))
    figures, text = outputs_of(nb)
    assert figures >= 2
    assert "no lag_hist.json in these runs" in text


@pytest.mark.slow
def test_lag_study_script_writes_the_table_and_the_figure(sweeps: dict[str, Path], tmp_path):
    png, md = tmp_path / "lag_study.png", tmp_path / "lag_study.md"
    proc = subprocess.run(
        [sys.executable, "-m", "impala_gpu.reports.lag_study", str(sweeps["lag"]),
         "--png", str(png), "--md", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert png.stat().st_size > 10_000
    rows = [ln for ln in md.read_text().splitlines() if ln.startswith("| V-trace") or
            ln.startswith("| no correction")]  # fmt: skip
    assert len(rows) == 6  # 2 corrections x (lag 0, lag 0 with replay, lag 8)
    assert "| V-trace | 8 | 0% | 1 |" in md.read_text()
    assert "Mean final return over seeds" in md.read_text()


@pytest.mark.slow
def test_compare_report_writes_the_table_and_the_figure(sweeps: dict[str, Path], tmp_path):
    png, md = tmp_path / "compare.png", tmp_path / "compare.md"
    proc = subprocess.run(
        [sys.executable, "-m", "impala_gpu.reports.compare", str(sweeps["baselines"]),
         "--thresholds", "5,1e9", "--png", str(png), "--md", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert png.stat().st_size > 10_000
    rows = {ln.split(" | ")[0][2:]: ln for ln in md.read_text().splitlines()[2:]}
    assert set(rows) == {"a2c", "a3c", "impala"}
    for algo, row in rows.items():
        to_5, to_1e9 = row.split(" | ")[2:4]
        assert to_5.endswith(" min") and "M, " in to_5  # CartPole's first episodes pass 5
        assert to_1e9.startswith("not in ") and to_1e9.endswith("M")  # nobody gets to 1e9
        assert (" — | " in row) == (algo == "a3c")  # A3C has no central learner to be busy
