"""Policy networks. One interface for all of them::

    out = policy(obs_t, first_t, core_state)   # time-major
    out.logits [T, B, A], out.value [T, B], out.core_state (same structure as core_state)

``obs_t`` may be uint8 (Atari frames): the model scales it to [0, 1] itself, on its own device,
so nobody upstream converts anything. ``first_t`` [T, B] bool marks the first observation of an
episode; the LSTM core (when enabled) resets its state there.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from impala_gpu.config import ModelCfg
from impala_gpu.health import Layer

CoreState = tuple[Tensor, ...]  # () without LSTM; (h, c), each [B, lstm_size], with it
MODEL_NAMES = ("auto", "shallow", "resnet", "mlp")
INIT_SCHEMES = ("torch", "orthogonal")


class PolicyOutput(NamedTuple):
    logits: Tensor  # [T, B, A]
    value: Tensor  # [T, B]
    core_state: CoreState


class InputConv(nn.Conv2d):
    """A torso's first convolution. With channels_last on, it keeps its weight (and, but for
    fp32 training, its input) in NCHW and hands its output on in channels_last: transposing a
    4-channel frame stack costs more than the convolution saves (actor inference at batch 16:
    4.1 -> 3.3 ms fp32, 2.5 -> 2.0 ms bf16; bf16 learner step 130 -> 113 ms), while the later
    layers, with 16-64 channels, run fastest in channels_last."""

    output_format = torch.contiguous_format

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).contiguous(memory_format=self.output_format)


class NatureTorso(nn.Module):
    """Mnih et al. 2015 CNN: 32x8x8/4, 64x4x4/2, 64x3x3/1, then FC."""

    def __init__(self, obs_shape: tuple[int, ...], hidden_size: int):
        super().__init__()
        c, h, w = obs_shape
        self.convs = nn.Sequential(
            InputConv(c, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
        )
        with torch.no_grad():
            n_flat = self.convs(torch.zeros(1, c, h, w)).numel()
        self.fc = nn.Sequential(nn.Linear(n_flat, hidden_size), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.convs(x).flatten(1))

    def health_layers(self) -> list[Layer]:
        convs = [Layer(f"conv{i + 1}", self.convs[2 * i], self.convs[2 * i + 1]) for i in range(3)]
        return [*convs, Layer("fc", self.fc[0], self.fc[1])]


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        # Modules rather than torch.relu, so network-health hooks can watch them (no weights:
        # checkpoints are unchanged).
        self.act0 = nn.ReLU()
        self.act1 = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv0(self.act0(x))
        y = self.conv1(self.act1(y))
        return x + y


class ImpalaTorso(nn.Module):
    """Espeholt et al. 2018 deep net: per section conv3x3, maxpool3x3/2, 2 residual blocks."""

    def __init__(self, obs_shape: tuple[int, ...], hidden_size: int, channels=(16, 32, 32)):
        super().__init__()
        c, h, w = obs_shape
        layers: list[nn.Module] = []
        for i, out_c in enumerate(channels):
            layers += [
                (InputConv if i == 0 else nn.Conv2d)(c, out_c, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                ResidualBlock(out_c),
                ResidualBlock(out_c),
            ]
            c = out_c
        layers.append(nn.ReLU())
        self.sections = nn.Sequential(*layers)
        with torch.no_grad():
            n_flat = self.sections(torch.zeros(1, *obs_shape)).numel()
        self.fc = nn.Sequential(nn.Linear(n_flat, hidden_size), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.sections(x).flatten(1))

    def health_layers(self) -> list[Layer]:
        layers, mods = [], list(self.sections)
        for i in range(0, len(mods) - 1, 4):
            conv, blocks = mods[i], mods[i + 2 : i + 4]
            s = i // 4
            # The section's conv is max-pooled, then rectified by its first block's act0.
            layers.append(Layer(f"s{s}.conv", conv, blocks[0].act0))
            for j, block in enumerate(blocks):
                layers += [
                    Layer(f"s{s}.b{j}.conv0", block.conv0, block.act1),
                    Layer(f"s{s}.b{j}.conv1", block.conv1, None),  # summed into the residual
                ]
        return [*layers, Layer("fc", self.fc[0], self.fc[1])]


class MLPTorso(nn.Module):
    def __init__(self, obs_shape: tuple[int, ...], hidden_size: int, num_layers: int):
        super().__init__()
        n_in = int(torch.tensor(obs_shape).prod())
        layers: list[nn.Module] = []
        for _ in range(num_layers):
            layers += [nn.Linear(n_in, hidden_size), nn.Tanh()]
            n_in = hidden_size
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.flatten(1))

    def health_layers(self) -> list[Layer]:
        # tanh units saturate rather than die: no dead-unit count for them.
        return [Layer(f"fc{i // 2 + 1}", self.net[i], None) for i in range(0, len(self.net), 2)]


class Policy(nn.Module):
    """Torso -> optional LSTM core -> policy logits and value heads."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, cfg: ModelCfg):
        super().__init__()
        name = resolve_model_name(cfg.name, obs_shape)
        self.obs_shape = tuple(obs_shape)
        self.num_actions = num_actions
        self.is_image = len(obs_shape) == 3
        self.channels_last = cfg.channels_last and self.is_image
        if name == "shallow":
            self.torso: nn.Module = NatureTorso(obs_shape, cfg.hidden_size)
        elif name == "resnet":
            self.torso = ImpalaTorso(obs_shape, cfg.hidden_size)
        else:
            self.torso = MLPTorso(obs_shape, cfg.hidden_size, cfg.mlp_layers)
        core_in = cfg.hidden_size
        self.lstm = nn.LSTM(core_in, cfg.lstm_size) if cfg.use_lstm else None
        head_in = cfg.lstm_size if cfg.use_lstm else core_in
        self.policy_head = nn.Linear(head_in, num_actions)
        self.value_head = nn.Linear(head_in, 1)
        init_weights(self, cfg.init)
        if self.channels_last:
            self.to(memory_format=torch.channels_last)
            for m in self.modules():
                if isinstance(m, InputConv):
                    m.weight.data = m.weight.data.contiguous()
                    m.output_format = torch.channels_last

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> CoreState:
        if self.lstm is None:
            return ()
        z = torch.zeros(batch_size, self.lstm.hidden_size, device=device)
        return (z, z.clone())

    def forward(self, obs: Tensor, first: Tensor, core_state: CoreState = ()) -> PolicyOutput:
        """obs [T, B, *obs_shape] uint8 or float; first [T, B] bool; core_state as initial_state."""
        if obs.shape[2:] != self.obs_shape:
            raise ValueError(f"obs shape {tuple(obs.shape)} does not end in {self.obs_shape}")
        T, B = obs.shape[:2]
        x = obs.reshape(T * B, *self.obs_shape)
        # Straight to bf16 under bf16 autocast (the first layer would cast again). The layout
        # stays NCHW (see InputConv), except for fp32 training, where a channels_last input is
        # faster (learner step 234 -> 200 ms, Pong T=20 B=32, 2 threads).
        dtype = _input_dtype(x.device.type)
        fp32_training = dtype == torch.float32 and torch.is_grad_enabled()
        cl_input = self.channels_last and fp32_training
        x = x.to(dtype, memory_format=torch.channels_last if cl_input else torch.contiguous_format)
        if obs.dtype == torch.uint8:
            x = x.mul_(1.0 / 255.0)
        features = self.torso(x)
        if self.lstm is not None:
            if len(core_state) != 2:
                raise ValueError("this model has an LSTM core: pass core_state=(h, c)")
            # The core runs in fp32 even under bf16 autocast: CUDA autocast would run cuDNN's
            # LSTM in fp16 (with no grad scaler), and the recurrent state should not round.
            with torch.autocast(features.device.type, enabled=False):
                features, core_state = self._core(features.float(), first, core_state, T, B)
        logits = self.policy_head(features).view(T, B, self.num_actions)
        value = self.value_head(features).view(T, B)
        return PolicyOutput(logits, value, core_state)

    def _core(
        self, features: Tensor, first: Tensor, core_state: CoreState, T: int, B: int
    ) -> tuple[Tensor, CoreState]:
        """LSTM over time; features [T*B, H] -> [T*B, lstm_size], state reset where first."""
        h, c = core_state
        keep = (~first).to(features.dtype).unsqueeze(-1)  # [T, B, 1]
        seq = features.view(T, B, -1)
        outs = []
        for t in range(T):
            # A new episode starts from a zero state, also in the middle of an unroll.
            h, c = h * keep[t], c * keep[t]
            out, (h1, c1) = self.lstm(seq[t].unsqueeze(0), (h.unsqueeze(0), c.unsqueeze(0)))
            h, c = h1.squeeze(0), c1.squeeze(0)
            outs.append(out.squeeze(0))
        return torch.stack(outs).view(T * B, -1), (h, c)


