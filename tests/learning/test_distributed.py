"""learners=N: two gloo learners on CPU, each on half of a batch, make the update one learner
makes on the whole batch, input statistics included, and agree with each other; and a CartPole
run with learners=2 trains and leaves nothing behind."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from leakcheck import run_cartpole_and_check_it_learns
from ringdata import random_batch

from impala_gpu.config import AlgoCfg, Config, ConfigError, EnvCfg, ModelCfg
from impala_gpu.learning import distributed
from impala_gpu.learning.learner import Learner
from impala_gpu.models import build_model
from impala_gpu.models.normalize import ObsNormalizer
from impala_gpu.validate import validate_config

OBS, ACTIONS, T, B, STEPS = (4,), 2, 5, 8, 3


def algo(reduction: str, normalize: bool = False) -> AlgoCfg:
    return AlgoCfg(reduction=reduction, grad_norm_clip=0, normalize_advantages=normalize)


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    """Plain SGD: its step is linear in the gradient, so a wrong loss scale on the ranks shows
    as a wrong step. Adam's step is nearly scale-free: with it, doubling every rank's gradient
    passed the mean and sum MLP cases, and moved 1 of 256 LSTM-case weights past 1e-4."""
    return torch.optim.SGD(model.parameters(), lr=0.05)


def fresh_model(lstm: bool, inputs: bool = False) -> torch.nn.Module:
    """With ``inputs``, the policy keeps input statistics (the default Atari recipe's
    ``normalize_input``, here on vectors: the statistics are the same code)."""
    torch.manual_seed(0)
    model = build_model(OBS, ACTIONS, ModelCfg(name="mlp", hidden_size=16, use_lstm=lstm))
    if inputs:
        model.obs_norm = ObsNormalizer(OBS)
    return model


def with_core(batch, lstm: bool, seed: int):
    if not lstm:
        return batch
    g = torch.Generator().manual_seed(100 + seed)
    core = tuple(torch.randn(B, 256, generator=g) for _ in range(2))
    return dataclasses.replace(batch, core_state=core)


def one_learner(reduction: str, lstm: bool, normalize: bool, inputs: bool) -> list[torch.Tensor]:
    model = fresh_model(lstm, inputs)
    lrn = Learner(model, sgd(model), algo(reduction, normalize))
    for step in range(STEPS):
        lrn.update(with_core(random_batch(OBS, ACTIONS, T=T, B=B, seed=step), lstm, step))
    return [p.detach().clone() for p in model.parameters()]


# (reduction, lstm, normalize_advantages, normalize_input): advantages normalised over the whole
# batch, not per share; input statistics merged from the whole batch, the same on every rank
CASES = [
    ("mean", False, False, False),
    ("sum", False, False, False),
    ("mean", True, False, False),
    ("mean", False, True, False),
    ("mean", False, False, True),
]


def rank_main(rank: int, world: int, init_method: str, out) -> None:
    """One learner rank: every case in turn (one process group, so the suite pays one spawn)."""
    rdv = distributed.Rendezvous(rank, world, init_method)
    device = torch.device("cpu")
    distributed.join_group(rdv, device, timeout_s=60)
    try:
        for case in CASES:
            out.put((rank, case, train_as_rank(rank, device, *case)))
    finally:
        distributed.leave_group()


def train_as_rank(
    rank: int, device, reduction: str, lstm: bool, normalize: bool, inputs: bool
) -> list:
    model = fresh_model(lstm, inputs)
    with torch.no_grad():  # a different start on rank 1: DDP must broadcast rank 0's
        for p in model.parameters():
            p.add_(rank)
    cfg = Config(env=EnvCfg(id="CartPole-v1"), unroll_length=T, batch_size=B)
    cfg.model = ModelCfg(name="mlp", hidden_size=16, use_lstm=lstm)
    cfg.algo = algo(reduction, normalize)
    ranks = distributed.Ranks(rank, cfg, distributed_spec(), device, model)
    lrn = Learner(model, sgd(model), cfg.algo, parallel=ranks)
    if rank == 0:
        for step in range(STEPS):
            lrn.update(with_core(random_batch(OBS, ACTIONS, T=T, B=B, seed=step), lstm, step))
        ranks.scatter.signal(go=False)
    else:
        while ranks.scatter.signal(go=False):  # the flag is rank 0's
            lrn.update(None)
    ranks.close()
    return [p.detach().numpy().copy() for p in model.parameters()]  # by value


def distributed_spec():
    from impala_gpu.envs import env_spec

    return env_spec(EnvCfg(id="CartPole-v1"))


def test_two_learners_at_half_batch_make_one_learners_update():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    rdv = distributed.local_rendezvous(2)
    procs = [ctx.Process(target=rank_main, args=(r, 2, rdv.init_method, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=120) for _ in range(2 * len(CASES))]
    finally:
        for p in procs:
            p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    by_rank = {(rank, case): params for rank, case, params in got}
    for case in CASES:
        reduction, lstm, normalize, inputs = case
        want = one_learner(*case)
        start = dict(fresh_model(lstm, inputs).named_parameters())
        moved = max(
            float((w - s.detach()).abs().max()) for w, s in zip(want, start.values(), strict=True)
        )
        assert moved > 1e-3, "the updates did not move anything"
        for rank in (0, 1):
            for name, g, w in zip(start, by_rank[rank, case], want, strict=True):
                torch.testing.assert_close(
                    torch.from_numpy(g),
                    w,
                    # fp32 all-reduce sums in another order than one backward: 1e-8 to 1e-7
                    # here (Xeon), against moves of 1.4e-2 (mean) and 0.75 (sum); a doubled
                    # loss scale puts the ranks a whole move off
                    rtol=1e-5,
                    atol=1e-6,
                    msg=lambda m, c=case, n=name, r=rank: f"rank {r}, {c}, {n}: {m}",
                )


# A fresh interpreter: once any test has imported torch._dynamo, the leak cannot show.
LEAVE_IN_A_FRESH_PROCESS = """
import os, sys, torch
from impala_gpu.learning import distributed

