"""The policy: a torso, an optional LSTM core, and the policy and value heads (``ModelCfg``)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from impala_gpu.config import ModelCfg
from impala_gpu.models.normalize import ObsNormalizer
from impala_gpu.models.torsos import ImpalaTorso, InputConv, MinAtarTorso, MLPTorso, NatureTorso

CoreState = tuple[Tensor, ...]  # () without LSTM; (h, c), each [B, lstm_size], with it


MODEL_NAMES = ("auto", "shallow", "resnet", "minatar", "mlp")
SMALL_GRID = 36  # images smaller than this (MinAtar's 10x10) are too small for the Nature CNN


INIT_SCHEMES = ("torch", "orthogonal")


class PolicyOutput(NamedTuple):
    logits: Tensor  # [T, B, A]
    value: Tensor  # [T, B]
    core_state: CoreState


class Policy(nn.Module):
    """Torso -> optional LSTM core -> policy logits and value heads."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, cfg: ModelCfg):
        super().__init__()
        name = resolve_model_name(cfg.name, obs_shape)
        self.obs_shape = tuple(obs_shape)
        self.num_actions = num_actions
        self.is_image = len(obs_shape) == 3
        self.channels_last = cfg.channels_last and self.is_image
        self.torso = build_torso(name, obs_shape, cfg)
        if cfg.normalize_input and not self.is_image:
            raise ValueError(
                "model.normalize_input=true normalises screen pixels; this env's observations "
                f"have shape {tuple(obs_shape)}. Fix: model.normalize_input=false."
            )
        self.obs_norm = ObsNormalizer(self.obs_shape) if cfg.normalize_input else None
        if cfg.separate_value and cfg.use_lstm:
            raise ValueError(
                "model.separate_value=true gives the value its own torso, which an LSTM core "
                "cannot share: set model.use_lstm=false or model.separate_value=false."
            )
        # SB3's MlpPolicy: the value's large, unscaled errors (dense rewards in the hundreds)
        # do not flow into the policy's features, and clipping them does not starve the policy.
        self.value_torso = build_torso(name, obs_shape, cfg) if cfg.separate_value else None
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
        # stays NCHW (see InputConv: the transpose of a few uint8 channels costs more than it
        # saves), except for fp32 training, the one case where a channels_last input pays for
        # its transpose (docs/performance.md, "input layout").
        dtype = _input_dtype(x.device.type)
        fp32_training = dtype == torch.float32 and torch.is_grad_enabled()
        cl_input = self.channels_last and fp32_training
        layout = torch.channels_last if cl_input else torch.contiguous_format
        if self.obs_norm is not None:
            x = self.obs_norm(x).to(dtype, memory_format=layout)
        else:
            x = x.to(dtype, memory_format=layout)
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
        value_features = features if self.value_torso is None else self.value_torso(x)
        value = self.value_head(value_features).view(T, B)
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


def build_torso(name: str, obs_shape: tuple[int, ...], cfg: ModelCfg) -> nn.Module:
    """The torso ``name`` (already resolved from ``auto``): [N, *obs_shape] -> [N, hidden]."""
    if cfg.activation != "relu" and name not in ("shallow", "minatar"):
        raise ValueError(
            f"model.activation={cfg.activation!r} is built for the shallow and minatar torsos, "
            f"not {name!r}. Fix: model.activation=relu."
        )
    if name == "shallow":
        return NatureTorso(obs_shape, cfg.hidden_size, cfg.activation)
    if name == "resnet":
        return ImpalaTorso(obs_shape, cfg.hidden_size)
    if name == "minatar":
        return MinAtarTorso(obs_shape, cfg.hidden_size, cfg.activation)
    return MLPTorso(obs_shape, cfg.hidden_size, cfg.mlp_layers)


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
        if not is_image:
            return "mlp"
        return "minatar" if min(obs_shape[1:]) < SMALL_GRID else "shallow"
    if name in ("shallow", "resnet", "minatar") and not is_image:
        raise ValueError(
            f"model={name} needs image observations [C, H, W], but this env's are {obs_shape}. "
            "Fix: use model=mlp (or model=auto)."
        )
    return name


def build_model(obs_shape: tuple[int, ...], num_actions: int, cfg: ModelCfg) -> Policy:
    return Policy(obs_shape, num_actions, cfg)
