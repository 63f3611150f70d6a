"""Tests for the Hydra config tree (conf/ + impala_gpu.config), the CLI and validate_config."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from leakcheck import schema_defaults
from omegaconf import OmegaConf

from impala_gpu.cli import CONF_DIR, save_config
from impala_gpu.config import (
    AlgoCfg,
    Config,
    ConfigError,
    EnvCfg,
    ModelCfg,
    WandbCfg,
    register_configs,
)
from impala_gpu.validate import validate_config

REPO_ROOT = Path(CONF_DIR).parent

TOP_LEVEL_TYPES = {
    "total_frames": int,
    "num_actors": str,  # "auto" by default; an int when set
    "envs_per_actor": str,
    "precision": str,
    "unroll_length": int,
    "batch_size": int,
    "device": str,
    "seed": int,
}


@pytest.fixture(scope="module")
def hydra_compose():
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        yield lambda overrides=(): compose(config_name="config", overrides=list(overrides))


def _to_config(dcfg) -> Config:
    cfg = OmegaConf.to_object(dcfg)
    assert isinstance(cfg, Config)
    return cfg


def _exception_chain_text(exc: BaseException) -> str:
    parts = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


# --------------------------------------------------------------------------- composition


@pytest.mark.parametrize(
    "env,env_id",
    [("pong", "ALE/Pong-v5"), ("breakout", "ALE/Breakout-v5"), ("cartpole", "CartPole-v1")],
)
def test_compose_env_group(hydra_compose, env, env_id):
    cfg = _to_config(hydra_compose(["~recipe", f"env={env}"]))
    assert isinstance(cfg.env, EnvCfg)
    assert cfg.env.id == env_id
    assert cfg.env.clip_rewards is (env != "cartpole")
    assert cfg.env.episodic_life is (env == "breakout")  # Breakout trains by lives


@pytest.mark.parametrize("model", ["auto", "shallow", "resnet", "mlp"])
def test_compose_model_group(hydra_compose, model):
    cfg = _to_config(hydra_compose(["~recipe", f"model={model}"]))
    assert isinstance(cfg.model, ModelCfg)
    assert cfg.model.name == model
    assert cfg.model.hidden_size == (64 if model == "mlp" else 256)


def test_compose_algo_group(hydra_compose):
    cfg = _to_config(hydra_compose(["~recipe", "algo=impala"]))
    assert isinstance(cfg.algo, AlgoCfg)
    assert cfg.algo == AlgoCfg(name="impala")


def test_compose_default_is_the_pong_recipe(hydra_compose):
    cfg = _to_config(hydra_compose())
    assert cfg == _to_config(hydra_compose(["experiment=pong_impala"]))
    assert cfg.env.id == "ALE/Pong-v5" and cfg.model.name == "shallow"
    assert cfg.algo.name == "impala" and cfg.target_return == 18
    assert isinstance(cfg.wandb, WandbCfg)
    schema = _to_config(hydra_compose(["~recipe"]))
    assert schema.model.name == "auto" and schema.target_return is None


# The IMPALA paper's shallow Atari agent (Espeholt et al. 2018, table D.2 and section 5.3),
# as the project has always stated it: a preset that stays this when the schema changes.
PAPER_PONG = {
    "total_frames": 50_000_000,
    "unroll_length": 20,
    "batch_size": 32,
    "target_return": None,
    "bounded_lag": None,
    "model": {"name": "shallow", "init": "torch", "hidden_size": 256, "use_lstm": False},
    "algo": {
        "name": "impala",
        "optimizer": "rmsprop",
        "learning_rate": 6e-4,
        "rmsprop_alpha": 0.99,
        "rmsprop_eps": 0.01,
        "lr_schedule": "linear",
        "lr_decay_frames": 0,
        "reduction": "sum",
        "discount": 0.99,
        "baseline_cost": 0.5,
        "entropy_cost": 0.01,
        "grad_norm_clip": 40.0,
        "vtrace_lambda": 1.0,
        "epochs": 1,
        "ppo_clip": 0.0,
        "normalize_advantages": False,
    },
}


def test_paper_pong_is_the_papers_recipe(hydra_compose):
    cfg = _to_config(hydra_compose(["experiment=paper_pong"]))
    assert cfg.env.id == "ALE/Pong-v5"
    _assert_subset(PAPER_PONG, dataclasses.asdict(cfg))


def _experiment_values(name: str, group: str = "experiment") -> dict:
    """The keys an experiment file sets, merged over those of the experiments it lists in its
    defaults and of the recipe it picks (``override /recipe: atari``; other entries there, like
    ``override /env``, are config groups), as a nested dict. Interpolations are left out: the
    recipes' ``target_return`` depends on the env id (``impala_gpu.config.STOP_RETURNS``)."""
    own = OmegaConf.load(Path(CONF_DIR) / group / f"{name}.yaml")
    own.pop("hydra", None)  # the sweeper's grid: Hydra's settings, not the run's config
    defaults = own.pop("defaults", [])
    parents = [(d, group) for d in defaults if isinstance(d, str) and not d.startswith("/")]
    recipes = [d.get("override /recipe") for d in defaults if not isinstance(d, str)]
    parents += [(r, "recipe") for r in recipes if r]
    merged = OmegaConf.merge(*(_experiment_values(p, g) for p, g in parents), own)
    return _without_interpolations(OmegaConf.to_container(merged))


