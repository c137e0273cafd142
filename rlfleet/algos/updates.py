"""What updates share: minibatch epochs, explained variance, linear schedules, target networks (hard copies on a
clock, Polyak averages), and recurrent sequence batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from rlfleet.algos.contract import Algorithm, RolloutAlgorithm
from rlfleet.data.batch import Batch, map_obs
from rlfleet.device import host
from rlfleet.nets.heads import DiagGaussian, SoftmaxCategorical
from rlfleet.nets.models import ActorCritic
from rlfleet.nets.recurrent import LSTMCore, State
from rlfleet.optim.step import optimize


def minibatch_epochs(
    algo: RolloutAlgorithm,
    batch: Batch,
    epochs: int,
    minibatch_size: int,
    rng: np.random.Generator,
    stop_kl: float | None = None,
) -> dict[str, float]:
    """`epochs` shuffled passes of `algo.loss` + optimiser step over minibatches; mean metrics of the steps taken,
    and `epochs`, the passes made (fractional when stopped). With `stop_kl`, the passes end at the first minibatch
    whose `approx_kl` metric exceeds it, before that minibatch's step. On a device the minibatches' metrics stay
    there (`rlfleet.device.metric`) until their means are read at the end: one wait for the device per update
    (one per minibatch with `stop_kl`, which reads each `approx_kl`)."""
    seen: dict[str, list[Any]] = {}  # floats, or 0-dim tensors on a device
    steps = 0
    if algo.device.type != "cpu":  # on the learner's device once; minibatches are slices of it there
        batch = batch.to_torch(algo.device)

    def summary(passes: float) -> dict[str, float]:
        means = {k: sum(v) if not isinstance(v[0], torch.Tensor) else torch.stack(v).sum() for k, v in seen.items()}
        return {**{k: float(v) / max(steps, 1) for k, v in means.items()}, "epochs": passes}

    for epoch in range(epochs):
        minibatches = list(batch.split(minibatch_size, shuffle=True, rng=rng))
        for i, minibatch in enumerate(minibatches):
            loss, metrics = algo.loss(minibatch)
            if stop_kl is not None and metrics["approx_kl"] > stop_kl:
                return summary(epoch + i / len(minibatches))
            metrics["grad_norm"] = optimize(algo.optimizer, loss, algo.params, algo.cfg.max_grad_norm)
            for k, v in metrics.items():
                seen.setdefault(k, []).append(v)
            steps += 1
    return summary(float(epochs))


def explained_variance(predicted: np.ndarray | torch.Tensor, target: np.ndarray | torch.Tensor) -> float:
    """1 − Var(target − predicted) / Var(target): 1 for perfect values, 0 for a constant, below 0 for worse; NaN
    when the targets do not vary."""
    predicted, target = (
        np.asarray(host(x) if isinstance(x, torch.Tensor) else x, np.float64) for x in (predicted, target)
    )
    variance = np.var(target)
    return float("nan") if variance == 0 else float(1 - np.var(target - predicted) / variance)


def clip_norm(algo: Algorithm) -> float:
    """The global gradient-norm clip of an algorithm's own update (0: none): the contract's `max_grad_norm`."""
    return cast(float, algo.cfg.max_grad_norm)


def linear(start: float, end: float, duration: int, t: int) -> float:
    """Linear interpolation from start to end over `duration` steps, then constant."""
    if duration <= 0:
        return end
    return start + (end - start) * min(1.0, t / duration)


def sequence_batch(batch: Batch, starts: np.ndarray, initial_state: State | None, core: LSTMCore) -> Batch:
    """A `[T, N, ...]` segment batch as N sequences for an LSTM policy to replay.

    Every leaf becomes `[N, T, ...]`, so splitting the Batch splits whole sequences; `starts` (1 where an
    episode begins) and the state before the segment, `h0`/`c0` `[N, H]` (zeros when `initial_state` is
    None: the run's first segment), go with them.
    """
    n = starts.shape[1]
    out = batch.apply(lambda leaf: leaf.swapaxes(0, 1))
    h, c = initial_state if initial_state is not None else core.initial_state(n)
    out["starts"] = starts.swapaxes(0, 1)
    out["h0"], out["c0"] = host(h), host(c)
    return out


def unroll_sequences(
    model: ActorCritic, b: Batch
) -> tuple[SoftmaxCategorical | DiagGaussian, torch.Tensor | None, Batch]:
    """Replay a (torch) `sequence_batch` through an LSTM ActorCritic.

    Returns (policy, values, steps): the policy and values over the T * N steps, time-major, and a Batch
    of the other `[N, T, ...]` leaves flattened in the same order.
    """

    def time_major(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)

    dist, value, _ = model.unroll(map_obs(time_major, b.obs), (b.h0, b.c0), time_major(b.starts))
    rest = Batch({k: v for k, v in b.items() if k not in ("obs", "starts", "h0", "c0")})
    steps = rest.apply(lambda x: time_major(cast(torch.Tensor, x)).reshape(-1, *x.shape[2:]))
    return dist, value, steps


def hard_update(target: nn.Module, source: nn.Module) -> None:
    target.load_state_dict(source.state_dict())


class SyncClock(nn.Module):
    """When a target network was last copied, on the global step clock: `due(step)` is True once for every
    multiple of `every` that `step` has reached since the last copy. The step lives in a module buffer, so an
    architecture shares or copies it exactly as it does the target network (hogwild: one clock for all
    workers, as there is one target network; so the copies follow the global step, not each worker's)."""

    synced_at: torch.Tensor
    host_only = True  # the host reads it at every segment: on a GPU each read would wait for the queued kernels

    def __init__(self, every: int):
        super().__init__()
        self.every = every
        self.register_buffer("synced_at", torch.zeros((), dtype=torch.int64))

    def due(self, step: int) -> bool:
        mark = step if self.every <= 0 else step // self.every * self.every
        if mark <= int(self.synced_at) and self.every > 0:
            return False
        self.synced_at.fill_(mark)
        return True


def soft_update(target: Sequence[torch.Tensor], source: Sequence[torch.Tensor], tau: float) -> None:
    """Polyak averaging of target parameters toward the online ones: θ' ← (1 − τ) θ' + τ θ, in one fused op."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target), list(source), tau)
