"""The configuration errors a GPU user meets first, each a ConfigError naming the key and the
fix before any process or file: ``learners`` beyond the GPUs (NCCL), a ``cuda:N`` that is not
there, and a ring that ``/dev/shm`` cannot hold. Checked on CPU: ``torch.cuda``'s counts and
``os.statvfs`` are monkeypatched to describe the machine each case needs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from impala_gpu import resources
from impala_gpu.algos.a2c import synchronous_config
from impala_gpu.channels.params import ParamStore
from impala_gpu.channels.ring import TrajectoryRing, ring_spec
from impala_gpu.config import Config, ConfigError, EnvCfg, ModelCfg, resolve_device
from impala_gpu.models import build_model
from impala_gpu.validate import validate_config, validate_run_config

REPO = Path(__file__).resolve().parent.parent


def cartpole(**kw) -> Config:
    base = Config(
        env=EnvCfg(id="CartPole-v1"),
        model=ModelCfg(name="mlp"),
        num_actors=2,
        envs_per_actor=4,
        batch_size=8,
        precision="fp32",
        device="cpu",
    )
    return dataclasses.replace(base, **kw)


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)``: torch sees ``n`` CUDA devices named ``Fake GPU`` (0: no CUDA at all)."""

    def have(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "Fake GPU")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    return have


def message(cfg: Config, allow_auto: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, allow_auto=allow_auto)
    text = str(info.value)
    assert "Fix:" in text and "\n" not in text, text
    return text


# ------------------------------------------------------------------------------ learners (NCCL)
def test_more_learners_than_gpus_on_cuda_is_a_config_error(gpus):
    gpus(1)
    msg = message(cartpole(device="cuda", learners=2))
    assert msg.startswith("learners=2 on device=cuda")
    assert "1 visible (cpu, cuda:0 (Fake GPU))" in msg
    assert "learners=1" in msg and "device=cpu" in msg
    message(cartpole(device="auto", learners=2))  # auto picks CUDA here: NCCL too
    validate_config(cartpole(device="cpu", learners=2))  # gloo: ranks share the CPU
    validate_config(cartpole(device="cuda", learners=1))
    gpus(2)
    validate_config(cartpole(device="cuda", learners=2))  # one GPU each


def test_torchrun_processes_per_node_beyond_the_gpus_name_nproc_per_node(gpus, monkeypatch):
    gpus(2)
    monkeypatch.setenv("WORLD_SIZE", "8")  # 2 nodes x 4 processes
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    msg = message(cartpole(device="cuda"))
    assert msg.startswith("torchrun --nproc-per-node=4 on device=cuda")
    assert "--nproc-per-node=2" in msg
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    validate_config(cartpole(device="cuda"))  # 2 processes a node, 2 GPUs a node


