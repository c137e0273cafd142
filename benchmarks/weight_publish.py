"""Time to publish weights of 10^4 to 10^7 parameters through each backend, measured end to end.

One role (`Probe`) with a local network of N float32 parameters. Each trial the coordinator changes the
published network in place (a new version, as a learner's step does), gives the role its credit and waits
for its next item; the role copies the newest weights into its own network (`weights.read(copy)`, as every
sampler and gradient worker does) and answers with the version it got. The time from the new version to the
answer is what a worker waits for fresh weights:

  serial  the role copies from the coordinator's own tensors (one memcpy);
  local   the worker process copies from shared memory (one memcpy) and answers through its pipe;
  ray     the coordinator puts the state into the object store (once per version), the actor's call
          carries it, the actor loads it into its replica and the role copies it (two memcpys) and answers.

The row of 100 parameters is the round trip itself. Median of --trials per size, one backend at a time
(never run other benchmarks beside it).

    python benchmarks/weight_publish.py --out benchmarks/results/weight_publish.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import torch
from harness import cpu_model, split_choices

from rlfleet.arch.parallel import ParallelOptions
from rlfleet.backends import BACKENDS, make_backend

SIZES = [100, 10_000, 100_000, 1_000_000, 10_000_000]


class Probe:
    """A role whose item is the weight version it copied into its own network."""

    def __init__(self, size: int, shared, weights, worker_id: int, incarnation: int):
        self.shared, self.weights = shared, weights
        self.local = torch.zeros(size)

    def produce(self, global_steps, stop):
        return self.weights.read(lambda: self.local.copy_(self.shared["net"].weight.view(-1)), stop)

    def close(self) -> None:
        pass


def measure(backend_name: str, size: int, trials: int) -> list[float]:
    backend = make_backend(backend_name, ParallelOptions(backend=backend_name, workers=1))
    net = torch.nn.Linear(size, 1, bias=False)
    net.weight.requires_grad_(False)
    shared = backend.share({"net": net})
    weights, counter, stop = backend.weight_version(), backend.step_counter(1), backend.stop_flag()
    group = backend.start(partial(Probe, size, shared, weights), 1, counter, stop, total_steps=1, credits=1)
    times = []
    try:
        assert group.get(0, 120) == 0
        for _ in range(trials + 1):  # the first is a warm-up
            with weights.writing():
                shared["net"].weight.add_(1.0)
            start = time.perf_counter()
            group.release(0, group.incarnations[0])
            version = group.get(0, 120)
            times.append(time.perf_counter() - start)
            assert version == weights.version, (version, weights.version)
    finally:
        stop.set()
        group.stop()
        backend.close()
    return times[1:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="serial,local,ray")
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.backend_list = split_choices(parser, "--backends", args.backends, tuple(BACKENDS))
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, got {args.trials}")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    results = []
    backends = args.backend_list
    if "ray" in backends:  # one private instance for every size (runs use the connection this process has)
        from rlfleet.backends.ray_instance import start_private_instance

        start_private_instance(2)
    for backend in backends:
        for size in SIZES:
            times = measure(backend, size, args.trials)
            row = {"backend": backend, "params": size, "median_ms": 1e3 * statistics.median(times),
                   "min_ms": 1e3 * min(times), "max_ms": 1e3 * max(times), "trials": len(times)}  # fmt: skip
            results.append(row)
            print(f"{backend:<7} {size:>10,} params: {row['median_ms']:8.2f} ms median "
                  f"({row['min_ms']:.2f}-{row['max_ms']:.2f})", flush=True)  # fmt: skip
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}
    print(f"\n{machine['cpu']}, {machine['cores']} cores; median of {args.trials} trials, ms\n")
    print("| parameters | " + " | ".join(backends) + " |")
    print("|---|" + "---|" * len(backends))
    for size in SIZES:
        row = {r["backend"]: r for r in results if r["params"] == size}
        cells = [f"{row[b]['median_ms']:.2f}" for b in backends]
        print(f"| {size:,} | " + " | ".join(cells) + " |")
    if args.out:
        described = {k: v for k, v in vars(args).items() if k != "backend_list"}
        Path(args.out).write_text(json.dumps({"machine": machine, "args": described, "results": results}, indent=2))


if __name__ == "__main__":
    main()
