"""ParamPublisher: weights written into the parameter store by a thread. Exact snapshots (the
model changing right after publish never leaks into a version), every version in order in
bounded-lag mode with back-pressure, the newest in latest-only mode, no torn reads, a flush on
close with no thread left behind, and the thread's errors raised in the learner."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from impala_gpu.channels.params import ParamStore
from impala_gpu.channels.publisher import ParamPublisher


class Weights(nn.Module):
    """Two parameters (``[n]`` and ``[3]``): flattening must concatenate, not just view."""

    def __init__(self, n: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n))
        self.b = nn.Parameter(torch.zeros(3))


def set_weights(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class RecordingStore(ParamStore):
    """A store that records each write ``(version, copy of the flat weights)`` and whose writes
    the test can hold (``gate``), slow down (``delay``) or fail (``fail_at``)."""

    def __init__(self, n: int, history: int = 1, delay: float = 0.0, fail_at: int | None = None):
        super().__init__(n, history)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # the thread has started a write
        self.delay, self.fail_at = delay, fail_at
        self.writes: list[tuple[int, Tensor]] = []

    def publish_flat(self, flat: Tensor, version: int) -> None:
        self.entered.set()
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        time.sleep(self.delay)
        if version == self.fail_at:
            raise ValueError(f"disk full writing version {version}")
        self.writes.append((version, flat.clone()))
        super().publish_flat(flat, version)

    def versions(self) -> list[int]:
        return [v for v, _ in self.writes]


def returns_within(seconds: float, fn: Callable[[], object]) -> tuple[bool, list]:
    """Run ``fn`` in a helper thread; whether it returned within ``seconds``, and what it
    raised (a list the helper appends to, so a late exception still shows up)."""
    raised: list = []

    def call():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            raised.append(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive(), raised


def assert_exact(store: RecordingStore) -> None:
    for v, flat in store.writes:
        lo, hi = float(flat.min()), float(flat.max())
        assert lo == hi == float(v), f"version {v} was written holding {lo}..{hi}"


def publish_all(pub: ParamPublisher, model: nn.Module, versions) -> None:
    for v in versions:
        set_weights(model, v)
        pub.publish(model, v)
        set_weights(model, -v)  # the next update changes the weights at once


# ----------------------------------------------------------------------------- seqlock
def test_reader_never_sees_a_torn_copy_while_the_thread_writes():
    n = 1 << 20  # big enough that the reader's copy overlaps the thread's writes
    model, versions = Weights(n - 3), 300
    store = ParamStore(n)
    pub = ParamPublisher(store, "cpu", every_version=True)  # history 1: each write, one slot
    stop, torn, reads = threading.Event(), [], [0]

    def reader():
        out = torch.empty(n)
        while not stop.is_set():
            got = store.try_read(out)
            if got is None:
                continue
            reads[0] += 1
            lo, hi = float(out.min()), float(out.max())
            if not lo == hi == float(got):
                torn.append((got, lo, hi))

    t = threading.Thread(target=reader)
    t.start()
    try:
        publish_all(pub, model, range(1, versions + 1))
        pub.flush(timeout=60)
    finally:
        stop.set()
        t.join()
        pub.close()
    assert not torn, f"torn reads (version, min, max): {torn[:5]}"
    assert reads[0] > 10
    assert store.version == versions


# --------------------------------------------------------------------- every version
def test_every_version_lands_in_order_with_the_weights_it_had_at_publish():
    model = Weights(1000)
    store = RecordingStore(num_params(model), history=4)
    store.gate.clear()  # the thread can't write until the model has moved on
    pub = ParamPublisher(store, "cpu")
    assert pub.every_version  # history > 1: bounded lag's mode by default
    try:
        done, raised = returns_within(10, lambda: publish_all(pub, model, range(1, 5)))
        assert done and not raised, raised  # 4 unwritten versions fit a history of 4
        store.gate.set()
        pub.flush(timeout=30)
    finally:
        store.gate.set()
        pub.close()
    assert store.versions() == [1, 2, 3, 4]
    assert_exact(store)  # a lazy copy of the live parameters would hold -4 here
    out = torch.empty(num_params(model))
    for v in (1, 2, 3, 4):  # an actor asking for exact version v gets exactly v
        assert store.try_read(out, version=v) == v and torch.all(out == v)


def test_every_version_mode_blocks_only_when_history_versions_are_unwritten():
    model = Weights(100)
    store = RecordingStore(num_params(model), history=3)
    store.gate.clear()
    pub = ParamPublisher(store, "cpu")
    try:
        done, raised = returns_within(10, lambda: publish_all(pub, model, range(1, 4)))
        assert done and not raised, raised
        done, raised = returns_within(0.5, lambda: publish_all(pub, model, [4]))
        assert not done, "a 4th unwritten version with history=3 must wait (back-pressure)"
        store.gate.set()  # the thread writes version 1: the blocked publish goes on
        pub.flush(timeout=30)
    finally:
        store.gate.set()
        pub.close()
    assert not raised, raised
    assert store.versions() == [1, 2, 3, 4]
    assert_exact(store)


def test_an_actor_reading_each_exact_version_gets_its_weights():
    # Bounded lag as the actors see it: a reader in another thread asks for versions 1, 2, ...
    # in turn, while the learner keeps changing the weights right after each publish. The
    # learner stays within history - 1 versions of the reader (as the batches force it to).
    n, history, versions = 1 << 16, 3, 200
    model = Weights(n - 3)
    store = ParamStore(n, history=history)
    pub = ParamPublisher(store, "cpu")
    acked = [0]
    got: list[tuple[int | None, float, float]] = []
    cond = threading.Condition()

    def actor():
        out = torch.empty(n)
        for v in range(1, versions + 1):
            r = store.read(out, version=v, timeout=30)
            got.append((r, float(out.min()), float(out.max())))
            with cond:
                acked[0] = v
                cond.notify_all()
            if r is None:
                return

    t = threading.Thread(target=actor)
    t.start()
    try:
        for v in range(1, versions + 1):
            with cond:
                assert cond.wait_for(lambda v=v: acked[0] >= v - (history - 1), timeout=30)
            publish_all(pub, model, [v])
        pub.flush(timeout=30)
    finally:
        t.join(timeout=60)
        pub.close()
    assert len(got) == versions
    for v, (r, lo, hi) in enumerate(got, start=1):
        assert r == v and lo == hi == float(v), f"asked for {v}, got {r} holding {lo}..{hi}"


# ----------------------------------------------------------------------- latest only
def test_latest_only_never_blocks_and_ends_with_the_newest_version():
    model = Weights(100)
    store = RecordingStore(num_params(model))  # history 1: latest only by default
    store.gate.clear()
    pub = ParamPublisher(store, "cpu")
    assert not pub.every_version
    try:
        publish_all(pub, model, [1])
        assert store.entered.wait(10)  # the thread holds version 1, stuck at the gate
        done, raised = returns_within(10, lambda: publish_all(pub, model, range(2, 11)))
        assert done and not raised, raised  # never waits for the thread
        store.gate.set()
        pub.flush(timeout=30)
    finally:
        store.gate.set()
        pub.close()
    assert store.versions() == [1, 10]  # 2..9 were replaced while pending
    assert pub.dropped == 8
    assert_exact(store)
    out = torch.empty(num_params(model))
    assert store.version == 10 and store.try_read(out) == 10 and torch.all(out == 10)


# ------------------------------------------------------------------------------ close
@pytest.mark.parametrize("every_version", [True, False], ids=["every", "latest"])
def test_close_writes_what_is_pending_and_leaves_no_thread(every_version):
    before = set(threading.enumerate())
    model = Weights(100)
    store = RecordingStore(num_params(model), history=4, delay=0.05)  # a slow writer
    pub = ParamPublisher(store, "cpu", every_version=every_version)
    publish_all(pub, model, range(1, 5))
    pub.close()  # at once: versions are still pending
    assert store.version == 4
    if every_version:
        assert store.versions() == [1, 2, 3, 4]
    else:
        assert store.versions()[-1] == 4
    assert_exact(store)
    assert not pub.alive
    assert set(threading.enumerate()) <= before, "a publisher thread outlived close()"
    pub.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        pub.publish(model, 5)


# ----------------------------------------------------------------------------- errors
def test_an_error_in_the_thread_surfaces_on_the_next_publish_and_not_twice():
    model = Weights(100)
    store = RecordingStore(num_params(model), history=3, fail_at=2)
    pub = ParamPublisher(store, "cpu")
    publish_all(pub, model, [1, 2])
    with pytest.raises(RuntimeError, match="publisher thread failed") as err:
        pub.flush(timeout=30)
    assert isinstance(err.value.__cause__, ValueError)
    with pytest.raises(RuntimeError, match="publisher thread failed"):
        pub.publish(model, 3)
    pub.close()  # already raised: close doesn't raise it again
    assert not pub.alive
    assert store.versions() == [1]


def test_an_error_in_the_thread_surfaces_on_close():
    model = Weights(100)
    store = RecordingStore(num_params(model), fail_at=1)
    pub = ParamPublisher(store, "cpu")
    publish_all(pub, model, [1])
    with pytest.raises(RuntimeError, match="publisher thread failed") as err:
        pub.close()
    assert isinstance(err.value.__cause__, ValueError)
    assert not pub.alive


def test_a_publish_waiting_on_back_pressure_raises_when_the_thread_fails():
    model = Weights(100)
    store = RecordingStore(num_params(model), history=2, fail_at=1)
    store.gate.clear()
    pub = ParamPublisher(store, "cpu")
    try:
        publish_all(pub, model, [1, 2])
        done, raised = returns_within(0.3, lambda: publish_all(pub, model, [3]))
        assert not done  # waiting for a free slot
        store.gate.set()  # version 1 fails: the waiting publish must not wait forever
        deadline = time.monotonic() + 10
        while not raised and time.monotonic() < deadline:
            time.sleep(0.01)
        assert raised and isinstance(raised[0], RuntimeError), raised
        assert isinstance(raised[0].__cause__, ValueError)
    finally:
        store.gate.set()
        pub.close()


# ------------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_publish_does_not_sync_and_snapshots_the_weights():
    model = Weights(1 << 22).cuda()
    store = RecordingStore(num_params(model), history=4)
    pub = ParamPublisher(store, "cuda")
    try:
        publish_all(pub, model, [0])  # warm-up: kernels loaded, outside the sync check
        torch.cuda._sleep(1000)
        pub.flush(timeout=30)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any synchronizing call in publish raises
        try:
            for v in (1, 2, 3):
                torch.cuda._sleep(500_000_000)  # a busy GPU: a sync here would wait it out
                publish_all(pub, model, [v])
        finally:
            torch.cuda.set_sync_debug_mode(0)
        # publish returned while the GPU was still busy, and the copies (queued behind the
        # sleeps) have not reached the store: the thread waits for them, not the learner.
        assert not torch.cuda.current_stream().query()
        assert store.version == 0
        pub.flush(timeout=60)
    finally:
        pub.close()
    assert store.versions() == [0, 1, 2, 3]
    assert_exact(store)  # the model held -3 by then: each version is its own snapshot
    assert float(model.w.min()) == -3.0
