"""Atari-5 from archived runs: the per-game table, the Atari-5 estimate of the Atari-57 median,
and one figure of the five learning curves (docs/results/atari5.md).

    python -m impala_gpu.reports.atari5 results/atari5/* \\
        --budget 10e6 --png docs/atari5.png --md /tmp/atari5.md

Each argument is one run dir (``config.yaml`` plus ``metrics.jsonl`` or ``metrics.jsonl.gz``),
one per game; the game is the config's ``env.id``. Per game:

- **score**: the mean of the last 100 *whole games* (the ``episode_return`` the learner logs is
  already that: under ``env.episodic_life`` a lost life ends the training episode, not the
  game, and only game over or the 108K-frame limit ends a reported game), read at the first
  log line at or past ``--budget`` frames, or at the last line of a run that stopped short
  (marked). Fewer than 100 games so far is marked too.
- **HNS**: human-normalised, with the random and human scores the Atari-5 paper uses
  (``impala_gpu.analysis.atari5``).
- **frames/s** and **wall-clock**: the run's own clock (``elapsed_s``, which resumes carry on),
  so the time a stopped run spent stopped is left out.
- **CPU**: from the run's ``events.jsonl`` start events (a ``cpu_model`` or ``cpu`` field) or a
  ``machine.json`` beside them; ``--stamp`` writes that file on the machine that ran it.

The estimate needs all five games; with fewer it says which are missing. The protocol each run
used (sticky actions, action set, lives, no-ops, frame skip) is printed from its config.

``--published results/atari5/published.csv`` adds a table of ours beside published figures
(one CSV row per column: its budget, sticky actions, source, and a score per game, empty where
none is published), with the Atari-5 estimate of every column that has all five games.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from impala_gpu.analysis import load_run
from impala_gpu.analysis.atari5 import (
    ATARI5,
    RELATIVE_ERROR_PERCENT,
    SOURCE_COMMIT,
    SOURCE_REPO,
    Atari5Game,
    atari5_game,
    atari5_median_estimate,
    human_normalized,
)
from impala_gpu.analysis.runs import MACHINE_FILE, run_machine

WINDOW = 100  # games in the logged mean return (telemetry/window.py)


@dataclass(frozen=True)
class GameRun:
    """One run's Atari-5 numbers, at the budget (or where it stopped)."""

    game: Atari5Game
    path: Path
    frames: float
    elapsed_s: float
    score: float
    games: int  # games in the window the score averages (100 once that many have ended)
    cpu: str
    device: str
    protocol: dict[str, Any]
    curve: pd.DataFrame  # frames, episode_return: the whole lineage, for the figure

    @property
    def hns(self) -> float:
        return human_normalized(self.game.key, self.score)

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.elapsed_s if self.elapsed_s > 0 else math.nan


@dataclass(frozen=True)
class Published:
    """One column of published scores: some of the five games, at one budget."""

    column: str  # the heading, e.g. "PPO, 40M frames"
    budget_frames: float
    sticky_actions: str
    source: str
    scores: dict[str, float]  # game key -> raw score; games not published are absent


def load_published(path: str | Path) -> list[Published]:
    """The columns of ``path`` (a CSV: ``column, budget_frames, sticky_actions, source`` and
    one cell per game key, empty where nothing is published). Raises ValueError naming
    missing CSV columns."""
    table = pd.read_csv(path, dtype={"sticky_actions": str, "column": str, "source": str})
    missing = {"column", "budget_frames", "sticky_actions", "source"} | {g.key for g in ATARI5}
    missing -= set(table.columns)
    if missing:
        raise ValueError(f"{path}: no {', '.join(sorted(missing))} column (see --help)")
    return [
        Published(
            column=row["column"],
            budget_frames=float(row["budget_frames"]),
            sticky_actions=row["sticky_actions"],
            source=row["source"],
            scores={g.key: float(row[g.key]) for g in ATARI5 if pd.notna(row[g.key])},
        )
        for _, row in table.iterrows()
    ]


def resumed_lineage(df: pd.DataFrame) -> pd.DataFrame:
    """The metric lines of the run as it finally went on: a resume from a checkpoint older
    than the last line logged re-plays frames, and appends lines whose frames go back. Keep a
    line only if no later line has fewer frames (the abandoned stretch drops out)."""
    if df.empty:
        return df
    later_min = df["frames"][::-1].cummin()[::-1]
    return df[df["frames"] <= later_min].reset_index(drop=True)


