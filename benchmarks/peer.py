"""Peer benchmark (issue 6): impala_gpu against Sample Factory 2.1.1 APPO on Pong, same box.

    bash benchmarks/peer_setup.sh                 # once: .venv-sf with sample-factory 2.1.1
    .venv/bin/python -m benchmarks.peer           # 3 rounds x (SF 60 s, impala_gpu 60 s)
    .venv/bin/python -m benchmarks.peer --seconds 90 model=resnet   # Hydra overrides: impala_gpu
    .venv/bin/python -m benchmarks.peer --sf-arg=--worker_num_splits=1  # extra SF flags (last wins)

Each round runs Sample Factory's APPO (sf_examples.atari, env atari_pong: PongNoFrameskip-v4,
frameskip 4, 84x84 gray, stack 4), then impala_gpu end to end (benchmarks/throughput.py's run(),
default config), each for --seconds of training. Both count frames at the learner (consumed
samples x frameskip 4) over 5 s log windows, and both drop their warm-up window and last window
(common.steady_windows). SF side: V-trace, 2 rollout workers x 8 envs (double-buffered, 2 splits
of 4), rollout = recurrence = 20, batch 640 samples = 32 trajectories x 20 (impala_gpu's T=20,
B=32), one epoch of one minibatch per batch (no PPO epochs), async, learner on the CPU; its
encoder is the Nature CNN (convnet_atari: 32x8/4, 64x4/2, 64x3/1) + FC 256, impala_gpu's
"shallow" torso; no RNN, no input normalisation (impala_gpu only scales by 1/255). Left as SF
has them: its learner, inference worker and rollout workers use 1 torch thread each (hard-coded),
rollout workers are pinned to cores (set_workers_cpu_affinity), Adam rather than RMSprop.

SF's own timer (--train_for_seconds) is never advanced in 2.1.1, so this script stops it: SIGINT
to its process group --seconds after its first FPS report with a trained batch, SIGKILL to what
is left of the group after a grace period; its train dir, in a temp dir, is removed. Reports the
median frames/s of each side over the rounds and the ratio impala_gpu / SF. Not run in CI (needs
.venv-sf, minutes, an idle machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import throughput
from benchmarks.common import median, steady_windows, write_result

ROOT = Path(__file__).resolve().parent.parent
FRAMESKIP = 4

# SF's entry point, written to SF's temp dir and run with .venv-sf's python. SF starts its
# processes with "spawn", which re-imports this file (as __mp_main__) in each, so both fixes
# below reach every process:
# - ale-py >= 0.9 (the first with the ROMs in its wheel) registers the ALE envs with gymnasium on
#   import and has no gymnasium entry point; SF 2.1.1 never imports it.
# - SF 2.1.1's learner crashes on its first summaries with V-trace (mb.advantages exists only on
#   the GAE path; fixed upstream after 2.1.1, alex-petrenko/sample-factory PRs 278/286/332, never
#   released). A placeholder lets it write its summaries as usual; only adv_min/adv_max are moot.
SF_LAUNCHER = """\
import sys

import ale_py  # noqa: F401
import torch
from sample_factory.algo.learning.learner import Learner

from sf_examples.atari.train_atari import main

_record_summaries = Learner._record_summaries


def _record_summaries_vtrace(self, var):
    if "advantages" not in var.mb:
        var.mb["advantages"] = torch.zeros(1)
    return _record_summaries(self, var)


Learner._record_summaries = _record_summaries_vtrace

if __name__ == "__main__":
    sys.exit(main())
