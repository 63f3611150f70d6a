"""impala_gpu.analysis against synthetic run directories whose numbers are worked out by hand."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from impala_gpu import analysis as A


def write_run(
    path: Path,
    config: dict[str, Any],
    lines: list[dict[str, Any]] | None,
    *,
    lag_hist: dict[str, list[float]] | None = None,
    error: str | None = None,
    tail: str = "",
) -> Path:
    """A run directory as the runtime writes it (``tail``: raw text after the last line)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    if lines is not None:
        text = "".join(json.dumps(line) + "\n" for line in lines)
        (path / "metrics.jsonl").write_text(text + tail)
    if lag_hist is not None:
        (path / "lag_hist.json").write_text(json.dumps(lag_hist))
    if error is not None:
        (path / "error.txt").write_text(error)
    return path


def cfg(algo: str, seed: int, **extra: Any) -> dict[str, Any]:
    algo_cfg: dict[str, Any] = {"name": algo, "learning_rate": 0.0006, "adam_eps": 1e-8}
    if "correction" in extra:
        algo_cfg["correction"] = extra.pop("correction")
    return {"algo": algo_cfg, "env": {"id": "CartPole-v1"}, "seed": seed, **extra}


KEYS = ("frames", "elapsed_s", "frames_per_s", "learner_busy", "policy_lag_mean", "episode_return")


def rows(*values: tuple, **const: Any) -> list[dict[str, Any]]:
    return [{**dict(zip(KEYS, v, strict=True)), **const} for v in values]


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """impala seeds 0 and 1, an old a3c run, a failed point with one line, one with none.

    Steady windows (first line dropped) of impala: frames/s 100, 110, 120, 80, 90 (median
    100); learner_busy .5 .7 .9 .6 .8 (mean .7); policy lag 2 2 4 3 3 (mean 2.8). Final
    returns 30 and 40 (mean 35). Return 20 is first reached at 300 frames / 3 s (seed 0) and
    200 frames / 4 s (seed 1): means 250 frames, 3.5 s.
    """
    root = tmp_path / "multirun" / "2026-11-30" / "14-00-00"
    a = write_run(
        root / "0_algo=impala,seed=0",
        cfg("impala", 0, correction=True, refresh_every=1),
        [
            *rows((100, 1.0, 50, 0.2, 1.0, None), policy_lag_p95=2.0, policy_lag_max=3.0),
            *rows((200, 2.0, 100, 0.5, 2.0, 10), policy_lag_p95=3.0, policy_lag_max=4.0),
            *rows((300, 3.0, 110, 0.7, 2.0, 20), policy_lag_p95=3.0, policy_lag_max=4.0),
            *rows((400, 4.0, 120, 0.9, 4.0, 30), policy_lag_p95=5.0, policy_lag_max=6.0),
        ],
        lag_hist={"bins": [0, 1, 2], "counts": [1, 2, 3]},
    )
    (a / ".hydra").mkdir()
    (a / ".hydra" / "config.yaml").write_text("seed: 0\n")  # no metrics: not a run
    write_run(
        root / "1_algo=impala,seed=1",
        cfg("impala", 1, correction=True, refresh_every=1),
        rows(
            (100, 2.0, 60, 0.4, 1.0, 0),
            (200, 4.0, 80, 0.6, 3.0, 20),
            (400, 8.0, 90, 0.8, 3.0, 40),  # no line at 300 frames: interpolated
        ),
        lag_hist={"bins": [0, 1, 2, 3], "counts": [2, 0, 0, 1]},
    )
    # An a3c run from before refresh_every and algo.correction existed: no learner_busy, no
    # lag fields, and a truncated last line (killed mid-write).
    write_run(
        root / "2_algo=a3c,seed=0",
        {"algo": {"name": "a3c"}, "env": {"id": "CartPole-v1"}, "seed": 0},
        [
            {"frames": 100, "elapsed_s": 0.5, "frames_per_s": 400, "episode_return": 5},
            {"frames": 200, "elapsed_s": 1.0, "frames_per_s": 500, "episode_return": 15},
            {"frames": 300, "elapsed_s": 1.5, "frames_per_s": 600, "episode_return": 25},
        ],
        tail='{"frames": 4',
    )
    write_run(
        root / "3_algo=impala,seed=2",
        cfg("impala", 2, correction=True, refresh_every=1),
        rows((100, 1.0, 10, 0.1, 1.0, 1000)),
        error="sweep point: seed=2\n\nTraceback ...\nRuntimeError: actor process died\n",
    )
    write_run(
        root / "4_algo=impala,seed=3",
        cfg("impala", 3, correction=True, refresh_every=1),
        None,
        error="sweep point: seed=3\n\nValueError: bad config\n",
    )
    return root


