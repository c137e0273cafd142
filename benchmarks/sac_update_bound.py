"""How close SAC's update (the `mujoco` preset on HalfCheetah-v5's sizes: 17-dim observations, 6-dim actions,
256-256 networks, minibatch 256) runs to this CPU's matrix-product speed, on one torch thread.

Prints the update's median time over 5 × 100 updates, its multiply-add count (counted layer by layer below), the
GFLOP/s that makes, and the time the same arithmetic would take at the speed of one square 256×256 product.

    OMP_NUM_THREADS=1 python benchmarks/sac_update_bound.py
"""

from __future__ import annotations

import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from rlfleet.algos.sac import PRESETS, SAC, Config
from rlfleet.data.batch import Batch

OBS, ACT = 17, 6


def timed(fn, repeats: int, inner: int) -> float:
    """Median seconds per call of `fn` over `repeats` rounds of `inner` calls."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        runs.append((time.perf_counter() - start) / inner)
    return statistics.median(runs)


def update_macs(hidden: int, batch: int) -> int:
    """Multiply-adds of one update: per network, a forward is 1 pass, a backward with weight gradients 2 more,
    a backward with input gradients only 1 more."""
    critic = sum(i * o for i, o in [(OBS + ACT, hidden), (hidden, hidden), (hidden, 1)]) * 2  # twin critics
    actor = sum(i * o for i, o in [(OBS, hidden), (hidden, hidden), (hidden, 2 * ACT)])
    return batch * (
        actor * 2  # the actor samples on s and s'
        + critic  # target critics on s'
        + critic * 3  # critics forward and backward
        + critic * 2  # critics on π(s): forward, and input gradients only
        + actor * 2  # the actor's backward (the s half)
        + actor  # α's step: the actor on s
    )


def main() -> None:
    torch.set_num_threads(1)
    cfg = Config(**PRESETS["mujoco"])
    algo = SAC(cfg, gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32), gym.spaces.Box(-1, 1, (ACT,), np.float32))
    b, rng = cfg.batch_size, np.random.default_rng(0)
    batch = Batch(
        obs=rng.standard_normal((b, OBS)).astype(np.float32),
        act=rng.uniform(-1, 1, (b, ACT)).astype(np.float32),
        rew=rng.standard_normal(b).astype(np.float32),
        next_obs=rng.standard_normal((b, OBS)).astype(np.float32),
        terminated=np.zeros(b, np.float32),
        discount=np.full(b, cfg.gamma, np.float32),
        weight=np.ones(b, np.float32),
    )
    timed(lambda: algo.update(batch), 1, 20)  # warm-up
    update_s = timed(lambda: algo.update(batch), 5, 100)
    gflop = 2 * update_macs(cfg.hidden[0], b) / 1e9
    h = cfg.hidden[0]
    x, w = torch.randn(b, h), torch.randn(h, h)
    timed(lambda: x @ w, 1, 50)
    matmul_s = timed(lambda: x @ w, 5, 400)
    peak = 2 * b * h * h / matmul_s / 1e9
    print(f"SAC update (hidden {cfg.hidden}, batch {b}): {update_s * 1e3:.2f} ms for {gflop:.3f} GFLOP")
    print(f"  = {gflop / update_s:.1f} GFLOP/s")
    print(f"one {b}x{h} @ {h}x{h} product: {matmul_s * 1e6:.0f} us = {peak:.1f} GFLOP/s")
    print(f"  the update's arithmetic at that speed: {gflop / peak * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
