"""``learners=N``: data-parallel learners with torch.distributed (gloo on CPU, NCCL on CUDA).

Rank 0 is the whole single-box system (actors, ring, batcher, reporting, checkpoints) and the
only learner that publishes weights. Before each update it broadcasts "go on", then scatters
the batch column-wise: rank r trains on trajectories [r*B/N, (r+1)*B/N). Every rank runs the
same train step on its share inside ``DistributedDataParallel``, which all-reduces (averages)
the gradients during backward, so every rank clips the same gradient and takes the same
optimizer step: N learners at B/N make the update one learner makes at B (``loss_scale``
weighs each share's loss so that this holds for a sum and for a mean over valid steps;
with ``algo.normalize_advantages`` the ranks sum their advantages' moments, ``sum_over_ranks``,
so each normalises by the whole minibatch's mean and standard deviation).

The other ranks need nothing but the config and the rendezvous: spawned by rank 0 on this box
(``learners=N``), or each started by ``torchrun`` on any number of machines (the batch travels
over the process group, not through shared memory).
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor, nn

from impala_gpu.channels.ring import STEP_FIELDS
from impala_gpu.config import Config, ConfigError, resolve_device
from impala_gpu.envs import env_spec
from impala_gpu.learning.batcher import Batch
from impala_gpu.learning.learner import build_learner
from impala_gpu.speed.threads import learner_threads

GO, STOP = 1, 0
BOOL_FIELDS = ("terminated", "truncated", "first")  # carried as uint8


@dataclass(frozen=True)
class Rendezvous:
    rank: int
    world: int
    init_method: str  # tcp://host:port, or env:// under torchrun

    @property
    def leader(self) -> bool:
        return self.rank == 0


def torchrun_rendezvous() -> Rendezvous | None:
    """The rank and world that ``torchrun`` set in the environment, or None outside it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or "RANK" not in os.environ:
        return None
    return Rendezvous(int(os.environ["RANK"]), world, "env://")


def learners_on_this_box(cfg: Config) -> tuple[int, str]:
    """How many learner processes share this machine's GPUs, and the setting that made it so:
    ``learners``, or under torchrun its processes per node (``LOCAL_WORLD_SIZE``)."""
    rdv = torchrun_rendezvous()
    if rdv is None:
        return cfg.learners, f"learners={cfg.learners}"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", rdv.world))
    return local, f"torchrun --nproc-per-node={local}"


def rendezvous(cfg: Config) -> Rendezvous | None:
    """This process's place among ``learners`` learners: torchrun's, or rank 0 of
    ``cfg.learners`` on this box; None for a single learner."""
    rdv = torchrun_rendezvous()
    if rdv is not None:
        if cfg.learners not in (1, rdv.world):
            raise ConfigError(
                f"learners={cfg.learners} under torchrun with {rdv.world} processes. Fix: omit "
                "learners (torchrun's --nproc-per-node x --nnodes decides), or match it."
            )
        return rdv
    return local_rendezvous(cfg.learners) if cfg.learners > 1 else None


def local_rendezvous(world: int) -> Rendezvous:
    """Rank 0 of ``world`` learner processes on this box (a free loopback port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return Rendezvous(0, world, f"tcp://127.0.0.1:{port}")


def learner_device(device: torch.device, rank: int) -> torch.device:
    """Each rank's device: its own GPU (LOCAL_RANK under torchrun), or the CPU."""
    if device.type != "cuda":
        return device
    local = int(os.environ.get("LOCAL_RANK", rank))
    return torch.device("cuda", local % torch.cuda.device_count())


def use_device(device: torch.device) -> None:
    """Make a CUDA ``device`` with an index this process's current device.

    Call it in the learner process before anything touches CUDA: the timers' events, the
    telemetry's memory readings, the batcher's side stream and every ``torch.cuda`` call
    without a device take the current one, which is cuda:0 until set, so ``device=cuda:1``
    would put the model on cuda:1 and time and measure cuda:0. ``cuda`` without an index is
    the current device already (and ``set_device`` wants an index); the CPU needs nothing.
    """
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


