"""Env steps per second of one Stable-Baselines3 A2C or PPO run on an Atari game, for a fixed number of env steps.

Run by ``benchmarks/atari_speed.py``, which passes rlfleet's own ``atari`` preset translated to SB3's arguments
(``--settings``: one JSON object, see ``atari_speed.sb3_settings``), so that both libraries train with the same
numbers of envs, steps per segment, epochs, minibatch size, network and optimizer settings:

- envs: ``make_atari_env(ENV, n_envs, seed, env_kwargs={"frameskip": 1}, wrapper_kwargs=
  {"terminal_on_life_loss": False})`` — SB3's ``AtariWrapper`` (30 no-ops, ``MaxAndSkipEnv`` 4, FIRE on reset
  where the game has it, 84x84 grayscale by ``WarpFrame``, sign-clipped rewards) over an ALE env whose own frame
  skip is off, so that frames are skipped once (4) and the id's sticky actions (0.25 for ``-v5``) stay, as in
  rlfleet; in ``SubprocVecEnv`` (one process per env, the layout of rlfleet's async vector env) or
  ``DummyVecEnv`` (``--vec-env``); then ``VecFrameStack(4)`` in this process;
- network: ``CnnPolicy`` with SB3's ``NatureCNN`` (PPO) or the Mnih 2013 network below (A2C), one
  features extractor shared by policy and value, no hidden layers after it (``net_arch=[]``);
- ``torch.set_num_threads(--threads)``, CPU.

The timed span is ``model.learn(total_timesteps=--steps)`` (SB3 collects whole segments: it stops at the first
segment boundary at or past the budget), with no evaluation. One JSON line on stdout: ``env_steps`` (SB3's
``num_timesteps``), ``wall_time_s``, ``cpu_time_s`` (this process only; the env processes are not counted),
``env_steps_per_s``, the settings used, the network's parameter count and the library versions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

import gymnasium as gym
import torch
from common import Clock, library_versions
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, NatureCNN
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack
from torch import nn

ALGOS = {"a2c": A2C, "ppo": PPO}
VEC_ENVS = {"subproc": SubprocVecEnv, "dummy": DummyVecEnv}
FRAME_STACK = 4


class Mnih2013CNN(BaseFeaturesExtractor):
    """The network of Mnih et al. 2013 (rlfleet's ``mnih2013`` encoder): conv 16x8x8/4, conv 32x4x4/2, fc 256."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 256) -> None:
        super().__init__(observation_space, features_dim)
        channels = observation_space.shape[0]
        self.cnn = nn.Sequential(
            nn.Conv2d(channels, 16, 8, 4), nn.ReLU(), nn.Conv2d(16, 32, 4, 2), nn.ReLU(), nn.Flatten()
        )
        with torch.no_grad():
            flat = self.cnn(torch.as_tensor(observation_space.sample()[None]).float()).shape[1]
        self.linear = nn.Sequential(nn.Linear(flat, features_dim), nn.ReLU())

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.linear(self.cnn(observations))


EXTRACTORS = {"nature": NatureCNN, "mnih2013": Mnih2013CNN}


def linear_schedule(start: float):
    """SB3's learning-rate callable: ``start`` decayed linearly to 0 over training (rlfleet's ``lr_anneal``)."""
    return lambda progress_remaining: start * progress_remaining


def model_kwargs(settings: dict[str, Any]) -> dict[str, Any]:
    """The algorithm's constructor arguments from ``--settings``: ``encoder`` picks the features extractor,
    ``lr_anneal`` turns ``learning_rate`` into a linear decay, the rest goes to the constructor as it is."""
    kwargs = dict(settings)
    extractor = EXTRACTORS[kwargs.pop("encoder")]
    if kwargs.pop("lr_anneal"):
        kwargs["learning_rate"] = linear_schedule(kwargs["learning_rate"])
    kwargs["policy_kwargs"] = {"features_extractor_class": extractor, "net_arch": [], **kwargs.get("policy_kwargs", {})}
    return kwargs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", required=True, choices=list(ALGOS))
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vec-env", choices=list(VEC_ENVS), default="subproc")
    parser.add_argument("--settings", required=True, help="JSON: n_envs, encoder, lr_anneal and constructor args")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = json.loads(args.settings)
    n_envs = settings.pop("n_envs")
    envs = make_atari_env(
        f"ale_py:{args.env}",  # gymnasium imports ale_py (registering the ALE ids) in each env process
        n_envs=n_envs,
        seed=args.seed,
        env_kwargs={"frameskip": 1},
        wrapper_kwargs={"terminal_on_life_loss": False},
        vec_env_cls=VEC_ENVS[args.vec_env],
    )
    envs = VecFrameStack(envs, n_stack=FRAME_STACK)
    model = ALGOS[args.algo]("CnnPolicy", envs, seed=args.seed, device="cpu", verbose=0, **model_kwargs(settings))
    clock = Clock()
    clock.start()
    model.learn(total_timesteps=args.steps)
    wall, cpu = clock.wall(), clock.cpu()
    envs.close()
    record = {
        "framework": "sb3",
        "version": library_versions("stable-baselines3")["stable-baselines3"],
        "algo": args.algo,
        "env": args.env,
        "threads": torch.get_num_threads(),
        "vec_env": args.vec_env,
        "n_envs": n_envs,
        "settings": settings,
        "params": sum(p.numel() for p in model.policy.parameters()),
        "steps": args.steps,
        "env_steps": int(model.num_timesteps),
        "wall_time_s": wall,
        "cpu_time_s": cpu,
        "env_steps_per_s": model.num_timesteps / wall,
        "libraries": library_versions("torch", "gymnasium", "ale-py", "numpy", "opencv-python-headless"),
    }
    sys.__stdout__.write(json.dumps(record) + "\n")
    sys.__stdout__.flush()


if __name__ == "__main__":
    with contextlib.redirect_stdout(sys.stderr):
        main()
