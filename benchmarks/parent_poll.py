"""What an actor pays to ask whether its learner still runs: ``parent_alive()`` (a zero-timeout
poll of multiprocessing's pipe to the parent) against the old ``os.getppid()`` comparison,
timed inside a spawned child, as the actors run.

    python -m benchmarks.parent_poll [--calls 20000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time


def _per_call_us(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def child(calls: int, out) -> None:
    from impala_gpu.acting.rollout import parent_alive

    parent = os.getppid()
    out.put(
        {
            "parent_alive_us": _per_call_us(parent_alive, calls),
            "getppid_us": _per_call_us(lambda: os.getppid() != parent, calls),
        }
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=20_000)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=child, args=(args.calls, out))
    proc.start()
    r = out.get(timeout=120)
    proc.join()
    print(f"parent_alive {r['parent_alive_us']:.2f} us/call, getppid {r['getppid_us']:.2f} us/call")


if __name__ == "__main__":
    main()
