"""An impossible config fails before anything happens: before ``auto``'s calibration, any
process, any file and any sweep point, with the project's message naming the key and the fix;
and Hydra's own files follow ``run_dir``."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from leakcheck import schema_defaults

from impala_gpu.config import AlgoCfg, Config, ConfigError, EnvCfg, WandbCfg
from impala_gpu.validate import validate_config

REPO = Path(__file__).resolve().parent.parent


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m impala_gpu`` from this checkout (PYTHONPATH: not an installed copy), with a
    calibration cache of its own under ``cwd``."""
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        HYDRA_FULL_ERROR="0",
        WANDB_MODE="disabled",
        IMPALA_GPU_CACHE_DIR=str(cwd / "cache"),
    )
    return subprocess.run(
        [sys.executable, "-m", "impala_gpu", *args, *schema_defaults(args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# Each with precision, num_actors and envs_per_actor left at auto. Before this check existed,
# batch_size=-4 died inside the calibration ("negative dimension -4") and unroll_length=0
# calibrated for ~15 s and then divided by zero.
BAD = [
    ("batch_size=-4", "batch_size=-4"),
    ("unroll_length=0", "unroll_length=0"),
    ("num_slots=3", "num_slots=3"),  # < batch_size (32) + one unroll, whatever auto picks
    ("envs_per_actor=0", "envs_per_actor=0"),
    ("algo.learning_rate=-1", "algo.learning_rate=-1"),
    ("wandb.mode=bogus", "wandb.mode='bogus'"),
    ("env.id=CartPol-v1", "Unknown env id 'CartPol-v1'"),
]


@pytest.mark.parametrize("override,named", BAD, ids=[o for o, _ in BAD])
def test_an_impossible_value_fails_before_calibrating_and_leaves_no_run_dir(
    tmp_path, override, named
):
    run_dir = tmp_path / "run"
    proc = _cli([override, f"run_dir={run_dir}"], tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"ConfigError: {named}" in proc.stderr and "Fix:" in proc.stderr, proc.stderr[-3000:]
    assert "auto (" not in proc.stderr  # auto chose nothing: it never measured
    assert not (tmp_path / "cache").exists()  # ... and cached nothing
    assert not run_dir.exists()
    assert not (tmp_path / "runs").exists()  # nor anything of Hydra's under ./runs


def test_what_only_the_calibration_can_rule_out_still_leaves_no_run_dir(tmp_path):
    """num_slots=33 holds batch_size=32 plus one unroll, so it passes the check before auto;
    the 32 envs auto then chooses need 64. That fails after the calibration, before config.yaml
    or auto.json, and Hydra's files in the run dir go too."""
    run_dir = tmp_path / "run"
    args = ["env=cartpole", "model=mlp", "precision=fp32", "num_slots=33", f"run_dir={run_dir}"]
    proc = _cli(args, tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "auto (num_actors, envs_per_actor)" in proc.stderr  # it did calibrate
    assert "ConfigError: num_slots=33 cannot hold batch_size=32" in proc.stderr
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_a_sweep_checks_every_point_before_the_first_starts(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", "batch_size=4,-1", "env=cartpole", "model=mlp", "total_frames=2000"]
    proc = _cli([*args, f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "1 of the sweep's 2 points cannot run, so none was started" in proc.stderr
    assert "point #1 (batch_size=-1" in proc.stderr and "batch_size=-1 must be" in proc.stderr
    assert "Launching" not in proc.stdout + proc.stderr  # point #0, valid, never started
    assert not sweep_dir.exists() and not (tmp_path / "cache").exists()


def test_hydra_output_dir_follows_run_dir(tmp_path):
    given = _cli(["--cfg", "all", "--resolve", f"run_dir={tmp_path / 'mine'}"], tmp_path)
    assert given.returncode == 0, given.stderr[-3000:]
    assert yaml.safe_load(given.stdout)["hydra"]["run"]["dir"] == str(tmp_path / "mine")
    default = _cli(["--cfg", "all", "--resolve"], tmp_path)
    assert default.returncode == 0, default.stderr[-3000:]
    # No run_dir: the dated dir under ./runs.
    assert yaml.safe_load(default.stdout)["hydra"]["run"]["dir"].startswith("runs/")


def test_version_names_the_package(tmp_path):
    proc = _cli(["--version"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith("impala_gpu ") and first.split()[1][0].isdigit(), proc.stdout


@pytest.mark.parametrize(
    "change,key",
    [
        ({"algo": AlgoCfg(learning_rate=-1.0)}, "algo.learning_rate"),
        ({"algo": AlgoCfg(learning_rate=math.nan)}, "algo.learning_rate"),
        ({"algo": AlgoCfg(learning_rate=math.inf)}, "algo.learning_rate"),
        ({"algo": AlgoCfg(discount=1.5)}, "algo.discount"),
        ({"algo": AlgoCfg(entropy_cost=-0.01)}, "algo.entropy_cost"),
        ({"algo": AlgoCfg(name="ppo")}, "algo.name"),
        ({"algo": AlgoCfg(epochs=0)}, "algo.epochs"),
        ({"wandb": WandbCfg(mode="bogus")}, "wandb.mode"),
        ({"total_frames": 0}, "total_frames"),
        ({"num_slots": 32}, "num_slots"),  # batch_size 32 + at least one unroll
        ({"num_slots": -1}, "num_slots"),
        ({"num_actors": 0}, "num_actors"),
        ({"precision": "fp16"}, "precision"),
        ({"max_seconds": -1.0}, "max_seconds"),
    ],
)
def test_the_check_before_auto_names_the_key(change, key):
    cfg = dataclasses.replace(Config(env=EnvCfg(id="CartPole-v1")), **change)
    assert cfg.num_actors == "auto" or cfg.precision == "auto"
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, allow_auto=True)
    assert f"{key}=" in str(info.value) and "Fix:" in str(info.value)


def test_the_check_before_auto_passes_the_defaults_and_leaves_auto_to_the_full_check():
    cfg = Config(env=EnvCfg(id="CartPole-v1"))
    validate_config(cfg, allow_auto=True)
    validate_config(dataclasses.replace(cfg, num_slots=33), allow_auto=True)  # 32 + 1 unroll
    with pytest.raises(ConfigError, match="precision=auto reached the runtime"):
        validate_config(cfg)


def test_the_atari_recipe_given_a_vector_env_id_names_the_env_group_to_take(tmp_path):
    # recipe=atari is what the bare command composes (env=pong brings it): env.id alone keeps it.
    run_dir = tmp_path / "run"
    proc = _cli(["recipe=atari", "env.id=CartPole-v1", f"run_dir={run_dir}"], tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "ConfigError: model.name=shallow needs image observations" in proc.stderr
    assert "Fix: env=cartpole or env=lunarlander" in proc.stderr
    assert "auto (" not in proc.stderr and not run_dir.exists()
