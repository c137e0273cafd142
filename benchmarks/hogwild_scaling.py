"""Scaling of the hogwild architecture in the A3C paper's Table 2 form, and A3C throughput per worker count.

Two measurements, one run at a time (never run other benchmarks beside it):

  speedup   for each method (a3c, nstep_q, onestep_q, sarsa) and each worker count n in --workers:
            wall-clock seconds until the greedy evaluation (10 episodes, every --eval-every env steps,
            evaluation time counting) first reaches --reference on CartPole-v1; median over --seeds;
            speedup(n) = time(1) / time(n).
  throughput  steady env steps/s of a3c with n workers over a fixed number of env steps (no evaluation until
            the end; the median of the per-row rates after the first, so the workers' start-up stays out), on
            CartPole-v1 and, with --pong, frames/s on ALE/Pong-v5 (4 frames per env step);
            scaling(n) = throughput(n) / throughput(1).

    python benchmarks/hogwild_scaling.py --workers 1,2 --seeds 3 --out benchmarks/results/hogwild_scaling.json
    python benchmarks/hogwild_scaling.py --only throughput --pong --workers 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from harness import cpu_model

from rlfleet.launch import train

METHODS = ["a3c", "nstep_q", "onestep_q", "sarsa"]
BUDGET = {"a3c": 400_000, "nstep_q": 800_000, "onestep_q": 800_000, "sarsa": 1_000_000}


def time_to_reference(algo: str, workers: int, seed: int, reference: float, eval_every: int, limit: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="rlfleet-scaling-") as tmp:
        r = train(algo, "CartPole-v1", arch="hogwild", workers=workers, seed=seed, steps=BUDGET[algo],
                  eval_every=eval_every, eval_episodes=10, stop_return=reference, time_limit=limit,
                  logdir=tmp, name="r", progress=False).result  # fmt: skip
    return {"solved": r["solved"], "seconds": r["solved_at_s"], "steps": r["solved_at_step"]}


def throughput(env: str, workers: int, steps: int, seed: int = 0) -> float:
    """Steady env steps/s of a3c with `workers` workers: the median of the run's `charts/SPS` rows after the first
    (each row's rate since the one before), so that the workers' start-up, which staggers when many processes import
    torch at once, counts in one or two rows rather than in the whole window; over a run too short for three rows,
    its env steps over its wall time."""
    with tempfile.TemporaryDirectory(prefix="rlfleet-scaling-") as tmp:
        r = train("a3c", env, arch="hogwild", workers=workers, seed=seed, steps=steps, eval_every=10 * steps,
                  eval_episodes=1, stop_return=1e9, logdir=tmp, name="r", progress=False).result  # fmt: skip
        rows = [line.split(",") for line in (Path(tmp) / "r" / "metrics.csv").read_text().splitlines()[1:]]
    sps = [float(value) for _, _, key, value in rows if key == "charts/SPS"]
    if len(sps) >= 3:
        return statistics.median(sps[1:])
    return r["env_steps"] / r["wall_time_s"]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--reference", type=float, default=475.0, help="reference score (CartPole-v1 return)")
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per run at most")
    parser.add_argument("--throughput-steps", type=int, default=100_000)
    parser.add_argument("--pong", action="store_true", help="also measure frames/s on ALE/Pong-v5")
    parser.add_argument("--pong-steps", type=int, default=6_000)
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per case")
    parser.add_argument("--only", choices=["speedup", "throughput"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/hogwild_scaling.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workers = [int(w) for w in args.workers.split(",")]
    out: dict = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "args": {k: str(v) for k, v in vars(args).items()},
        "speedup": {},
        "throughput": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    if args.only in (None, "speedup"):
        for algo in args.methods.split(","):
            out["speedup"][algo] = {}
            for n in workers:
                runs = [
                    time_to_reference(algo, n, seed, args.reference, args.eval_every, args.time_limit)
                    for seed in range(args.seeds)
                ]
                times = [r["seconds"] for r in runs if r["solved"]]
                out["speedup"][algo][n] = {"runs": runs, "median_s": median(times), "solved": len(times)}
                print(f"{algo:<10} workers={n}: median {median(times)} s over {len(times)}/{len(runs)} solved")
                args.out.write_text(json.dumps(out, indent=2))
    if args.only in (None, "throughput"):
        cases = [("CartPole-v1", args.throughput_steps, 1)] + (
            [("ALE/Pong-v5", args.pong_steps, 4)] if args.pong else []
        )
        for env, steps, frames in cases:
            out["throughput"][env] = {}
            for n in workers:
                runs = [throughput(env, n, steps, seed=r) * frames for r in range(args.repeats)]
                out["throughput"][env][n] = {"runs": runs, "median": median(runs), "unit": "frames/s"}
                print(f"{env:<12} workers={n}: {median(runs):,.0f} frames/s (runs {[round(r) for r in runs]})")
                args.out.write_text(json.dumps(out, indent=2))
    print_table(out)
    args.out.write_text(json.dumps(out, indent=2))


def print_table(out: dict) -> None:
    for algo, by_n in out["speedup"].items():
        base = by_n.get(1, {}).get("median_s")
        for n, row in by_n.items():
            ratio = f"{base / row['median_s']:.2f}x" if base and row["median_s"] else "n/a"
            print(f"| {algo} | {n} | {row['median_s']} | {row['solved']}/{len(row['runs'])} | {ratio} |")
    for env, by_n in out["throughput"].items():
        base = by_n.get(1, {}).get("median")
        for n, row in by_n.items():
            ratio = f"{row['median'] / base:.2f}x" if base else "n/a"
            print(f"| {env} | {n} | {row['median']:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
