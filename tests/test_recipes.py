"""One flag changes the env: each env group brings its family's recipe (conf/recipe/), the stop
target follows the env id that runs (``impala_gpu.config.STOP_RETURNS``), and the run dir and
W&B name carry that id. Compose-level checks, then the default command run end to end."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from leakcheck import leaked_shm, processes_with_marker, read_metrics, run_cli, shm_entries
from omegaconf import OmegaConf

from impala_gpu.cli import CONF_DIR
from impala_gpu.config import Config, register_configs
from impala_gpu.reporting.logger import run_names
from impala_gpu.reporting.progress import eta_text
from impala_gpu.validate import validate_config

RECIPES = Path(CONF_DIR) / "recipe"


@pytest.fixture(scope="module")
def compose_run():
    """``(Config, Hydra's group choices, the run dir Hydra would make)`` for some overrides of
    the default command."""
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):

        def composed(overrides=()) -> tuple[Config, dict, str]:
            dcfg = compose("config", overrides=list(overrides), return_hydra_config=True)
            choices = {k: v for k, v in dcfg.hydra.runtime.choices.items() if v is not None}
            # Resolved as Hydra does at a run's start (${now:...}, ${hydra:...} read it), then
            # unset: later tests in this process must not see a run's HydraConfig.
            HydraConfig.instance().set_config(dcfg)
            try:
                run_dir = str(dcfg.hydra.run.dir)
            finally:
                HydraConfig.instance().cfg = None
            del dcfg.hydra
            cfg = OmegaConf.to_object(dcfg)
            assert isinstance(cfg, Config)
            return cfg, choices, run_dir

        yield composed


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _recipe_values(name: str) -> dict:
    """What conf/recipe/<name>.yaml sets, flat; its ``target_return`` interpolation left out."""
    values = OmegaConf.to_container(OmegaConf.load(RECIPES / f"{name}.yaml"))
    values.pop("defaults")
    return {k: v for k, v in _flat(values).items() if not str(v).startswith("${")}


# overrides of the default command -> env id, recipe, model, normalize_input, target_return
SWITCHES = [
    ((), "ALE/Pong-v5", "atari", "shallow", True, 18.0),
    (("env=breakout",), "ALE/Breakout-v5", "atari", "shallow", True, 100.0),
    (("env.id=ALE/SpaceInvaders-v5",), "ALE/SpaceInvaders-v5", "atari", "shallow", True, None),
    (("env=cartpole",), "CartPole-v1", "classic_control", "mlp", False, 475.0),
    (("env=cartpole", "env.id=Acrobot-v1"), "Acrobot-v1", "classic_control", "mlp", False, None),
    (("env=lunarlander",), "LunarLander-v3", "box2d", "mlp", False, 200.0),
    (("env=minatar_breakout",), "MinAtar/Breakout-v1", "minatar", "minatar", False, None),
]


@pytest.mark.parametrize("overrides,env_id,recipe,model,normalize,target", SWITCHES)
def test_one_flag_picks_the_env_familys_recipe(
    compose_run, overrides, env_id, recipe, model, normalize, target
):
    cfg, choices, _ = compose_run(overrides)
    assert (cfg.env.id, choices["recipe"], cfg.model.name) == (env_id, recipe, model)
    assert cfg.model.normalize_input is normalize
    assert cfg.target_return == target  # Pong's 18 never reaches another game
    flat = _flat(dataclasses.asdict(cfg))
    for key, value in _recipe_values(recipe).items():
        assert flat[key] == pytest.approx(value), key
    validate_config(cfg, allow_auto=True)  # it runs as composed: nothing else to set


@pytest.mark.parametrize(
    "env,preset,differ",
    [
        # The presets the recipes were taken from; what differs is what a study pins for its
        # sweep (its budget, fp32, no checkpoints, the lag cell) and the env's solved score.
        ("cartpole", "cartpole_impala", set()),
        ("pong", "pong_impala", set()),
        ("lunarlander", "lag_study", {"total_frames", "target_return", "precision"}),
        ("minatar_breakout", "lag_study_minatar", {"precision"}),
    ],
)
def test_each_family_recipe_is_its_presets(compose_run, env, preset, differ):
    recipe = _flat(dataclasses.asdict(compose_run([f"env={env}"])[0]))
    study = _flat(dataclasses.asdict(compose_run([f"experiment={preset}"])[0]))
    study_only = {"checkpoint.every_minutes", "bounded_lag"} if "lag_study" in preset else set()
    assert {k for k in recipe if recipe[k] != study[k]} == differ | study_only


def test_presets_keep_their_own_recipe(compose_run):
    # A preset pins its recipe (or none): the env it names does not bring another under it.
    paper, choices, _ = compose_run(["experiment=paper_pong"])
    assert "recipe" not in choices and paper.num_actors == "auto"
    assert compose_run(["experiment=lag_study"])[0].target_return is None
    assert compose_run(["experiment=compare_cartpole"])[0].target_return is None
    # cartpole_impala stops at 475, as the README says (it ran 1.5M frames past it).
    assert compose_run(["experiment=cartpole_impala"])[0].target_return == 475.0


@pytest.mark.parametrize(
    "overrides,short,name",
    [
        (("env.id=ALE/SpaceInvaders-v5",), "spaceinvaders", "impala-spaceinvaders-s0"),
        (("env=cartpole", "env.id=Acrobot-v1"), "acrobot", "impala-acrobot-s0"),
        (("env=minatar_breakout",), "minatar_breakout", "impala-minatar_breakout-s0"),
        (("experiment=pong_impala", "env.id=ALE/Qbert-v5"), "qbert", "pong_impala-qbert-s0"),
    ],
)
def test_run_dir_and_wandb_name_carry_the_env_that_runs(compose_run, overrides, short, name):
    cfg, choices, run_dir = compose_run(overrides)
    assert run_dir.startswith("runs/") and run_dir.endswith(f"_impala_{short}")
    assert run_names(cfg, {}, choices, today="2026-12-06").name == name


def test_breakout_shows_its_own_target_and_another_game_none(compose_run):
    breakout = compose_run(["env=breakout"])[0]
    assert eta_text(0, breakout.total_frames, 1e3, breakout.target_return).endswith(
        "(or sooner at return 100)"
    )
    invaders = compose_run(["env.id=ALE/SpaceInvaders-v5"])[0]
    assert "or sooner" not in eta_text(0, invaders.total_frames, 1e3, invaders.target_return)


# --------------------------------------------------------------------------- the CLI


@pytest.mark.slow
def test_env_cartpole_from_the_default_command_reaches_475_and_stops(tmp_path):
    """``python -m impala_gpu env=cartpole`` and nothing else that changes training: it passes
    a mean return of 475 (~700K frames, about a minute on 2 free cores) and stops there, well
    inside the recipe's 1.5M frames and the safety cap."""
    run_dir = tmp_path / "run"
    run_cli(run_dir, "env=cartpole", "max_seconds=480", timeout=600, schema=False)
    last = read_metrics(run_dir)[-1]
    assert last["episode_return"] >= 475 and last["episodes"] >= 100, last
    assert last["frames"] < 1_500_000 and last["elapsed_s"] < 480  # no budget nor cap ended it
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["target_return"] == 475 and saved["model"]["name"] == "mlp"


def _default_command(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``python -m impala_gpu`` in ``cwd`` with no run_dir= (Hydra names it), W&B off; no
    child process and no /dev/shm segment may outlive it."""
    marker, shm_before = uuid.uuid4().hex, shm_entries()
    proc = subprocess.run(
        [sys.executable, "-m", "impala_gpu", "wandb.mode=disabled", "progress=false", *overrides],
        cwd=cwd,
        env={**os.environ, "IMPALA_TEST_MARKER": marker},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert processes_with_marker(marker) == [], "a child process outlived the run"
    assert leaked_shm(shm_before) == set()
    return proc


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides,short,target",
    [
        # 1 update of the Atari recipe (16 x 64 agent steps of 4 frames each).
        (("env.id=ALE/SpaceInvaders-v5", "total_frames=4096"), "spaceinvaders", None),
        # 50 updates of the Box2D recipe (8 x 5 steps).
        (("env=lunarlander", "total_frames=2000"), "lunarlander", 200),
    ],
)
def test_another_env_trains_from_the_default_command_to_its_budget(
    tmp_path, overrides, short, target
):
    # fp32: auto would measure bf16 against fp32 first, minutes on a busy box, for nothing the
    # env switch decides.
    _default_command(tmp_path, *overrides, "precision=fp32")
    (run_dir,) = tmp_path.glob(f"runs/*/*_impala_{short}")  # named by the env that ran
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["target_return"] == target  # not Pong's 18
    last = read_metrics(run_dir)[-1]
    assert last["frames"] >= saved["total_frames"]  # played its budget: no target stopped it
