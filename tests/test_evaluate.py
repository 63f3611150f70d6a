"""Evaluation of a checkpoint: full games, greedy or sampled, LSTM state carried, video."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import impala_gpu.evaluate as evaluate_module
from impala_gpu.config import Config, ConfigError, EnvCfg, ModelCfg, to_container
from impala_gpu.envs import env_spec, make_vector_env, reset_vector_env
from impala_gpu.evaluate import EvalCfg, evaluate, main, make_eval_env
from impala_gpu.models import build_model
from impala_gpu.reporting.checkpoint import atomic_torch_save

REPO = Path(__file__).resolve().parents[1]


def make_checkpoint(run_dir, env_id="CartPole-v1", model=None, name="ckpt_000000001000.pt", **env):
    cfg = Config(env=EnvCfg(id=env_id, **env), model=model or ModelCfg(name="auto", hidden_size=32))
    spec = env_spec(cfg.env)
    torch.manual_seed(0)
    net = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    path = run_dir / "checkpoints" / name
    atomic_torch_save({"model": net.state_dict(), "config": to_container(cfg)}, path)
    return path


def test_cartpole_greedy_and_sampled_with_lstm(tmp_path):
    make_checkpoint(
        tmp_path, model=ModelCfg(name="mlp", hidden_size=16, use_lstm=True, lstm_size=8)
    )
    greedy = main([f"checkpoint={tmp_path}", "episodes=3", "greedy=true"])
    assert greedy["episodes"] == 3 and greedy["greedy"] is True
    lengths = [e["length"] for e in greedy["per_episode"]]
    assert all(1 <= n <= 500 for n in lengths)
    # CartPole's reward is 1 per step: the return of a full episode is its length.
    assert [e["return"] for e in greedy["per_episode"]] == [float(n) for n in lengths]
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["return_mean"] == pytest.approx(sum(lengths) / 3)
    again = main([f"checkpoint={tmp_path}", "episodes=3", "greedy=true"])
    assert again["per_episode"] == greedy["per_episode"], "same seed, same games"


@pytest.mark.parametrize("greedy", [True, False])
def test_games_play_the_same_however_many_run_at_once(tmp_path, greedy):
    make_checkpoint(tmp_path)
    args = [f"checkpoint={tmp_path}", "episodes=5", f"greedy={greedy}"]
    alone = main([*args, "envs=1"])["per_episode"]
    batched = main([*args, "envs=3"])["per_episode"]  # a wave of 3, then 2 (one env idle)
    assert [e["episode"] for e in batched] == [0, 1, 2, 3, 4]
    assert batched == alone
    assert len({e["length"] for e in alone}) > 1, "five identical games test nothing"


def test_pong_video_is_recorded(tmp_path):
    pytest.importorskip("moviepy")
    make_checkpoint(tmp_path, env_id="ALE/Pong-v5", model=ModelCfg(name="shallow"))
    out = evaluate(EvalCfg(checkpoint=str(tmp_path), episodes=1, video=True, max_steps=40))
    assert out["per_episode"][0]["length"] == 40 and out["per_episode"][0]["truncated"]
    assert len(out["videos"]) == 1 and (tmp_path / "videos").is_dir()
    assert len(list((tmp_path / "videos").glob("*.mp4"))) == 1


def test_bad_inputs_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        main([f"checkpoint={tmp_path / 'missing'}"])
    with pytest.raises(Exception, match="checkpoint"):
        main(["episodes=2"])  # no checkpoint given
    bogus = tmp_path / "bogus.pt"
    torch.save({"weights": 1}, bogus)
    with pytest.raises(ConfigError, match="not an impala_gpu checkpoint"):
        main([f"checkpoint={bogus}"])
    with pytest.raises(ConfigError, match="envs=0: must be at least 1"):
        main([f"checkpoint={bogus}", "envs=0"])


def evaluate_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m impala_gpu.evaluate`` of this checkout (run from its root)."""
    cmd = [sys.executable, "-m", "impala_gpu.evaluate", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_run_dir_is_evaluated_with_its_best_checkpoint_and_says_which(tmp_path, capsys):
    newest = make_checkpoint(tmp_path)
    out = main([f"checkpoint={tmp_path}", "episodes=1"])
    assert out["checkpoint"] == str(newest)
    assert f"evaluating {newest} (the run has no best.pt" in capsys.readouterr().err
    best = make_checkpoint(tmp_path, name="best.pt")
    make_checkpoint(tmp_path, name="ckpt_000000002000.pt")  # newer than best.pt
    out = main([f"checkpoint={tmp_path}", "episodes=1"])
    assert out["checkpoint"] == str(best)
    assert f"evaluating {best} (the run's best.pt" in capsys.readouterr().err
    main([f"checkpoint={newest}", "episodes=1"])
    assert f"evaluating {newest} (the file given)" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_an_unreadable_checkpoint_is_a_clear_error_naming_it(tmp_path, how):
    good = make_checkpoint(tmp_path)
    bad = make_checkpoint(tmp_path, name="ckpt_000000002000.pt")
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2] if how == "truncated" else bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="not a readable checkpoint") as e:
        main([f"checkpoint={bad}"])
    assert str(e.value).startswith(f"checkpoint {bad} is not a readable checkpoint")
    assert f"Fix: pass an older checkpoint of the run, e.g. {good}" in str(e.value)
    proc = evaluate_cli(f"checkpoint={bad}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"error: checkpoint {bad} is not a readable checkpoint (truncated or" in proc.stderr
    assert "Fix:" in proc.stderr


def test_help_lists_every_key_with_its_doc():
    proc = evaluate_cli("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for key, doc in [
        ("checkpoint=(required)", "a run dir"),
        ("episodes=10", "full games to play"),
        ("greedy=false", "argmax actions"),
        ("wandb.mode=disabled", "offline | online | disabled"),
    ]:
        (line,) = [x for x in proc.stdout.splitlines() if x.strip().startswith(key)]
        assert doc in line
    bad = evaluate_cli("epsiodes=3")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "epsiodes" in bad.stderr and "--help" in bad.stderr


@pytest.mark.parametrize("spelling", ["wandb.mode", "wandb_mode"])
def test_wandb_mode_is_spelled_as_in_training(tmp_path, monkeypatch, capsys, spelling):
    make_checkpoint(tmp_path)
    logged = []
    monkeypatch.setattr(evaluate_module, "_log_wandb", lambda ev, *_: logged.append(ev))
    main([f"checkpoint={tmp_path}", "episodes=1", f"{spelling}=offline"])
    assert [ev.wandb.mode for ev in logged] == ["offline"]
    deprecated = "wandb_mode= is deprecated; it is spelled wandb.mode= now"
    assert (deprecated in capsys.readouterr().err) == (spelling == "wandb_mode")


@pytest.mark.parametrize("backend", ["auto", "gymnasium"])
@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "ALE/Breakout-v5"])
def test_eval_env_plays_the_training_game(env_id, backend):
    # The actors' env (make_vector_env) and the evaluation env, same seed: same backend, same
    # first observation (FIRE reset, no-ops, zero padding, stack) and the same next steps.
    env_cfg = EnvCfg(id=env_id, vector_backend=backend, episodic_life="Breakout" in env_id)
    train, evaluation = make_vector_env(env_cfg, 1), make_eval_env(Config(env=env_cfg))
    try:
        assert type(train.unwrapped) is type(evaluation.unwrapped)
        obs = [reset_vector_env(e, [2024])[0] for e in (train, evaluation)]
        np.testing.assert_array_equal(obs[0], obs[1])
        assert obs[0].any()
        for t in range(20):
            action = np.array([t % 4], dtype=np.int64)
            obs = [e.step(action)[0] for e in (train, evaluation)]
            np.testing.assert_array_equal(obs[0], obs[1])
    finally:
        train.close()
        evaluation.close()


def test_breakout_episodic_life_policy_is_evaluated_over_whole_games(tmp_path):
    # Trained with episodic life (a life loss ends the training episode), evaluated over the
    # whole game: all five lives are played in one episode, which ends at game over. The FIRE
    # after each life loss that training had stays, so even an untrained greedy policy that
    # never fires relaunches the ball.
    make_checkpoint(tmp_path, "ALE/Breakout-v5", ModelCfg(name="shallow"), episodic_life=True)
    out = evaluate(EvalCfg(checkpoint=str(tmp_path), episodes=1, greedy=True))
    (ep,) = out["per_episode"]
    assert not ep["truncated"]
    assert ep["length"] > 100  # five lives of ~24 steps (118 here), not one