@pytest.fixture
def lag_sweep(tmp_path: Path) -> Path:
    """impala with and without correction at refresh_every 1 and 5, two seeds each.

    Final returns: K=1 V-trace 100, 110 (mean 105, std 7.07) vs none 98, 106 (102): a gap of
    3, inside the spread. K=5 V-trace 100, 104 (102) vs none 50, 54 (52): V-trace higher.
    """
    root = tmp_path / "lag"
    finals = {
        (1, True): (100, 110),
        (1, False): (98, 106),
        (5, True): (100, 104),
        (5, False): (50, 54),
    }
    i = 0
    for (k, corr), values in finals.items():
        for seed, final in enumerate(values):
            write_run(
                root / f"{i}_refresh_every={k},correction={corr},seed={seed}",
                cfg("impala", seed, correction=corr, refresh_every=k),
                rows((100, 1.0, 100, 0.5, k, 0), (200, 2.0, 100, 0.5, k + 1, final)),
                lag_hist={"bins": [0, 2, 4], "counts": [3, 1]} if k == 5 else None,
            )
            i += 1
    return root


def test_find_runs(sweep: Path) -> None:
    names = [p.name for p in A.find_runs(sweep)]
    assert names == [
        "0_algo=impala,seed=0",
        "1_algo=impala,seed=1",
        "2_algo=a3c,seed=0",
        "3_algo=impala,seed=2",
    ]
    with_failed = [p.name for p in A.find_runs(sweep.parents[1], include_failed=True)]
    assert with_failed == [*names, "4_algo=impala,seed=3"]
    with pytest.raises(FileNotFoundError):
        A.find_runs(sweep / "nope")


def test_load_run(sweep: Path) -> None:
    run = A.load_run(sweep / "0_algo=impala,seed=0")
    assert (run.algo, run.env, run.seed, run.refresh_every, run.correction) == (
        "impala",
        "CartPole-v1",
        0,
        1,
        "vtrace",
    )
    assert run.config["algo"]["adam_eps"] == pytest.approx(1e-8)
    assert run.lag_hist == {"bins": [0, 1, 2], "counts": [1, 2, 3]}
    assert not run.failed and run.error is None
    assert math.isnan(run.metrics["episode_return"].iloc[0])  # JSON null
    assert run.metrics["frames"].tolist() == [100, 200, 300, 400]

    old = A.load_run(sweep / "2_algo=a3c,seed=0")
    assert len(old.metrics) == 3  # the truncated line is dropped
    assert old.refresh_every == 1 and old.correction == "none" and old.lag_hist is None
    assert old.metrics["learner_busy"].isna().all()  # never logged: NaN, not missing

    failed = A.load_run(sweep / "4_algo=impala,seed=3")
    assert failed.failed and "bad config" in (failed.error or "")
    assert failed.metrics.empty and "frames" in failed.metrics.columns


def test_load_sweep(sweep: Path) -> None:
    df = A.load_sweep(sweep)
    assert list(df.columns[: len(A.RUN_COLUMNS)]) == list(A.RUN_COLUMNS)
    assert len(df) == 4 + 3 + 3  # failed points left out
    assert df.groupby("algo")["run"].nunique().to_dict() == {"a3c": 1, "impala": 2}
    assert set(df["refresh_every"]) == {1}
    assert df.loc[df["algo"] == "a3c", "correction"].eq("none").all()
    assert not df["failed"].any()

    with_failed = A.load_sweep(sweep, include_failed=True)
    assert len(with_failed) == 11 and with_failed["failed"].sum() == 1

    # Several sweeps under one root: the run label keeps their points apart.
    assert A.load_sweep(sweep.parent)["run"].iloc[0] == "14-00-00/0_algo=impala,seed=0"


