"""Networks of a user's own, importable by path (`user_nets:mlp`) as `--net` takes them; and ones that are wrong in
each way a user's network can be."""

from __future__ import annotations

import threading

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


class Actor(nn.Module):
    """A whole actor (`--actor-net`): observations to A numbers (ddpg, td3) or 2A (sac: mean and log σ)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, width: int = 64, gaussian: bool = False):
        super().__init__()
        outputs = int(action_space.shape[0]) * (2 if gaussian else 1)
        size = int(np.prod(obs_space.shape))
        self.net = nn.Sequential(nn.Linear(size, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.out = nn.Linear(width, outputs)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.out(self.net(obs.float()))


class Critic(nn.Module):
    """A whole critic (`--critic-net`): observations and actions to Q, `[batch, 1]`."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, width: int = 64):
        super().__init__()
        size = int(np.prod(obs_space.shape)) + int(action_space.shape[0])
        self.net = nn.Sequential(
            nn.Linear(size, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
        )

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs.float(), act], dim=-1))


class PairCritic(Critic):
    """A critic that gives two values per pair: wrong."""

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return super().forward(obs, act).repeat(1, 2)


class Dropped(nn.Module):
    """An MLP with Dropout and BatchNorm: random and batch-dependent in training mode, neither in eval mode."""

    def __init__(self, obs_space: gym.Space, width: int = 32):
        super().__init__()
        size = int(np.prod(obs_space.shape))
        self.net = nn.Sequential(nn.Linear(size, width), nn.BatchNorm1d(width), nn.Tanh(), nn.Dropout(0.5))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


class Frozen(nn.Module):
    """A fixed random projection (a frozen "pretrained" layer) under a trainable one."""

    def __init__(self, obs_space: gym.Space, width: int = 16):
        super().__init__()
        self.proj = nn.Linear(int(np.prod(obs_space.shape)), 32).requires_grad_(False)
        self.linear = nn.Linear(32, width)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(torch.relu(self.proj(obs.float()))))


class Double(nn.Module):
    """float64 features: wrong (the heads are float32)."""

    def __init__(self, obs_space: gym.Space):
        super().__init__()
        self.linear = nn.Linear(int(np.prod(obs_space.shape)), 16).double()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs.double())


class Squeezy(nn.Module):
    """`squeeze()`d features: right for batches of two or more, no batch at all for one: wrong."""

    def __init__(self, obs_space: gym.Space):
        super().__init__()
        self.linear = nn.Linear(int(np.prod(obs_space.shape)), 16)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs.float()).unsqueeze(1).squeeze()


class Locked(nn.Module):
    """Holds a lock: cannot be copied (a target network) nor sent to another process."""

    def __init__(self, obs_space: gym.Space):
        super().__init__()
        self.linear = nn.Linear(int(np.prod(obs_space.shape)), 16)
        self.lock = threading.Lock()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs.float())


class Lambda(nn.Module):
    """Holds a lambda: copied fine, but not sent to another process (pickle refuses it)."""

    def __init__(self, obs_space: gym.Space):
        super().__init__()
        self.linear = nn.Linear(int(np.prod(obs_space.shape)), 16)
        self.activation = lambda x: torch.tanh(x)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(obs.float()))


class PretrainedNorm(nn.Module):
    """A "pretrained" part whose BatchNorm the factory holds in eval mode (its statistics fixed) under a layer that
    learns: the fine-tuning recipe."""

    def __init__(self, obs_space: gym.Space):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(int(np.prod(obs_space.shape)), 16), nn.BatchNorm1d(16)).eval()
        self.head = nn.Linear(16, 16)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.backbone(obs.float())))


class FixedBatch(nn.Module):
    """Works for a batch of two only: wrong."""

    def __init__(self, obs_space: gym.Space):
        super().__init__()
        self.linear = nn.Linear(int(np.prod(obs_space.shape)), 8)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs.float()).reshape(2, -1)


class NoFeatures(nn.Module):
    """Zero features per observation: wrong."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float()[:, :0]


def no_features(obs_space: gym.Space) -> nn.Module:
    return NoFeatures()
