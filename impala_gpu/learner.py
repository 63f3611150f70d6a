"""Learner: a batcher thread that turns full ring slots into device batches, and a train step
that does only forward, V-trace loss, backward, clipping and the optimizer step.

The batcher gathers ``batch_size`` slots into a time-major staging batch (pinned memory on
CUDA), starts the host-to-device copy on a side stream, and frees the slots at once. Two
buffers alternate, so the next batch is assembled while the current one trains.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from impala_gpu.config import AlgoCfg, Config
from impala_gpu.health import layer_grad_norms
from impala_gpu.losses import discounts_from_terminated, impala_loss
from impala_gpu.optim import OPTIMIZERS, RMSpropTF
from impala_gpu.ring import STEP_FIELDS, SlotManager, TrajectoryRing
from impala_gpu.speed import autocast


@dataclass
class Batch:
    """Time-major learner batch on the learner's device. Step fields are ``[T+1, B, ...]``."""

    obs: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    first: Tensor
    action: Tensor
    logits: Tensor
    core_state: tuple[Tensor, ...] = ()  # (h, c) [B, H] each, or ()
    versions: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))  # [B], CPU


def _alloc_batch(ring: TrajectoryRing, B: int, device: torch.device, pin: bool) -> Batch:
    def alloc(name: str) -> Tensor:
        src = ring.fields[name]
        shape = (src.shape[1], B, *src.shape[2:])
        return torch.empty(shape, dtype=src.dtype, device=device, pin_memory=pin)

    core = ()
    if "core_h" in ring.fields:
        h = ring.fields["core_h"].shape[1]
        core = tuple(torch.empty(B, h, device=device, pin_memory=pin) for _ in ("core_h", "core_c"))
    return Batch(**{n: alloc(n) for n in STEP_FIELDS}, core_state=core)