def test_curves_interpolates_and_aggregates(sweep: Path) -> None:
    df = A.load_sweep(sweep)
    c = A.curves(df, by="algo", grid=[100, 150, 200, 300, 400])
    imp = c[c["algo"] == "impala"].set_index("frames")
    # Seed 0 has no return at 100 frames, so "all" coverage starts at 200.
    assert imp.index.tolist() == [200, 300, 400]
    assert imp["mean"].tolist() == pytest.approx([15, 25, 35])  # seed 1 at 300: 30 (interp)
    assert imp["min"].tolist() == pytest.approx([10, 20, 30])
    assert imp["max"].tolist() == pytest.approx([20, 30, 40])
    assert imp["std"].tolist() == pytest.approx([math.sqrt(50)] * 3)
    assert imp["n"].tolist() == [2, 2, 2]
    a3c = c[c["algo"] == "a3c"]
    assert a3c["frames"].tolist() == [100, 150, 200, 300]  # no extrapolation past 300
    assert a3c["mean"].tolist() == pytest.approx([5, 10, 15, 25])
    assert a3c["std"].isna().all()  # one run: no spread

    anyc = A.curves(df[df["algo"] == "impala"], grid=[100, 150, 200], coverage="any")
    assert anyc["mean"].tolist() == pytest.approx([0, 10, 15])
    assert anyc["n"].tolist() == [1, 1, 2]
    assert math.isnan(anyc["std"].iloc[0])

    by_time = A.curves(df[df["algo"] == "impala"], x="elapsed_s", grid=4)
    # grid: linspace over every return-bearing elapsed_s (2 .. 8); seed 0 ends at 4 s.
    assert by_time["elapsed_s"].tolist() == pytest.approx([2, 4])
    assert by_time["mean"].tolist() == pytest.approx([(10 + 0) / 2, (30 + 20) / 2])

    with pytest.raises(ValueError):
        A.curves(df, coverage="some")


def test_thresholds() -> None:
    m = pd.DataFrame(
        {
            "frames": [100, 200, 300, 400],
            "elapsed_s": [1.0, 2.5, 3.0, 4.0],
            "episode_return": [np.nan, 19.9, 20.0, 10.0],
        }
    )
    assert A.frames_to_threshold(m, 20) == 300  # >=, first line only
    assert A.seconds_to_threshold(m, 20) == 3.0
    assert A.frames_to_threshold(m, 15) == 200
    assert math.isnan(A.frames_to_threshold(m, 21))
    assert math.isnan(A.seconds_to_threshold(m, 21))


def test_summary_table(sweep: Path) -> None:
    df = A.load_sweep(sweep)
    assert A.summary_keys(df) == ["algo"]  # correction differs across algos only
    t = A.summary_table(df, threshold=20).set_index("algo")
    assert t.attrs["threshold"] == 20
    imp, a3c = t.loc["impala"], t.loc["a3c"]
    assert imp["runs"] == 2 and a3c["runs"] == 1
    assert imp["frames_per_s"] == pytest.approx(100)
    assert imp["learner_busy"] == pytest.approx(0.7)
    assert imp["policy_lag_mean"] == pytest.approx(2.8)
    assert imp["final_return"] == pytest.approx(35)
    assert imp["final_return_std"] == pytest.approx(math.sqrt(50))
    assert imp["reached"] == 2
    assert imp["frames_to_threshold"] == pytest.approx(250)
    assert imp["seconds_to_threshold"] == pytest.approx(3.5)
    assert a3c["frames_per_s"] == pytest.approx(550)
    assert math.isnan(a3c["learner_busy"]) and math.isnan(a3c["policy_lag_mean"])
    assert a3c["final_return"] == pytest.approx(25) and math.isnan(a3c["final_return_std"])
    assert a3c["frames_to_threshold"] == 300 and a3c["seconds_to_threshold"] == 1.5

    none = A.summary_table(df)
    assert "frames_to_threshold" not in none.columns and none.attrs["threshold"] is None
    never = A.summary_table(df, threshold=1000).set_index("algo")
    assert never["reached"].tolist() == [0, 0]
    assert never["frames_to_threshold"].isna().all()


