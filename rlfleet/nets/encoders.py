"""Observation encoders: an MLP for vectors, the Mnih-2013 / Nature DQN CNNs for stacked Atari frames and MinAtar's for
its 10×10 grids, for every Gymnasium observation space.

`FlatInput` turns an observation of any space but an image into one float vector per sample: a `Box` flattened,
a `Discrete` one-hot, a `MultiDiscrete` as its one-hots side by side, a `MultiBinary` as 0/1 floats, and a `Dict`
as its entries' vectors concatenated in key order (a `Tuple` reaches the agent as a `Dict` keyed "0", "1", ...:
see `rlfleet.envs.wrappers.FlatDictObservation`). An MLP encoder of a non-`Box` space starts with one. A `Dict` with
images gets a `MultiInputEncoder`: a CNN per image entry, `FlatInput` for the rest, an MLP over the features side
by side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeGuard, TypeVar, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlfleet.nets.user import UserNet

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}
Layer = TypeVar("Layer", bound=nn.Module)


def layer_init(layer: Layer, gain: float = math.sqrt(2), bias: float = 0.0) -> Layer:
    """Orthogonal weights and constant bias, the usual initialisation for policy-gradient nets."""
    if isinstance(layer, nn.Linear | nn.Conv2d):
        nn.init.orthogonal_(layer.weight, gain)
        assert layer.bias is not None  # the layers given here all have one
        nn.init.constant_(layer.bias, bias)
    return layer


class UnsupportedObservationError(ValueError):
    """An observation space no encoder takes (Text, Graph, Sequence, ...)."""


def is_image(space: gym.Space) -> TypeGuard[gym.spaces.Box]:
    """A stack of uint8 frames `(C, H, W)`: what the CNN encoders take."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def has_image(space: gym.Space) -> bool:
    """An image, or a `Dict` with an image entry."""
    if isinstance(space, gym.spaces.Dict):
        return any(is_image(sub) for sub in space.spaces.values())
    return is_image(space)


MAX_INPUT_WIDTH = 2**24
"""The most floats `FlatInput` makes of one observation (16,777,216: a 4096 x 4096 image): past it the first layer
alone would not fit in memory (a `Discrete(10**16)` one-hot), so the space is refused before any network is built."""


def flat_size(space: gym.Space) -> int:
    """How many floats `FlatInput` makes of one observation of `space`; an `UnsupportedObservationError` for
    spaces no encoder takes, an empty `Dict`, and encodings wider than `MAX_INPUT_WIDTH`."""
    width = _flat_size(space)
    if width == 0:
        raise UnsupportedObservationError(f"observation space {space} is empty: the agent would see nothing")
    if width > MAX_INPUT_WIDTH:
        raise UnsupportedObservationError(
            f"observation space {space} encodes to {width:,} floats per observation (one-hot for Discrete and "
            f"MultiDiscrete), more than the {MAX_INPUT_WIDTH:,} a network's input can take: give the env a smaller "
            "or a Box observation (an index as a number, not one-hot)"
        )
    return width