def at_budget(df: pd.DataFrame, budget: float) -> pd.Series:
    """The first line at or past ``budget`` frames, or the last line of a shorter run."""
    reached = df[df["frames"] >= budget]
    return reached.iloc[0] if len(reached) else df.iloc[-1]


def protocol(config: dict[str, Any]) -> dict[str, Any]:
    """The env settings that decide how a score compares with published ones."""
    env = config.get("env", {})
    return {
        "sticky actions": env.get("repeat_action_probability", "?"),
        "action set": "full (18)" if env.get("full_action_space") else "minimal",
        "life loss ends episode": env.get("episodic_life", "?"),
        "frame skip": env.get("frame_skip", "?"),
        "no-op starts": env.get("noop_max", "?"),
        "max frames per game": env.get("max_episode_frames", "?"),
    }


def summarize(run_dir: str | Path, budget: float) -> GameRun:
    """Read one run dir. Raises ValueError for a run that is not on an Atari-5 game or has no
    ended game yet."""
    run = load_run(run_dir)
    try:
        game = atari5_game(run.env)
    except KeyError as e:
        raise ValueError(f"{run_dir}: {e.args[0]}") from None
    df = resumed_lineage(run.metrics)
    scored = df[df["episode_return"].notna()]
    if scored.empty:
        raise ValueError(f"{run_dir}: no game has ended in its metrics")
    row = at_budget(scored, budget)
    episodes = row.get("episodes", math.nan)
    games = WINDOW if pd.isna(episodes) else int(min(episodes, WINDOW))
    cpu, device = run_machine(run_dir)
    return GameRun(
        game=game,
        path=Path(run_dir),
        frames=float(row["frames"]),
        elapsed_s=float(row["elapsed_s"]),
        score=float(row["episode_return"]),
        games=games,
        cpu=cpu,
        device=device,
        protocol=protocol(run.config),
        curve=df[["frames", "episode_return"]],
    )


