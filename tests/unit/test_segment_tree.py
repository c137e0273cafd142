"""Tests for SumTree and MinTree: invariants, prefix-sum search, duplicate indices and argument checks."""

import numpy as np
import pytest

from rlfleet.data import MinTree, SumTree
from rlfleet.data.segment_tree import update_trees


def assert_invariants(tree, reduce, leaves: np.ndarray) -> None:
    """Every internal node is the reduction of its children, and the leaves are what we wrote."""
    nodes = tree._tree
    size = tree._size
    np.testing.assert_allclose(nodes[size : size + tree.capacity], leaves)
    internal = np.arange(1, size)
    np.testing.assert_allclose(nodes[internal], reduce(nodes[2 * internal], nodes[2 * internal + 1]))


@pytest.mark.parametrize("capacity", [1, 7, 16, 37])
def test_random_updates_keep_invariants(capacity):
    rng = np.random.default_rng(capacity)
    s, m = SumTree(capacity), MinTree(capacity)
    leaves_sum, leaves_min = np.zeros(capacity), np.full(capacity, np.inf)
    for _ in range(20):
        idx = rng.choice(capacity, size=rng.integers(1, capacity + 1), replace=False)
        vals = rng.random(idx.size) * 10
        s.update(idx, vals)
        m.update(idx, vals)
        leaves_sum[idx] = vals
        leaves_min[idx] = vals
        assert_invariants(s, np.add, leaves_sum)
        assert_invariants(m, np.minimum, leaves_min)
        assert s.total() == pytest.approx(leaves_sum.sum())
        assert m.min() == leaves_min.min()
        np.testing.assert_array_equal(s[np.arange(capacity)], leaves_sum)


def test_empty_trees():
    assert SumTree(5).total() == 0.0
    assert MinTree(5).min() == np.inf


def test_duplicate_indices_last_write_wins():
    rng = np.random.default_rng(0)
    for _ in range(10):
        batched, min_tree = SumTree(13), MinTree(13)
        reference = np.full(13, np.inf)
        idx = rng.integers(0, 13, size=40)  # many repeats
        vals = rng.random(40)
        batched.update(idx, vals)
        min_tree.update(idx, vals)
        for i, v in zip(idx, vals, strict=True):
            reference[i] = v
        written = np.isfinite(reference)
        np.testing.assert_array_equal(batched[np.flatnonzero(written)], reference[written])
        assert batched.total() == pytest.approx(reference[written].sum())
        assert min_tree.min() == reference.min()
        assert_invariants(batched, np.add, np.where(written, reference, 0.0))


def test_find_prefixsum_matches_searchsorted_exactly_on_integer_values():
    rng = np.random.default_rng(1)
    leaves = rng.integers(0, 5, size=23).astype(np.float64)  # includes zero leaves
    tree = SumTree(23)
    tree.update(np.arange(23), leaves)
    cumsum = np.cumsum(leaves)
    queries = np.concatenate([np.arange(0, cumsum[-1]), np.arange(0, cumsum[-1]) + 0.5])  # boundaries and mids
    expected = np.searchsorted(cumsum, queries, side="right")
    np.testing.assert_array_equal(tree.find_prefixsum(queries), expected)
    assert (leaves[tree.find_prefixsum(queries)] > 0).all()


def test_find_prefixsum_matches_searchsorted_on_random_floats():
    rng = np.random.default_rng(2)
    leaves = rng.random(100)
    tree = SumTree(100)
    tree.update(np.arange(100), leaves)
    queries = rng.random(10_000) * tree.total()
    expected = np.searchsorted(np.cumsum(leaves), queries, side="right")
    np.testing.assert_array_equal(tree.find_prefixsum(queries), expected)


def test_find_prefixsum_never_returns_an_empty_leaf():
    tree = SumTree(10)
    tree.update(np.array([2, 5]), np.array([0.1, 0.2]))
    queries = np.array([-1.0, 0.0, 0.1, 0.3, 0.30000001, 5.0])
    assert set(tree.find_prefixsum(queries).tolist()) <= {2, 5}
    assert tree.find_prefixsum(np.array([5.0]))[0] == 5


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)
    tree = SumTree(4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        tree.update(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError, match=">= 0"):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError, match="positive total"):
        tree.find_prefixsum(np.array([0.0]))


def reference_update(tree, reduce, idx: np.ndarray, vals: np.ndarray) -> None:
    """The update the trees had before the shared ancestor walk: per tree, level by level, parents reduced from
    their pair of children with `reduce.reduce`."""
    nodes = tree._tree
    if idx.size > 1 and np.unique(idx).size < idx.size:
        idx, first = np.unique(idx[::-1], return_index=True)
        vals = vals[::-1][first]
    at = idx + tree._size
    nodes[at] = vals
    pairs = nodes.reshape(-1, 2)
    for _ in range(tree._depth):
        at = at >> 1
        nodes[at] = reduce.reduce(pairs[at], axis=1)


def reference_find_prefixsum(tree, prefix_sums: np.ndarray) -> np.ndarray:
    """The prefix-sum descent as it was written before (one gather per child)."""
    x = np.asarray(prefix_sums, dtype=np.float64).reshape(-1).copy()
    nodes = np.ones(x.shape, dtype=np.int64)
    for _ in range(tree._depth):
        left = 2 * nodes
        left_sum = tree._tree[left]
        go_right = (tree._tree[left + 1] > 0) & ((x >= left_sum) | (left_sum <= 0))
        x = np.where(go_right, x - left_sum, x)
        nodes = left + go_right
    return nodes - tree._size


@pytest.mark.parametrize("capacity", [1, 5, 64, 1000])
def test_update_trees_and_find_prefixsum_give_the_reference_nodes_and_leaves_bit_for_bit(capacity):
    """Sum and min trees updated together (as a prioritized replay does), with repeated indices and zeros, hold
    exactly the node arrays of the per-tree, per-level reference update; the prefix-sum search finds exactly the
    reference's leaves, also for queries at and past the total."""
    rng = np.random.default_rng(capacity)
    s, m, ref_s, ref_m = SumTree(capacity), MinTree(capacity), SumTree(capacity), MinTree(capacity)
    for _ in range(30):
        idx = rng.integers(0, capacity, size=rng.integers(1, 70))
        vals = rng.random(idx.size) ** 3 * (rng.random(idx.size) < 0.9)  # some zero priorities
        update_trees((s, m), idx, vals)
        reference_update(ref_s, np.add, idx, vals)
        reference_update(ref_m, np.minimum, idx, vals)
        np.testing.assert_array_equal(s._tree, ref_s._tree)
        np.testing.assert_array_equal(m._tree, ref_m._tree)
        if s.total() > 0:
            queries = np.concatenate([rng.random(64) * s.total(), [0.0, s.total(), s.total() * 2, -1.0]])
            np.testing.assert_array_equal(s.find_prefixsum(queries), reference_find_prefixsum(ref_s, queries))


def test_update_trees_checks_every_tree_before_writing_any():
    s, m = SumTree(8), MinTree(8)
    with pytest.raises(ValueError, match=">= 0"):
        update_trees((m, s), np.array([1]), np.array([-1.0]))  # fine for the min tree, not for the sum tree
    assert m.min() == np.inf and s.total() == 0.0
    with pytest.raises(ValueError, match="one capacity"):
        update_trees((s, MinTree(9)), np.array([1]), np.array([1.0]))