def _flat_size(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Box | gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, gym.spaces.Dict):
        return sum(_flat_size(sub) for sub in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        raise UnsupportedObservationError(
            f"Tuple observations reach an agent as Dict ones keyed '0', '1', ... (rlfleet's envs do that; "
            f"wrap the env in rlfleet.envs.wrappers.FlatDictObservation), got {space}"
        )
    raise UnsupportedObservationError(
        f"observation space {space} is not supported: the encoders take Box, Discrete, MultiDiscrete, MultiBinary, "
        "and Dict or Tuple of these"
    )


class FlatInput(nn.Module):
    """Observations of a space as float vectors `[B, out_dim]`, in PyTorch (`forward`) and NumPy (`numpy`).

    `Box`: flattened; `Discrete(n, start)`: one-hot of `x − start`; `MultiDiscrete(nvec, start)`: one one-hot per
    entry, side by side; `MultiBinary`: the bits as floats; `Dict`: its entries' vectors concatenated in the
    space's key order. It has no parameters, so it adds nothing to a network's `state_dict`.
    """

    def __init__(self, space: gym.Space):
        super().__init__()
        self.out_dim = flat_size(space)
        self.space = space
        # per entry: key (None: the space itself), width, and for one-hots the shift that turns each value into its
        # column (x − start + the factor's offset in the one-hot block); None for floats
        self.parts: list[tuple[str | None, int, np.ndarray | None]] = []
        entries = space.spaces.items() if isinstance(space, gym.spaces.Dict) else [(None, space)]
        for key, sub in entries:
            if isinstance(sub, gym.spaces.Dict):
                raise UnsupportedObservationError(
                    f"nested Dict observations reach an agent flattened to one level (keys 'outer.inner'), got {space}"
                )
            width = flat_size(sub)  # rejects spaces no encoder takes
            if isinstance(sub, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
                sizes = np.asarray(sub.n if isinstance(sub, gym.spaces.Discrete) else sub.nvec).reshape(-1)
                starts = np.broadcast_to(sub.start, sizes.shape).reshape(-1).astype(np.int64)
                offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
                self.parts.append((key, width, starts - offsets))
            else:
                self.parts.append((key, width, None))

    def forward(self, obs: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        outs = []
        for key, width, shift in self.parts:
            x = torch.as_tensor(obs if key is None else cast(Mapping[str, torch.Tensor], obs)[key])
            batch = x.shape[0]
            if shift is None:
                outs.append(x.reshape(batch, -1).float())
            elif len(shift) == 1:
                outs.append(F.one_hot(x.reshape(batch).long() - int(shift[0]), width).float())
            else:
                index = x.reshape(batch, -1).long() - torch.as_tensor(shift, device=x.device)
                outs.append(torch.zeros(batch, width, device=x.device).scatter_(1, index, 1.0))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def numpy(self, obs: np.ndarray | Mapping[str, np.ndarray]) -> np.ndarray:
        outs = []
        for key, width, shift in self.parts:
            x = np.asarray(obs if key is None else obs[key])
            batch = x.shape[0]
            if shift is None:
                outs.append(x.reshape(batch, -1).astype(np.float32, copy=False))
                continue
            out = np.zeros((batch, width), dtype=np.float32)
            out[np.arange(batch)[:, None], x.reshape(batch, -1).astype(np.int64) - shift] = 1.0
            outs.append(out)
        return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=-1)


class MLP(nn.Module):
    """Flatten, then Linear + activation for each hidden size. `out_dim` is the last hidden size.

    With `inputs` (a `FlatInput`), observations go through it first (one-hots, dict entries side by side) and
    `in_dim` is its `out_dim`.
    """

    def __init__(
        self,
        in_dim: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        inputs: FlatInput | None = None,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
        self.inputs = inputs
        if inputs is not None:
            in_dim = inputs.out_dim
        layers: list[nn.Module] = [nn.Flatten()]
        last = in_dim
        for h in hidden:
            layers += [layer_init(nn.Linear(last, h)), ACTIVATIONS[activation]()]
            last = h
        self.net = nn.Sequential(*layers)
        self.out_dim = last

    def forward(self, obs: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.net(self.inputs(obs) if self.inputs is not None else cast(torch.Tensor, obs).float())


class _AtariCNN(nn.Module):
    """Shared scaffolding: uint8 frames scaled to [0, 1] (divided by `scale`, the image space's bound: 255 for Atari
    frames, 1 for MinAtar's 0/1 grids), the class's convolutions (`CONVS`: channels, kernel, stride), one fully
    connected layer of `FC` units."""

    CONVS: ClassVar[tuple[tuple[int, int, int], ...]] = ()
    FC: ClassVar[int] = 0

    def __init__(self, in_channels: int = 4, size: int = 84, scale: float = 255.0, width: int | None = None):
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for out, kernel, stride in self.CONVS:
            layers += [layer_init(nn.Conv2d(channels, out, kernel, stride)), nn.ReLU()]
            channels = out
        layers.append(nn.Flatten())
        conv = nn.Sequential(*layers)
        with torch.no_grad():
            flat = conv(torch.zeros(1, in_channels, size, width or size)).shape[1]  # size × width frames
        self.net = nn.Sequential(conv, layer_init(nn.Linear(flat, self.FC)), nn.ReLU())
        self.out_dim = self.FC
        self.scale = float(scale)

    @classmethod
    def min_size(cls) -> int:
        """The smallest frame side the convolutions take (each leaves at least one cell)."""
        size = 1
        for _, kernel, stride in reversed(cls.CONVS):
            size = (size - 1) * stride + kernel
        return size

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float() / self.scale)


class Mnih2013CNN(_AtariCNN):
    """The network of Mnih et al. 2013 used by the A3C paper: conv 16×8×8/4, conv 32×4×4/2, fc 256."""

    CONVS = ((16, 8, 4), (32, 4, 2))
    FC = 256


class NatureCNN(_AtariCNN):
    """The Nature DQN network: conv 32×8×8/4, 64×4×4/2, 64×3×3/1, fc 512."""

    CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    FC = 512


class MinAtarCNN(_AtariCNN):
    """The MinAtar paper's network (Young & Tian 2019) for its 10×10 grids: conv 16×3×3/1, fc 128."""

    CONVS = ((16, 3, 1),)
    FC = 128


ENCODERS = {"mlp", "mnih2013", "nature", "minatar"}
CNNS: dict[str, type[_AtariCNN]] = {"mnih2013": Mnih2013CNN, "nature": NatureCNN, "minatar": MinAtarCNN}


def auto_cnn(space: gym.spaces.Box) -> str:
    """The CNN `auto` picks for an image: Nature DQN's, or MinAtar's for frames smaller than Nature's smallest
    (36×36)."""
    return "nature" if min(space.shape[1:]) >= NatureCNN.min_size() else "minatar"


def make_cnn(kind: str, space: gym.spaces.Box) -> _AtariCNN:
    """The CNN `kind` for an image space `(C, H, W)`, scaling by the space's upper bound; a ValueError naming the
    smallest frame it takes when the image is smaller."""
    cls = CNNS[kind]
    channels, height, width = space.shape
    if min(height, width) < cls.min_size():
        smallest = cls.min_size()
        raise ValueError(
            f"encoder {kind!r} takes frames of at least {smallest}×{smallest}, the observations are {height}×{width}: "
            f"--set encoder=auto (it picks a CNN that fits) or minatar"
        )
    return cls(channels, height, float(np.max(space.high)), width)


class MultiInputEncoder(nn.Module):
    """A `Dict` observation with images: a CNN per image entry, the other entries through `FlatInput`, and an MLP
    over all their features side by side (Stable-Baselines3's `MultiInputPolicy` does the same)."""

    def __init__(self, space: gym.spaces.Dict, cnn: str, hidden: Sequence[int], activation: str):
        super().__init__()
        images = {key: sub for key, sub in space.spaces.items() if is_image(sub)}
        cnns = {key: make_cnn(auto_cnn(sub) if cnn == "auto" else cnn, sub) for key, sub in images.items()}
        self.cnns = nn.ModuleDict(cnns)
        rest = gym.spaces.Dict({key: sub for key, sub in space.spaces.items() if key not in images})
        self.rest = FlatInput(rest) if len(rest.spaces) else None
        features = sum(c.out_dim for c in cnns.values()) + (self.rest.out_dim if self.rest is not None else 0)
        self.mlp = MLP(features, hidden, activation)
        self.out_dim = self.mlp.out_dim

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        features = [cnn(obs[key]) for key, cnn in self.cnns.items()]
        if self.rest is not None:
            features.append(self.rest(obs))
        return self.mlp(torch.cat(features, dim=-1))


Encoder = MLP | _AtariCNN | MultiInputEncoder | UserNet
"""What `make_encoder` makes: a module of `out_dim` features per observation."""


def make_encoder(
    obs_space: gym.Space,
    kind: str = "auto",
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
    net: str = "",
    net_kwargs: dict[str, Any] | None = None,
) -> Encoder:
    """Pick an encoder for an observation space: a user network where `net` names one (`UserNet`), else images
    (C, H, W) get a CNN (`auto`: Nature DQN's, MinAtar's for grids under 36×36), a `Dict` with images a
    `MultiInputEncoder`, everything else an MLP (behind a `FlatInput` for spaces other than `Box`)."""
    if net:
        return UserNet(obs_space, net, net_kwargs)
    if kind not in ENCODERS | {"auto"}:
        raise ValueError(f"unknown encoder {kind!r}; choose one of {sorted(ENCODERS | {'auto'})}")
    if isinstance(obs_space, gym.spaces.Box):
        shape = obs_space.shape
        if kind == "auto":
            kind = auto_cnn(obs_space) if is_image(obs_space) else "mlp"
        if kind == "mlp":
            return MLP(int(np.prod(shape)), hidden, activation)
        if len(shape) != 3:
            raise ValueError(f"encoder {kind!r} needs image observations (C, H, W), got shape {shape}")
        return make_cnn(kind, obs_space)
    inputs = FlatInput(obs_space)  # rejects the spaces no encoder takes
    if isinstance(obs_space, gym.spaces.Dict) and has_image(obs_space) and kind != "mlp":
        return MultiInputEncoder(obs_space, kind, hidden, activation)
    if kind not in ("auto", "mlp"):
        raise ValueError(f"encoder {kind!r} needs image observations (C, H, W), got {obs_space}")
    return MLP(inputs.out_dim, hidden, activation, inputs=inputs)