def test_threshold_times_lists_every_run(sweep: Path) -> None:
    df = A.load_sweep(sweep)
    t = A.threshold_times(df, [15, 20, 1000])
    assert t["algo"].tolist() == ["a3c", "impala", "impala"] and t["seed"].tolist() == [0, 0, 1]
    a3c, imp0, imp1 = (row for _, row in t.iterrows())
    assert a3c["frames"] == 300 and imp0["frames"] == 400 and imp1["frames"] == 400
    # The first logged line at or above each return (the fixture's docstring).
    assert (a3c["frames_to_15"], a3c["seconds_to_15"]) == (200, 1.0)
    assert (imp0["frames_to_20"], imp0["seconds_to_20"]) == (300, 3.0)
    assert (imp1["frames_to_15"], imp1["seconds_to_20"]) == (200, 4.0)
    assert t["frames_to_1000"].isna().all() and t["seconds_to_1000"].isna().all()
    assert list(A.threshold_times(df.iloc[0:0], [5]).columns) == [
        "run",
        "algo",
        "seed",
        "frames",
        "frames_to_5",
        "seconds_to_5",
    ]


def test_conclusion_reads_the_numbers(sweep: Path) -> None:
    df = A.load_sweep(sweep)
    text = A.conclusion(A.summary_table(df, threshold=20))
    assert "a3c was the fastest at 550 frames/s" in text
    assert "5.5x the slowest, impala (100)" in text
    assert "impala reached the best final return: 35 ± 7.07" in text
    assert "impala needed the fewest frames (250, 2/2 runs)" in text
    assert "a3c the least wall-clock time (1.5 s, 1/1 runs)" in text
    assert "V-trace" not in text  # nothing to compare: no lag sentence

    # Change the numbers and the text follows: nothing is hard-coded.
    t = A.summary_table(df, threshold=20)
    t.loc[t["algo"] == "impala", "frames_per_s"] = 10_000.0
    t.loc[t["algo"] == "a3c", "final_return"] = 99.0
    flipped = A.conclusion(t)
    assert "impala was the fastest at 10,000 frames/s" in flipped
    assert "a3c reached the best final return: 99" in flipped

    assert "No configuration reached a return of 1,000" in A.conclusion(
        A.summary_table(df, threshold=1000)
    )
    assert A.conclusion(A.summary_table(df.iloc[0:0])) == "No runs to compare."


def test_threshold_ranking_prefers_groups_that_always_get_there() -> None:
    t = pd.DataFrame(
        {
            "algo": ["lucky", "steady"],
            "runs": [3, 3],
            "frames_per_s": [1.0, 1.0],
            "final_return": [1.0, 1.0],
            "final_return_std": [0.0, 0.0],
            "reached": [1, 3],
            "frames_to_threshold": [100.0, 500.0],
            "seconds_to_threshold": [1.0, 5.0],
        }
    )
    text = A.conclusion(t, threshold=10)
    assert "steady needed the fewest frames (500, 3/3 runs)" in text


def test_lag_sweep_summary_and_conclusion(lag_sweep: Path) -> None:
    df = A.load_sweep(lag_sweep)
    assert A.summary_keys(df) == ["algo", "refresh_every", "correction"]
    t = A.summary_table(df)
    assert len(t) == 4
    row = t[(t["refresh_every"] == 5) & (t["correction"] == "none")].iloc[0]
    assert row["final_return"] == pytest.approx(52)
    assert row["policy_lag_mean"] == pytest.approx(6)  # steady window only: lag k + 1
    text = A.conclusion(t)
    assert (
        "at refresh_every=1, measured mean lag 2, V-trace 105 vs 102 without correction "
        "(within the spread over seeds)" in text
    )
    assert (
        "at refresh_every=5, measured mean lag 6, V-trace 102 vs 52 without correction (higher)"
        in text
    )
    assert "went from 3 at refresh_every=1 to 50 at refresh_every=5" in text


