"""Observation encoders: an MLP for vectors and the Mnih-2013 / Nature DQN CNNs for stacked Atari frames."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}


def layer_init(layer: nn.Module, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights and constant bias, the usual initialisation for policy-gradient nets."""
    if isinstance(layer, nn.Linear | nn.Conv2d):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.constant_(layer.bias, bias)
    return layer


class MLP(nn.Module):
    """Flatten, then Linear + activation for each hidden size. `out_dim` is the last hidden size."""

    def __init__(self, in_dim: int, hidden: Sequence[int] = (64, 64), activation: str = "tanh"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
        layers: list[nn.Module] = [nn.Flatten()]
        last = in_dim
        for h in hidden:
            layers += [layer_init(nn.Linear(last, h)), ACTIVATIONS[activation]()]
            last = h
        self.net = nn.Sequential(*layers)
        self.out_dim = last

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


class _AtariCNN(nn.Module):
    """Shared scaffolding: uint8 frames scaled to [0, 1], convolutions, one fully connected layer."""

    def __init__(self, in_channels: int, convs: list[tuple[int, int, int]], fc: int, size: int = 84):
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for out, kernel, stride in convs:
            layers += [layer_init(nn.Conv2d(channels, out, kernel, stride)), nn.ReLU()]
            channels = out
        layers.append(nn.Flatten())
        conv = nn.Sequential(*layers)
        with torch.no_grad():
            flat = conv(torch.zeros(1, in_channels, size, size)).shape[1]
        self.net = nn.Sequential(conv, layer_init(nn.Linear(flat, fc)), nn.ReLU())
        self.out_dim = fc

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float() / 255.0)


class Mnih2013CNN(_AtariCNN):
    """The network of Mnih et al. 2013 used by the A3C paper: conv 16×8×8/4, conv 32×4×4/2, fc 256."""

    def __init__(self, in_channels: int = 4, size: int = 84):
        super().__init__(in_channels, [(16, 8, 4), (32, 4, 2)], 256, size)


class NatureCNN(_AtariCNN):
    """The Nature DQN network: conv 32×8×8/4, 64×4×4/2, 64×3×3/1, fc 512."""

    def __init__(self, in_channels: int = 4, size: int = 84):
        super().__init__(in_channels, [(32, 8, 4), (64, 4, 2), (64, 3, 1)], 512, size)


ENCODERS = {"mlp", "mnih2013", "nature"}


def make_encoder(
    obs_space: gym.Space, kind: str = "auto", hidden: Sequence[int] = (64, 64), activation: str = "tanh"
) -> nn.Module:
    """Pick an encoder for an observation space: images (C, H, W) get a CNN, everything else an MLP."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(
            f"observation space {obs_space} is not supported by the built-in encoders (Box only); "
            "pass a Box observation or flatten it with gymnasium.wrappers.FlattenObservation"
        )
    shape = obs_space.shape
    is_image = len(shape) == 3 and obs_space.dtype == np.uint8
    if kind == "auto":
        kind = "nature" if is_image else "mlp"
    if kind == "mlp":
        return MLP(int(np.prod(shape)), hidden, activation)
    if kind in ("mnih2013", "nature"):
        if len(shape) != 3:
            raise ValueError(f"encoder {kind!r} needs image observations (C, H, W), got shape {shape}")
        cls = Mnih2013CNN if kind == "mnih2013" else NatureCNN
        return cls(shape[0], shape[1])
    raise ValueError(f"unknown encoder {kind!r}; choose one of {sorted(ENCODERS | {'auto'})}")