class Batcher(threading.Thread):
    """Feeds the train loop with ready batches; owns the staging and device buffers."""

    def __init__(
        self,
        ring: TrajectoryRing,
        slots: SlotManager,
        batch_size: int,
        device: torch.device,
        learner_version,  # () -> int
        max_policy_lag: int = 0,
        ordered_unrolls_per_batch: int = 0,  # bounded-lag: unrolls per batch, in global order
        envs_per_actor: int = 1,
        num_buffers: int = 2,
    ):
        super().__init__(name="batcher", daemon=True)
        self.ring, self.slots, self.B, self.device = ring, slots, batch_size, device
        self.cuda = device.type == "cuda"
        self.learner_version = learner_version
        self.max_policy_lag = max_policy_lag
        self.ordered = ordered_unrolls_per_batch
        self.E = envs_per_actor
        self.staging = [
            _alloc_batch(ring, batch_size, torch.device("cpu"), self.cuda)
            for _ in range(num_buffers)
        ]
        self.device_bufs = (
            [_alloc_batch(ring, batch_size, device, False) for _ in range(num_buffers)]
            if self.cuda
            else self.staging
        )
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.copy_done = [None] * num_buffers  # CUDA events: staging k may be reused
        self.train_done = [None] * num_buffers  # CUDA events: device buffer k may be overwritten
        self.free_bufs: queue.Queue[int] = queue.Queue()
        for k in range(num_buffers):
            self.free_bufs.put(k)
        self.ready: queue.Queue = queue.Queue()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.dropped_stale = 0
        self.gather_s = 0.0
        self._pending: dict[tuple[int, int], int] = {}
        self._next_batch = 0

    # -- producer side --------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    k = self.free_bufs.get(timeout=0.1)
                except queue.Empty:
                    continue
                slots = self._collect()
                if slots is None:
                    return
                t0 = time.perf_counter()
                self._fill(k, slots)
                self.gather_s += time.perf_counter() - t0
                self.ready.put((k, self.copy_done[k]))
        except BaseException as e:  # surfaced to the train loop by get()
            self.error = e
            self.ready.put(None)

    def _take_one(self) -> int | None:
        while not self.stop_event.is_set():
            item = self.ring.take(timeout=0.1)
            if item is not None:
                slot = self.slots.accept(item)  # None: written by an actor that since died
                if slot is not None:
                    return slot
        return None

    def _collect(self) -> list[int] | None:
        if self.ordered:
            return self._collect_ordered()
        slots: list[int] = []
        while len(slots) < self.B:
            slot = self._take_one()
            if slot is None:
                for s in slots:
                    self.slots.give(s)
                return None
            if self.max_policy_lag > 0:
                lag = self.learner_version() - int(self.ring.version[slot])
                if lag > self.max_policy_lag:
                    self.dropped_stale += 1
                    self.slots.give(slot)
                    continue
            slots.append(slot)
        return slots

    def _collect_ordered(self) -> list[int] | None:
        """Bounded-lag mode: batch u is exactly global unrolls [u*n, (u+1)*n), every env."""
        n = self.ordered
        want = [
            (g, j)
            for g in range(self._next_batch * n, (self._next_batch + 1) * n)
            for j in range(self.E)
        ]
        while not all(key in self._pending for key in want):
            slot = self._take_one()
            if slot is None:
                return None
            key = (int(self.ring.unroll[slot]), int(self.ring.env_index[slot]))
            self._pending[key] = slot
        self._next_batch += 1
        return [self._pending.pop(key) for key in want]

    def _fill(self, k: int, slots: list[int]) -> None:
        ring, stage = self.ring, self.staging[k]
        if self.cuda and self.copy_done[k] is not None:
            self.copy_done[k].synchronize()  # the previous H2D copy out of staging k is done
        idx = torch.tensor(slots)
        for name in STEP_FIELDS:
            src, dst = ring.fields[name], getattr(stage, name)
            if name == "obs":
                for b, slot in enumerate(slots):  # contiguous per-slot reads, no temporary
                    dst[:, b].copy_(src[slot])
            else:
                dst.copy_(src.index_select(0, idx).transpose(0, 1))
        if stage.core_state:
            stage.core_state[0].copy_(ring.core_h.index_select(0, idx))
            stage.core_state[1].copy_(ring.core_c.index_select(0, idx))
        stage.versions = ring.version.index_select(0, idx)
        if self.cuda:
            dev = self.device_bufs[k]
            with torch.cuda.stream(self.stream):
                if self.train_done[k] is not None:
                    self.stream.wait_event(self.train_done[k])
                for name in STEP_FIELDS:
                    getattr(dev, name).copy_(getattr(stage, name), non_blocking=True)
                for d, s in zip(dev.core_state, stage.core_state, strict=True):
                    d.copy_(s, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.stream)
            dev.versions = stage.versions
            self.copy_done[k] = ev
        # The ring slots are free as soon as their data is in staging (CPU) / the copy is issued.
        for slot in slots:
            self.slots.give(slot)

    # -- consumer side --------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> tuple[int, Batch] | None:
        """Next ready batch (waiting for it), or None on timeout."""
        try:
            item = self.ready.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is None:
            raise RuntimeError("batcher thread failed") from self.error
        k, ev = item
        if ev is not None:
            torch.cuda.current_stream(self.device).wait_event(ev)
        return k, self.device_bufs[k]

    def done(self, k: int) -> None:
        """The train step no longer needs buffer k."""
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self.train_done[k] = ev
        self.free_bufs.put(k)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


def make_optimizer(model: nn.Module, algo: AlgoCfg) -> torch.optim.Optimizer:
    if algo.optimizer == "rmsprop":
        return torch.optim.RMSprop(
            model.parameters(),
            lr=algo.learning_rate,
            alpha=algo.rmsprop_alpha,
            eps=algo.rmsprop_eps,
            momentum=algo.rmsprop_momentum,
        )
    if algo.optimizer == "rmsprop_tf":
        return RMSpropTF(
            model.parameters(),
            lr=algo.learning_rate,
            alpha=algo.rmsprop_alpha,
            eps=algo.rmsprop_eps,
            momentum=algo.rmsprop_momentum,
        )
    if algo.optimizer == "adam":
        return torch.optim.Adam(
            model.parameters(),
            lr=algo.learning_rate,
            betas=(algo.adam_beta1, algo.adam_beta2),
            eps=algo.adam_eps,
        )
    raise ValueError(f"algo.optimizer={algo.optimizer!r} is not one of {OPTIMIZERS}.")


