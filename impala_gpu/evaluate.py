"""Evaluate a checkpoint over full games (not lives), greedily or by sampling, optionally with
video:

    python -m impala_gpu.evaluate checkpoint=runs/.../ episodes=10
    python -m impala_gpu.evaluate checkpoint=runs/.../checkpoints/ckpt_000001000000.pt greedy=true
    python -m impala_gpu.evaluate --help

Given a run dir it evaluates the run's ``best.pt`` (the best mean return), or its newest
checkpoint when it has none; it prints which. The env is the actors' own stack
(``make_vector_env`` with one env, see ``make_eval_env``), so evaluation plays the game training
played. Writes ``eval.json`` (and ``videos/*.mp4``) into the checkpoint's run dir; logs to W&B
when ``wandb.mode`` (spelled as in training) is not ``disabled``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from impala_gpu.config import Config, ConfigError
from impala_gpu.envs import env_spec, make_vector_env, reset_vector_env
from impala_gpu.models import build_model
from impala_gpu.reporting.checkpoint import BEST, load_checkpoint


@dataclass
class EvalWandbCfg:
    mode: str = "disabled"  # offline | online | disabled (project, entity: the run's own)


@dataclass
class EvalCfg:
    checkpoint: str = MISSING  # a run dir (its best.pt, else its newest checkpoint) or a .pt file
    episodes: int = 10  # full games to play
    envs: int = 8  # games played at once, one batched forward pass per step (1 with video)
    greedy: bool = False  # argmax actions instead of sampling from the policy
    video: bool = False  # record mp4s with gymnasium's RecordVideo into <run_dir>/videos
    seed: int = 12345  # env and sampling seed
    max_steps: int = 0  # cap agent steps per episode (0: the env's own time limit)
    wandb: EvalWandbCfg = field(default_factory=EvalWandbCfg)  # W&B logging of the results


def load_policy(path: Path, device: str = "cpu") -> tuple[torch.nn.Module, Config]:
    """The checkpoint's model (eval mode) and the config it was trained with. An unreadable
    file is an error naming it and the run's other checkpoints."""
    return policy_from_checkpoint(load_checkpoint(path)[1], path, device)


def policy_from_checkpoint(
    ckpt: Any, path: Path, device: str = "cpu"
) -> tuple[torch.nn.Module, Config]:
    """``load_policy`` for a checkpoint already read from ``path`` (named in errors)."""
    if not isinstance(ckpt, dict) or "config" not in ckpt or "model" not in ckpt:
        raise ConfigError(f"{path} is not an impala_gpu checkpoint (no 'config'/'model').")
    cfg: Config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), ckpt["config"]))
    spec = env_spec(cfg.env)
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ConfigError(f"{path}: weights don't fit the saved model config: {e}") from e
    return model.to(device).eval(), cfg


def make_eval_env(cfg: Config, video_dir: Path | None = None, num_envs: int = 1):
    """The actors' env stack (``make_vector_env``: same backend, FIRE reset, no-ops, padding,
    frame stack) with ``num_envs`` envs, playing full games: a life loss ends no episode.

    ale-py's vector env cannot render, so a video run plays on the gymnasium backend, which
    plays the same game (its first observation and steps match the ale backend's exactly for
    ``noop_max=0``) but draws its no-op starts from another RNG."""
    env_cfg = cfg.env
    wrap = None
    if video_dir is not None:
        import gymnasium as gym

        env_cfg = dataclasses.replace(env_cfg, vector_backend="gymnasium")

        def wrap(env):
            return gym.wrappers.RecordVideo(
                env,
                str(video_dir),
                episode_trigger=lambda _: True,
                name_prefix="eval",
                disable_logger=True,
            )

    return make_vector_env(
        env_cfg,
        num_envs,
        full_games=True,
        render_mode="rgb_array" if video_dir is not None else None,
        wrap_env=wrap,
    )


def play(model, cfg: Config, ev: EvalCfg, video_dir: Path | None = None) -> list[dict[str, Any]]:
    """Play ``ev.episodes`` full games, ``ev.envs`` at a time; returns one dict per episode
    (raw return, length), in episode order.

    Game ``ep`` is reset with seed ``ev.seed + ep`` and samples its actions from its own
    generator, so a game plays the same however many are played beside it."""
    num_envs = 1 if video_dir is not None else max(1, min(ev.envs, ev.episodes))
    env = make_eval_env(cfg, video_dir, num_envs)
    results: list[dict[str, Any]] = []
    try:
        for first_ep in range(0, ev.episodes, num_envs):
            games = range(first_ep, min(first_ep + num_envs, ev.episodes))
            results += play_wave(model, cfg, ev, env, list(games))
    finally:
        env.close()
    return results


