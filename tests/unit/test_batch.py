"""Tests for Batch: construction, nesting, indexing, combining, splitting, reshaping and torch conversion."""

import copy
import pickle

import numpy as np
import pytest
import torch

from rlfleet.data import Batch


def make_batch(n: int = 6) -> Batch:
    return Batch(
        obs=np.arange(n * 3, dtype=np.float32).reshape(n, 3),
        act=np.arange(n),
        info={"done": np.arange(n) % 2 == 0, "score": np.linspace(0.0, 1.0, n)},
    )


def test_construction_from_kwargs_and_dict_are_equal():
    a = Batch(obs=np.zeros((2, 3)), act=np.ones(2))
    b = Batch({"obs": np.zeros((2, 3)), "act": np.ones(2)})
    assert list(a.keys()) == list(b.keys()) == ["obs", "act"]
    np.testing.assert_array_equal(a.obs, b["obs"])


def test_dict_value_becomes_nested_batch_and_access_by_attr_and_key():
    b = make_batch()
    assert isinstance(b.info, Batch)
    assert b["info"]["done"] is b.info.done
    assert "info" in b and "missing" not in b
    b.rew = np.ones(6)
    b["next"] = {"obs": np.zeros((6, 3))}
    assert b["rew"] is b.rew
    assert isinstance(b.next, Batch)
    assert dict(b.items())["act"] is b.act
    assert len(list(b.values())) == 5
    with pytest.raises(AttributeError, match="missing"):
        _ = b.missing


def test_setting_a_method_name_as_attribute_is_refused_but_key_works():
    b = make_batch()
    with pytest.raises(ValueError, match="split"):
        b.split = np.zeros(6)
    b["split"] = np.zeros(6)
    assert b["split"].shape == (6,)


def test_len_and_mismatch_error_names_the_keys():
    assert len(make_batch(5)) == 5
    assert len(Batch()) == 0
    bad = Batch(obs=np.zeros((4, 2)), nested={"act": np.zeros(3)})
    with pytest.raises(ValueError, match=r"obs.*nested\.act|nested\.act.*obs"):
        len(bad)


@pytest.mark.parametrize(
    "index",
    [2, slice(1, 4), np.array([4, 0, 0]), np.array([True, False, True, False, False, True])],
    ids=["int", "slice", "int-array", "bool-array"],
)
def test_indexing_applies_to_every_leaf(index):
    b = make_batch()
    sub = b[index]
    np.testing.assert_array_equal(sub.obs, b.obs[index])
    np.testing.assert_array_equal(sub.act, b.act[index])
    np.testing.assert_array_equal(sub.info.score, b.info.score[index])
    tsub = b.to_torch()[index]
    np.testing.assert_array_equal(tsub.act.numpy(), b.act[index])


def test_string_index_returns_value():
    b = make_batch()
    assert b["act"] is b.act


def test_cat_and_stack_including_nested_and_torch():
    a, b = make_batch(2), make_batch(3)
    c = Batch.cat([a, b])
    assert len(c) == 5
    np.testing.assert_array_equal(c.info.score, np.concatenate([a.info.score, b.info.score]))
    ta, tb = a.to_torch(), make_batch(2).to_torch()
    tc = Batch.cat([ta, tb])
    assert isinstance(tc.obs, torch.Tensor) and tc.obs.shape == (4, 3)
    s = Batch.stack([a, make_batch(2)])
    assert s.obs.shape == (2, 2, 3) and s.info.done.shape == (2, 2)
    s1 = Batch.stack([a, make_batch(2)], axis=1)
    assert s1.obs.shape == (2, 2, 3)
    np.testing.assert_array_equal(s1.act[:, 0], a.act)
    with pytest.raises(ValueError, match="different keys"):
        Batch.cat([a, Batch(obs=np.zeros((1, 3)))])


@pytest.mark.parametrize("shuffle", [True, False])
def test_split_covers_every_row_exactly_once(shuffle):
    b = make_batch(10)
    parts = list(b.split(3, shuffle=shuffle, rng=np.random.default_rng(0)))
    assert [len(p) for p in parts] == [3, 3, 3, 1]
    acts = np.concatenate([p.act for p in parts])
    assert sorted(acts.tolist()) == list(range(10))
    if not shuffle:
        assert acts.tolist() == list(range(10))
    for p in parts:  # rows stay aligned across keys
        np.testing.assert_array_equal(p.obs, b.obs[p.act])


