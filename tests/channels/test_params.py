"""Parameter store: versioned publish, no torn reads, exact old versions in history mode."""

from __future__ import annotations

import torch
import torch.multiprocessing as mp
from torch import nn

from impala_gpu.channels.params import ParamStore, flat_parameters, load_flat_into

N = 1 << 21  # big enough that a copy takes long and overlaps with the writer


def write_forever(store: ParamStore, versions: int) -> None:
    buf = torch.empty(N)
    for v in range(1, versions + 1):
        buf.fill_(float(v))
        store.publish_flat(buf, v)


def test_reader_never_sees_a_half_written_copy():
    store = ParamStore(N)
    store.publish_flat(torch.zeros(N), 0)
    ctx = mp.get_context("spawn")
    writer = ctx.Process(target=write_forever, args=(store, 400))
    writer.start()
    out = torch.empty(N)
    reads = retries = 0
    try:
        while writer.is_alive() or reads == 0:
            got = store.try_read(out)
            if got is None:
                retries += 1
                continue
            reads += 1
            lo, hi = float(out.min()), float(out.max())
            assert lo == hi == float(got), f"torn read: version {got} holds {lo}..{hi}"
    finally:
        writer.join(timeout=30)
    assert writer.exitcode == 0
    assert reads > 10
    assert store.version == 400


def test_odd_sequence_number_means_writing_and_is_refused():
    store = ParamStore(8)
    store.publish_flat(torch.ones(8), 3)
    store.seq[0] += 1  # a writer is mid-copy
    assert store.try_read(torch.empty(8)) is None
    store.seq[0] += 1
    assert store.try_read(torch.empty(8)) == 3


def test_history_keeps_exact_old_versions():
    store = ParamStore(4, history=3)
    for v in range(5):
        store.publish_flat(torch.full((4,), float(v)), v)
    out = torch.empty(4)
    for v in (2, 3, 4):
        assert store.try_read(out, version=v) == v and torch.all(out == v)
    assert store.try_read(out, version=1) is None  # overwritten by version 4
    assert store.try_read(out, version=5) is None  # not published yet


def test_round_trip_through_a_model():
    src, dst = nn.Linear(3, 2), nn.Linear(3, 2)
    store = ParamStore.for_model(src)
    store.publish(src, 7)
    flat = torch.empty_like(flat_parameters(dst))
    assert store.read(flat, timeout=1) == 7
    load_flat_into(dst, flat)
    for a, b in zip(src.parameters(), dst.parameters(), strict=True):
        assert torch.equal(a, b)


def test_round_trip_keeps_channels_last_weights():
    from impala_gpu.config import ModelCfg
    from impala_gpu.models import build_model

    cfg = ModelCfg(name="shallow", channels_last=True)
    src, dst = build_model((4, 84, 84), 6, cfg), build_model((4, 84, 84), 6, cfg)
    store = ParamStore.for_model(src)
    store.publish(src, 1)
    flat = torch.empty(store.flat.shape[1])
    assert store.read(flat, timeout=1) == 1
    load_flat_into(dst, flat)
    conv = dst.torso.convs[2].weight  # [0] is the InputConv, NCHW by design
    assert conv.is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(src.parameters(), dst.parameters(), strict=True):
        assert torch.equal(a, b)


def test_input_statistics_travel_with_the_weights():
    # model.normalize_input's running mean and variance are gradient-free parameters, so the
    # actors' copies follow the learner's: a stale copy would normalise with other statistics.
    from impala_gpu.config import ModelCfg
    from impala_gpu.models import build_model

    cfg = ModelCfg(name="shallow", normalize_input=True, activation="elu")
    learner, actor = build_model((4, 84, 84), 6, cfg), build_model((4, 84, 84), 6, cfg)
    learner.obs_norm.update(torch.randint(0, 255, (64, 4, 84, 84), dtype=torch.uint8))
    store = ParamStore.for_model(learner)
    store.publish(learner, 1)
    flat = torch.empty(store.flat.shape[1])
    assert store.try_read(flat) == 1
    load_flat_into(actor, flat)
    torch.testing.assert_close(actor.obs_norm.mean, learner.obs_norm.mean)
    torch.testing.assert_close(actor.obs_norm.var, learner.obs_norm.var)
    assert not torch.equal(actor.obs_norm.var, torch.ones_like(actor.obs_norm.var))
