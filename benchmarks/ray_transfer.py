"""The cost of moving one actor's unroll to the learner's ring: through the local shared-memory
ring, and through Ray's object store on one node and across two raylets (a loopback cluster:
head on 127.0.0.2, worker on 127.0.0.3, as in tests/acting/test_ray_pool.py).

    python -m benchmarks.ray_transfer                     # Pong unrolls of 16 envs, T=20 and T=5
    python -m benchmarks.ray_transfer --unrolls 16x20 --calls 100

Per unroll (one actor's E envs x (T+1) steps, every ring field):
- local: the copy into ring slots plus the slot indices' trip through the queues (what an actor
  process pays; the policy and env steps are left out);
- ray, same node / across raylets: a remote call that returns a ready unroll, ``ray.get`` and
  the copy into ring slots (what ``RayActorPool``'s feeder pays per unroll).
Writes µs per unroll (median) and MB/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import median, write_result
from impala_gpu.channels.ring import RingSpec, TrajectoryRing

HEAD, WORKER, PORT = "127.0.0.2", "127.0.0.3", 6391


def spec_for(envs: int, T: int) -> RingSpec:
    return RingSpec(
        num_slots=envs,
        unroll_length=T,
        obs_shape=(4, 84, 84),
        obs_dtype=torch.uint8,
        num_actions=6,
    )


def unroll_arrays(spec: RingSpec) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for name, (shape, dtype) in spec.field_shapes().items():
        t = torch.zeros(shape, dtype=dtype)
        if dtype == torch.uint8:
            t = torch.from_numpy(rng.integers(0, 256, shape, dtype=np.uint8))
        out[name] = t.numpy()
    return out


def nbytes(arrays: dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays.values())


def local_us(spec: RingSpec, calls: int) -> list[float]:
    E = spec.num_slots
    ring = TrajectoryRing(RingSpec(**{**spec.__dict__, "num_slots": 2 * E}), num_actors=1)
    arrays = unroll_arrays(spec)
    times = []
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            idx = list(range(E))
            for name, value in arrays.items():
                ring.fields[name].numpy()[idx] = value
            for s in idx:
                ring.commit(0, (s, 0))
            for _ in idx:
                assert ring.take(timeout=5) is not None
            times.append((time.perf_counter() - t0) * 1e6)
    finally:
        ring.close()
    return times


class Producer:
    """A Ray actor that hands out the same ready unroll."""

    def __init__(self, spec: RingSpec):
        self.arrays = unroll_arrays(spec)

    def unroll(self) -> dict:
        return self.arrays


def ray_us(spec: RingSpec, calls: int, node_ip: str | None) -> list[float]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    opts: dict = {"num_cpus": 0}
    if node_ip is not None:
        node = next(n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == node_ip)
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
    producer = ray.remote(Producer).options(**opts).remote(spec)
    ring = TrajectoryRing(spec, num_actors=1)
    idx = list(range(spec.num_slots))
    ray.get(producer.unroll.remote())  # warm: the actor is up
    times = []
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            arrays = ray.get(producer.unroll.remote())
            for name, value in arrays.items():
                ring.fields[name].numpy()[idx] = value
            times.append((time.perf_counter() - t0) * 1e6)
            del arrays
    finally:
        ring.close()
        ray.kill(producer)
    return times


def ray_cli() -> str:
    path = Path(sys.executable).with_name("ray")
    return str(path) if path.exists() else shutil.which("ray") or "ray"


def start_cluster(env: dict) -> None:
    common = ["--num-cpus=1", "--disable-usage-stats", "--object-store-memory=300000000"]
    subprocess.run(
        [
            ray_cli(),
            "start",
            "--head",
            f"--port={PORT}",
            f"--node-ip-address={HEAD}",
            "--include-dashboard=false",
            *common,
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [ray_cli(), "start", f"--address={HEAD}:{PORT}", f"--node-ip-address={WORKER}", *common],
        env=env,
        check=True,
        capture_output=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--unrolls", nargs="+", default=["16x20", "16x5"], help="ENVSxT")
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--name", default="ray_transfer")
    ap.add_argument("--out", default="bench_out")
    args = ap.parse_args()
    # Ray reads RAY_AUTH_MODE when it is imported: set it first, or ray.init joins the
    # token-auth cluster with auth disabled and is refused.
    os.environ["RAY_AUTH_MODE"] = "token"
    import ray

    env = dict(os.environ)
    start_cluster(env)
    results = []
    try:
        ray.init(
            address=f"{HEAD}:{PORT}",
            _node_ip_address=HEAD,
            include_dashboard=False,
            logging_level="WARNING",
        )
        for text in args.unrolls:
            envs, T = (int(x) for x in text.split("x"))
            spec = spec_for(envs, T)
            size = nbytes(unroll_arrays(spec))
            row = {"envs": envs, "T": T, "unroll_mb": size / 1e6}
            for where, fn in (
                ("local_ring", lambda s=spec: local_us(s, args.calls)),
                ("ray_same_node", lambda s=spec: ray_us(s, args.calls, HEAD)),
                ("ray_across_raylets", lambda s=spec: ray_us(s, args.calls, WORKER)),
            ):
                us = median(fn())
                row[f"{where}_us"] = us
                row[f"{where}_mb_per_s"] = size / us  # bytes per µs = MB/s
            results.append(row)
            print(row, flush=True)
    finally:
        ray.shutdown()
        subprocess.run([ray_cli(), "stop", "--force"], env=env, capture_output=True)
    print(write_result(args.name, {"calls": args.calls, "results": results}, args.out))


if __name__ == "__main__":
    main()
