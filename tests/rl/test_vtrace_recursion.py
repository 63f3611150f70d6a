"""V-trace's backward recursion: the blocked (matmul) path that runs on GPUs gives the CPU's
loop and the paper's brute-force sum (``test_vtrace.brute_force_vtrace``), on CPU, with episode
ends (zero discounts) and masked steps (``-inf`` log rhos, so ``c = 0``)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from test_vtrace import brute_force_vtrace, random_inputs

from impala_gpu.rl import vtrace

TS = [1, 5, 64]
DTYPES = [torch.float32, torch.float64]
TIGHT = {torch.float32: 1e-5, torch.float64: 1e-12}  # blocked vs loop, both in that dtype


def seeded(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def recursion_inputs(T: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """deltas ~ N(0, 1) and decays in [0, 1) with exact zeros (about 1 step in 6), [T, 4, 3]."""
    rng = seeded(T, str(dtype), seed)
    decays = rng.uniform(0.0, 1.0, size=(T, 4, 3))
    decays[rng.uniform(size=decays.shape) < 0.15] = 0.0
    deltas = rng.normal(size=(T, 4, 3))
    return torch.tensor(deltas, dtype=dtype), torch.tensor(decays, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("T", [*TS, 300], ids=[f"T{t}" for t in [*TS, 300]])
@pytest.mark.parametrize("block", [vtrace.BLOCK, 4], ids=["block128", "block4"])
def test_blocked_recursion_equals_the_loop(T, dtype, block, monkeypatch):
    monkeypatch.setattr(vtrace, "BLOCK", block)  # 4: many blocks, so the carries are tested
    deltas, decays = recursion_inputs(T, dtype, seed=block)
    loop = vtrace.backward_recursion(deltas, decays, "loop")
    blocked = vtrace.backward_recursion(deltas, decays, "blocked")
    assert blocked.dtype == dtype and blocked.shape == deltas.shape
    torch.testing.assert_close(blocked, loop, rtol=TIGHT[dtype], atol=TIGHT[dtype])


@pytest.mark.parametrize("block", [vtrace.BLOCK, 4], ids=["block128", "block4"])
def test_a_zero_decay_cuts_the_trace_exactly(block, monkeypatch):
    """Where decay_t = 0 nothing after t reaches acc_t: it is delta_t to the bit, even when
    what comes after is huge."""
    monkeypatch.setattr(vtrace, "BLOCK", block)
    deltas, decays = recursion_inputs(64, torch.float32, seed=7)
    deltas[decays == 0] = 0.25
    deltas[1:][(decays[:-1] == 0)] = 1e30  # right after an episode end
    blocked = vtrace.backward_recursion(deltas, decays, "blocked")
    cut = decays == 0
    assert cut.sum() > 10
    assert torch.equal(blocked[cut], deltas[cut])


def test_long_traces_underflow_to_zero_not_nan():
    """A product of many small decays underflows to 0; the blocked path multiplies, never
    divides, so it gives the loop's finite values."""
    deltas = torch.ones(64, 2)
    decays = torch.full((64, 2), 1e-3)  # 1e-3 ** 20 underflows float32
    blocked = vtrace.backward_recursion(deltas, decays, "blocked")
    assert torch.isfinite(blocked).all()
    torch.testing.assert_close(blocked, vtrace.backward_recursion(deltas, decays, "loop"))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("T", TS, ids=[f"T{t}" for t in TS])
def test_vtrace_on_either_path_matches_the_brute_force_sum(T, dtype):
    rng = seeded("vtrace", T, str(dtype))
    inputs = random_inputs(rng, (T, 3))
    masked = rng.uniform(size=(T, 3)) < 0.2  # invalid steps: rho = c = 0
    inputs["log_rhos"][masked] = -np.inf
    want_vs, want_pg = brute_force_vtrace(
        **inputs, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, lambda_=0.95
    )
    torch_inputs = {k: torch.tensor(v, dtype=dtype) for k, v in inputs.items()}
    outs = {
        path: vtrace.from_importance_weights(**torch_inputs, lambda_=0.95, recursion=path)
        for path in ("loop", "blocked")
    }
    for path, out in outs.items():  # V-trace computes in float32 whatever comes in
        np.testing.assert_allclose(out.vs.numpy(), want_vs, rtol=1e-5, atol=1e-4, err_msg=path)
        np.testing.assert_allclose(out.pg_advantages.numpy(), want_pg, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(outs["blocked"].vs, outs["loop"].vs, rtol=1e-5, atol=1e-5)


def test_auto_loops_on_the_cpu_and_blocks_on_a_gpu():
    assert vtrace.recursion_for(torch.device("cpu")) == "loop"
    assert vtrace.recursion_for(torch.device("cuda", 0)) == "blocked"
    with pytest.raises(ValueError, match="recursion"):
        vtrace.backward_recursion(torch.zeros(3, 2), torch.zeros(3, 2), "scan")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_auto_gives_the_cpu_loops_targets():
    inputs = random_inputs(seeded("cuda"), (64, 32))
    cpu = vtrace.from_importance_weights(**{k: torch.tensor(v) for k, v in inputs.items()})
    gpu = vtrace.from_importance_weights(
        **{k: torch.tensor(v, device="cuda") for k, v in inputs.items()}
    )
    torch.testing.assert_close(gpu.vs.cpu(), cpu.vs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gpu.pg_advantages.cpu(), cpu.pg_advantages, rtol=1e-5, atol=1e-5)