def join_group(rdv: Rendezvous, device: torch.device, timeout_s: float) -> None:
    # DDP imports torch._dynamo. Imported after the group exists, it keeps a reference to the
    # group that destroy_process_group cannot drop, so gloo's worker threads outlive it into
    # interpreter exit; one releasing its last work's tensors then needs the GIL and the rank
    # dies with SIGABRT ("terminate called without an active exception") after its work is done.
    import torch._dynamo  # noqa: F401

    backend = "nccl" if device.type == "cuda" else "gloo"
    use_device(device)  # learner_device's, which has an index
    dist.init_process_group(
        backend,
        init_method=rdv.init_method,
        rank=rdv.rank,
        world_size=rdv.world,
        timeout=timedelta(seconds=timeout_s),
    )


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """The model every rank trains through: DDP averages the gradients in backward."""
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def sync_optimizer_state(optimizer, scheduler, device: torch.device) -> None:
    """Rank 0's optimizer and schedule state to every rank (a resumed run starts equal).
    DDP broadcasts the parameters themselves when it wraps the model."""
    box = [
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        if dist.get_rank() == 0
        else None
    ]
    dist.broadcast_object_list(box, src=0, device=device if device.type == "cuda" else None)
    if dist.get_rank() != 0:
        optimizer.load_state_dict(box[0]["optimizer"])
        scheduler.load_state_dict(box[0]["scheduler"])