def test_lag_conclusion_from_algo_names(lag_sweep: Path) -> None:
    """algo=impala,impala_nocorrection: the table has no correction column, the names say it."""
    df = A.load_sweep(lag_sweep)
    df.loc[df["correction"] == "none", "algo"] = "impala_nocorrection"
    t = A.summary_table(df)
    assert "correction" not in t.columns
    text = A.conclusion(t)
    assert "All 4 configurations ran at 100 frames/s." in text
    assert "impala (refresh_every=1) reached the best final return: 105" in text
    assert "at refresh_every=5, measured mean lag 6, V-trace 102 vs 52" in text


def test_lag_histograms_and_summary(sweep: Path, lag_sweep: Path) -> None:
    h = A.lag_histograms(A.load_runs(sweep), by="algo")
    assert set(h["algo"]) == {"impala"}  # a3c wrote no lag_hist.json
    assert h["lag"].tolist() == [0, 1, 2, 3]
    assert h["count"].tolist() == [3, 2, 3, 1]  # summed over both seeds
    assert h["fraction"].tolist() == pytest.approx([3 / 9, 2 / 9, 3 / 9, 1 / 9])
    assert h["center"].tolist() == [0, 1, 2, 3] and h["width"].tolist() == [1, 1, 1, 1]

    edges = A.lag_histograms(A.load_runs(lag_sweep))  # bins given as edges [0, 2, 4]
    assert set(edges["refresh_every"]) == {5}
    one = edges[edges["correction"] == "vtrace"]
    assert one["lag"].tolist() == [0, 2] and one["width"].tolist() == [2, 2]
    assert one["center"].tolist() == [1, 3] and one["count"].tolist() == [6, 2]

    assert A.lag_histograms([]).empty

    s = A.lag_summary(A.load_sweep(sweep), by="algo").set_index("algo")
    assert s.loc["impala", "lag_mean"] == pytest.approx(2.8)
    assert s.loc["impala", "lag_p95"] == pytest.approx(11 / 3)  # seed 1 logged no p95
    assert s.loc["impala", "lag_max"] == 6
    assert math.isnan(s.loc["a3c", "lag_mean"])


def test_bad_lag_hist_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "lag_hist.json"
    path.write_text(json.dumps({"bins": [0, 1, 2, 3, 4], "counts": [1, 2]}))
    with pytest.warns(UserWarning, match="bins"):
        assert A.read_lag_hist(path) is None
    path.write_text("{not json")
    with pytest.warns(UserWarning):
        assert A.read_lag_hist(path) is None
    assert A.read_lag_hist(tmp_path / "absent.json") is None


def test_latest_sweep(sweep: Path, tmp_path: Path) -> None:
    multirun = tmp_path / "multirun"
    newer = multirun / "2026-12-01" / "09-00-00"
    write_run(newer / "0_seed=0", cfg("impala", 0), rows((100, 1.0, 1, 0, 0, 0)))
    assert A.latest_sweep(multirun) == newer
    assert A.latest_sweep(sweep) == sweep  # already a sweep
    assert A.latest_sweep(tmp_path / "empty") == tmp_path / "empty"


def test_an_archived_run_reads_from_its_gzipped_metrics(tmp_path):
    lines = [{"frames": 100 * i, "episode_return": -21.0 + i} for i in range(5)]
    text = "".join(json.dumps(m) + "\n" for m in lines)
    plain, archived = tmp_path / "plain", tmp_path / "archived"
    plain.mkdir()
    archived.mkdir()
    (plain / "metrics.jsonl").write_text(text)
    with gzip.open(archived / "metrics.jsonl.gz", "wt") as f:
        f.write(text)
    assert A.metrics_path(archived).name == "metrics.jsonl.gz"
    assert A.metrics_path(plain).name == "metrics.jsonl"
    pd.testing.assert_frame_equal(
        A.read_metrics(A.metrics_path(archived)), A.read_metrics(A.metrics_path(plain))
    )
    (archived / "config.yaml").write_text("algo:\n  name: impala\n")
    assert A.find_runs(tmp_path) == [archived]  # plain has no config.yaml: not a run dir
    assert A.load_run(archived).metrics["frames"].tolist() == [0, 100, 200, 300, 400]
    assert A.read_metrics(A.metrics_path(archived))["episode_return"].tolist() == [
        -21.0,
        -20.0,
        -19.0,
        -18.0,
        -17.0,
    ]


