"""runtime=ray: Ray actors produce the ring's unrolls, acted by the weights they are stamped
with; on a real two-node Ray cluster on loopback, CartPole trains with actors on both nodes,
survives a SIGKILLed Ray actor, learns, and leaves no process or /dev/shm segment behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from leakcheck import cli_command, kill_marked, leaked_shm, processes_with_marker, shm_entries

from impala_gpu.channels.params import flat_parameters
from impala_gpu.config import Config, ConfigError, EnvCfg, ModelCfg
from impala_gpu.envs import env_spec
from impala_gpu.models import build_model
from impala_gpu.validate import validate_runtime

ray = pytest.importorskip("ray")

E, T = 3, 4
HEAD, WORKER, PORT = "127.0.0.2", "127.0.0.3", 6390


def small_cfg(**overrides) -> Config:
    cfg = Config(
        env=EnvCfg(id="CartPole-v1"),
        model=ModelCfg(name="mlp", hidden_size=16),
        num_actors=1,
        envs_per_actor=E,
        unroll_length=T,
        precision="fp32",
        runtime="ray",
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def weights(model, version: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(version)
    return torch.randn(flat_parameters(model).numel(), generator=g) * 0.5


@pytest.fixture
def local_ray():  # per test: later tests check how Ray starts, so none may be left up
    ray.init(address="local", num_cpus=1, object_store_memory=100 << 20, include_dashboard=False)
    yield
    ray.shutdown()


def test_worker_unrolls_carry_over_and_come_from_their_version(local_ray):
    from impala_gpu.acting.ray_pool import RolloutWorker

    cfg = small_cfg(refresh_every=1)
    spec = env_spec(cfg.env)
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    worker = ray.remote(num_cpus=1)(RolloutWorker).remote(cfg, spec, 0, 7)
    previous = None
    for version in (0, 0, 1, 5):
        ref = ray.put(weights(model, version).numpy())
        arrays, games, idle_ns, node = ray.get(worker.unroll.remote([ref], version))
        assert arrays["obs"].shape == (E, T + 1, *spec.obs_shape) and idle_ns >= 0 and node
        assert (arrays["version"] == version).all() and (arrays["actor"] == 0).all()
        assert list(arrays["env_index"]) == list(range(E))
        reference = build_model(spec.obs_shape, spec.num_actions, cfg.model)
        torch.nn.utils.vector_to_parameters(weights(model, version), reference.parameters())
        obs = torch.tensor(arrays["obs"]).transpose(0, 1)  # [T+1, E, ...]
        first = torch.tensor(arrays["first"]).transpose(0, 1)
        with torch.no_grad():
            logits = reference(obs, first).logits.transpose(0, 1)
        # Steps 0..T-1 were acted on with this version; o_T is the next unroll's o_0.
        torch.testing.assert_close(
            torch.tensor(arrays["logits"])[:, :T], logits[:, :T], rtol=1e-5, atol=1e-5
        )
        if previous is not None:
            assert (arrays["obs"][:, 0] == previous["obs"][:, T]).all()
            assert (arrays["unroll"] == previous["unroll"] + 1).all()
        previous = {k: v.copy() for k, v in arrays.items()}


def test_worker_keeps_stale_weights_until_refresh_every_behind(local_ray):
    from impala_gpu.acting.ray_pool import RolloutWorker

    cfg = small_cfg(refresh_every=3)
    spec = env_spec(cfg.env)
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    worker = ray.remote(num_cpus=1)(RolloutWorker).remote(cfg, spec, 0, 7)
    stamped = []
    for version in range(7):
        ref = ray.put(weights(model, version).numpy())
        arrays, *_ = ray.get(worker.unroll.remote([ref], version))
        stamped.append(int(arrays["version"][0]))
    assert stamped == [0, 0, 0, 3, 3, 3, 6]


def test_runtime_ray_checks_its_config(monkeypatch):
    with pytest.raises(ConfigError, match="bounded_lag"):
        validate_runtime(small_cfg(bounded_lag=2))
    with pytest.raises(ConfigError, match="object_store_mb"):
        cfg = small_cfg()
        cfg.ray.object_store_mb = 10
        validate_runtime(cfg)
    with pytest.raises(ConfigError, match="runtime='rays'"):
        validate_runtime(small_cfg(runtime="rays"))
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[ray\]"'):
        validate_runtime(small_cfg())


def test_an_unreachable_cluster_fails_at_once_with_the_fix():
    from impala_gpu.acting.ray_pool import connect

    cfg = small_cfg()
    cfg.ray.address = "127.0.0.9:1"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"nothing answers at ray.address='127.0.0.9:1'"):
        connect(cfg)
    assert time.monotonic() - t0 < 15 and not ray.is_initialized()


def test_runtime_ray_is_for_impala_only():
    from impala_gpu.config import AlgoCfg

    cfg = small_cfg()
    cfg.algo = AlgoCfg(name="a2c")
    with pytest.raises(ConfigError, match="only IMPALA"):
        validate_runtime(cfg)


# -- a real two-node cluster on loopback --------------------------------------------------------


def ray_cli() -> str:
    path = Path(sys.executable).with_name("ray")
    return str(path) if path.exists() else shutil.which("ray") or "ray"


def start_cluster(env: dict) -> None:
    common = ["--num-cpus=1", "--disable-usage-stats", "--object-store-memory=100000000"]
    head = [ray_cli(), "start", "--head", f"--port={PORT}", f"--node-ip-address={HEAD}"]
    subprocess.run([*head, "--include-dashboard=false", *common], env=env, check=True, timeout=120)
    worker = [ray_cli(), "start", f"--address={HEAD}:{PORT}", f"--node-ip-address={WORKER}"]
    subprocess.run([*worker, *common], env=env, check=True, timeout=120)


def stop_cluster(env: dict) -> None:
    subprocess.run([ray_cli(), "stop", "--force"], env=env, timeout=120, capture_output=True)


def worker_pids() -> list[int]:
    """Live RolloutWorker actor processes (Ray names its worker processes after the actor)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::RolloutWorker"):
                    pids.append(int(pid))
        except OSError:
            continue
    return sorted(pids)


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def wait_for(cond, timeout: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited waiting for {what}: {proc.communicate()[1]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_an_address_a_run_starts_its_own_ray_beside_one_already_up():
    from impala_gpu.acting.ray_pool import connect

    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    other = [ray_cli(), "start", "--head", f"--port={PORT + 1}", f"--node-ip-address={HEAD}"]
    common = ["--num-cpus=1", "--disable-usage-stats", "--object-store-memory=100000000"]
    subprocess.run([*other, "--include-dashboard=false", *common], env=env, check=True, timeout=120)
    try:
        assert connect(small_cfg()) is True
        try:
            assert ray.get_runtime_context().gcs_address != f"{HEAD}:{PORT + 1}"
            assert ray.cluster_resources()["CPU"] >= 2  # its own num_cpus, not the other's 1
        finally:
            ray.shutdown()
    finally:
        stop_cluster(env)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_node_cluster_trains_through_a_killed_actor(tmp_path):
    marker = uuid.uuid4().hex
    env = {**os.environ, "RAY_AUTH_MODE": "token", "IMPALA_TEST_MARKER": marker}
    shm_before = shm_entries()
    run_dir = tmp_path / "run"
    start_cluster(env)
    try:
        cmd = cli_command(
            run_dir,
            "experiment=cartpole_impala",
            "runtime=ray",
            f"ray.address={HEAD}:{PORT}",
            f"ray.node_ip_address={HEAD}",
            "precision=fp32",
            # The run stops at 150; the budget is only a ceiling. 400K frames was too tight:
            # one CI run, its actor killed early, ended there at a mean return of 149.1
            "total_frames=1000000",
            "target_return=150",
            "log_interval_s=1",
        )
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            ready = lambda: [e for e in events(run_dir) if e["event"] == "actor_ready"]  # noqa: E731
            wait_for(lambda: len(ready()) >= 2, 180, "both Ray actors' first unrolls", proc)
            assert {e["node"] for e in ready()} == {HEAD, WORKER}, ready()
            victim = worker_pids()[0]
            os.kill(victim, signal.SIGKILL)
            replaced = lambda: [e for e in events(run_dir) if e["event"] == "actor_replaced"]  # noqa: E731
            wait_for(lambda: replaced(), 120, "the killed actor's replacement", proc)
            _, err = proc.communicate(timeout=400)
        finally:
            if proc.poll() is None:
                kill_marked(proc, marker)
        assert proc.returncode == 0, err[-3000:]
        event = replaced()[0]
        assert event["runtime"] == "ray" and "died" in event["cause"], event
        assert event["unrolls_dropped"] >= 0
        assert "replaced (restart 1" in err
        assert len(ready()) >= 3, "the replacement never landed an unroll"
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert metrics[-1]["episode_return"] >= 150, "CartPole did not learn on the cluster"
        assert metrics[-1]["actor_restarts"] == 1
    finally:
        stop_cluster(env)
    wait_for(lambda: processes_with_marker(marker) == [], 60, "the cluster's processes to exit")
    assert worker_pids() == []
    assert leaked_shm(shm_before) == set()