def init_weights(policy: Policy, scheme: str) -> None:
    """``orthogonal``: the init of the PyTorch recipes that learn Atari quickly (OpenAI baselines,
    CleanRL, SB3): orthogonal weights with gain sqrt(2) in the torso, 0.01 on the policy head
    (a near-uniform first policy whatever the frame), 1 on the value head; zero biases.
    ``torch`` keeps PyTorch's per-layer defaults (uniform, fan-in scaled, random biases)."""
    if scheme not in INIT_SCHEMES:
        raise ValueError(
            f"model.init={scheme!r} is not one of {INIT_SCHEMES} (try model.init=orthogonal)."
        )
    if scheme == "torch":
        return
    heads = {policy.policy_head: 0.01, policy.value_head: 1.0}
    for m in policy.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(m.weight, gain=heads.get(m, nn.init.calculate_gain("relu")))
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LSTM):
            for name, p in m.named_parameters():
                (nn.init.orthogonal_ if name.startswith("weight") else nn.init.zeros_)(p)


def _input_dtype(device_type: str) -> torch.dtype:
    """The dtype the torso's first layer computes in: autocast's when it is on."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:  # torch < 2.4: per-device functions
        if device_type == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
    return torch.float32


def resolve_model_name(name: str, obs_shape: tuple[int, ...]) -> str:
    if name not in MODEL_NAMES:
        raise ValueError(f"model.name={name!r} is not one of {MODEL_NAMES} (try model=shallow).")
    is_image = len(obs_shape) == 3
    if name == "auto":
        return "shallow" if is_image else "mlp"
    if name in ("shallow", "resnet") and not is_image:
        raise ValueError(
            f"model={name} needs image observations [C, H, W], but this env's are {obs_shape}. "
            "Fix: use model=mlp (or model=auto)."
        )
    return name


def build_model(obs_shape: tuple[int, ...], num_actions: int, cfg: ModelCfg) -> Policy:
    return Policy(obs_shape, num_actions, cfg)
