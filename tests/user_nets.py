"""Networks of a user's own, importable by path (`user_nets:mlp`) as `--net` takes them; and ones that are wrong in
each way a user's network can be."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn


def mlp(obs_space: gym.Space, width: int = 64, depth: int = 2) -> nn.Module:
    """A plain MLP over flat observations."""
    layers: list[nn.Module] = [nn.Flatten()]
    size = int(np.prod(obs_space.shape))
    for _ in range(depth):
        layers += [nn.Linear(size, width), nn.Tanh()]
        size = width
    return nn.Sequential(*layers)


class Scaled(nn.Module):
    """An MLP whose forward is not its layers' alone (features scaled by 2): acting must go through torch."""

    def __init__(self, obs_space: gym.Space, width: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(int(np.prod(obs_space.shape)), width), nn.Tanh())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return 2.0 * self.net(obs.float())


class SmallCNN(nn.Module):
    """A CNN for MinAtar's (C, 10, 10) 0/1 frames."""

    def __init__(self, obs_space: gym.Space, channels: int = 8):
        super().__init__()
        c, h, w = obs_space.shape
        self.conv = nn.Sequential(nn.Conv2d(c, channels, 3), nn.ReLU(), nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(channels * (h - 2) * (w - 2), 64), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(obs.float()))


def raising(obs_space: gym.Space, width: int = 3) -> nn.Module:
    raise ValueError(f"width must be even, got {width}")


def not_a_module(obs_space: gym.Space) -> list[int]:
    return [1, 2, 3]


class ThreeDimensional(nn.Module):
    def __init__(self, obs_space: gym.Space):
        super().__init__()
        self.linear = nn.Linear(int(np.prod(obs_space.shape)), 6)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs.float()).reshape(len(obs), 2, 3)


class WithState(nn.Module):
    def __init__(self, obs_space: gym.Space):
        super().__init__()
        self.linear = nn.Linear(int(np.prod(obs_space.shape)), 8)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.linear(obs.float())
        return out, out


NOT_CALLABLE = 3
