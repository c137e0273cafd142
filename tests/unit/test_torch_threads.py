"""torch's thread count per run: `torch_threads` "auto" (the default) gives a CNN learner that has its process to
itself (the `single` and `offline` architectures) every core the process may use, and every other run one thread;
a count is taken as given. The measurements behind the rule: docs/benchmarks.md, "Atari: where the time goes"."""

from __future__ import annotations

import json
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet import train
from rlfleet.arch import ARCHITECTURES, runner_class
from rlfleet.cli import build_parser
from rlfleet.run.config import ConfigError, RunConfig, resolve_torch_threads

FRAMES_ID = "rlfleet-test/Frames-v0"


class Frames(gym.Env):
    """One-step episodes of a stack of 4 random 36x36 uint8 frames: an image task small enough for a unit test."""

    observation_space = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), float(action), True, False, {}


if FRAMES_ID not in gym.registry:
    gym.register(FRAMES_ID, entry_point=Frames, reward_threshold=1.0)


@pytest.fixture
def three_cores(monkeypatch):
    """This process may use cores 0, 1 and 2 (whatever the machine has)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_auto_gives_a_cnn_learner_in_one_process_every_usable_core(three_cores):
    assert resolve_torch_threads("auto", single_process=True, convolutional=True) == 3


@pytest.mark.parametrize(("single_process", "convolutional"), [(True, False), (False, True), (False, False)])
def test_auto_gives_mlp_learners_and_multi_process_architectures_one_thread(three_cores, single_process, convolutional):
    assert resolve_torch_threads("auto", single_process=single_process, convolutional=convolutional) == 1


def test_auto_stays_within_omp_num_threads(three_cores, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert resolve_torch_threads("auto", single_process=True, convolutional=True) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # a cap, not a count: still the 3 usable cores
    assert resolve_torch_threads("auto", single_process=True, convolutional=True) == 3
    assert resolve_torch_threads(4, single_process=True, convolutional=True) == 4  # a count is the user's choice


def test_a_count_is_taken_as_given(three_cores):
    assert resolve_torch_threads(5, single_process=False, convolutional=False) == 5
    assert resolve_torch_threads(1, single_process=True, convolutional=True) == 1


def test_the_default_is_auto():
    assert RunConfig(algo="ppo", env="CartPole-v1").torch_threads == "auto"


def test_only_the_single_process_architectures_give_their_learner_every_core():
    one_process = {arch for arch in ARCHITECTURES if runner_class(arch).single_process}
    assert one_process == {"single", "offline"}


def test_the_cli_takes_a_count_or_auto():
    parser = build_parser()
    assert parser.parse_args(["train", "ppo", "--env", "X", "--torch-threads", "auto"]).torch_threads == "auto"
    assert parser.parse_args(["train", "ppo", "--env", "X", "--torch-threads", "2"]).torch_threads == 2


def test_another_word_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^--torch-threads='many' must be in \[1, 1024\], or auto$"):
        train("ppo", "CartPole-v1", torch_threads="many", logdir=str(tmp_path), progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("env", "overrides", "threads"),
    [(FRAMES_ID, {}, 3), (FRAMES_ID, {"encoder": "mlp"}, 1), ("CartPole-v1", {}, 1)],
    ids=["cnn", "mlp-on-frames", "mlp"],
)
def test_a_run_sets_and_records_the_count_it_resolved(tmp_path, three_cores, env, overrides, threads):
    result = train("ppo", env, steps=256, eval_episodes=1, overrides=overrides, logdir=str(tmp_path), name="run",
                   progress=False)  # fmt: skip
    assert torch.get_num_threads() == threads
    assert result["torch_threads"] == threads
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["torch_threads"] == threads
    assert config["run"]["torch_threads"] == "auto"
