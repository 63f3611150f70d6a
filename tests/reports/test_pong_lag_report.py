"""`python -m impala_gpu.reports.pong_lag` on synthetic run dirs: a few metric lines each."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from impala_gpu.analysis import load_run
from impala_gpu.reports import pong_lag as report


def make_run(
    root: Path, name: str, lag, correction: str, returns: list[float], hist, **algo
) -> Path:
    run = root / name
    run.mkdir(parents=True)
    config = {
        "seed": 1,
        "num_actors": 4,
        "batch_size": 16,
        "bounded_lag": lag,
        "algo": {
            "name": "impala",
            "correction": correction,
            "learning_rate": 2.5e-4,
            "epochs": 2,
            "ppo_reference": "first_visit",
            "clip_pg_rho_threshold": 1.0,
            **algo,
        },
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [
        {
            "frames": 500_000 * (i + 1),
            "episode_return": r,
            "entropy": 1.0,
            "logit_spread": 2.0,
            "mean_abs_log_rho": 0.1 * (i + 1),
        }
        for i, r in enumerate(returns)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run / "lag_hist.json").write_text(json.dumps(hist))
    return run


def test_table_rows_thresholds_and_free_running_lag(tmp_path):
    exact = make_run(tmp_path, "K8", 8, "none", [-20, -10, 5, 18.5], {"bins": [8], "counts": [5]})
    free = make_run(tmp_path, "F4", None, "vtrace", [-20, -14], {"bins": [2, 4], "counts": [1, 3]})
    df = report.table([load_run(free), load_run(exact)])
    assert list(df["run"]) == ["K8", "F4"]  # correction none first
    k8, f4 = df.iloc[0], df.iloc[1]
    assert k8["to -15"] == 1_000_000 and k8["to 0"] == 1_500_000 and k8["to 18"] == 2_000_000
    assert k8["mean_abs_log_rho"] == 0.25  # the median of the windows
    assert f4["lag"] == "free, 4 actors (3.5)"  # (1*2 + 3*4) / 4
    assert math.isnan(f4["to 0"]) and f4["end"] == "-14.0 at 1.00M"
    text = report.markdown(df)
    row = "| K8 | 8 | none | 16 | 0.00025 | 2 | first_visit | 1.0 | - | 1 | not recorded | 1.00M |"
    assert row in text


def test_the_other_column_names_only_the_settings_a_run_changed(tmp_path):
    hist = {"bins": [8], "counts": [1]}
    recipe = make_run(tmp_path, "R", 8, "none", [-20], hist, adam_beta1=0.9, ppo_clip=0.1)
    changed = make_run(tmp_path, "C", 8, "none", [-20], hist, adam_beta1=0.0, ppo_clip=0.2)
    rows = report.table([load_run(recipe), load_run(changed)]).set_index("run")
    assert rows.loc["R", "other"] == "-"
    assert rows.loc["C", "other"] == "adam_beta1=0.0, ppo_clip=0.2"


def test_the_cpu_column_reads_the_start_event_else_machine_json(tmp_path):
    hist = {"bins": [8], "counts": [1]}
    logged = make_run(tmp_path, "L", 8, "none", [-20], hist)
    start = {"event": "start", "cpu_model": "Intel(R) Xeon(R) Processor (family 6 model 167; avx2)"}
    (logged / "events.jsonl").write_text(json.dumps(start) + "\n")
    stamped = make_run(tmp_path, "S", 8, "none", [-20], hist)
    stamp = {"cpu_model": "AMD EPYC (family 25 model 17)"}
    (stamped / "machine.json").write_text(json.dumps(stamp))
    rows = report.table([load_run(logged), load_run(stamped)]).set_index("run")
    assert rows.loc["L", "cpu"] == "Intel Xeon 6/167"
    assert rows.loc["S", "cpu"] == "AMD EPYC 25/17"


def test_the_anchor_column_names_a_target_network_and_its_interval(tmp_path):
    hist = {"bins": [8], "counts": [1]}
    run = make_run(tmp_path, "T", 8, "none", [-20], hist, ppo_reference="target", target_interval=2)
    assert report.table([load_run(run)]).iloc[0]["anchor"] == "target/2"
    bounded = make_run(tmp_path, "B", 8, "none", [-20], hist, ppo_reference="first_visit",
                       behavior_clip=0.5)  # fmt: skip
    assert report.table([load_run(bounded)]).iloc[0]["anchor"] == "first_visit, mu±0.5"


def test_figure_draws_the_chosen_runs(tmp_path):
    a = make_run(tmp_path, "K1", 1, "none", [-20, 0, 18.2], {"bins": [1], "counts": [1]})
    b = make_run(tmp_path, "K8", 8, "vtrace", [-20, -5], {"bins": [8], "counts": [1]})
    runs = [load_run(a), load_run(b)]
    assert [r.name for r in runs if report.matches(r, ["bounded_lag=8"])] == ["K8"]
    out = tmp_path / "lag.png"
    report.figure(runs, out)
    assert out.stat().st_size > 10_000
