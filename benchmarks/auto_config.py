"""Does ``auto`` pick what is fastest here? ``auto`` against a small grid of hand-set configs.

    python -m benchmarks.auto_config                       # Pong defaults, 60 s a run, 3 rounds
    python -m benchmarks.auto_config --seconds 90 --rounds 2 model=resnet   # any Hydra override

Each round runs every config once, in an order that alternates between rounds (the box is
shared and noisy): ``auto``, then fp32/bf16 x 1 actor x 32 envs and 2 x 16, plus whatever
``auto`` picked if it is not among them. Writes, per config, the median frames/s over rounds;
the ratio of ``auto`` to the fastest hand-set config; and, beside each measured figure, what
the calibration predicted for it (``auto.json``), so the prediction's error is on record.
The calibration cache of the first ``auto`` run is reused by the later ones.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import yaml

from benchmarks.common import cli_command, median, steady_windows, write_result

GRID = [("fp32", 1, 32), ("fp32", 2, 16), ("bf16", 1, 32), ("bf16", 2, 16)]


def run_once(seconds: float, config: list[str], overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = cli_command(
            tmp, f"max_seconds={seconds}", "total_frames=10_000_000_000", *overrides, *config
        )
        subprocess.run(cmd, check=True)
        metrics = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        ran = yaml.safe_load((Path(tmp) / "config.yaml").read_text())
        auto = Path(tmp) / "auto.json"
        decision = json.loads(auto.read_text()) if auto.exists() else None
    body = steady_windows(metrics)
    return {
        "frames_per_s": median([m["frames_per_s"] for m in body]),
        "learner_busy": median([m["learner_busy"] for m in body]),
        "ran": (ran["precision"], ran["num_actors"], ran["envs_per_actor"]),
        "decision": decision,
    }


def label(p: str, n: int, e: int) -> str:
    return f"{p} {n}x{e}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="auto_config")
    ap.add_argument("--out", default="bench_out")
    args, overrides = ap.parse_known_args()
    auto_cfg = ["precision=auto", "num_actors=auto", "envs_per_actor=auto"]
    runs: list[dict] = []
    grid = list(GRID)
    predicted: dict[str, float] = {}
    for r in range(args.rounds):
        configs = [("auto", auto_cfg)] + [
            (label(*g), [f"precision={g[0]}", f"num_actors={g[1]}", f"envs_per_actor={g[2]}"])
            for g in grid
        ]
        if r % 2:
            configs.reverse()
        for name, config in configs:
            out = run_once(args.seconds, config, overrides)
            runs.append({"round": r, "config": name, **out})
            print(f"round {r} {name} (ran {label(*out['ran'])}): "
                  f"{out['frames_per_s']:,.0f} frames/s", flush=True)  # fmt: skip
            if name == "auto":
                picked = tuple(out["ran"])  # auto's pick, resolved in the run's config.yaml
                if picked not in grid:  # auto chose outside the grid: measure it by hand too
                    grid.append(picked)
                for row in out["decision"]["predicted_frames_per_s"]:
                    key = label(row["precision"], row["num_actors"], row["envs_per_actor"])
                    predicted[key] = row["frames_per_s"]
    names = sorted({x["config"] for x in runs})
    med = {n: median([x["frames_per_s"] for x in runs if x["config"] == n]) for n in names}
    hand = {n: v for n, v in med.items() if n != "auto"}
    best = max(hand, key=hand.get)  # type: ignore[arg-type]
    auto_label = next(label(*x["ran"]) for x in runs if x["config"] == "auto")
    summary = {
        "median_frames_per_s": med,
        "predicted_frames_per_s": predicted,
        "auto_picked": auto_label,
        "fastest_hand_set": best,
        "auto_over_fastest": med["auto"] / hand[best],
    }
    path = write_result(
        args.name,
        {"overrides": overrides, "seconds": args.seconds, "runs": runs, "summary": summary},
        args.out,
    )
    for n in names:
        pred = predicted.get(auto_label if n == "auto" else n)
        extra = f" (predicted {pred:,.0f})" if pred else ""
        print(f"{n}: {med[n]:,.0f} frames/s{extra}")
    print(
        f"auto picked {auto_label}; fastest hand-set {best}; auto/fastest "
        f"{summary['auto_over_fastest']:.3f}  ({path})"
    )


if __name__ == "__main__":
    main()
