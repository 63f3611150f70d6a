"""Torsos, observations to features: the Nature CNN, IMPALA's residual net, MinAtar's small CNN
and an MLP."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from impala_gpu.telemetry.health import Layer


class InputConv(nn.Conv2d):
    """A torso's first convolution. With channels_last on, it keeps its weight (and, but for
    fp32 training, its input) in NCHW and hands its output on in channels_last: transposing a
    4-channel frame stack costs more than the convolution saves (actor inference at batch 16:
    4.1 -> 3.3 ms fp32, 2.5 -> 2.0 ms bf16; bf16 learner step 130 -> 113 ms), while the later
    layers, with 16-64 channels, run fastest in channels_last."""

    output_format = torch.contiguous_format

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).contiguous(memory_format=self.output_format)


ACTIVATIONS = {"relu": nn.ReLU, "elu": nn.ELU}  # model.activation


def activation_class(name: str) -> Callable[[], nn.Module]:
    """The activation ``name``, in place: it always follows a convolution or linear layer,
    whose backward does not need its output, and writing over that output saves an
    allocation and a pass over memory (ELU's exp makes it a visible share of the learner)."""
    if name not in ACTIVATIONS:
        raise ValueError(
            f"model.activation={name!r} is not one of {tuple(ACTIVATIONS)} "
            "(try model.activation=relu)."
        )
    return partial(ACTIVATIONS[name], inplace=True)


def _watched(activation: nn.Module) -> nn.Module | None:
    """The activation to count dead units on: only a ReLU's units can die (an ELU unit below 0
    still passes gradient)."""
    return activation if isinstance(activation, nn.ReLU) else None


class NatureTorso(nn.Module):
    """Mnih et al. 2015 CNN: 32x8x8/4, 64x4x4/2, 64x3x3/1, then FC."""

    def __init__(self, obs_shape: tuple[int, ...], hidden_size: int, activation: str = "relu"):
        super().__init__()
        c, h, w = obs_shape
        act = activation_class(activation)
        self.convs = nn.Sequential(
            InputConv(c, 32, 8, stride=4),
            act(),
            nn.Conv2d(32, 64, 4, stride=2),
            act(),
            nn.Conv2d(64, 64, 3, stride=1),
            act(),
        )
        with torch.no_grad():
            n_flat = self.convs(torch.zeros(1, c, h, w)).numel()
        self.fc = nn.Sequential(nn.Linear(n_flat, hidden_size), act())

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.convs(x).flatten(1))

    def health_layers(self) -> list[Layer]:
        convs = [
            Layer(f"conv{i + 1}", self.convs[2 * i], _watched(self.convs[2 * i + 1]))
            for i in range(3)
        ]
        return [*convs, Layer("fc", self.fc[0], _watched(self.fc[1]))]


class MinAtarTorso(nn.Module):
    """Young & Tian 2019 (MinAtar): one 16x3x3/1 convolution over the 10x10 grid, then FC."""

    def __init__(self, obs_shape: tuple[int, ...], hidden_size: int, activation: str = "relu"):
        super().__init__()
        c, h, w = obs_shape
        act = activation_class(activation)
        self.conv = nn.Sequential(InputConv(c, 16, 3, stride=1), act())
        self.fc = nn.Sequential(nn.Linear(16 * (h - 2) * (w - 2), hidden_size), act())

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.conv(x).flatten(1))

    def health_layers(self) -> list[Layer]:
        return [
            Layer("conv1", self.conv[0], _watched(self.conv[1])),
            Layer("fc", self.fc[0], _watched(self.fc[1])),
        ]


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
