"""The algorithm contract: what the architectures call on an algorithm, and nothing else, as `typing.Protocol`s.

An algorithm is one class in one module (`rlfleet/algos/<name>.py`); it subclasses nothing. It keeps the
contract of the data it learns from (`data`): `RolloutAlgorithm` (on-policy segments), `ReplayAlgorithm`
(transitions from a replay buffer) or `DatasetAlgorithm` (demonstrations, the `offline` architecture's), all of
them `Algorithm`; a replay algorithm that an Ape-X actor can run is also an `ApexActor`, and one with a state per
env (an LSTM) is also `Recurrent`. `tests/unit/test_contract.py` checks that every registered algorithm keeps its
contract; an architecture asks which one with `isinstance` (the protocols are runtime-checkable), never with
`hasattr`.

What the protocols cannot say:

- `__init__(cfg, obs_space, action_space, seed, device="cpu")` raises `UnsupportedSpaceError` for spaces it
  cannot handle; puts its networks on `device` (`rlfleet.device.place`, before its optimizer is built); its
  updates move their batches there (`Batch.to_torch(self.device)`), and every tensor it makes in an update is
  made there; `act` goes through `rlfleet.device.acting` (a CPU copy of an MLP on a device) and brings results
  back with `rlfleet.device.host`.
- Every optimizer step of an update goes through `optimize(self.optimizer, ...)` (`rlfleet.optim.step`), which
  calls the gradient hook an architecture may set on that optimizer (`set_gradient_hook`) between the backward
  pass and the clip (the `allreduce` learners average their gradients there).
- An update whose tensor work reads nothing back on the host may run it through a `rlfleet.cuda_graph.StepGraph`
  (sac, td3, ddpg): replayed as a CUDA graph when the learner is on CUDA, a plain call elsewhere.
- Box actions: `act` returns env-ready actions (rescaled to the bounds and clipped) and puts the policy's own,
  unclipped sample into `extras["raw_act"]`, from which the loss takes its log-probabilities.
- Exploration noise with a state per env (Ornstein–Uhlenbeck): `reset_noise(done)` puts the noise of the envs in
  the `[N]` bool mask `done` back at its start; the `Collector` calls it after every step in which an env
  finished. The noise state is part of `state_dict()`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

Metrics = dict[str, Any]
"""What an update reports: floats, or 0-dim tensors that a learner on a device leaves there until they are logged
(reading each one would wait for the device after every update)."""


@runtime_checkable
class Algorithm(Protocol):
    """What every algorithm has."""

    cfg: Any
    """Its `Config` (a dataclass of checked fields)."""
    device: torch.device
    data: str
    """What it learns from: "rollout", "replay" or "dataset"."""
    optimizer: torch.optim.Optimizer
    """The one optimizer its updates step (several parameter groups where it has several networks)."""
    params: list[torch.nn.Parameter]

    def act(
        self, obs: np.ndarray, state: Any = None, explore: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        """(actions, extras, next state) for a batch of observations, one per env; `extras` are per-env arrays
        stored with a rollout (values, log-probabilities); the state is None for a feed-forward algorithm."""
        ...

    def schedule(self, env_steps: int, total_steps: int) -> None:
        """Set exploration, the learning rate and target-network schedules for the run's progress."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class RolloutAlgorithm(Algorithm, Protocol):
    """On-policy: learns from segments of `rollout_len` steps of `n_envs` envs (`Collector.collect_rollout`)."""

    def value(self, obs: np.ndarray, state: Any = None) -> np.ndarray:
        """The bootstrap value of each env's observation (continued from `state` for a recurrent one)."""
        ...

    def process(self, segment: Any) -> Any:
        """The segment as a training `Batch` (returns, advantages, targets)."""
        ...

    def loss(self, batch: Any) -> tuple[torch.Tensor, Metrics]:
        """The loss of a batch (or a minibatch of one) and its metrics."""
        ...

    def update(self, segment: Any) -> Metrics:
        """Learn from one segment: its own optimizer steps on `loss(process(segment))`."""
        ...

    @property
    def one_gradient(self) -> bool:
        """`update(segment)` is exactly one optimizer step on `loss(process(segment))`: what the architectures
        that apply one gradient per segment (hogwild, grad_parallel, param_server) can run as designed."""
        ...

    def lr_at(self, env_steps: int, total_steps: int) -> float:
        """The learning rate its schedule gives at `env_steps` of `total_steps` (a pure function of them), for
        architectures that step with an optimizer of their own."""
        ...

    @property
    def max_grad_norm(self) -> float:
        """The global-norm clip of its update (0: none), which those architectures apply too."""
        ...

    def uneven_updates(self) -> str | None:
        """Why `update` may take a different number of optimizer steps from one learner to another on segments of
        one size, with what to set instead (None: it never does): what learners that step together (allreduce)
        cannot run."""
        ...


@runtime_checkable
class ReplayAlgorithm(Algorithm, Protocol):
    """Off-policy: learns from batches sampled from the replay buffer it makes."""

    def make_buffer(self, n_envs: int, total_steps: int, seed: int = 0) -> Any:
        """Its replay buffer (prioritized, n-step or of sequences, as its config says)."""
        ...

    def update(self, batch: Any) -> Metrics:
        """One update on a sampled batch; its metrics hold "priorities" ([B] |TD errors|, a tensor on the learner's
        device, read on the host only by a prioritized replay) where the algorithm computes them."""
        ...


@runtime_checkable
class ApexActor(ReplayAlgorithm, Protocol):
    """A replay algorithm an Ape-X actor can run (dqn, ddpg, td3): it computes the priorities of what it collects
    and acts with one rung of an exploration ladder."""

    @property
    def replays_sequences(self) -> bool:
        """It learns from replayed sequences (recurrent DQN), not from the single transitions Ape-X sends."""
        ...

    def priorities(self, batch: Any) -> np.ndarray:
        """The |TD errors| `update` would write back ([B]), computed without learning: an actor's priorities."""
        ...

    def fix_exploration(self, level: float, share: float) -> float:
        """Act from now on with one rung of the exploration ladder: ε-greedy algorithms take ε = `level`,
        noise-driven ones scale their noise by `share` (the rung over the ladder's top); the ε or σ used."""
        ...


@runtime_checkable
class DatasetAlgorithm(Algorithm, Protocol):
    """Imitation: learns from demonstrations (the `offline` architecture)."""

    def process(self, demos: Any) -> Any:
        """The demonstrations as a training `Batch` of `obs` and the env actions `act`."""
        ...

    def loss(self, batch: Any) -> tuple[torch.Tensor, Metrics]: ...

    def update(self, minibatch: Any) -> Metrics:
        """One gradient step on a minibatch."""
        ...


@runtime_checkable
class Recurrent(Protocol):
    """An algorithm whose `act` returns a state (None means zeros). Whoever steps envs calls `reset_state` after
    every step in which an env finished (`Collector`, `evaluate`); a rollout's `process(segment)` reads
    `segment.data.starts` ([T, N], 1 where an observation begins an episode) and `segment.initial_state` (the
    state before the segment's first step; None: zeros)."""

    def reset_state(self, state: Any, done: np.ndarray) -> Any:
        """A new state with the envs of the `[N]` bool mask `done` (their episode just ended) reset; the given
        state is not modified."""
        ...


def contract_of(algo: Any) -> type:
    """The protocol of the data an algorithm says it learns from."""
    return {"rollout": RolloutAlgorithm, "replay": ReplayAlgorithm, "dataset": DatasetAlgorithm}[algo.data]