# --------------------------------------------------------------------------------- cuda:N
def test_a_missing_cuda_index_is_a_config_error_listing_the_devices(gpus):
    gpus(2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    msg = message(cartpole(device="cuda:2"))
    assert msg.startswith("device=cuda:2 but this machine has 2 visible CUDA device(s)")
    assert "cpu, cuda:0 (Fake GPU), cuda:1 (Fake GPU)" in msg and "device=cuda:1" in msg


def test_cuda_without_cuda_lists_the_cpu_as_all_there_is(gpus):
    gpus(0)
    for device in ("cuda", "cuda:0"):
        assert "devices here: cpu)" in message(cartpole(device=device))


def test_a_malformed_cuda_device_is_a_config_error_not_a_runtime_error(gpus):
    gpus(1)
    assert "device='cuda:x' is not one of" in message(cartpole(device="cuda:x"))


# ------------------------------------------------------------------------------- /dev/shm
class FakeStatvfs:
    def __init__(self, free_bytes: int):
        self.f_frsize = 1  # blocks of one byte: the free space exactly
        self.f_bavail = free_bytes


@pytest.fixture
def shm_free(monkeypatch):
    """``shm_free(n)``: /dev/shm reports ``n`` bytes free (None: there is no /dev/shm)."""
    real = os.statvfs

    def have(free: int | None) -> None:
        def statvfs(path):
            if path != resources.SHM_DIR:
                return real(path)
            if free is None:
                raise FileNotFoundError(path)
            return FakeStatvfs(free)

        monkeypatch.setattr(os, "statvfs", statvfs)

    return have


def need_of(cfg: Config, slots: int) -> resources.SharedMemoryNeed:
    return resources.shared_memory_need(cfg, slots)


def test_the_counted_bytes_are_what_the_ring_and_parameter_store_allocate():
    cfg = cartpole(bounded_lag=1, model=ModelCfg(name="mlp", use_lstm=True))
    spec = resources.cached_env_spec(cfg)
    ring = TrajectoryRing(ring_spec(cfg, spec, 20))
    try:
        need = need_of(cfg, 20)
        assert need.ring_bytes == sum(t.nbytes for t in ring.fields.values())
        assert need.slot_bytes * 20 == need.ring_bytes
    finally:
        ring.close()
    store = ParamStore.for_model(build_model(spec.obs_shape, spec.num_actions, cfg.model), 3)
    assert need.param_bytes == store.flat.nbytes  # bounded_lag=1 keeps 3 versions


def test_a_ring_larger_than_dev_shm_is_a_config_error_with_both_sizes(shm_free):
    cfg = cartpole()  # auto ring: 2 batches + 2 unrolls per env = 32 slots
    need = need_of(cfg, 32)
    shm_free(need.total - 1)
    msg = message(cfg)
    assert msg.startswith("num_slots=0 (auto: 32) x unroll_length=20 (num_actors=2 x ")
    assert "envs_per_actor=4, batch_size=8)" in msg
    assert f"needs {resources.size_text(need.ring_bytes)} of shared memory" in msg
    assert f"/dev/shm has {resources.size_text(need.total - 1)} free" in msg
    assert "--shm-size" in msg and "shorter unroll_length" in msg
    shm_free(need.total)
    validate_config(cfg)  # exactly enough
    shm_free(None)
    validate_config(cartpole(num_slots=10_000))  # no /dev/shm (macOS): nothing to check


def test_the_fix_names_the_most_slots_that_fit(shm_free):
    cfg = cartpole(num_slots=100)
    need = need_of(cfg, 100)
    shm_free(need.param_bytes + 40 * need.slot_bytes + 10)
    assert "Fix: num_slots=40 (the most that fit)" in message(cfg)
    validate_config(dataclasses.replace(cfg, num_slots=40))


def test_the_check_before_auto_counts_auto_at_its_least(shm_free):
    cfg = cartpole(num_actors="auto", envs_per_actor="auto", precision="auto")
    least = need_of(cfg, 2 * 8 + 2)  # 2 batches + 2 unrolls of 1 actor x 1 env
    shm_free(least.total)
    validate_config(cfg, allow_auto=True)
    shm_free(least.total - 1)
    assert "num_slots=0 (auto: 18)" in message(cfg, allow_auto=True)


def test_the_cli_stops_on_a_full_dev_shm_before_any_run_dir(tmp_path):
    """The whole command, with ``os.statvfs`` reporting 1 MiB free on /dev/shm: the check runs
    in Hydra's callback, before Hydra makes the run dir."""
    run_dir = tmp_path / "run"
    args = ["~recipe", "env=cartpole", "model=mlp", "precision=fp32", "num_actors=1"]
    args += ["envs_per_actor=2", "num_slots=5000", "total_frames=400", "wandb.mode=disabled"]
    args += ["progress=false", f"run_dir={run_dir}"]
    code = (
        "import os, sys; real = os.statvfs\n"
        "class Full: f_frsize = 4096; f_bavail = 256\n"
        "os.statvfs = lambda p: Full() if p == '/dev/shm' else real(p)\n"
        f"sys.argv = ['impala_gpu', *{args!r}]\n"
        "from impala_gpu.cli import main; main()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0", WANDB_MODE="disabled")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "ConfigError: num_slots=5000 x unroll_length=20" in proc.stderr, proc.stderr[-3000:]
    assert "/dev/shm has 1.0 MiB free" in proc.stderr
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_the_run_config_is_checked_where_auto_or_the_algorithm_changed_it():
    """``validate_run_config`` takes ``validate_config``'s verdict on the keys that did not
    change, and checks again what depends on the ones ``auto`` resolved: room for one unroll
    per env is checked at 1 x 1 envs first, and must hold for the counts auto chose."""
    checked = cartpole(num_actors="auto", envs_per_actor="auto", precision="auto", num_slots=12)
    validate_config(checked, allow_auto=True)  # 8 + 1 x 1 slots needed: fits
    resolved = dataclasses.replace(checked, num_actors=2, envs_per_actor=4, precision="fp32")
    with pytest.raises(ConfigError, match=r"num_slots=12 cannot hold .* needs >= 16"):
        validate_run_config(checked, resolved)
    validate_run_config(checked, dataclasses.replace(resolved, num_slots=16))
    # A key that neither auto nor an algorithm changes gets every check again.
    with pytest.raises(ConfigError, match="unroll_length=0 must be positive"):
        validate_run_config(checked, dataclasses.replace(checked, unroll_length=0))


def test_a2cs_derived_batch_is_checked_as_it_runs():
    """A2C's batch is one unroll of every env (``synchronous_config``): a split that held for
    the configured batch is checked again on the derived one."""
    a2c = dataclasses.replace(cartpole().algo, name="a2c")
    checked = cartpole(algo=a2c, num_actors=1, envs_per_actor=3, batch_size=4, learner_shards=4)
    validate_config(checked)  # 4 trajectories per step: 4 shards fit
    with pytest.warns(UserWarning, match="a2c updates on one unroll from every env"):
        runs = synchronous_config(checked)
    with pytest.raises(ConfigError, match="learner_shards=4 is more than the 3 trajectories"):
        validate_run_config(checked, runs)