def test_split_is_reproducible_with_a_seeded_rng():
    b = make_batch(10)
    first = [p.act for p in b.split(4, rng=np.random.default_rng(7))]
    second = [p.act for p in b.split(4, rng=np.random.default_rng(7))]
    for x, y in zip(first, second, strict=True):
        np.testing.assert_array_equal(x, y)
    assert np.concatenate(first).tolist() != list(range(10))


def test_flatten_leading():
    b = Batch(obs=np.arange(24).reshape(2, 3, 4), rew=np.arange(6).reshape(2, 3), nested={"x": torch.zeros(2, 3, 5)})
    f = b.flatten_leading(2)
    assert f.obs.shape == (6, 4) and f.rew.shape == (6,) and f.nested.x.shape == (6, 5)
    np.testing.assert_array_equal(f.obs[4], b.obs[1, 1])
    with pytest.raises(ValueError, match="first 3 dims"):
        Batch(rew=np.zeros((2, 3))).flatten_leading(3)


def test_to_torch_shares_memory_and_converts_floats_only():
    obs32 = np.zeros((4, 2), dtype=np.float32)
    b = Batch(obs=obs32, obs64=np.zeros(4), act=np.arange(4, dtype=np.int32), done=np.zeros(4, dtype=bool))
    t = b.to_torch()
    assert t.obs.dtype == torch.float32 and t.obs64.dtype == torch.float32
    assert t.act.dtype == torch.int32 and t.done.dtype == torch.bool
    assert np.shares_memory(t.obs.numpy(), obs32)
    obs32[1, 1] = 5.0
    assert t.obs[1, 1].item() == 5.0
    t.act[0] = 9
    assert b.act[0] == 9
    kept = b.to_torch(float_dtype=None)
    assert kept.obs64.dtype == torch.float64


def test_to_torch_handles_negative_strides_and_read_only_arrays():
    ro = np.arange(4.0)
    ro.flags.writeable = False
    t = Batch(rev=np.arange(4)[::-1], ro=ro).to_torch()
    assert t.rev.tolist() == [3, 2, 1, 0]
    assert t.ro.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_to_numpy_round_trip_is_zero_copy_on_cpu():
    t = Batch(x=torch.arange(5.0), nested={"y": torch.ones(5, 2)})
    n = t.to_numpy()
    assert isinstance(n.x, np.ndarray) and isinstance(n.nested.y, np.ndarray)
    n.x[0] = 42.0
    assert t.x[0].item() == 42.0


def test_repr_shows_keys_shapes_and_dtypes():
    text = repr(make_batch(6))
    assert "obs" in text and "[6, 3]" in text and "float32" in text and "info" in text and "bool" in text


def test_batch_survives_pickle_and_deepcopy():
    b = make_batch()
    for c in (pickle.loads(pickle.dumps(b)), copy.deepcopy(b)):
        np.testing.assert_array_equal(c.info.score, b.info.score)
        assert len(c) == len(b)


def test_a_shuffled_split_on_a_device_uploads_its_order_once(monkeypatch):
    """Each upload to a GPU is a copy and a wait: the permutation goes once, and each minibatch indexes every leaf
    with a slice of it there (not one upload per minibatch and leaf)."""
    rows = torch.arange(64.0)
    batch = Batch(a=rows.to("meta"), b=Batch(c=torch.zeros(64, 3, device="meta")), d=torch.zeros(64, device="meta"))
    uploads: list = []
    as_tensor = torch.as_tensor
    monkeypatch.setattr(torch, "as_tensor", lambda x, *a, **k: uploads.append(x) or as_tensor(x, *a, **k))
    minibatches = list(batch.split(16, rng=np.random.default_rng(0)))
    assert len(uploads) == 1 and [len(m) for m in minibatches] == [16] * 4 and minibatches[0].b.c.is_meta
    on_cpu = [m.a for m in Batch(a=rows, b=Batch(c=rows.numpy())).split(16, rng=np.random.default_rng(0))]
    assert sorted(torch.cat(on_cpu).tolist()) == rows.tolist()  # every row once, as before