def play_wave(model, cfg: Config, ev: EvalCfg, env, games: list[int]) -> list[dict[str, Any]]:
    """Play the games numbered ``games`` at once, one per env (envs beyond them idle)."""
    n = env.num_envs
    seeds = [ev.seed + games[0] + i for i in range(n)]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    device = next(model.parameters()).device
    obs, _ = reset_vector_env(env, seeds)
    state = model.initial_state(n, device)
    first = torch.ones(1, n, dtype=torch.bool, device=device)
    # The LSTM state is carried over the whole game, except where training reset it: at the
    # start of each life with episodic_life.
    reset_core_on_life_loss = cfg.env.episodic_life
    ret, steps = np.zeros(n), np.zeros(n, dtype=np.int64)
    playing = np.arange(n) < len(games)
    life_lost = np.zeros(n, dtype=bool)
    results = []
    while playing.any():
        x = torch.as_tensor(np.asarray(obs), device=device)[None]
        with torch.no_grad():
            out = model(x, first, state)
        state = out.core_state
        logits = out.logits[0].float().cpu()  # [n, A]
        if ev.greedy:
            actions = logits.argmax(-1).numpy()
        else:
            probs = logits.softmax(-1)
            actions = np.array(
                [int(torch.multinomial(probs[i], 1, generator=gens[i])) for i in range(n)]
            )
        obs, reward, term, trunc, info = env.step(actions.astype(np.int64))
        ret += np.where(playing, reward, 0.0)
        steps += playing
        # As in training: the observation after a life-loss step starts a new life.
        first = torch.as_tensor(reset_core_on_life_loss & life_lost, device=device)[None]
        life_lost = np.asarray(info.get("life_loss", np.zeros(n, dtype=bool)), dtype=bool)
        capped = (ev.max_steps > 0) & (steps >= ev.max_steps)
        truncated = np.asarray(trunc, dtype=bool) | capped
        for i in np.flatnonzero(playing & (np.asarray(term, dtype=bool) | truncated)):
            playing[i] = False  # its env autoresets and plays on unwatched
            results.append(
                {
                    "episode": games[i],
                    "return": float(ret[i]),
                    "length": int(steps[i]),
                    "truncated": bool(truncated[i]),
                }
            )
            cut = cut_note(bool(capped[i]), bool(truncated[i]), ev.max_steps)
            print(  # a game of Pong is thousands of steps: say where we are
                f"impala_gpu.evaluate: game {games[i] + 1}/{ev.episodes}: return {ret[i]:g}, "
                f"{steps[i]:,} steps{cut}",
                file=sys.stderr,
                flush=True,
            )
    return sorted(results, key=lambda r: r["episode"])


def cut_note(capped: bool, truncated: bool, max_steps: int) -> str:
    """Why a game ended without a terminal state: ``max_steps`` only when that cap is on and
    was reached; else the env's own time limit (max_steps=0 used to be named as the cause)."""
    if capped:
        return f" (truncated at max_steps={max_steps})"
    if truncated:
        return " (truncated by the env's time limit)"
    return ""


def evaluate(ev: EvalCfg) -> dict[str, Any]:
    for name in ("episodes", "envs"):
        if getattr(ev, name) < 1:
            raise ConfigError(
                f"{name}={getattr(ev, name)}: must be at least 1. Fix: {name}="
                f"{getattr(EvalCfg, name)} (the default)."
            )
    if ev.max_steps < 0:
        raise ConfigError(
            f"max_steps={ev.max_steps}: must be >= 0. Fix: max_steps=0 (the env's own time "
            "limit) or a positive cap on agent steps per game."
        )
    path, ckpt = load_checkpoint(ev.checkpoint, prefer_best=True)
    print(
        f"impala_gpu.evaluate: evaluating {path} ({_why(Path(ev.checkpoint), path)})",
        file=sys.stderr,
    )
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    model, cfg = policy_from_checkpoint(ckpt, path)
    video_dir = run_dir / "videos" if ev.video else None
    episodes = play(model, cfg, ev, video_dir)
    returns = np.array([e["return"] for e in episodes])
    summary = {
        "checkpoint": str(path),
        "env": cfg.env.id,
        "episodes": len(episodes),
        "greedy": ev.greedy,
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "per_episode": episodes,
        "videos": sorted(str(p) for p in video_dir.glob("*.mp4")) if video_dir else [],
    }
    (run_dir / "eval.json").write_text(json.dumps(summary, indent=2))
    if ev.wandb.mode != "disabled":
        _log_wandb(ev, cfg, run_dir, summary)
    return summary


