"""Throughput of the parallel architectures: env steps/s of A2C on data_parallel, grad_parallel, hogwild, ...,
on each backend (--backends local,ray: what Ray costs on one machine).

Each run trains `a2c` (the same algorithm config on every architecture) with --workers worker processes
for a fixed number of env steps, with no evaluation until the end (`stop_return=1e9`, `eval_every` past
the budget), one run at a time (never run other benchmarks beside it). Two figures per run:

  overall   env_steps / wall_time_s from `result.json`: worker start-up and the final evaluation included;
  steady    from the first to the last `charts/SPS` row of `metrics.csv`: the rate once every worker runs.

Atari frames/s are 4 × env steps/s (the standard frame skip). Results go to --out as JSON and a
markdown table is printed.

    python benchmarks/parallel_throughput.py --steps 200000
    python benchmarks/parallel_throughput.py --archs data_parallel,grad_parallel,async_grad --backends local,ray
    python benchmarks/parallel_throughput.py --env ALE/Pong-v5 --steps 20000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from harness import cpu_model, split_choices

from rlfleet.arch import ARCHITECTURES
from rlfleet.backends import BACKENDS
from rlfleet.launch import train
from rlfleet.run.config import ConfigError

ARCHS = ["data_parallel", "grad_parallel", "hogwild"]


def measure(arch: str, env: str, workers: int, steps: int, seed: int, backend: str = "local") -> dict:
    """One run of `steps` env steps; overall and steady-state env steps/s."""
    with tempfile.TemporaryDirectory(prefix="rlfleet-throughput-") as tmp:
        r = train("a2c", env, arch=arch, workers=workers, seed=seed, steps=steps, eval_every=10 * steps,
                  eval_episodes=1, stop_return=1e9, logdir=tmp, name="r", progress=False,
                  backend=backend).result  # fmt: skip
        rows = [line.split(",") for line in (Path(tmp) / "r" / "metrics.csv").read_text().splitlines()[1:]]
    sps = [(int(s), float(t)) for s, t, key, _ in rows if key == "charts/SPS"]
    steady = None
    if len(sps) >= 3:
        (s0, t0), (s1, t1) = sps[0], sps[-1]
        steady = (s1 - s0) / max(t1 - t0, 1e-9)
    return {
        "arch": arch,
        "backend": backend,
        "env": env,
        "workers": workers,
        "env_steps": r["env_steps"],
        "wall_time_s": r["wall_time_s"],
        "overall_sps": r["env_steps"] / r["wall_time_s"],
        "steady_sps": steady,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--archs", default=",".join(ARCHS), help=f"comma-separated, of {','.join(ARCHITECTURES)}")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backends", default="local", help="local, ray (one private Ray instance for all runs)")
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per architecture (interleaved)")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args(argv)
    args.arch_list = split_choices(parser, "--archs", args.archs, tuple(ARCHITECTURES))
    args.backend_list = split_choices(parser, "--backends", args.backends, tuple(BACKENDS))
    for flag in ("workers", "steps", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = []
    backends = args.backend_list
    if "ray" in backends:  # started once: runs use the connection this process has
        from rlfleet.backends.ray_instance import start_private_instance

        start = time.perf_counter()
        start_private_instance(args.workers)
        print(f"private Ray instance started in {time.perf_counter() - start:.1f} s", flush=True)
    for repeat in range(args.repeats):
        for arch in args.arch_list:
            for backend in backends:
                start = time.perf_counter()
                try:
                    row = measure(arch, args.env, args.workers, args.steps, seed=repeat, backend=backend)
                except ConfigError as error:  # e.g. an env or an architecture that a2c cannot run on
                    raise SystemExit(f"{arch} {backend} {args.env}: {error}") from None
                row["repeat"] = repeat
                results.append(row)
                steady = f"{row['steady_sps']:.0f}" if row["steady_sps"] else "n/a"
                took = time.perf_counter() - start
                print(f"{arch:<14} {backend:<6} {args.env}: {row['overall_sps']:.0f} steps/s overall, {steady} "
                      f"steady ({row['env_steps']} steps, {took:.1f} s)", flush=True)  # fmt: skip
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}
    frames = 4 if args.env.startswith("ALE/") else 1
    print(f"\nA2C, {args.workers} workers, {args.env}, {args.steps} env steps per run; {machine['cpu']}, "
          f"{machine['cores']} cores\n")  # fmt: skip
    print("| architecture | backend | env steps/s overall | env steps/s steady | frames/s steady |")
    print("|---|---|---|---|---|")
    for row in results:
        steady = row["steady_sps"] or row["overall_sps"]
        print(f"| {row['arch']} | {row['backend']} | {row['overall_sps']:.0f} | {steady:.0f} | {frames * steady:.0f} |")
    if args.out:
        described = {k: v for k, v in vars(args).items() if k not in ("arch_list", "backend_list")}
        Path(args.out).write_text(json.dumps({"machine": machine, "args": described, "results": results}, indent=2))


if __name__ == "__main__":
    main()
