"""Learners on a GPU against the CPU: the table behind `--device auto`, and SAC on HalfCheetah with both rlfleet's and
Stable-Baselines3's learner on the GPU.

`updates`: learner updates per second of rlfleet's own algorithms on synthetic batches of each task's sizes, on the
CPU with one torch thread, on the CPU with every core, and on CUDA (the batch moved from host memory in each update,
as replay and rollouts keep it there; PPO's minibatch steps start from a segment already on the device, as
`minibatch_epochs` moves it once):

- PPO and DQN with the Nature CNN on Pong's sizes (4 stacked 84x84 frames, 6 actions; PPO minibatch 256, DQN batch 32);
- SAC on HalfCheetah's sizes (17-dim observations, 6-dim actions, 256-256 networks, batch 256);
- PPO and DQN with CartPole's 64-64 MLPs (minibatch 64).

And acting: one forward of PPO's Nature CNN policy for 8 envs (what a step of `single` costs), on the CPU and on CUDA.
And a round of gossip (`gossip`'s learners) with one in-neighbour for a learner with PPO's Nature CNN: flatten its
parameters, mix them with the neighbour's message, load the mix back. Three ways: as `gossip` does it, in host
memory (its messages cross processes and machines there); messages in host memory but mixed on the learner's
device; and every vector on the device, the least a CUDA IPC exchange between learners on one GPU could cost.

`sac`: SAC on HalfCheetah-v5 for 20,000 env steps (10,000 random, then one update per step) and a 10-episode greedy
evaluation, wall time, rlfleet (its `mujoco` preset) and SB3 (rl-zoo3's HalfCheetah entry: SB3's SAC defaults with
`learning_starts=10000`), both with the learner on CUDA, one torch thread each.

    python benchmarks/device_learner.py updates [--repeats 5]
    python benchmarks/device_learner.py sac --seeds 0 1 2
    python benchmarks/device_learner.py sac --seeds 0 --steps 10500 --device cpu   # a rehearsal, without a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
import torch
from torch.nn.utils import parameters_to_vector

from rlfleet.algos import resolve
from rlfleet.arch.gossip import flat_params, load_flat
from rlfleet.arch.shared import algo_modules, trainable_params
from rlfleet.data.batch import Batch
from rlfleet.optim.step import optimize

IMAGE = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
CARTPOLE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
CHEETAH = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def per_second(fn, device: str, seconds: float = 1.0, repeats: int = 5) -> float:
    """Median calls per second of `fn` over `repeats` rounds of about `seconds` each (after a warm-up)."""
    for _ in range(3):
        fn()
    _sync(device)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < 0.2:
        fn()
        n += 1
    _sync(device)
    inner = max(1, int(n / (time.perf_counter() - start) * seconds))
    rates = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        rates.append(inner / (time.perf_counter() - start))
    return statistics.median(rates)


def _obs(space: gym.spaces.Box, n: int, rng: np.random.Generator) -> np.ndarray:
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (n, *space.shape), dtype=np.uint8)
    return rng.standard_normal((n, *space.shape)).astype(np.float32)


def _build(name: str, preset: str | None, obs_space, action_space, device: str, **overrides):
    algo_cls, config_cls, presets, _ = resolve(name)
    cfg = config_cls(**{**(presets[preset] if preset else {}), **overrides})
    return algo_cls(cfg, obs_space, action_space, seed=0, device=device), cfg


def ppo_step(obs_space, n_actions: int, minibatch: int, device: str, preset: str | None):
    """One of PPO's minibatch gradient steps (loss and optimizer step) on a segment already on `device`."""
    ppo, cfg = _build("ppo", preset, obs_space, gym.spaces.Discrete(n_actions), device)
    rng = np.random.default_rng(0)
    batch = Batch(
        obs=_obs(obs_space, minibatch, rng),
        act=rng.integers(n_actions, size=minibatch),
        logp=np.full(minibatch, -np.log(n_actions), np.float32),
        value=rng.standard_normal(minibatch).astype(np.float32),
        adv=rng.standard_normal(minibatch).astype(np.float32),
        ret=rng.standard_normal(minibatch).astype(np.float32),
    ).to_torch(ppo.device)

    def step():
        loss, _ = ppo.loss(batch)
        optimize(ppo.optimizer, loss, ppo.params, cfg.max_grad_norm)

    return step


