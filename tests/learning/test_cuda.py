"""The CUDA learner against the CPU one: the Batcher's device batches (pinned staging, side-stream
copies, events, double buffering), an update in fp32 and bf16, and a CLI run's gpu_busy.

Every test here needs a CUDA device and is skipped without one (run them on a GPU machine:
``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from leakcheck import read_events, read_metrics, run_cli
from ringdata import (
    ATARI_ACTIONS,
    ATARI_OBS,
    LOSS_STATS,
    batches_from_ring,
    expected_batch,
    one_update,
    random_batch,
)
from ringdata import SPEC as LSTM_SPEC

from impala_gpu.channels.ring import STEP_FIELDS, RingSpec
from impala_gpu.config import ModelCfg
from impala_gpu.learning.batcher import Batch
from impala_gpu.learning.learner import STAT_NAMES
from impala_gpu.models import build_model
from impala_gpu.speed.precision import autocast
from impala_gpu.speed.threads import default_learner_threads

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ATARI_SPEC = RingSpec(
    num_slots=8, unroll_length=20, obs_shape=ATARI_OBS, obs_dtype=torch.uint8, num_actions=6
)


# ------------------------------------------------------------------------------------ Batcher
@pytest.mark.parametrize("spec", [LSTM_SPEC, ATARI_SPEC], ids=["lstm", "atari"])
def test_batcher_on_cuda_gives_the_cpu_batches_bit_for_bit(spec):
    B, pairs = 3, 3
    cpu = batches_from_ring(spec, "cpu", B, pairs)
    cuda = batches_from_ring(spec, "cuda", B, pairs)
    assert len(cpu) == len(cuda) == 2 * pairs
    for i, (c, g) in enumerate(zip(cpu, cuda, strict=True)):
        want = expected_batch(spec, B, i)
        assert c.keys() == g.keys() == want.keys()
        for name in want:
            assert g[name].dtype == c[name].dtype, (i, name)
            assert torch.equal(c[name], want[name]), f"cpu batch {i}: {name}"
            assert torch.equal(g[name], c[name]), f"cuda batch {i} differs from cpu: {name}"


# ------------------------------------------------------------------------------------ update
def to_device(batch: Batch, device: str) -> Batch:
    moved = {n: getattr(batch, n).to(device) for n in STEP_FIELDS}
    core = tuple(t.to(device) for t in batch.core_state)
    return dataclasses.replace(batch, **moved, core_state=core)


def lstm_batch() -> Batch:
    batch = random_batch(ATARI_OBS, ATARI_ACTIONS)
    g = torch.Generator().manual_seed(1)
    B = batch.obs.shape[1]
    batch.core_state = (torch.randn(B, 256, generator=g), torch.randn(B, 256, generator=g))
    return batch


CASES = {
    "shallow": (ModelCfg(name="shallow", hidden_size=64), random_batch),
    "resnet": (ModelCfg(name="resnet", hidden_size=64), random_batch),
    "shallow_lstm": (ModelCfg(name="shallow", use_lstm=True), lambda *a: lstm_batch()),
}
COMPARED = [*LOSS_STATS, STAT_NAMES.index("grad_norm")]


def assert_same_update(stats, delta, ref_stats, ref_delta, rtol, cosine_min, norm_tol):
    torch.testing.assert_close(stats[COMPARED], ref_stats[COMPARED], rtol=rtol, atol=rtol)
    cosine = torch.nn.functional.cosine_similarity(delta, ref_delta, dim=0)
    assert cosine > cosine_min, f"update direction differs: cosine {cosine:.5f}"
    ratio = delta.norm() / ref_delta.norm()
    assert abs(ratio - 1) < norm_tol, f"update size differs: ratio {ratio:.4f}"


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_update_on_cuda_matches_cpu(case):
    mcfg, make_batch = CASES[case]
    torch.manual_seed(0)
    model = build_model(ATARI_OBS, ATARI_ACTIONS, mcfg)
    batch = make_batch(ATARI_OBS, ATARI_ACTIONS)
    ref_stats, ref_delta = one_update(copy.deepcopy(model), batch, "fp32")
    stats, delta = one_update(copy.deepcopy(model).cuda(), to_device(batch, "cuda"), "fp32")
    assert stats.is_cuda and stats.dtype == torch.float32
    assert stats[STAT_NAMES.index("nonfinite")] == 0
    # cuDNN convolutions run in TF32 by default (10-bit mantissa): close, not equal.
    assert_same_update(
        stats.cpu(), delta.cpu(), ref_stats, ref_delta, rtol=1e-2, cosine_min=0.999, norm_tol=1e-2
    )


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_update_on_cuda_matches_fp32(case):
    mcfg, make_batch = CASES[case]
    torch.manual_seed(0)
    model = build_model(ATARI_OBS, ATARI_ACTIONS, mcfg).cuda()
    batch = to_device(make_batch(ATARI_OBS, ATARI_ACTIONS), "cuda")
    ref_stats, ref_delta = one_update(copy.deepcopy(model), batch, "fp32")
    bf_model = copy.deepcopy(model)
    bf_stats, bf_delta = one_update(bf_model, batch, "bf16")
    # The thresholds of tests/speed/test_precision.py's CPU bf16 test.
    assert_same_update(
        bf_stats, bf_delta, ref_stats, ref_delta, rtol=3e-2, cosine_min=0.99, norm_tol=0.05
    )
    assert not torch.equal(bf_delta, ref_delta), "bf16 autocast did not change anything"
    assert bf_stats.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in bf_model.parameters())
    with torch.no_grad(), autocast("cuda", "bf16"):
        out = bf_model(batch.obs, batch.first, batch.core_state)
    assert out.logits.dtype == torch.bfloat16, "autocast did not run the forward in bf16"


# ----------------------------------------------------------------------------------- the CLI
@pytest.mark.slow
def test_cuda_cartpole_run_learns_and_reports_gpu_busy(tmp_path):
    run_dir = tmp_path / "cuda"
    run_cli(
        run_dir,
        "experiment=cartpole_impala",
        "device=cuda",
        "total_frames=200000",
        "log_interval_s=1",
    )
    metrics = read_metrics(run_dir)
    for m in metrics:  # every metric line closes a window with at least one update
        assert "gpu_busy" in m, m
        assert 0 < m["gpu_busy"] <= 1, m["gpu_busy"]
        assert m["gpu_mem_peak_gb"] > 0
    assert metrics[-1]["frames"] >= 200_000
    assert metrics[-1]["episode_return"] > 75, [m["episode_return"] for m in metrics]
    start = read_events(run_dir)[0]
    assert start["event"] == "start" and start["device"].startswith("cuda")
    assert start["learner_threads"] == default_learner_threads("cuda", "fp32", 1, 2)