def _why(given: Path, used: Path) -> str:
    """Why ``used`` is the file evaluated, for the line that names it."""
    if given.is_file() or used == given:
        return "the file given"
    if used.name == BEST:
        return f"the run's {BEST}: the checkpoint with its best mean return"
    if not (used.parent / BEST).is_file():
        return f"the run has no {BEST} (no episode had ended by a checkpoint): its newest one"
    return f"its {BEST} does not load (see the warning above): its newest one that loads"


def _log_wandb(ev: EvalCfg, cfg: Config, run_dir: Path, summary: dict[str, Any]) -> None:
    import wandb

    run = wandb.init(
        mode=ev.wandb.mode,
        project=cfg.wandb.project,
        entity=cfg.wandb.entity,
        job_type="eval",
        dir=str(run_dir),
        config={"eval": dataclasses.asdict(ev)},
    )
    data: dict[str, Any] = {
        "eval/return_mean": summary["return_mean"],
        "eval/return_std": summary["return_std"],
    }
    for i, video in enumerate(summary["videos"]):
        data[f"eval/video_{i}"] = wandb.Video(video, format="mp4")
    run.log(data)
    run.finish()


# Renamed keys: old spelling -> the one training uses. The old one still works, with a warning.
DEPRECATED_KEYS = {"wandb_mode": "wandb.mode"}


def key_docs(cls: type = EvalCfg, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, one-line doc) for each key of ``cls``, nested dataclasses as ``a.b``.
    The docs are the fields' own end-of-line comments, so ``--help`` cannot drift from them."""
    comments = dict(re.findall(r"^\s+(\w+):[^#\n]*#\s*(.*)$", inspect.getsource(cls), re.M))
    rows = []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
            f.default_factory
        ):
            rows += key_docs(f.default_factory, f"{prefix}{f.name}.")
            continue
        default = "(required)" if f.default in (MISSING, dataclasses.MISSING) else f.default
        shown = str(default).lower() if isinstance(default, bool) else str(default)  # as typed
        rows.append((prefix + f.name, shown, comments.get(f.name, "")))
    return rows


def usage() -> str:
    """The ``--help`` text: how to call, then every key with its default and doc."""
    rows = key_docs()
    width = max(len(f"{k}={d}") for k, d, _ in rows)
    lines = [
        "usage: python -m impala_gpu.evaluate checkpoint=RUN_DIR_OR_PT [key=value ...]",
        "",
        "Plays full games with a checkpoint's policy; writes eval.json into its run dir.",
        "",
        "keys (key=default):",
    ]
    lines += [f"  {f'{k}={d}':<{width}}  {doc}" for k, d, doc in rows]
    return "\n".join(lines)


def parse_args(args: list[str]) -> EvalCfg:
    """``key=value`` arguments to an ``EvalCfg``. An unknown or malformed one is a
    ``ConfigError`` naming it and the keys there are; old spellings are renamed, with a
    warning."""
    renamed = []
    for arg in args:
        key, eq, value = arg.partition("=")
        if key in DEPRECATED_KEYS:
            print(
                f"impala_gpu.evaluate: warning: {key}= is deprecated; it is spelled "
                f"{DEPRECATED_KEYS[key]}= now, as in training.",
                file=sys.stderr,
            )
            key = DEPRECATED_KEYS[key]
        if not eq:
            raise ConfigError(
                f"argument {arg!r} is not key=value. Fix: e.g. checkpoint=runs/<run>; "
                "python -m impala_gpu.evaluate --help lists the keys."
            )
        renamed.append(f"{key}={value}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(EvalCfg), OmegaConf.from_dotlist(renamed))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        keys = ", ".join(k for k, _, _ in key_docs())
        raise ConfigError(
            f"{str(e).splitlines()[0]}. Fix: use the keys {keys} "
            "(python -m impala_gpu.evaluate --help says what each does)."
        ) from e


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = sys.argv[1:] if argv is None else argv
    if {"-h", "--help", "help"} & set(args):
        print(usage())
        raise SystemExit(0)
    ev = parse_args(args)
    summary = evaluate(ev)
    mode = "greedy" if ev.greedy else "sampled"
    print(
        f"{summary['env']}: return {summary['return_mean']:.2f} ± {summary['return_std']:.2f} "
        f"over {summary['episodes']} full episodes ({mode}); {Path(summary['checkpoint'])}"
    )
    return summary


def cli() -> None:
    """``python -m impala_gpu.evaluate``: a bad argument or checkpoint prints its message (what
    was wrong, and the fix) and exits 2, instead of a traceback."""
    try:
        main()
    except (ConfigError, FileNotFoundError) as e:
        print(f"impala_gpu.evaluate: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cli()