def replay_update(name: str, obs_space, action_space, batch_size: int, device: str, preset: str | None, **overrides):
    """One `update` of a replay algorithm on a host-memory batch (moved to `device` inside, as a replay sample is)."""
    algo, cfg = _build(name, preset, obs_space, action_space, device, batch_size=batch_size, **overrides)
    rng = np.random.default_rng(0)
    b = batch_size
    act = rng.integers(action_space.n, size=b) if isinstance(action_space, gym.spaces.Discrete) else None
    if act is None:
        act = rng.uniform(-1, 1, (b, *action_space.shape)).astype(np.float32)
    batch = Batch(
        obs=_obs(obs_space, b, rng),
        act=act,
        rew=rng.standard_normal(b).astype(np.float32),
        next_obs=_obs(obs_space, b, rng),
        terminated=np.zeros(b, np.float32),
        discount=np.full(b, cfg.gamma, np.float32),
        weight=np.ones(b, np.float32),
    )
    return lambda: algo.update(batch)


def cnn_act(n_envs: int, device: str):
    ppo, _ = _build("ppo", "atari", IMAGE, gym.spaces.Discrete(6), device)
    obs = _obs(IMAGE, n_envs, np.random.default_rng(0))
    return lambda: ppo.act(obs)


def gossip_round(device: str, how: str):
    """One round of gossip with one in-neighbour (equal weights) for a learner with PPO's Nature CNN on `device`:
    `host`, as `gossip` does it (flattened into host memory, mixed there, loaded back); `mixed_on_device`, the
    messages in host memory but mixed on the device (the learner's own vector still copied out, to post); `device`,
    every vector on the device."""
    ppo, _ = _build("ppo", "atari", IMAGE, gym.spaces.Discrete(6), device)
    params = trainable_params(algo_modules(ppo))
    peer = flat_params(params).to(device if how == "device" else "cpu")

    @torch.no_grad()
    def step():
        mine = parameters_to_vector(params)  # on the learner's device
        posted = mine if how == "device" else mine.cpu()  # what it posts
        if how == "host":
            mine = posted  # mixed in host memory
        load_flat(params, 0.5 * mine + 0.5 * peer.to(mine.device))  # mixed on the device: the message copied there

    return step


CASES = {
    "PPO, Nature CNN (Pong), minibatch 256": lambda d: ppo_step(IMAGE, 6, 256, d, "atari"),
    "DQN, Nature CNN (Pong), batch 32": lambda d: replay_update("dqn", IMAGE, gym.spaces.Discrete(6), 32, d, "atari"),
    "SAC, 256-256 (HalfCheetah), batch 256": lambda d: replay_update(
        "sac", CHEETAH, gym.spaces.Box(-1, 1, (6,), np.float32), 256, d, "mujoco"
    ),
    "SAC, the same, without the CUDA graph": lambda d: replay_update(
        "sac", CHEETAH, gym.spaces.Box(-1, 1, (6,), np.float32), 256, d, "mujoco", cuda_graph=False
    ),
    "PPO, 64-64 MLP (CartPole), minibatch 64": lambda d: ppo_step(CARTPOLE, 2, 64, d, None),
    "DQN, 64-64 MLP (CartPole), batch 64": lambda d: replay_update(
        "dqn", CARTPOLE, gym.spaces.Discrete(2), 64, d, None
    ),
    "acting: PPO's Nature CNN policy, 8 envs": lambda d: cnn_act(8, d),
    "gossip round, Nature CNN learner, 1 peer: as gossip does it, in host memory": lambda d: gossip_round(d, "host"),
    "gossip round, the same, messages mixed on the learner's device": lambda d: gossip_round(d, "mixed_on_device"),
    "gossip round, the same, every vector on the learner's device": lambda d: gossip_round(d, "device"),
}


