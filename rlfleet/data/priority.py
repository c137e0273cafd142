"""Proportional priorities over a fixed number of slots (Schaul et al. 2016): the sum and min trees over p^α, the
largest priority seen, stratified draws and max-normalised importance weights. Shared by
`PrioritizedReplayBuffer` and the Ape-X replay shards (`rlfleet.arch.apex.ReplayShard`), which keep their own
storage and hand the slots' priorities to one of these."""

from __future__ import annotations

import numpy as np
import torch

from rlfleet.data.segment_tree import MinTree, SumTree, update_trees
from rlfleet.device import host


def importance_weights(mass: np.ndarray, min_mass: float, beta: float) -> np.ndarray:
    """w_i = (N·P(i))^−β / max_j (N·P(j))^−β (float32, at most 1) for drawn slots of p^α `mass`, where P(i) =
    p_i^α / Σ p^α over the whole replay and `min_mass` is the smallest p^α stored in it. N and Σ p^α cancel:
    w_i = (p_i^α / min_j p_j^α)^−β, so a replay spread over shards needs only its global minimum."""
    return ((np.asarray(mass, dtype=np.float64) / min_mass) ** (-beta)).astype(np.float32)


class PriorityIndex:
    """Priorities of `capacity` slots: a slot with priority p (|TD error| + `eps`) is drawn with probability
    p^α / Σ p^α. New slots get the largest priority seen so far (1.0 at first) unless given their own."""

    def __init__(self, capacity: int, alpha: float = 0.6, eps: float = 1e-6) -> None:
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if eps <= 0:
            raise ValueError(f"eps must be > 0 so every transition can be drawn, got {eps}")
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.max_priority = 1.0
        self.sum_tree = SumTree(self.capacity)
        self.min_tree = MinTree(self.capacity)

    def checked(self, priorities: np.ndarray | torch.Tensor, n: int) -> np.ndarray:
        """|priorities| + eps, one finite value for each of `n` slots."""
        if isinstance(priorities, torch.Tensor):  # an update's, on the learner's device: read here, where needed
            priorities = host(priorities)
        p = np.abs(np.asarray(priorities, dtype=np.float64)).reshape(-1)
        if p.shape != (n,):
            raise ValueError(f"got {p.size} priorities for {n} transitions; give one per transition")
        if not np.isfinite(p).all():
            raise ValueError("priorities must be finite (check the TD errors for NaN/inf)")
        return p + self.eps

    def set(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Slots get priorities |priorities| + eps (the largest seen grows with them); a repeated slot: last wins."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        p = self.checked(priorities, slots.size)
        if slots.size:
            self.max_priority = max(self.max_priority, float(p.max()))
            self.set_checked(slots, p)

    def set_max(self, slots: np.ndarray) -> None:
        """New slots with no priority of their own: the largest seen so far."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        self.set_checked(slots, np.full(slots.size, self.max_priority))

    def set_checked(self, slots: np.ndarray, p: np.ndarray) -> None:
        """Priorities already checked (eps included), without touching the largest seen."""
        update_trees((self.sum_tree, self.min_tree), slots, p**self.alpha)

    def __getitem__(self, slots: np.ndarray | int) -> np.ndarray:
        """p^α of `slots` (0 where never set)."""
        return self.sum_tree[slots]

    def total(self) -> float:
        """Σ p^α over the slots."""
        return self.sum_tree.total()

    def min(self) -> float:
        """The smallest p^α of a set slot (+inf when none is)."""
        return self.min_tree.min()

    def draw(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """`batch_size` slots in proportion to p^α, one per equal slice of the mass (stratified)."""
        segment = self.total() / batch_size
        return self.sum_tree.find_prefixsum((np.arange(batch_size) + rng.random(batch_size)) * segment)

    def weights(self, slots: np.ndarray, beta: float) -> np.ndarray:
        """Importance weights of drawn `slots` when these slots are the whole replay."""
        return importance_weights(self[slots], self.min(), beta)