def _without_interpolations(values: dict) -> dict:
    return {
        k: _without_interpolations(v) if isinstance(v, dict) else v
        for k, v in values.items()
        if not (isinstance(v, str) and v.startswith("${"))
    }


def _assert_subset(expected: dict, actual: dict, prefix: str = "") -> None:
    for key, value in expected.items():
        if isinstance(value, dict):
            _assert_subset(value, actual[key], f"{prefix}{key}.")
        else:
            assert actual[key] == pytest.approx(value), f"{prefix}{key}"


@pytest.mark.parametrize(
    "experiment,env_id,model",
    [
        ("cartpole_impala", "CartPole-v1", "mlp"),
        ("pong_impala", "ALE/Pong-v5", "shallow"),
        ("paper_pong", "ALE/Pong-v5", "shallow"),
        ("pong_a2c_sizes", "ALE/Pong-v5", "shallow"),
        ("breakout_impala", "ALE/Breakout-v5", "shallow"),
        ("lag_study", "LunarLander-v3", "mlp"),
        ("lag_study_minatar", "MinAtar/Breakout-v1", "minatar"),
    ],
)
def test_compose_experiment(hydra_compose, experiment, env_id, model):
    cfg = _to_config(hydra_compose([f"experiment={experiment}"]))
    assert cfg.env.id == env_id
    assert cfg.model.name == model
    # Every value the (@package _global_) experiment file sets lands in the composed config.
    values = _experiment_values(experiment)
    assert "total_frames" in values and "batch_size" in values
    _assert_subset(values, dataclasses.asdict(cfg))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_breakout_preset_is_the_pong_recipe_plus_its_documented_changes(hydra_compose):
    pong = _flat(dataclasses.asdict(_to_config(hydra_compose(["experiment=pong_impala"]))))
    breakout = _flat(dataclasses.asdict(_to_config(hydra_compose(["experiment=breakout_impala"]))))
    differ = {k for k in pong if pong[k] != breakout[k]}
    own = {"total_frames", "target_return", "algo.entropy_cost"}
    assert {k for k in differ if not k.startswith("env.")} == own
    assert (breakout["algo.entropy_cost"], breakout["target_return"]) == (0.02, 100)


def test_experiment_cartpole_overrides_defaults(hydra_compose):
    default = _to_config(hydra_compose(["~recipe", "env=cartpole", "model=mlp"]))
    cfg = _to_config(hydra_compose(["experiment=cartpole_impala"]))
    assert cfg.batch_size != default.batch_size
    assert cfg.total_frames != default.total_frames
    assert cfg.algo.optimizer == "adam" != default.algo.optimizer
    assert cfg.algo.reduction == "mean" != default.algo.reduction


def test_command_line_override_beats_experiment(hydra_compose):
    cfg = _to_config(hydra_compose(["experiment=cartpole_impala", "batch_size=16", "seed=3"]))
    assert (cfg.batch_size, cfg.seed) == (16, 3)


def test_top_level_keys_and_types(hydra_compose):
    dcfg = hydra_compose(["~recipe"])  # the schema's own defaults
    cfg = _to_config(dcfg)
    for key, typ in TOP_LEVEL_TYPES.items():
        assert key in dcfg
        assert type(getattr(cfg, key)) is typ, key
    assert cfg.device == "auto"
    assert (cfg.precision, cfg.num_actors, cfg.envs_per_actor) == ("auto", "auto", "auto")
    set_ = _to_config(hydra_compose(["num_actors=3", "envs_per_actor=8", "precision=bf16"]))
    assert (set_.num_actors, set_.envs_per_actor, set_.precision) == (3, 8, "bf16")
    assert cfg.wandb.mode == "offline"
    assert cfg.seed == 0
    assert cfg.bounded_lag is None


