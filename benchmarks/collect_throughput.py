"""Collection throughput: env steps/s of rlfleet's Collector (policy in the loop) against the raw vector env.

Measures, on CartPole-v1 with one torch thread:
  raw-1        one Gymnasium env, random actions
  raw-sync-8   SyncVectorEnv of 8, random actions (same-step autoreset, as rlfleet builds it)
  collect-8    rlfleet Collector filling a PPO rollout with its 64×64 MLP policy, 8 sync envs
  raw-envpool-8 / collect-envpool-8   the same on EnvPool's 8 envs (if envpool is installed)

    python benchmarks/collect_throughput.py --steps 200000 --repeats 5 --out benchmarks/results/throughput.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from harness import RESULTS

from rlfleet.algos.ppo import PPO, Config
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs import make_env, make_vector_env
from rlfleet.run.collector import Collector


def raw_single(steps: int) -> float:
    env = make_env("CartPole-v1", seed=0)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(2, size=steps)
    start = time.perf_counter()
    for a in actions:
        _, _, term, trunc, _ = env.step(int(a))
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - start)


def raw_vector(steps: int, mode: str, n_envs: int = 8) -> float:
    envs = make_vector_env("CartPole-v1", n_envs, seed=0, mode=mode)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    iters = steps // n_envs
    actions = rng.integers(2, size=(iters, n_envs))
    start = time.perf_counter()
    for a in actions:
        envs.step(a)
    elapsed = time.perf_counter() - start
    envs.close()
    return iters * n_envs / elapsed


def collect(steps: int, mode: str, n_envs: int = 8, rollout_len: int = 128) -> float:
    envs = make_vector_env("CartPole-v1", n_envs, seed=0, mode=mode)
    cfg = Config(n_envs=n_envs, rollout_len=rollout_len)
    algo = PPO(cfg, envs.single_observation_space, envs.single_action_space)
    collector = Collector(envs, algo, seed=0)
    storage = RolloutStorage(rollout_len, n_envs)
    segments = max(1, steps // (n_envs * rollout_len))
    start = time.perf_counter()
    for _ in range(segments):
        collector.collect_rollout(storage)
    elapsed = time.perf_counter() - start
    envs.close()
    return segments * n_envs * rollout_len / elapsed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per measurement (at least 8)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "throughput.json")
    args = parser.parse_args(argv)
    if args.steps < 8:  # the vector cases step 8 envs at once
        parser.error(f"--steps must be at least 8, got {args.steps}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    cases = {
        "raw-1": lambda: raw_single(args.steps),
        "raw-sync-8": lambda: raw_vector(args.steps, "sync"),
        "collect-sync-8": lambda: collect(args.steps, "sync"),
    }
    try:
        import envpool  # noqa: F401

        cases["raw-envpool-8"] = lambda: raw_vector(args.steps, "envpool")
        cases["collect-envpool-8"] = lambda: collect(args.steps, "envpool")
    except ImportError:
        pass
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):  # interleave cases so drift hits all of them alike
        for name, fn in cases.items():
            results[name].append(fn())
    medians = {name: statistics.median(v) for name, v in results.items()}
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    report = {
        "machine": {
            "cpu": cpu,
            "cores": __import__("os").cpu_count(),
            "python": platform.python_version(),
            "gymnasium": gym.__version__,
            "torch": torch.__version__,
        },
        "steps": args.steps,
        "repeats": args.repeats,
        "runs": results,
        "median": medians,
        "ratio_collect_vs_raw_sync": medians["collect-sync-8"] / medians["raw-sync-8"],
    }
    if "collect-envpool-8" in medians:
        report["ratio_collect_vs_raw_envpool"] = medians["collect-envpool-8"] / medians["raw-envpool-8"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"machine: {cpu}, {report['machine']['cores']} cores")
    print(f"{'case':<20} {'median steps/s':>15}   runs")
    for name, runs in results.items():
        print(f"{name:<20} {medians[name]:>15,.0f}   " + ", ".join(f"{r:,.0f}" for r in runs))
    print(f"collect / raw (sync 8): {report['ratio_collect_vs_raw_sync']:.2f}")
    if "ratio_collect_vs_raw_envpool" in report:
        print(f"collect / raw (envpool 8): {report['ratio_collect_vs_raw_envpool']:.2f}")


if __name__ == "__main__":
    main()