"""

# The SF side of the workload (see the module docstring); --sf-arg appends to it.
SF_ARGS = [
    "--algo=APPO",
    "--env=atari_pong",
    "--device=cpu",
    "--with_vtrace=True",
    "--normalize_returns=False",  # SF refuses it with V-trace
    "--num_workers=2",
    "--num_envs_per_worker=8",
    "--worker_num_splits=2",
    "--rollout=20",
    "--recurrence=20",  # V-trace in SF needs recurrence == rollout
    "--batch_size=640",
    "--num_batches_per_epoch=1",
    "--num_epochs=1",
    "--async_rl=True",
    "--use_rnn=False",
    "--encoder_conv_architecture=convnet_atari",
    "--encoder_conv_mlp_layers",
    "256",
    "--normalize_input=False",
    "--env_frameskip=4",
    "--summaries_use_frameskip=True",  # its frame counts are env frames (agent steps x 4)
    "--learning_rate=0.0006",
    "--lr_schedule=constant",
    "--save_every_sec=1000000",
    "--with_wandb=False",
    "--seed=0",
]

FPS_LINE = re.compile(
    r"^\[(?P<t>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]\[\d+\] Fps is .*?"
    r"Total num frames: (?P<frames>\d+)\..*?"
    r"Policy #0 lag: \(min: (?P<lmin>[-\d.]+), avg: (?P<lavg>[-\d.]+), max: (?P<lmax>[-\d.]+)\)"
)


def sf_reports(log: Path) -> list[tuple[float, int, float]]:
    """(unix time, total env frames, mean policy lag) of each of SF's 5 s FPS reports."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = FPS_LINE.match(line)
        if m:
            t = datetime.strptime(m["t"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((t, int(m["frames"]), float(m["lavg"])))
    return out


def sf_windows(reports: list[tuple[float, int, float]]) -> list[dict[str, float]]:
    """One window per pair of consecutive reports, like impala_gpu's log windows."""
    wins = []
    for (t0, f0, _), (t1, f1, lag) in zip(reports, reports[1:], strict=False):
        fps = (f1 - f0) / max(t1 - t0, 1e-9)
        wins.append(
            {
                "window_s": t1 - t0,
                "frames_per_s": fps,
                "agent_steps_per_s": fps / FRAMESKIP,
                "policy_lag_mean": lag,
            }
        )
    return wins


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(proc: subprocess.Popen, grace: float) -> bool:
    """SIGINT to SF's process group (its runner stops its components and exits; they ignore
    SIGINT), then up to `grace` s for the whole group to exit by itself (multiprocessing's
    resource tracker, last, unlinks the named semaphores), then SIGKILL to whatever is left.
    True if the group had emptied by itself."""
    deadline = time.monotonic() + grace
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    clean = False
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader, or the group never empties
        if not group_alive(proc.pid):
            clean = True
            break
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return clean


def run_sf(
    sf_python: str, seconds: float, extra: list[str], startup_timeout: float, grace: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="peer_sf_") as tmp:
        launcher = Path(tmp) / "sf_launch.py"
        launcher.write_text(SF_LAUNCHER)
        train_dir = Path(tmp) / "train_dir"
        cmd = [
            os.path.abspath(sf_python),  # not resolve(): the venv's python is a symlink
            str(launcher),
            *SF_ARGS,
            f"--train_dir={train_dir}",
            "--experiment=peer",
            *extra,
        ]
        log = train_dir / "peer" / "sf_log.txt"
        out_path = Path(tmp) / "sf_stdout.txt"
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True
            )
            try:
                t_launch = time.monotonic()
                t_first = None
                while proc.poll() is None:
                    now = time.monotonic()
                    if t_first is None:
                        if any(frames > 0 for _, frames, _ in sf_reports(log)):
                            t_first = now  # the learner's first batch is done
                        elif now - t_launch > startup_timeout:
                            break
                    elif now - t_first >= seconds + 1.0:  # +1 s: keep the report due at `seconds`
                        break
                    time.sleep(0.5)
                exited = proc.poll()
            finally:
                clean = stop_group(proc, grace)
        reports = sf_reports(log)
        # From the last report before the first trained batch: that first window is the warm-up
        # one that steady_windows drops, as impala_gpu's first window is.
        first = next((i for i, r in enumerate(reports) if r[1] > 0), None)
        body = steady_windows(sf_windows(reports[max(first - 1, 0) :])) if first is not None else []
        if exited is not None:
            problem = f"exited with {exited} before the end"
        elif first is None:
            problem = f"trained no batch in {startup_timeout:g} s"
        elif not body or min(w["frames_per_s"] for w in body) <= 0:
            problem = "its learner stalled"
        else:
            problem = None
        if problem:
            tail = out_path.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"Sample Factory {problem}: {' '.join(cmd)}\n{tail}")
    return {
        "frames_per_s": median([w["frames_per_s"] for w in body]),
        "agent_steps_per_s": median([w["agent_steps_per_s"] for w in body]),
        "policy_lag_mean": median([w["policy_lag_mean"] for w in body]),
        "windows": len(body),
        "frames_total": reports[-1][1],
        "startup_s": round(t_first - t_launch, 1) if t_first is not None else None,
        "exited_early": exited is not None,
        "stopped_cleanly": clean,
    }