# --------------------------------------------------------------------------- bad overrides


@pytest.mark.parametrize(
    "override,key",
    # num_actors=abc composes (the key takes an int or auto); resolve_auto rejects it:
    # tests/test_calibration.py.
    [("algo.lrr=1", "lrr"), ("env.idd=x", "idd")],
)
def test_bad_override_names_key(hydra_compose, override, key):
    with pytest.raises(Exception) as info:  # noqa: B017 - Hydra wraps omegaconf's errors
        hydra_compose([override])
    assert key in _exception_chain_text(info.value)


def test_wrong_type_nested(hydra_compose):
    with pytest.raises(Exception) as info:  # noqa: B017
        hydra_compose(["model.use_lstm=maybe"])
    text = _exception_chain_text(info.value)
    assert "use_lstm" in text


# --------------------------------------------------------------------------- CLI


def _run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HYDRA_FULL_ERROR="0", WANDB_MODE="disabled")
    return subprocess.run(
        [sys.executable, "-m", "impala_gpu", *args, *schema_defaults(args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_prints_job_config(tmp_path):
    proc = _run_cli(["--cfg", "job", "env=cartpole"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    for key in TOP_LEVEL_TYPES:
        assert key in printed, key
    assert "id: CartPole-v1" in proc.stdout
    assert printed["env"]["id"] == "CartPole-v1"
    assert printed["device"] == "auto"
    assert printed["wandb"]["mode"] == "offline"
    # --cfg only prints: nothing is run, so no run directory appears.
    assert list(tmp_path.iterdir()) == []


def test_cli_bad_override_fails(tmp_path):
    proc = _run_cli(["--cfg", "job", "algo.lrr=1"], tmp_path)
    assert proc.returncode != 0
    assert "lrr" in proc.stdout + proc.stderr


# --------------------------------------------------------------------------- validate_config


def _cartpole_cfg(**kw) -> Config:
    base = Config(
        env=EnvCfg(id="CartPole-v1"),
        model=ModelCfg(name="mlp"),
        num_actors=2,
        envs_per_actor=8,
        batch_size=32,
        device="cpu",
        precision="fp32",
    )
    return dataclasses.replace(base, **kw)


def test_validate_accepts_cartpole():
    validate_config(_cartpole_cfg())
    validate_config(_cartpole_cfg(num_slots=48))  # exactly batch + actors * envs
    validate_config(_cartpole_cfg(bounded_lag=1, batch_size=16))


def test_validate_accepts_composed_configs(hydra_compose):
    validate_config(_to_config(hydra_compose(["experiment=cartpole_impala", "precision=fp32"])))
    # The Atari recipe leaves the actor count, and so its exact lag, to auto; paper_pong leaves
    # the actor split to auto, as the paper's fleet size means nothing here.
    for name in ("pong_impala", "breakout_impala", "paper_pong"):
        cfg = _to_config(hydra_compose([f"experiment={name}"]))
        validate_config(cfg, allow_auto=True)
    for name in ("pong_impala", "breakout_impala"):  # as auto would resolve them
        overrides = [f"experiment={name}", "precision=fp32", "num_actors=4", "bounded_lag=4"]
        validate_config(_to_config(hydra_compose(overrides)))


@pytest.mark.parametrize(
    "overrides,key",
    [
        ({"num_actors": 0}, "num_actors"),
        ({"envs_per_actor": 0}, "envs_per_actor"),
        ({"unroll_length": 0}, "unroll_length"),
        ({"batch_size": 0}, "batch_size"),
        ({"total_frames": -1}, "total_frames"),
        ({"num_slots": 4}, "num_slots"),
        ({"num_slots": 47}, "num_slots"),
        ({"bounded_lag": 1, "batch_size": 12}, "bounded_lag"),
        ({"bounded_lag": 1, "max_policy_lag": 3}, "max_policy_lag"),
        ({"publish_interval": 0}, "publish_interval"),
        ({"start_method": "fork"}, "start_method"),
        ({"device": "tpu"}, "device"),
        ({"algo": AlgoCfg(correction="retrace")}, "algo.correction='retrace'"),
    ],
)
def test_validate_rejects(overrides, key):
    with pytest.raises(ConfigError) as info:
        validate_config(_cartpole_cfg(**overrides))
    assert key in str(info.value)


def test_validate_rejects_bounded_lag_message_names_both_keys():
    with pytest.raises(ConfigError) as info:
        validate_config(_cartpole_cfg(bounded_lag=0, batch_size=12, envs_per_actor=8))
    msg = str(info.value)
    assert "batch_size" in msg and "envs_per_actor" in msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present: device=cuda is valid")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_validate_rejects_cuda_without_cuda(device):
    with pytest.raises(ConfigError) as info:
        validate_config(_cartpole_cfg(device=device))
    assert "device" in str(info.value)


def test_validate_rejects_unknown_env_and_bad_backend():
    with pytest.raises(ValueError, match="env.id"):
        validate_config(_cartpole_cfg(env=EnvCfg(id="CartPol-v1")))
    with pytest.raises(ValueError, match="vector_backend"):
        validate_config(_cartpole_cfg(env=EnvCfg(id="CartPole-v1", vector_backend="ale")))


def test_validate_rejects_unknown_model():
    with pytest.raises(ConfigError, match="model.name"):
        validate_config(_cartpole_cfg(model=ModelCfg(name="transformer")))


# --------------------------------------------------------------------------- save_config


def test_save_config_round_trips(hydra_compose, tmp_path):
    cfg = _to_config(
        hydra_compose(
            [
                "experiment=cartpole_impala",
                "seed=7",
                "bounded_lag=2",
                "algo.clip_rho_threshold=null",
                "wandb.tags=[a,b]",
                "run_dir=/tmp/somewhere",
            ]
        )
    )
    path = save_config(cfg, tmp_path / "nested" / "run")
    assert path == tmp_path / "nested" / "run" / "config.yaml"
    assert path.is_file()
    loaded = OmegaConf.load(path)
    merged = OmegaConf.merge(OmegaConf.structured(Config), loaded)
    back = OmegaConf.to_object(merged)
    assert isinstance(back, Config)
    assert back == cfg
    assert back != Config(env=EnvCfg(id="CartPole-v1"))  # the comparison is not vacuous
    assert back.seed == 7 and back.bounded_lag == 2 and back.algo.clip_rho_threshold is None
    assert back.wandb.tags == ["a", "b"]


def test_help_speaks_for_the_program(tmp_path):
    out = _run_cli(["--help"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert text.startswith("impala_gpu:") and "powered by Hydra" not in text
    for group in ("env", "model", "algo", "experiment"):
        assert f"\n  {group} " in text, f"--help does not explain the {group} group"
    assert "pong_impala" in text and "python -m impala_gpu -m" in text  # the two examples


def _steps_per_update(cfg: Config) -> int:
    """Agent steps one update learns from: IMPALA's B x T, A2C's every env x T, and one A3C
    worker's own envs x T."""
    if cfg.algo.name == "a2c":
        return cfg.num_actors * cfg.envs_per_actor * cfg.unroll_length
    if cfg.algo.name == "a3c":
        return cfg.envs_per_actor * cfg.unroll_length
    return cfg.batch_size * cfg.unroll_length


@pytest.mark.parametrize("experiment, steps", [("compare_cartpole", 320), ("compare_pong", 80)])
def test_comparison_cells_compose_with_one_update_size(hydra_compose, experiment, steps):
    swept = OmegaConf.load(Path(CONF_DIR) / "experiment" / f"{experiment}.yaml")
    cells = swept.hydra.sweeper.params.compare_cell.split(",")
    assert {"impala", "a2c", "a3c"} <= set(cells)
    for cell in cells:
        cfg = _to_config(hydra_compose([f"experiment={experiment}", f"compare_cell={cell}"]))
        validate_config(dataclasses.replace(cfg, precision="fp32"))
        assert cfg.algo.name == cell.split("_")[0]
        # a3c_160 is the unmatched A3C kept for the before/after figures in docs/results/compare.md.
        assert _steps_per_update(cfg) == (steps // 2 if cell == "a3c_160" else steps), cell


def test_an_update_counts_the_fresh_trajectories_steps_and_frames() -> None:
    from impala_gpu.config import ReplayCfg, frames_per_update, steps_per_update

    cfg = Config(env=EnvCfg(id="ALE/Pong-v5"), batch_size=32, unroll_length=20)
    assert steps_per_update(cfg) == 32 * 20
    assert frames_per_update(cfg, 4) == 32 * 20 * 4
    # A quarter of each batch replayed: those steps were counted when they were fresh.
    cfg.replay = ReplayCfg(proportion=0.25, capacity=100)
    assert steps_per_update(cfg) == 24 * 20
    assert frames_per_update(cfg, 4) == 24 * 20 * 4
