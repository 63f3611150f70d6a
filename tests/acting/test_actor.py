"""The actor's rollout loop, in-process against a real ring and parameter store: every step of
an unroll is acted by the weights whose version the unroll is stamped with."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.multiprocessing as mp

from impala_gpu.acting.actor import ActorHandles, _run
from impala_gpu.channels.params import ParamStore, flat_parameters
from impala_gpu.channels.ring import RingSpec, SlotManager, TrajectoryRing, numpy_to_torch_dtype
from impala_gpu.config import Config, EnvCfg, ModelCfg
from impala_gpu.envs import env_spec, make_vector_env
from impala_gpu.models import build_model

E, T = 3, 4


def weights(model, version: int) -> torch.Tensor:
    """Distinct weights per version: the logits tell the versions apart."""
    g = torch.Generator().manual_seed(version)
    return torch.randn(flat_parameters(model).numel(), generator=g) * 0.5


@pytest.mark.parametrize("refresh_every", [1, 2])
def test_every_step_comes_from_the_stamped_version(refresh_every):
    cfg = Config(
        env=EnvCfg(id="CartPole-v1"),
        model=ModelCfg(name="mlp", hidden_size=16),
        num_actors=1,
        envs_per_actor=E,
        unroll_length=T,
        precision="fp32",
        refresh_every=refresh_every,
    )
    spec = env_spec(cfg.env)
    model = build_model(spec.obs_shape, spec.num_actions, cfg.model)
    ring_spec = RingSpec(
        num_slots=2 * E,
        unroll_length=T,
        obs_shape=spec.obs_shape,
        obs_dtype=numpy_to_torch_dtype(spec.obs_dtype),
        num_actions=spec.num_actions,
    )
    ctx = mp.get_context("spawn")
    ring = TrajectoryRing(ring_spec, num_actors=1, ctx=ctx)
    slots = SlotManager(ring)
    params = ParamStore.for_model(model, history=64)
    params.publish_flat(weights(model, 0), 0)
    handles = ActorHandles.create(ctx, ring, params, 1)
    stop = threading.Event()
    env = make_vector_env(cfg.env, E, num_threads=1)
    actor = threading.Thread(
        target=_run, args=(0, cfg, spec, handles, 0, env, stop.is_set), daemon=True
    )
    actor.start()
    checked, version, stamped = 0, 0, set()
    try:
        for _ in range(8 * E):  # 8 unrolls of E slots
            item = ring.take(timeout=30)
            assert item is not None, "the actor wrote nothing"
            slot = slots.accept(item)
            v = int(ring.version[slot])
            stamped.add(v)
            reference = build_model(spec.obs_shape, spec.num_actions, cfg.model)
            torch.nn.utils.vector_to_parameters(weights(model, v), reference.parameters())
            with torch.no_grad():
                out = reference(ring.obs[slot].unsqueeze(1), ring.first[slot].unsqueeze(1))
            # Steps 0..T-1 are acted on; o_T is the bootstrap, acted on by the next unroll.
            torch.testing.assert_close(
                ring.logits[slot, :T], out.logits[:T, 0], rtol=1e-5, atol=1e-5
            )
            checked += 1
            slots.give(slot)
            if checked % E == 0:  # a whole unroll is back: the learner moves on a version
                version += 1
                params.publish_flat(weights(model, version), version)
    finally:
        stop.set()
        actor.join(timeout=10)
        env.close()
        ring.close()
    assert len(stamped) >= 3, f"the actor never refreshed its weights: versions {stamped}"