def lr_factor(cfg: Config, frames: int) -> float:
    """The learning rate's multiplier after ``frames`` frames: linear decay to 0 over
    ``total_frames`` (the paper), or 1 for a constant schedule."""
    if cfg.algo.lr_schedule == "constant":
        return 1.0
    if cfg.algo.lr_schedule != "linear":
        raise ValueError(
            f"algo.lr_schedule={cfg.algo.lr_schedule!r} is not 'linear' or 'constant'."
        )
    return max(0.0, 1.0 - frames / max(1, cfg.total_frames))


def make_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: Config, frames_per_update: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``lr_factor`` per update, as a torch scheduler (its state goes into checkpoints)."""
    lr_factor(cfg, 0)  # fail early on an unknown schedule
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda update: lr_factor(cfg, update * frames_per_update)
    )


STAT_NAMES = (
    "total_loss",
    "pg_loss",
    "baseline_loss",
    "entropy_loss",
    "entropy",
    "grad_norm",
    "clipped_rho_fraction",
    "clipped_pg_rho_fraction",
    "mean_rho",
    "nonfinite",
)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    algo: AlgoCfg,
    precision: str = "fp32",
    grad_groups: list[list[nn.Parameter]] | None = None,
) -> Tensor:
    """One update on ``batch``. Returns the detached stats in STAT_NAMES order (one tensor,
    so reading them costs one device sync), followed, when ``grad_groups`` is given, by each
    group's gradient norm before clipping (``health.layer_grad_norms``).

    ``precision="bf16"`` runs the forward pass under bf16 autocast; V-trace and the loss are
    computed from fp32 casts of the logits and values, and backward runs outside autocast.
    """
    with autocast(batch.obs.device, precision):
        out = model(batch.obs, batch.first, batch.core_state)
    logits, values = out.logits.float(), out.value.float()
    rewards = batch.reward[1:]
    loss = impala_loss(
        target_logits_t=logits[:-1],
        values_t=values[:-1],
        bootstrap_value=values[-1],
        behavior_logits=batch.logits[:-1],
        actions=batch.action[:-1],
        rewards=rewards,
        discounts=discounts_from_terminated(batch.terminated[1:], algo.discount),
        # The step out of a final observation only leads to the next episode's reset obs.
        valid=~(batch.terminated[:-1] | batch.truncated[:-1]),
        baseline_cost=algo.baseline_cost,
        entropy_cost=algo.entropy_cost,
        clip_rho_threshold=algo.clip_rho_threshold,
        clip_pg_rho_threshold=algo.clip_pg_rho_threshold,
        lambda_=algo.vtrace_lambda,
        reduction=algo.reduction,
        correction=algo.correction,
        normalize_advantages=algo.normalize_advantages,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.total.backward()
    layer_norms = layer_grad_norms(grad_groups) if grad_groups else None
    max_norm = algo.grad_norm_clip if algo.grad_norm_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    finite = torch.isfinite(grad_norm) & torch.isfinite(loss.total.detach())
    # A NaN/inf step is skipped, never applied: one sync, paid anyway when stats are read.
    if bool(finite):
        optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
    stats = torch.stack(
        [
            loss.total.detach(),
            loss.pg_loss,
            loss.baseline_loss,
            loss.entropy_loss,
            loss.entropy,
            grad_norm.detach(),
            loss.clipped_rho_fraction,
            loss.clipped_pg_rho_fraction,
            loss.mean_rho,
            (~finite).to(grad_norm.dtype),
        ]
    ).float()
    return stats if layer_norms is None else torch.cat([stats, layer_norms.to(stats.device)])
