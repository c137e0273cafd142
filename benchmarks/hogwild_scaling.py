"""Scaling of the hogwild architecture in the A3C paper's Table 2 form, and A3C throughput per worker count.

Two measurements, one run at a time (never run other benchmarks beside it):

  speedup   for each method (a3c, nstep_q, onestep_q, sarsa) and each worker count n in --workers:
            wall-clock seconds until the greedy evaluation (10 episodes, every --eval-every env steps,
            evaluation time counting) first reaches --reference on CartPole-v1; median over --seeds, a seed
            that does not reach it within --time-limit counting as --time-limit; speedup(n) = time(1) / time(n).
  throughput  steady env steps/s of a3c with n workers over a fixed number of env steps (no evaluation until
            the end; the median of the per-row rates after the first, so the workers' start-up stays out), on
            CartPole-v1 and, with --pong, frames/s on ALE/Pong-v5 (4 frames per env step);
            scaling(n) = throughput(n) / throughput(1).

Results go to --out (default benchmarks/results/hogwild_scaling.json): written anew; with --only, an existing
file keeps the other table and this session replaces its own.

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

from harness import RESULTS, cpu_model, split_choices

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


def speedup_row(runs: list[dict], limit: float) -> dict:
    """A (method, workers) case of the speedup table: the median time over every seed, a seed that did not reach
    the reference within ``limit`` counting as ``limit`` (as in time_to_solve.py: the time limit is checked at each
    evaluation, and one that ends past it does not count), and how many seeds reached it in time."""
    solved = [r["solved"] and r["seconds"] is not None and r["seconds"] <= limit for r in runs]
    times = [r["seconds"] if ok else limit for r, ok in zip(runs, solved, strict=True)]
    return {"runs": runs, "median_s": median(times), "solved": sum(solved)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the default")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--reference", type=float, default=475.0, help="reference score (CartPole-v1 return)")
    parser.add_argument("--eval-every", type=int, default=5_000)
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per run at most")
    parser.add_argument("--throughput-steps", type=int, default=100_000)
    parser.add_argument("--pong", action="store_true", help="also measure frames/s on ALE/Pong-v5")
    parser.add_argument("--pong-steps", type=int, default=6_000)
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per case")
    parser.add_argument(
        "--only", choices=["speedup", "throughput"], help="one table: an existing --out keeps the other one"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "hogwild_scaling.json")
    args = parser.parse_args(argv)
    try:
        args.worker_counts = [int(w) for w in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers: expected comma-separated worker counts, got {args.workers!r}")
    if min(args.worker_counts) < 1:
        parser.error(f"--workers: worker counts must be at least 1, got {args.workers!r}")
    args.method_list = split_choices(parser, "--methods", args.methods, tuple(METHODS))
    for flag in ("seeds", "eval_every", "throughput_steps", "pong_steps", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if not 0 < args.time_limit < float("inf"):
        parser.error(f"--time-limit must be a positive number of seconds, got {args.time_limit:g}")
    return args


def start_document(args: argparse.Namespace) -> dict:
    """The results document. With ``--only``, an existing ``--out`` is kept but for that table, which this session
    replaces, with its own ``<table>_started``, ``<table>_args`` and ``<table>_machine``; else a new one."""
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    described = {k: str(v) for k, v in vars(args).items() if k not in ("worker_counts", "method_list")}
    if args.only is not None and args.out.exists():
        out = json.loads(args.out.read_text())
        out[args.only] = {}
        out.update({f"{args.only}_started": started, f"{args.only}_args": described, f"{args.only}_machine": machine})
        out.setdefault("speedup", {})
        out.setdefault("throughput", {})
        return out
    return {"machine": machine, "started": started, "args": described, "speedup": {}, "throughput": {}}


def main() -> None:
    args = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workers = args.worker_counts
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = start_document(args)

    if args.only in (None, "speedup"):
        for algo in args.method_list:
            out["speedup"][algo] = {}
            for n in workers:
                runs = [
                    time_to_reference(algo, n, seed, args.reference, args.eval_every, args.time_limit)
                    for seed in range(args.seeds)
                ]
                row = out["speedup"][algo][n] = speedup_row(runs, args.time_limit)
                print(f"{algo:<10} workers={n}: median {row['median_s']:.1f} s over {len(runs)} seeds, "
                      f"{row['solved']} solved (the others count as {args.time_limit:g} s)")  # fmt: skip
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
        base = (by_n.get(1) or by_n.get("1") or {}).get("median_s")  # "1" in a table read back from --out
        for n, row in by_n.items():
            ratio = f"{base / row['median_s']:.2f}x" if base and row["median_s"] else "n/a"
            print(f"| {algo} | {n} | {row['median_s']} | {row['solved']}/{len(row['runs'])} | {ratio} |")
    for env, by_n in out["throughput"].items():
        base = (by_n.get(1) or by_n.get("1") or {}).get("median")
        for n, row in by_n.items():
            ratio = f"{row['median'] / base:.2f}x" if base else "n/a"
            print(f"| {env} | {n} | {row['median']:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
