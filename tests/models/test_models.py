"""Tests for impala_gpu.models: shapes, input scaling, LSTM state threading, gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from impala_gpu.config import ModelCfg
from impala_gpu.models import InputConv, build_model, resolve_model_name

ATARI_OBS = (4, 84, 84)
ATARI_ACTIONS = 6
VEC_OBS = (4,)
VEC_ACTIONS = 2
LSTM_SIZE = 32
HIDDEN = 64
T, B = 3, 2

# (model name, obs shape, num actions)
ARCHS = [
    ("shallow", ATARI_OBS, ATARI_ACTIONS),
    ("resnet", ATARI_OBS, ATARI_ACTIONS),
    ("mlp", VEC_OBS, VEC_ACTIONS),
]
ARCH_IDS = [a[0] for a in ARCHS]


def _model(name, obs_shape, num_actions, use_lstm, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelCfg(name=name, hidden_size=HIDDEN, use_lstm=use_lstm, lstm_size=LSTM_SIZE, **kw)
    return build_model(obs_shape, num_actions, cfg)


def _obs(obs_shape, t=T, b=B, seed=1):
    g = torch.Generator().manual_seed(seed)
    if len(obs_shape) == 3:
        return torch.randint(0, 256, (t, b, *obs_shape), dtype=torch.uint8, generator=g)
    return torch.randn(t, b, *obs_shape, generator=g)


def _random_state(b=B, seed=2):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, LSTM_SIZE, generator=g), torch.randn(b, LSTM_SIZE, generator=g))


def _no_first(t=T, b=B):
    return torch.zeros(t, b, dtype=torch.bool)


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("use_lstm", [False, True], ids=["ff", "lstm"])
@pytest.mark.parametrize("name,obs_shape,num_actions", ARCHS, ids=ARCH_IDS)
def test_output_shapes(name, obs_shape, num_actions, use_lstm):
    model = _model(name, obs_shape, num_actions, use_lstm)
    state = model.initial_state(B)
    out = model(_obs(obs_shape), _no_first(), state)
    assert out.logits.shape == (T, B, num_actions)
    assert out.value.shape == (T, B)
    assert out.logits.dtype == torch.float32 and out.value.dtype == torch.float32
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.value).all()
    if use_lstm:
        assert isinstance(state, tuple) and len(state) == 2
        assert all(s.shape == (B, LSTM_SIZE) and not s.any() for s in state)
        assert isinstance(out.core_state, tuple) and len(out.core_state) == 2
        assert all(s.shape == (B, LSTM_SIZE) for s in out.core_state)
        assert all(s.abs().sum() > 0 for s in out.core_state)  # the state advanced
    else:
        assert state == () and out.core_state == ()


def test_obs_shape_mismatch_raises():
    model = _model("mlp", VEC_OBS, VEC_ACTIONS, False)
    with pytest.raises(ValueError, match="obs shape"):
        model(torch.zeros(T, B, 5), _no_first())


def test_lstm_model_requires_core_state():
    model = _model("mlp", VEC_OBS, VEC_ACTIONS, True)
    with pytest.raises(ValueError, match="core_state"):
        model(_obs(VEC_OBS), _no_first(), ())


@pytest.mark.parametrize("use_lstm", [False, True], ids=["ff", "lstm"])
@pytest.mark.parametrize("name", ["shallow", "resnet"])
def test_uint8_input_scaled_inside_model(name, use_lstm):
    model = _model(name, ATARI_OBS, ATARI_ACTIONS, use_lstm)
    obs = _obs(ATARI_OBS)
    state = model.initial_state(B)
    out_u8 = model(obs, _no_first(), state)
    out_f = model(obs.float() / 255.0, _no_first(), state)
    torch.testing.assert_close(out_u8.logits, out_f.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_u8.value, out_f.value, rtol=1e-5, atol=1e-6)
    # Not a no-op: unscaled floats give different outputs.
    out_raw = model(obs.float(), _no_first(), state)
    assert not torch.allclose(out_u8.logits, out_raw.logits, atol=1e-4)


# --------------------------------------------------------------------------- LSTM state threading


@pytest.mark.parametrize("name,obs_shape,num_actions", ARCHS, ids=ARCH_IDS)
def test_lstm_unroll_equals_stepwise(name, obs_shape, num_actions):
    model = _model(name, obs_shape, num_actions, True)
    obs = _obs(obs_shape, t=4)
    first = torch.tensor([[True, False], [False, False], [False, True], [False, False]])
    state0 = _random_state()
    with torch.no_grad():
        full = model(obs, first, state0)
        state = state0
        logits, values = [], []
        for t in range(obs.shape[0]):
            out = model(obs[t : t + 1], first[t : t + 1], state)
            logits.append(out.logits)
            values.append(out.value)
            state = out.core_state
    torch.testing.assert_close(full.logits, torch.cat(logits), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(full.value, torch.cat(values), rtol=1e-5, atol=1e-6)
    for a, b in zip(full.core_state, state, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,obs_shape,num_actions", ARCHS, ids=ARCH_IDS)
def test_lstm_first_resets_state(name, obs_shape, num_actions):
    model = _model(name, obs_shape, num_actions, True)
    n, t0 = 5, 2
    obs = _obs(obs_shape, t=n)
    first = _no_first(t=n)
    first[t0, 0] = True  # env 0 starts a new episode at t0; env 1 does not
    with torch.no_grad():
        full = model(obs, first, _random_state())
        # A fresh-state run from t0 on (with different history before t0) matches env 0.
        fresh = model(obs[t0:], first[t0:], model.initial_state(B))
        other_history = model(obs[t0:], first[t0:], _random_state(seed=7))
    torch.testing.assert_close(full.logits[t0:, 0], fresh.logits[:, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(full.value[t0:, 0], fresh.value[:, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(full.logits[t0:, 0], other_history.logits[:, 0])
    # Env 1 had no episode start, so its history before t0 still matters.
    assert not torch.allclose(full.logits[t0:, 1], fresh.logits[:, 1], atol=1e-5)


@pytest.mark.parametrize("name,obs_shape,num_actions", ARCHS, ids=ARCH_IDS)
def test_lstm_state_matters_without_first(name, obs_shape, num_actions):
    model = _model(name, obs_shape, num_actions, True)
    obs = _obs(obs_shape)
    with torch.no_grad():
        a = model(obs, _no_first(), _random_state(seed=3))
        b = model(obs, _no_first(), _random_state(seed=4))
        zero = model(obs, _no_first(), model.initial_state(B))
        # first=True at t=0 discards whatever state is passed in.
        first = _no_first()
        first[0] = True
        c = model(obs, first, _random_state(seed=3))
    assert not torch.allclose(a.logits[0], b.logits[0], atol=1e-5)
    assert not torch.allclose(a.value[0], zero.value[0], atol=1e-5)
    torch.testing.assert_close(c.logits, zero.logits)
    torch.testing.assert_close(c.value, zero.value)


def test_feedforward_ignores_first():
    model = _model("mlp", VEC_OBS, VEC_ACTIONS, False)
    obs = _obs(VEC_OBS)
    with torch.no_grad():
        a = model(obs, _no_first())
        b = model(obs, torch.ones(T, B, dtype=torch.bool))
    torch.testing.assert_close(a.logits, b.logits)


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("use_lstm", [False, True], ids=["ff", "lstm"])
@pytest.mark.parametrize("name,obs_shape,num_actions", ARCHS, ids=ARCH_IDS)
def test_gradient_reaches_every_parameter(name, obs_shape, num_actions, use_lstm):
    model = _model(name, obs_shape, num_actions, use_lstm)
    obs = _obs(obs_shape)
    first = _no_first()
    first[0] = True
    out = model(obs, first, model.initial_state(B))
    g = torch.Generator().manual_seed(5)
    loss = (out.logits * torch.randn(out.logits.shape, generator=g)).sum() + (
        out.value * torch.randn(out.value.shape, generator=g)
    ).sum()
    loss.backward()
    params = dict(model.named_parameters())
    assert params
    missing = [n for n, p in params.items() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


# --------------------------------------------------------------------------- channels_last


@pytest.mark.parametrize("use_lstm", [False, True], ids=["ff", "lstm"])
@pytest.mark.parametrize("name", ["shallow", "resnet"])
def test_channels_last_matches_contiguous(name, use_lstm):
    ref = _model(name, ATARI_OBS, ATARI_ACTIONS, use_lstm, channels_last=False)
    cl = _model(name, ATARI_OBS, ATARI_ACTIONS, use_lstm, seed=123, channels_last=True)
    cl.load_state_dict(ref.state_dict())
    convs = [m for m in cl.modules() if isinstance(m, nn.Conv2d)]
    inner = [m for m in convs if not isinstance(m, InputConv)]
    assert len(inner) == len(convs) - 1, "one input conv per torso"
    assert all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in inner)
    obs = _obs(ATARI_OBS)
    with torch.no_grad():
        a = ref(obs, _no_first(), ref.initial_state(B))
        b = cl(obs, _no_first(), cl.initial_state(B))
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(a.value, b.value, rtol=0, atol=1e-5)
    # Training (grad on) takes a channels_last input in fp32: same outputs again.
    c = cl(obs, _no_first(), cl.initial_state(B))
    torch.testing.assert_close(a.logits, c.logits.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(a.value, c.value.detach(), rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- model names


@pytest.mark.parametrize("name", ["shallow", "resnet"])
def test_cnn_on_vector_obs_raises(name):
    with pytest.raises(ValueError, match="model=mlp"):
        build_model(VEC_OBS, VEC_ACTIONS, ModelCfg(name=name))


def test_unknown_model_name_raises():
    with pytest.raises(ValueError, match="model.name"):
        build_model(ATARI_OBS, ATARI_ACTIONS, ModelCfg(name="transformer"))


def test_auto_model_name():
    assert resolve_model_name("auto", ATARI_OBS) == "shallow"
    assert resolve_model_name("auto", VEC_OBS) == "mlp"
    assert resolve_model_name("resnet", ATARI_OBS) == "resnet"


# --------------------------------------------------------------------------- architecture


def test_resnet_structure():
    model = build_model(ATARI_OBS, ATARI_ACTIONS, ModelCfg(name="resnet"))
    sections = model.torso.sections
    # The conv that opens each section (the one that changes/sets the channel count).
    section_convs = [m for m in sections if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in section_convs] == [16, 32, 32]
    assert section_convs[0].in_channels == ATARI_OBS[0]
    assert sum(isinstance(m, nn.MaxPool2d) for m in sections) == 3
    all_convs = [m for m in sections.modules() if isinstance(m, nn.Conv2d)]
    assert len(all_convs) == 3 * (1 + 2 * 2)  # per section: conv + 2 residual blocks x 2 convs
    assert all(c.kernel_size == (3, 3) for c in all_convs)
    linears = [m for m in model.torso.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 1 and linears[0].out_features == 256
    # 84 -> 42 -> 21 -> 11 after three stride-2 pools, 32 channels.
    assert linears[0].in_features == 32 * 11 * 11
    assert model.policy_head.out_features == ATARI_ACTIONS
    assert model.value_head.out_features == 1


def test_shallow_structure():
    model = build_model(ATARI_OBS, ATARI_ACTIONS, ModelCfg(name="shallow"))
    convs = [m for m in model.torso.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 64, 64]
    assert [c.kernel_size for c in convs] == [(8, 8), (4, 4), (3, 3)]
    linears = [m for m in model.torso.modules() if isinstance(m, nn.Linear)]
    assert [(lin.in_features, lin.out_features) for lin in linears] == [(64 * 7 * 7, 256)]


def test_separate_value_torso_keeps_value_gradients_out_of_the_policy_features():
    torch.manual_seed(0)
    cfg = ModelCfg(name="mlp", hidden_size=16, separate_value=True, init="orthogonal")
    model = build_model((8,), 4, cfg)
    obs, first = torch.randn(3, 2, 8), torch.zeros(3, 2, dtype=torch.bool)
    model(obs, first).value.sum().backward()
    assert all(p.grad is None for p in model.torso.parameters())
    assert all(p.grad is not None for p in model.value_torso.parameters())
    model.zero_grad(set_to_none=True)
    model(obs, first).logits.sum().backward()
    assert all(p.grad is not None for p in model.torso.parameters())
    assert all(p.grad is None for p in model.value_torso.parameters())
    # Same architecture twice: the shared model has one torso's parameters fewer.
    shared = build_model((8,), 4, ModelCfg(name="mlp", hidden_size=16))
    n = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in shared.parameters())
    assert n == sum(p.numel() for p in model.torso.parameters())


def test_separate_value_with_lstm_is_refused():
    cfg = ModelCfg(name="mlp", hidden_size=16, separate_value=True, use_lstm=True)
    with pytest.raises(ValueError, match="separate_value=true .*model.use_lstm=false"):
        build_model((8,), 4, cfg)


def test_input_normaliser_matches_its_formula_and_running_moments():
    from impala_gpu.models.normalize import ObsNormalizer

    g = torch.Generator().manual_seed(0)
    norm = ObsNormalizer((2, 3, 3))
    frames = torch.randint(0, 256, (40, 2, 3, 3), generator=g, dtype=torch.uint8)
    for chunk in frames.split(7):  # uneven chunks: the merge must not depend on them
        norm.update(chunk)
    x = frames.double()
    torch.testing.assert_close(norm.mean.double(), x.mean(0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(norm.var.double(), x.var(0, unbiased=False), rtol=1e-4, atol=1e-3)
    expected = ((x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + 1e-5)).clamp(-5, 5)
    torch.testing.assert_close(norm(frames).double(), expected, rtol=1e-4, atol=1e-4)
    constant = torch.full((4, 2, 3, 3), 87, dtype=torch.uint8)
    still = ObsNormalizer((2, 3, 3))
    still.update(constant)
    assert torch.all(still(constant).abs() < 0.01)  # a pixel that never changes says ~nothing


@pytest.mark.parametrize("activation", ["relu", "elu"])
@pytest.mark.parametrize("name", ["shallow", "minatar"])
def test_in_place_activations_compute_what_out_of_place_ones_do(name, activation):
    """The torsos' activations write over their input: outputs and gradients must be those of
    the same net with out-of-place activations."""
    obs_shape = ATARI_OBS if name == "shallow" else (4, 10, 10)
    model = _model(name, obs_shape, ATARI_ACTIONS, False, activation=activation)
    acts = [m for m in model.modules() if isinstance(m, nn.ReLU | nn.ELU)]
    assert acts and all(m.inplace for m in acts)
    plain = _model(name, obs_shape, ATARI_ACTIONS, False, activation=activation)
    for m in plain.modules():
        if isinstance(m, nn.ReLU | nn.ELU):
            m.inplace = False
    obs = _obs(obs_shape)
    grads = []
    for net in (model, plain):
        out = net(obs, _no_first())
        (out.logits.square().sum() + out.value.sum()).backward()
        grads.append([p.grad.clone() for p in net.parameters() if p.requires_grad])
    torch.testing.assert_close(model(obs, _no_first()).logits, plain(obs, _no_first()).logits)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
