"""data_parallel's replay learner: blocks side by side with or without recurrent states, the episode boundary of a
restarted sampler's columns, and what a resumed run keeps of its (unsaved) replay buffer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.arch.data_parallel import DataParallelRunner, Experience, TransitionBlock, concat_blocks
from rlfleet.launch import train
from rlfleet.run.checkpoint import load_checkpoint
from rlfleet.run.config import RunConfig


def test_concat_blocks_gives_zero_states_to_a_block_acted_on_from_none():
    """A restarted sampler's first block of one step (train_freq=1) has no recurrent state; the others do."""

    def block(state):
        b = TransitionBlock(1)
        zeros = np.zeros(2, np.float32)
        b.add(np.zeros((2, 1)), zeros.astype(np.int64), zeros, np.zeros((2, 1)), zeros > 0, zeros > 0, state=state)
        return b.data

    with_state = block((torch.full((2, 3), 1.0), torch.full((2, 3), -1.0)))  # the collector's LSTM state
    for blocks, stateless in (([with_state, block(None)], [2, 3]), ([block(None), with_state], [0, 1])):
        rows = concat_blocks(blocks)
        assert rows["h"].shape == rows["c"].shape == (1, 4, 3) and rows["h"].dtype == np.float32
        acted = [i for i in range(4) if i not in stateless]
        np.testing.assert_array_equal(rows["h"][0, stateless], 0.0)
        np.testing.assert_array_equal(rows["c"][0, stateless], 0.0)
        np.testing.assert_array_equal(rows["h"][0, acted], 1.0)
        np.testing.assert_array_equal(rows["c"][0, acted], -1.0)


def block_item(worker: int, incarnation: int, rewards: list[float]) -> Experience:
    """A sampler's block of one env (CartPole-shaped obs, no episode ends)."""
    block = TransitionBlock(len(rewards))
    for t, r in enumerate(rewards):
        obs = np.full((1, 4), t, np.float32)
        block.add(obs, np.zeros(1, np.int64), np.full(1, r, np.float32), obs + 0.5, np.zeros(1, bool),
                  np.zeros(1, bool))  # fmt: skip
    return Experience(worker, incarnation, version=0, steps=len(rewards), returns=[], data=block.data)


def test_a_restarted_samplers_first_block_ends_the_episodes_stored_in_its_columns(tmp_path):
    g = 0.5
    cfg = RunConfig("dqn", "CartPole-v1", arch="data_parallel", options={"workers": 2, "backend": "serial"}, n_envs=1,
                    logdir=str(tmp_path),
                    progress=False, eval_episodes=1,
                    overrides={"learning_starts": 50_000, "n_step": 3, "gamma": g, "prioritized": False})  # fmt: skip
    learner = DataParallelRunner(cfg)  # learning_starts: a full replay, far past these blocks (no update)
    try:
        learner.learn_blocks([block_item(0, 0, [1.0, 1.0]), block_item(1, 0, [1.0, 1.0])])
        learner.learn_blocks([block_item(0, 0, [1.0, 1.0]), block_item(1, 1, [1.0, 1.0])])  # sampler 1 restarted
        learner.learn_blocks([block_item(0, 0, [1.0, 1.0]), block_item(1, 1, [1.0, 1.0])])
        rew = learner.buffer.sample(0).rew.reshape(6, 2)  # rows oldest first, one column per sampler
        full = 1 + g + g**2
        np.testing.assert_allclose(rew[:, 0], [full, full, full, full, 1 + g, 1])
        np.testing.assert_allclose(rew[:, 1], [1 + g, 1, full, full, 1 + g, 1])  # nothing summed across the restart
    finally:
        learner.eval_envs.close()


def test_data_parallel_dqn_resumes_the_prioritized_beta_annealing(run_opts, tmp_path):
    seen = {}

    def stop_half_way(info):
        seen["beta"] = info["trainer"].buffer.beta
        return info["env_steps"] >= 1_024

    train("dqn", "CartPole-v1", arch="data_parallel", workers=2, backend="serial", steps=2_048, name="r",
          eval_every=10**9, eval_episodes=1, stop_return=1e9, overrides={"learning_starts": 128},
          callbacks=[stop_half_way], **run_opts)  # fmt: skip
    assert seen["beta"] > 0.45  # annealed from 0.4 on
    payload = load_checkpoint(tmp_path / "r")
    resumed = DataParallelRunner(RunConfig(**payload["run_config"]), resume_from=payload, run_dir=tmp_path / "r")
    try:
        assert resumed.buffer.beta == pytest.approx(seen["beta"])
    finally:
        resumed.eval_envs.close()