def share_shapes(cfg: Config, spec, world: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of one rank's share of a batch: ``[T+1, B/N, ...]`` step fields (bools
    as uint8, which every backend carries), plus the LSTM state ``[B/N, H]``."""
    from impala_gpu.channels.ring import numpy_to_torch_dtype

    T1, b = cfg.unroll_length + 1, cfg.batch_size // world
    shapes = {
        "obs": ((T1, b, *spec.obs_shape), numpy_to_torch_dtype(spec.obs_dtype)),
        "reward": ((T1, b), torch.float32),
        **{name: ((T1, b), torch.uint8) for name in BOOL_FIELDS},
        "action": ((T1, b), torch.int64),
        "logits": ((T1, b, spec.num_actions), torch.float32),
    }
    if cfg.model.use_lstm:
        shapes["core_h"] = ((b, cfg.model.lstm_size), torch.float32)
        shapes["core_c"] = ((b, cfg.model.lstm_size), torch.float32)
    return shapes


class BatchScatter:
    """Every update: rank 0 says go (or stop) and hands each rank its share of the batch."""

    def __init__(self, shapes: dict, world: int, device: torch.device):
        self.world, self.device = world, device
        self.share = {n: torch.empty(s, dtype=d, device=device) for n, (s, d) in shapes.items()}
        self.flag = torch.zeros(1, dtype=torch.int64, device=device)

    def signal(self, go: bool) -> bool:
        """Rank 0 sets the flag; every rank returns it."""
        self.flag.fill_(GO if go else STOP)
        dist.broadcast(self.flag, src=0)
        return int(self.flag.item()) == GO

    def scatter(self, batch: Batch | None) -> Batch:
        """This rank's share of rank 0's ``batch`` (None on the other ranks)."""
        for name, out in self.share.items():
            chunks = None
            if batch is not None:
                full = _field(batch, name).to(out.dtype)  # bool -> uint8 for the wire
                dim = 0 if name.startswith("core_") else 1
                chunks = [c.contiguous() for c in full.chunk(self.world, dim=dim)]
            dist.scatter(out, chunks, src=0)
        s = self.share
        core = (s["core_h"], s["core_c"]) if "core_h" in s else ()
        return Batch(
            **{n: s[n].bool() if n in BOOL_FIELDS else s[n] for n in STEP_FIELDS},
            core_state=core,
        )


def _field(batch: Batch, name: str) -> Tensor:
    if name == "core_h":
        return batch.core_state[0]
    if name == "core_c":
        return batch.core_state[1]
    return getattr(batch, name)


def loss_scale(share: Batch, reduction: str) -> float:
    """What this rank's loss is multiplied by before backward, so that DDP's average of the
    ranks' gradients is the gradient of the whole batch's loss: N for a summed loss; for a mean
    (a sum over this share's valid steps, divided by their count) N x (its count / the whole
    batch's count), which takes one tiny all-reduce."""
    world = dist.get_world_size()
    if reduction == "sum":
        return float(world)
    valid = ~(share.terminated[:-1] | share.truncated[:-1])
    counts = valid.sum().to(torch.float64).reshape(1)
    mine = max(float(counts.item()), 1.0)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return world * mine / max(float(counts.item()), 1.0)


def sum_over_ranks(moments: Tensor) -> Tensor:
    """``MomentsReduce`` across the ranks: this rank's advantage moments summed over all."""
    dist.all_reduce(moments, op=dist.ReduceOp.SUM)
    return moments


def mean_over_ranks(stats: Tensor) -> Tensor:
    """The update's stats averaged over the ranks (each measured its own share)."""
    dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    return stats / dist.get_world_size()


class Ranks:
    """A learner rank's place in the group, as ``Learner.update`` uses it (``learner.Parallel``):
    the DDP-wrapped model, this rank's share of each batch, rank 0's input statistics, and sums
    and means over the ranks."""

    def __init__(self, rank: int, cfg: Config, spec, device: torch.device, model: nn.Module):
        self.rank = rank
        self.model = wrap(model, device)
        world = dist.get_world_size()
        self.scatter = BatchScatter(share_shapes(cfg, spec, world), world, device)
        self.reduction = cfg.algo.reduction

    def share(self, batch: Batch | None) -> tuple[Batch, float]:
        """Rank 0 tells the ranks to go on and hands each its share of ``batch``; the others
        (``batch`` None) receive theirs. Returns this rank's share and its loss scale."""
        if self.rank == 0:
            self.scatter.signal(go=True)
        share = self.scatter.scatter(batch)
        if batch is not None:
            share.versions, share.replayed = batch.versions, batch.replayed
        return share, loss_scale(share, self.reduction)

    def sync_input_stats(self, policy: nn.Module) -> None:
        """Rank 0's input statistics, merged from the whole batch, to every rank. They are
        parameters without gradient, which DDP never averages: merged from each rank's own
        share instead, the ranks' statistics, and then their weights, drift apart."""
        obs_norm = getattr(policy, "obs_norm", None)
        if obs_norm is None:
            return
        flat = torch.cat([p.detach().reshape(-1) for p in obs_norm.parameters()])
        dist.broadcast(flat, src=0)
        offset = 0
        with torch.no_grad():
            for p in obs_norm.parameters():
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def sum_moments(self, moments: Tensor) -> Tensor:
        return sum_over_ranks(moments)

    def mean(self, stats: Tensor) -> Tensor:
        return mean_over_ranks(stats)

    def close(self) -> None:
        self.model = None  # the DDP wrapper holds the group until it goes


class DataParallel(Ranks):
    """Rank 0's side of ``learners=N``: ``Ranks``, plus starting and stopping the others."""

    def __init__(
        self,
        rdv: Rendezvous,
        cfg: Config,
        spec,
        device: torch.device,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
    ):
        """Start the other ranks and hand them rank 0's weights and optimizer state."""
        self.rdv, self.device = rdv, device
        self.followers = spawn_followers(rdv, cfg) if rdv.init_method != "env://" else []
        join_group(rdv, device, cfg.learner_timeout_s)
        dist.broadcast_object_list([cfg], src=0)  # the resolved config (auto) for every rank
        super().__init__(0, cfg, spec, device, model)
        sync_optimizer_state(optimizer, scheduler, device)
        self.closed = False

    def close(self) -> None:
        """Stop the other ranks (they leave once told, or once the group breaks)."""
        if self.closed:
            return
        self.closed = True
        super().close()
        if all(p.is_alive() for p in self.followers):
            try:
                self.scatter.signal(go=False)
            except RuntimeError:  # a rank is gone: the group is broken
                pass
        for p in self.followers:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        leave_group()


def spawn_followers(rdv: Rendezvous, cfg: Config) -> list:
    """Ranks 1..N-1 as spawned processes on this box."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(1, rdv.world):
        p = ctx.Process(
            target=follower_main,
            args=(Rendezvous(rank, rdv.world, rdv.init_method), cfg, True),
            name=f"learner-{rank}",
            daemon=True,
        )
        p.start()
        procs.append(p)
    return procs


def follower_main(rdv: Rendezvous, cfg: Config, spawned: bool = False) -> None:
    """A learner rank other than 0: train on each share rank 0 scatters until told to stop."""
    if spawned:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 coordinates shutdown
    device = learner_device(resolve_device(cfg.device), rdv.rank)
    join_group(rdv, device, cfg.learner_timeout_s)
    try:
        # Rank 0's resolved config: under torchrun this rank never resolved `auto` itself.
        box: list = [None]
        dist.broadcast_object_list(box, src=0)
        cfg = box[0]
        spec = env_spec(cfg.env)
        cores = os.cpu_count() or 1
        torch.set_num_threads(
            learner_threads(
                device.type, cfg.precision, cores, cfg.num_actors, cfg.learner_threads, rdv.world
            )
        )
        torch.manual_seed(cfg.seed)

        def follower(model, optimizer, scheduler) -> Ranks:
            ranks = Ranks(rdv.rank, cfg, spec, device, model)  # DDP: rank 0's weights
            sync_optimizer_state(optimizer, scheduler, device)
            return ranks

        learner = build_learner(cfg, spec, device, data_parallel=follower)
        ranks = learner.parallel
        assert isinstance(ranks, Ranks)
        while ranks.scatter.signal(go=False):  # the flag is rank 0's
            learner.update(None)
            learner.scheduler.step()
    finally:
        leave_group()
