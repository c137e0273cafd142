"""Sum and min segment trees over a fixed number of leaves, updated and queried many at a time in NumPy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class _SegmentTree:
    """Array-backed complete binary tree: node 1 is the root, node i has children 2i and 2i+1.

    Leaves live at ``[size, 2 * size)`` where ``size`` is ``capacity`` rounded up to a power of two;
    padding leaves hold the neutral element so they never change a reduction.
    """

    _neutral: float
    _reduce: np.ufunc

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"segment tree capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._size = 1 << (self.capacity - 1).bit_length()
        self._depth = self._size.bit_length() - 1  # number of edges from root to a leaf
        self._tree = np.full(2 * self._size, self._neutral, dtype=np.float64)
        self._shifts = np.arange(1, self._depth + 1)[:, None]

    def __len__(self) -> int:
        return self.capacity

    def _check_indices(self, indices: np.ndarray | int) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            raise ValueError(f"leaf indices must lie in [0, {self.capacity}), got [{idx.min()}, {idx.max()}]")
        return idx

    def _check_values(self, values: np.ndarray) -> None:
        if np.isnan(values).any():
            raise ValueError("segment tree values must not be NaN")

    def __getitem__(self, indices: np.ndarray | int) -> np.ndarray:
        """Leaf values at ``indices`` (always a 1-D array)."""
        return self._tree[self._size + self._check_indices(indices)]

    def update(self, indices: np.ndarray | int, values: np.ndarray | float) -> None:
        """Set many leaves, refreshing ancestors level by level; for a repeated index the last write wins."""
        update_trees([self], indices, values)

    def _refresh(self, leaves: np.ndarray, values: np.ndarray, parents: np.ndarray, children: np.ndarray) -> None:
        """Write `values` at the (distinct) `leaves` and recompute their ancestors bottom-up: `parents[k]` are the
        nodes k + 1 levels up, `children[k]` their left children. Every parent becomes the reduction of its two
        children, as a rebuild would make it."""
        tree = self._tree
        tree[leaves + self._size] = values
        for nodes, left in zip(parents, children, strict=True):
            # a parent reached twice is recomputed twice from the same children: same value, no dedup needed
            tree[nodes] = self._reduce(tree[left], tree[left + 1])

    def state(self) -> np.ndarray:
        """The whole node array (for checkpoints)."""
        return self._tree.copy()

    def load_state(self, tree: np.ndarray) -> None:
        tree = np.asarray(tree, dtype=np.float64)
        if tree.shape != self._tree.shape:
            raise ValueError(f"tree array has shape {tree.shape}, this tree needs {self._tree.shape}")
        self._tree[:] = tree


class SumTree(_SegmentTree):
    """Sum over leaves with vectorised prefix-sum search, for proportional sampling."""

    _neutral = 0.0
    _reduce = np.add

    def _check_values(self, values: np.ndarray) -> None:
        if not np.isfinite(values).all() or (values < 0).any():
            raise ValueError("SumTree values must be finite and >= 0")

    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._tree[1])

    def find_prefixsum(self, prefix_sums: np.ndarray) -> np.ndarray:
        """For each ``x``, the first leaf ``i`` with ``sum(leaves[:i + 1]) > x``.

        Equivalent to ``np.searchsorted(np.cumsum(leaves), x, side="right")`` for ``0 <= x < total()``.
        All queries descend together, one NumPy step per level. Queries at or beyond the total (or
        rounding error near it) land on the last leaf with positive value, never on an empty leaf.
        """
        if self.total() <= 0:
            raise ValueError("find_prefixsum needs a positive total; update some leaves with values > 0 first")
        x = np.array(prefix_sums, dtype=np.float64).reshape(-1)
        children = self._tree.reshape(-1, 2)  # row p: the left and right child of node p
        nodes = np.ones(x.shape, dtype=np.int64)
        for _ in range(self._depth):
            pair = children[nodes]
            left_sum = pair[:, 0]
            # never step into an empty subtree (guards rounding near the total and negative queries)
            go_right = (pair[:, 1] > 0) & ((x >= left_sum) | (left_sum <= 0))
            np.subtract(x, left_sum, out=x, where=go_right)
            nodes *= 2
            nodes += go_right
        return nodes - self._size


class MinTree(_SegmentTree):
    """Minimum over leaves (empty leaves count as +inf)."""

    _neutral = np.inf
    _reduce = np.minimum

    def min(self) -> float:
        """Smallest leaf value (+inf when nothing was set)."""
        return float(self._tree[1])


def update_trees(trees: Sequence[_SegmentTree], indices: np.ndarray | int, values: np.ndarray | float) -> None:
    """Set the same leaves of trees of one capacity (a prioritized replay's sum and min trees) to the same values:
    one check of the indices and one walk up their ancestors, shared. For a repeated index the last write wins.

    A walk is one NumPy step per level for all leaves at once, so its cost is the calls, not the leaves: sharing
    them halves what a replay's priority update costs."""
    first = trees[0]
    if any(tree.capacity != first.capacity for tree in trees):
        raise ValueError(f"trees updated together need one capacity, got {[tree.capacity for tree in trees]}")
    idx = first._check_indices(indices)
    vals = np.broadcast_to(np.asarray(values, dtype=np.float64).reshape(-1), idx.shape)
    for tree in trees:
        tree._check_values(vals)
    if idx.size == 0:
        return
    if idx.size > 1 and np.unique(idx).size < idx.size:
        # keep the last occurrence of each index: first occurrence in the reversed arrays
        idx, first_in_reversed = np.unique(idx[::-1], return_index=True)
        vals = vals[::-1][first_in_reversed]
    parents = (idx + first._size) >> first._shifts  # [depth, B]: the ancestors, one level up per row
    children = 2 * parents
    for tree in trees:
        tree._refresh(idx, vals, parents, children)