def _md(text: str) -> str:
    """``text`` for a Markdown table: Q*bert's asterisk escaped, so it cannot start emphasis."""
    return text.replace("*", "\\*")


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def report(runs: list[GameRun], budget: float) -> str:
    """The Markdown: per-game table, the estimate, each run's protocol."""
    by_game = {r.game.key: r for r in runs}
    lines = [
        "| game | env id | frames | score (last 100 games) | HNS | frames/s | wall-clock | CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in ATARI5:
        r = by_game.get(g.key)
        if r is None:
            lines.append(f"| {_md(g.title)} | `{g.env_id}` | – | – | – | – | – | – |")
            continue
        notes = []
        if r.frames < budget:
            notes.append(f"stopped short of {budget / 1e6:g}M")
        if r.games < WINDOW:
            notes.append(f"mean of {r.games} games")
        note = f" ({'; '.join(notes)})" if notes else ""
        device = "" if r.device in ("cpu", "?") else f"; learner on {r.device}"
        lines.append(
            f"| {_md(g.title)} | `{g.env_id}` | {r.frames / 1e6:.2f}M | {r.score:,.1f}{note} | "
            f"{r.hns:.1f}% | {r.frames_per_s:,.0f} | {_clock(r.elapsed_s)} | {r.cpu}{device} |"
        )
    lines.append("")
    missing = [g.env_id for g in ATARI5 if g.key not in by_game]
    source = f"{SOURCE_REPO} at {SOURCE_COMMIT[:7]}"
    if missing:
        lines.append(f"Atari-5 estimate: not computed, no run for {', '.join(missing)}.")
    else:
        estimate = atari5_median_estimate({k: r.score for k, r in by_game.items()})
        lines.append(
            f"Atari-5 estimate of the Atari-57 median human-normalised score: **{estimate:.1f}%** "
            f"(Aitchison, Sweetser and Hutter, ICML 2023, regression from {source}; its stated "
            f"error is about {RELATIVE_ERROR_PERCENT:g}% of the value, for scores measured by "
            "the paper's protocol, which ours is not: docs/results/atari5.md)."
        )
    lines += ["", "Protocol, from each run's config.yaml:", ""]
    keys = list(next(iter(by_game.values())).protocol) if by_game else []
    lines.append("| game | " + " | ".join(keys) + " |")
    lines.append("|---|" + "---|" * len(keys))
    for g in ATARI5:
        if g.key in by_game:
            cells = [str(v).lower() for v in by_game[g.key].protocol.values()]
            lines.append(f"| {_md(g.title)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _score_cell(game: Atari5Game, score: float | None) -> str:
    if score is None:
        return "not published"
    return f"{score:,.1f} ({human_normalized(game.key, score):.1f}%)"


def _estimate_cell(scores: dict[str, float]) -> str:
    missing = [_md(g.title) for g in ATARI5 if g.key not in scores]
    if missing:
        return f"– (no {', '.join(missing)})"
    return f"**{atari5_median_estimate(scores):.1f}%**"


def comparison(runs: list[GameRun], published: list[Published], budget: float) -> str:
    """The Markdown: our score (HNS) per game beside each published column's, the Atari-5
    estimate of every column with all five games, then each column's budget and source."""
    ours = {r.game.key: r.score for r in runs}
    columns = [f"ours, {budget / 1e6:g}M frames", *(p.column for p in published)]
    lines = ["| game | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for g in ATARI5:
        cells = [_score_cell(g, ours.get(g.key)) if g.key in ours else "–"]
        cells += [_score_cell(g, p.scores.get(g.key)) for p in published]
        lines.append(f"| {_md(g.title)} | " + " | ".join(cells) + " |")
    estimates = [_estimate_cell(ours), *(_estimate_cell(p.scores) for p in published)]
    lines.append("| **Atari-5 estimate** | " + " | ".join(estimates) + " |")
    lines.append("")
    for p in published:
        lines.append(
            f"- **{p.column}**: {p.budget_frames / budget:g}× our budget, sticky actions "
            f"{p.sticky_actions}. {p.source}."
        )
    return "\n".join(lines) + "\n"


def figure(runs: list[GameRun], budget: float, out: Path, title: str) -> None:
    """One panel per game: mean score of the last 100 games against frames, with the random
    and human scores the normalisation uses as dashed lines."""
    by_game = {r.game.key: r for r in runs}
    fig, axes = plt.subplots(1, len(ATARI5), figsize=(22, 4.2))
    for ax, g in zip(axes, ATARI5, strict=True):
        ax.set_title(g.title, fontsize=11)
        ax.set_xlabel("frames (millions)")
        ax.grid(alpha=0.3)
        ax.axhline(g.random, color="gray", ls=":", lw=0.9, label="random")
        ax.axhline(g.human, color="gray", ls="--", lw=0.9, label="human")
        ax.axvline(budget / 1e6, color="black", lw=0.6, alpha=0.4)
        ax.set_xlim(left=0)
        r = by_game.get(g.key)
        if r is None:
            ax.text(0.5, 0.5, "no run", transform=ax.transAxes, ha="center", color="gray")
            continue
        ax.plot(r.curve["frames"] / 1e6, r.curve["episode_return"], color="C0", lw=1.3)
    axes[0].set_ylabel("mean score, last 100 games")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)


def stamp(run_dir: Path) -> None:
    """Write ``machine.json`` (this machine's CPU) into ``run_dir``, unless it has one."""
    from impala_gpu.calibration import cpu_model

    path = run_dir / MACHINE_FILE
    if path.exists():
        print(f"{path} exists; left as it is")
        return
    path.write_text(json.dumps({"cpu_model": cpu_model()}, indent=1) + "\n")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    # Files only, no display. Chosen here, not on import: a notebook that imports this
    # module keeps its own backend.
    matplotlib.use("Agg")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("runs", nargs="+", help="run dirs, one per Atari-5 game")
    p.add_argument("--budget", type=float, default=10e6, help="frames to read the score at")
    p.add_argument("--png", help="write the five curves here")
    p.add_argument("--md", help="also write the Markdown here")
    p.add_argument("--title", default="")
    p.add_argument("--published", help="a CSV of published scores to set ours beside")
    p.add_argument(
        "--stamp", action="store_true", help="write machine.json (this CPU) into each run dir"
    )
    args = p.parse_args(argv)
    if args.stamp:
        for run in args.runs:
            stamp(Path(run))
        return 0
    try:
        runs = [summarize(run, args.budget) for run in args.runs]
        published = load_published(args.published) if args.published else []
    except (ValueError, OSError) as e:
        print(f"atari5: {e}", file=sys.stderr)
        return 2
    seen: dict[str, Path] = {}
    for r in runs:
        if r.game.key in seen:
            print(
                f"atari5: two runs for {r.game.title}: {seen[r.game.key]} and {r.path}",
                file=sys.stderr,
            )
            return 2
        seen[r.game.key] = r.path
    text = report(runs, args.budget)
    if published:
        text += "\nOurs beside published figures:\n\n" + comparison(runs, published, args.budget)
    print(text, end="")
    if args.md:
        Path(args.md).write_text(text)
    if args.png:
        figure(runs, args.budget, Path(args.png), args.title)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