assert "torch._dynamo" not in sys.modules
torch.set_num_threads(1)
torch.nn.Linear(4, 2)(torch.randn(3, 4)).sum().backward()  # threads torch starts once, before
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
distributed.join_group(distributed.local_rendezvous(1), torch.device("cpu"), timeout_s=30)
model = distributed.wrap(torch.nn.Linear(4, 2), torch.device("cpu"))  # imports torch._dynamo
model(torch.randn(3, 4)).sum().backward()
del model
distributed.leave_group()
print(before, threads())
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_leaving_the_group_stops_its_threads():
    """A rank that left its group must hold none of gloo's threads: any left are torn down at
    interpreter exit, where one can abort the process (SIGABRT) after its work is done."""
    out = subprocess.run(
        [sys.executable, "-c", LEAVE_IN_A_FRESH_PROCESS],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, after = map(int, out.stdout.split())
    assert after == before, f"{after - before} of the group's threads outlived it"


def test_use_device_makes_an_indexed_cuda_device_current(monkeypatch):
    """device=cuda:1: events, streams and memory readings take the current device, cuda:0
    until set (on CPU: set_device recorded, not called)."""
    calls: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    distributed.use_device(torch.device("cuda", 1))
    distributed.use_device(torch.device("cuda"))  # the current one already; no index to set
    distributed.use_device(torch.device("cpu"))
    assert calls == [torch.device("cuda", 1)]


def test_learners_must_split_the_batch():
    cfg = Config(env=EnvCfg(id="CartPole-v1"), num_actors=1, envs_per_actor=2, precision="fp32")
    cfg.batch_size, cfg.learners = 6, 4
    with pytest.raises(ConfigError, match="batch_size=4"):
        validate_config(cfg)
    a2c = copy.deepcopy(cfg)
    a2c.batch_size, a2c.algo = 8, AlgoCfg(name="a2c")
    with pytest.raises(ConfigError, match="only IMPALA"):
        validate_config(a2c)


@pytest.mark.slow
def test_cartpole_trains_with_two_learners(tmp_path):
    run_cartpole_and_check_it_learns(tmp_path, "learners=2")