def test_conclusion_names_rows_by_the_keys_they_were_grouped_by(sweep: Path) -> None:
    df = A.load_sweep(sweep)
    df["cell"] = df["algo"].map({"impala": "big", "a3c": "small"})
    text = A.conclusion(A.summary_table(df, by=["cell"]))
    assert "cell=small was the fastest" in text and "cell=big" in text


def test_overrides_reads_a_sweep_points_name() -> None:
    assert A.overrides("3_compare_cell=a3c_160,experiment=compare_cartpole,seed=0") == {
        "compare_cell": "a3c_160",
        "experiment": "compare_cartpole",
        "seed": "0",
    }
    assert A.overrides("sweeps/A/12_algo.correction=none,lag_cell=L8") == {
        "algo.correction": "none",
        "lag_cell": "L8",
    }
    assert A.overrides("a2c_seed0") == {} and A.overrides("run_dir") == {}


@pytest.fixture
def compare_sweep(tmp_path: Path) -> Path:
    """compare_cartpole's shape: compare_cell=impala,a3c,a3c_160 x seed=0,1; a3c and a3c_160
    are the same algo. Final returns: impala 10, 20; a3c 30, 40; a3c_160 50, 60."""
    root = tmp_path / "compare"
    algos = {"impala": "impala", "a3c": "a3c", "a3c_160": "a3c"}
    i = 0
    for cell, algo in algos.items():
        for seed in (0, 1):
            final = 10 * (i + 1)
            write_run(
                root / f"{i}_compare_cell={cell},experiment=compare_cartpole,seed={seed}",
                cfg(algo, seed, correction=algo == "impala"),
                rows((100, 1.0, 100, 0.5, 1, 0), (200, 2.0, 100, 0.5, 1, final)),
            )
            i += 1
    return root


def test_compare_cells_are_not_pooled_by_algo(compare_sweep: Path) -> None:
    df = A.load_sweep(compare_sweep)
    assert {"compare_cell", "experiment"} <= set(df.columns)
    assert A.swept_keys(df) == ["compare_cell", "experiment"]
    # compare_cell varies within a3c and says which algo each run is: it is the group.
    assert A.summary_keys(df) == ["compare_cell"]
    t = A.summary_table(df).set_index("compare_cell")
    assert t["runs"].to_dict() == {"a3c": 2, "a3c_160": 2, "impala": 2}
    assert t["final_return"].to_dict() == {"a3c": 35.0, "a3c_160": 55.0, "impala": 15.0}
    assert "compare_cell=a3c_160 reached the best final return: 55" in A.conclusion(t.reset_index())
    times = A.threshold_times(df, [50])
    assert list(times.columns[:5]) == ["run", "algo", "compare_cell", "seed", "frames"]
    assert times["compare_cell"].tolist() == [
        "a3c",
        "a3c",
        "a3c_160",
        "a3c_160",
        "impala",
        "impala",
    ]
    # Without the cells' names (runs outside a sweep), algo is all there is.
    df["run"] = [f"run{i}" for i in range(len(df))]
    assert A.summary_keys(df.drop(columns=["compare_cell", "experiment"])) == ["algo"]


def test_a_swept_key_next_to_algo(compare_sweep: Path) -> None:
    """A swept key that does not say the algo (a learning rate across algos) joins it."""
    df = A.load_sweep(compare_sweep)
    df["lr"] = df["seed"].map({0: "1e-3", 1: "3e-4"})
    df["run"] = [
        f"{run.split('_')[0]}_algo={a},lr={lr}"
        for run, a, lr in zip(df["run"], df["algo"], df["lr"], strict=True)
    ]
    assert df["run"].nunique() == 6
    assert A.summary_keys(df.drop(columns=["compare_cell"])) == ["algo", "lr"]
