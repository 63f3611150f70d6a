"""`python -m impala_gpu.reports.atari5` on synthetic run dirs: a few metric lines each,
no learning."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pandas as pd
import yaml

from impala_gpu.analysis.atari5 import ATARI5, atari5_median_estimate, human_normalized
from impala_gpu.analysis.runs import run_machine
from impala_gpu.reports import atari5 as report

FINAL = {  # a made-up final score per game, the mean of its last 100 games
    "ALE/BattleZone-v5": 9000.0,
    "ALE/DoubleDunk-v5": -20.0,  # below random: HNS < 0, clipped in the estimate
    "ALE/NameThisGame-v5": 5000.0,
    "ALE/Phoenix-v5": 4000.0,
    "ALE/Qbert-v5": 3000.0,
}


def make_run(
    root: Path,
    env_id: str,
    lines: list[dict],
    *,
    gz: bool = False,
    start: dict | None = None,
    machine: dict | None = None,
) -> Path:
    """A run dir as the CLI leaves one: config.yaml, metrics.jsonl(.gz), events.jsonl."""
    run = root / env_id.split("/")[1]
    run.mkdir(parents=True)
    env = {
        "id": env_id,
        "repeat_action_probability": 0.0,
        "full_action_space": False,
        "episodic_life": True,
        "frame_skip": 4,
        "noop_max": 30,
        "max_episode_frames": 108000,
    }
    (run / "config.yaml").write_text(yaml.safe_dump({"env": env, "seed": 0}))
    text = "".join(json.dumps(m) + "\n" for m in lines)
    if gz:
        with gzip.open(run / "metrics.jsonl.gz", "wt") as f:
            f.write(text)
    else:
        (run / "metrics.jsonl").write_text(text)
    events = [{"event": "start", "device": "cpu", **(start or {})}, {"event": "actor_ready"}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if machine is not None:
        (run / "machine.json").write_text(json.dumps(machine))
    return run


def curve(final: float, frames: list[float], episodes: int = 500) -> list[dict]:
    """Lines whose score climbs to ``final`` at the last one; 1K frames/s of the run's clock.
    The first line has no ended game yet (null return, as the learner logs it)."""
    out = []
    for i, f in enumerate(frames):
        ret = None if i == 0 else final * i / (len(frames) - 1)
        n = episodes * i // (len(frames) - 1)
        out.append({"frames": f, "elapsed_s": f / 1000.0, "episode_return": ret, "episodes": n})
    return out


def five_runs(root: Path) -> list[Path]:
    steps = [0.0, 2.5e6, 5e6, 7.5e6, 10.004e6]
    runs = []
    for i, (env_id, final) in enumerate(FINAL.items()):
        start = {"cpu_model": "Test CPU (family 25 model 1; avx2)"} if i != 1 else {}
        machine = {"cpu_model": "Stamped CPU"} if i == 1 else None
        runs.append(
            make_run(root, env_id, curve(final, steps), gz=i == 2, start=start, machine=machine)
        )
    return runs


def test_the_table_the_estimate_and_the_figure(tmp_path: Path, capsys) -> None:
    runs = five_runs(tmp_path / "runs")
    png, md = tmp_path / "atari5.png", tmp_path / "atari5.md"
    rc = report.main([*map(str, runs), "--png", str(png), "--md", str(md)])
    assert rc == 0
    text = md.read_text()
    assert text in capsys.readouterr().out
    estimate = atari5_median_estimate(FINAL)
    assert f"**{estimate:.1f}%**" in text and "maitchison/Atari-5 at 118cad5" in text
    scores = text.split("Protocol")[0].splitlines()  # the per-game table, not the protocol one
    rows = {ln.split(" | ")[0][2:].replace("\\*", "*"): ln for ln in scores if ln.startswith("| ")}
    for g in ATARI5:
        row = rows[g.title]
        assert f"| {FINAL[g.env_id]:,.1f} |" in row  # read at the line that reached 10M
        assert f"| {human_normalized(g.key, FINAL[g.env_id]):.1f}% |" in row
        assert "| 10.00M |" in row and "| 1,000 |" in row and "| 2 h 47 min |" in row
    assert rows["Double Dunk"].endswith("| Stamped CPU |")  # no CPU in its events: machine.json
    assert rows["Battle Zone"].endswith("| Test CPU (family 25 model 1; avx2) |")
    assert "| Qbert | 0.0 | minimal | true | 4 | 30 | 108000 |" not in text  # title, not key
    assert "| Q\\*bert | 0.0 | minimal | true | 4 | 30 | 108000 |" in text
    assert png.stat().st_size > 10_000


def test_the_score_is_read_at_the_budget_not_past_it(tmp_path: Path, capsys) -> None:
    """A run that played on past 10M frames reports its score at 10M; one that stopped short
    reports its last line, marked, and a window of fewer than 100 games is marked too."""
    long = make_run(tmp_path, "ALE/Qbert-v5", curve(4000.0, [0, 5e6, 10.01e6, 15e6, 20e6]))
    short = make_run(tmp_path, "ALE/Phoenix-v5", curve(900.0, [0, 2e6, 4e6], episodes=40))
    assert report.main([str(long), str(short)]) == 0
    out = capsys.readouterr().out
    assert "| 10.01M | 2,000.0 |" in out  # the line at 10.01M frames, not 4000 at 20M
    assert "| 900.0 (stopped short of 10M; mean of 40 games) |" in out
    assert "not computed, no run for ALE/BattleZone-v5, ALE/DoubleDunk-v5" in out
    assert "| Battle Zone | `ALE/BattleZone-v5` | – |" in out
    assert "not recorded" in out  # neither run named its CPU


def test_a_resume_from_an_older_checkpoint_drops_the_replayed_stretch(tmp_path: Path) -> None:
    """Frames 0..6M, then a resume from the 4M checkpoint: the lines past 4M before the resume
    are not the run that went on."""
    lines = curve(100.0, [0, 2e6, 4e6, 6e6]) + curve(300.0, [4.5e6, 8e6, 10e6])
    kept = report.resumed_lineage(pd.DataFrame(lines))
    assert kept["frames"].tolist() == [0, 2e6, 4e6, 4.5e6, 8e6, 10e6]
    run = report.summarize(make_run(tmp_path, "ALE/BattleZone-v5", lines), 10e6)
    assert run.score == 300.0 and run.frames == 10e6
    assert run.curve["frames"].is_monotonic_increasing


def test_refusals(tmp_path: Path, capsys) -> None:
    pong = make_run(tmp_path / "a", "ALE/Pong-v5", curve(18.0, [0, 1e6]))
    assert report.main([str(pong)]) == 2
    assert "not an Atari-5 game" in capsys.readouterr().err
    one = make_run(tmp_path / "b", "ALE/Qbert-v5", curve(10.0, [0, 1e6]))
    two = make_run(tmp_path / "c", "ALE/Qbert-v5", curve(20.0, [0, 1e6]))
    assert report.main([str(one), str(two)]) == 2
    assert "two runs for Q*bert" in capsys.readouterr().err
    empty = make_run(tmp_path / "d", "ALE/Phoenix-v5", [{"frames": 4096, "elapsed_s": 3.0}])
    assert report.main([str(empty)]) == 2
    assert "no game has ended" in capsys.readouterr().err


def test_stamp_writes_this_machines_cpu_once(tmp_path: Path) -> None:
    run = make_run(tmp_path, "ALE/Qbert-v5", curve(10.0, [0, 1e6]))
    assert report.main(["--stamp", str(run)]) == 0
    first = json.loads((run / "machine.json").read_text())["cpu_model"]
    assert first and run_machine(run)[0] == first
    (run / "machine.json").write_text(json.dumps({"cpu_model": "kept"}))
    report.main(["--stamp", str(run)])
    assert run_machine(run)[0] == "kept"
    assert not math.isnan(report.summarize(run, 1e6).frames_per_s)


CSV_HEADER = "column,budget_frames,sticky_actions,source," + ",".join(g.key for g in ATARI5)
PUBLISHED_CSV = f"""{CSV_HEADER}
"PPO, 40M frames",40e6,none,"A paper, Table 6",17366.7,-14.9,6254.9,,14293.3
"All five, 20M",20e6,0.25,"A benchmark page",20000,-10,6000,5000,9000
"""


def test_published_columns_beside_ours_with_their_estimates(tmp_path: Path, capsys) -> None:
    runs = five_runs(tmp_path / "runs")
    csv = tmp_path / "published.csv"
    csv.write_text(PUBLISHED_CSV)
    assert report.main([*map(str, runs), "--published", str(csv)]) == 0
    text = capsys.readouterr().out.split("Ours beside published figures:")[1]
    assert "| game | ours, 10M frames | PPO, 40M frames | All five, 20M |" in text
    full = {"battlezone": 20000, "doubledunk": -10, "namethisgame": 6000, "phoenix": 5000,
            "qbert": 9000}  # fmt: skip
    ours, theirs = atari5_median_estimate(FINAL), atari5_median_estimate(full)
    assert f"| **{ours:.1f}%** | – (no Phoenix) | **{theirs:.1f}%** |" in text
    phoenix = next(ln for ln in text.splitlines() if ln.startswith("| Phoenix |"))
    assert "| not published |" in phoenix and "5,000.0 (65.4%)" in phoenix
    assert "- **PPO, 40M frames**: 4× our budget, sticky actions none. A paper, Table 6." in text
    assert "- **All five, 20M**: 2× our budget, sticky actions 0.25." in text


def test_a_published_csv_without_a_game_column_is_refused(tmp_path: Path, capsys) -> None:
    run = make_run(tmp_path, "ALE/Qbert-v5", curve(10.0, [0, 1e6]))
    csv = tmp_path / "published.csv"
    csv.write_text(CSV_HEADER.replace(",phoenix", "") + '\n"PPO",4e7,none,"A paper",1,2,3,4\n')
    assert report.main([str(run), "--published", str(csv)]) == 2
    assert "no phoenix column" in capsys.readouterr().err


def test_the_archived_published_figures_name_a_source_and_a_budget() -> None:
    root = Path(__file__).resolve().parents[2]
    columns = report.load_published(root / "results" / "atari5" / "published.csv")
    assert len(columns) >= 3
    for p in columns:
        assert p.budget_frames > 0 and len(p.source) > 20 and p.scores, p.column
        for key, score in p.scores.items():
            assert math.isfinite(human_normalized(key, score)), (p.column, key)