def sf_versions(sf_python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
        "('sample-factory', 'torch', 'gymnasium', 'ale-py', 'numpy')}))"
    )
    res = subprocess.run([sf_python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=60, help="training seconds per run")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of (SF, impala_gpu)")
    ap.add_argument("--log-interval", type=float, default=5, help="impala_gpu (SF's is 5 s)")
    ap.add_argument("--sf-python", default=str(ROOT / ".venv-sf" / "bin" / "python"))
    ap.add_argument("--sf-arg", action="append", default=[], help="extra SF flag (repeatable)")
    ap.add_argument("--sf-startup-timeout", type=float, default=180)
    ap.add_argument("--sf-grace", type=float, default=30, help="SIGINT to SIGKILL, seconds")
    ap.add_argument("--name", default="peer")
    ap.add_argument("--out", default="bench_out")
    args, overrides = ap.parse_known_args()
    if not Path(args.sf_python).exists():
        sys.exit(f"{args.sf_python} not found: run `bash benchmarks/peer_setup.sh` first")

    sf_rounds, ours_rounds = [], []
    for i in range(args.repeats):
        sf = run_sf(
            args.sf_python, args.seconds, args.sf_arg, args.sf_startup_timeout, args.sf_grace
        )
        sf_rounds.append(sf)
        print(f"round {i + 1}/{args.repeats} SF: {sf['frames_per_s']:,.0f} frames/s", flush=True)
        ours = throughput.run(args.seconds, overrides, args.log_interval)
        ours_rounds.append(ours)
        print(
            f"round {i + 1}/{args.repeats} impala_gpu: {ours['frames_per_s']:,.0f} frames/s",
            flush=True,
        )

    def side(rounds: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "frames_per_s": median([r["frames_per_s"] for r in rounds]),
            "agent_steps_per_s": median([r["agent_steps_per_s"] for r in rounds]),
            "rounds": rounds,
        }

    sf_res, ours_res = side(sf_rounds), side(ours_rounds)
    ratio = ours_res["frames_per_s"] / sf_res["frames_per_s"]
    result = {
        "seconds": args.seconds,
        "repeats": args.repeats,
        "frameskip": FRAMESKIP,
        "impala_gpu": {"overrides": overrides, **ours_res},
        "sample_factory": {
            "args": SF_ARGS + args.sf_arg,
            "versions": sf_versions(args.sf_python),
            **sf_res,
        },
        "ratio_frames_per_s": ratio,
        "ratio_per_round": [
            o["frames_per_s"] / s["frames_per_s"]
            for o, s in zip(ours_rounds, sf_rounds, strict=True)
        ],
    }
    path = write_result(args.name, result, args.out)
    print(
        f"{args.name}: impala_gpu {ours_res['frames_per_s']:,.0f} frames/s "
        f"({ours_res['agent_steps_per_s']:,.0f} agent steps/s) vs Sample Factory APPO "
        f"{sf_res['frames_per_s']:,.0f} frames/s ({sf_res['agent_steps_per_s']:,.0f} agent "
        f"steps/s): ratio {ratio:.2f}, median of {args.repeats} x {args.seconds:g} s  ({path})"
    )


if __name__ == "__main__":
    main()