def updates(args: argparse.Namespace) -> None:
    cores = len(os.sched_getaffinity(0))
    settings = [("cpu, 1 thread", "cpu", 1), (f"cpu, {cores} threads", "cpu", cores)]
    if torch.cuda.is_available():
        settings.append((f"cuda ({torch.cuda.get_device_name(0)})", "cuda", 1))
    rows = {}
    print("| what | " + " | ".join(s[0] for s in settings) + " | best |")
    print("|---|" + "---|" * (len(settings) + 1))
    for what, make in CASES.items():
        rates = []
        for _, device, threads in settings:
            torch.set_num_threads(threads)
            torch.manual_seed(0)
            rates.append(per_second(make(device), device, repeats=args.repeats))
        best = settings[int(np.argmax(rates))][0]
        rows[what] = dict(zip([s[0] for s in settings], rates, strict=True))
        print(f"| {what} | " + " | ".join(f"{r:,.0f}/s" for r in rates) + f" | {best} |", flush=True)
        _write(args.out, {"torch": torch.__version__, "cores": cores, "rows": rows})  # each row: a timeout keeps it


def sac(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    from rlfleet import train

    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            r = train(
                "sac", "HalfCheetah-v5", seed=seed, steps=args.steps, eval_every=args.steps, stop_return=1e9,
                eval_episodes=10, device=args.device, logdir=tmp, progress=False,
            )  # fmt: skip
            ours = time.perf_counter() - start
        print(f"seed {seed}: rlfleet {ours:.1f} s, return {r['eval_return_mean']:.0f}; SB3 now", flush=True)
        start = time.perf_counter()
        theirs_return = _sb3_sac(seed, args.steps, args.device)
        theirs = time.perf_counter() - start
        rows.append({"seed": seed, "rlfleet_s": ours, "rlfleet_return": r["eval_return_mean"], "sb3_s": theirs,
                     "sb3_return": theirs_return})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        ours = statistics.median(r["rlfleet_s"] for r in rows)
        theirs = statistics.median(r["sb3_s"] for r in rows)
        _write(args.out, {"rows": rows, "rlfleet_median_s": ours, "sb3_median_s": theirs})  # each seed's, as it ends
    print(f"median wall time: rlfleet {ours:.1f} s, SB3 {theirs:.1f} s: rlfleet {ours / theirs:.2f}x SB3's")


def _write(path: str | None, summary: dict) -> None:
    """The summary so far, to `path` (when given): rewritten after each measurement, so that a run stopped by its
    time limit keeps what it measured."""
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=2)


def _sb3_sac(seed: int, steps: int, device: str) -> float:
    """rl-zoo3's HalfCheetah SAC entry (SB3's defaults and learning_starts=10000), learner on `device`: trained for
    `steps`, then 10 greedy episodes; their mean return."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    env = make_vec_env("HalfCheetah-v5", n_envs=1, seed=seed)
    model = SAC("MlpPolicy", env, learning_starts=10_000, seed=seed, device=device, verbose=0)
    model.learn(total_timesteps=steps)
    eval_env = make_vec_env("HalfCheetah-v5", n_envs=1, seed=seed + 10_000)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    return float(mean)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    u = sub.add_parser("updates", help="updates/s on the CPU and on CUDA")
    u.add_argument("--repeats", type=int, default=5)
    u.add_argument("--out")
    s = sub.add_parser("sac", help="SAC on HalfCheetah-v5, rlfleet and SB3 on CUDA")
    s.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    s.add_argument("--steps", type=int, default=20_000)
    s.add_argument("--device", default="cuda", help="where both learners run (cpu: a rehearsal of the step)")
    s.add_argument("--out")
    args = parser.parse_args()
    {"updates": updates, "sac": sac}[args.command](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
