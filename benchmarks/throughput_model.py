"""A throughput model for many machines, from the measured costs of one worker and of the learner.

For each architecture the script builds the real runner (nothing is started) and times, in this process with
one torch thread, what each side does per item:

  worker   `produce` of its role (a sampler's segment, a gradient worker's segment and gradient): env steps per
           item and seconds per item, so a worker alone makes `actor_sps` env steps/s;
  learner  what the coordinator does with one item (`learn_segment`: A2C's update; `step`: the summed
           gradient's optimizer step), so the learner can take `learner_sps` env steps/s;
  bytes    what crosses the network per item: the pickled item up, the published weights down (a worker gets
           a new version before each item when the learner steps per item).

With W workers on W machines and a learner NIC of `--gbit` Gbit/s, the model's env steps/s is

    min(W × steps_per_item / (worker_s + rtt + learner_s),  learner_sps,  bandwidth / bytes_per_env_step)

A worker has one credit: its next item starts once the learner has used its last one, so its cycle is its own
time, a round trip of the call (`--rtt-ms`, default 3 ms: a Ray call on one machine, `weight_publish.py`'s
100-parameter row) and the learner's time for its item; workers never wait for one another. The printed table
says which term binds at W = 2 ... 256.

    python benchmarks/throughput_model.py --out benchmarks/results/throughput_model.json
    python benchmarks/throughput_model.py --env ALE/Pong-v5 --items 20
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from harness import cpu_model

from rlfleet.arch.data_parallel import Sampler
from rlfleet.arch.grad_parallel import GradientWorker
from rlfleet.launch import _runner
from rlfleet.run.config import RunConfig

WORKERS = [2, 16, 64, 256]
ROLES = {"data_parallel": Sampler, "grad_parallel": GradientWorker}


def costs(arch: str, env: str, items: int) -> dict:
    """Seconds and bytes per item on each side, measured on the real runner and role."""
    with tempfile.TemporaryDirectory(prefix="rlfleet-model-") as tmp:
        opts = {"workers": 1, "backend": "serial"} | ({"grad_sets": 1} if arch == "grad_parallel" else {})
        cfg = RunConfig(algo="a2c", env=env, arch=arch, logdir=tmp, progress=False, options=opts)
        runner = _runner(cfg)(cfg)
        role = ROLES[arch](runner.spec, runner.shared, runner.weights, 0)
        stop = runner.backend.stop_flag()
        worker_s, learner_s, steps, sizes = [], [], [], []
        for i in range(items + 2):  # the first two warm up
            start = time.perf_counter()
            item = role.produce(runner.env_steps, stop)
            produced = time.perf_counter() - start
            start = time.perf_counter()
            if arch == "data_parallel":
                runner.learn_segment(item)
            else:
                runner.take([item])
                runner.step([item])
            learned = time.perf_counter() - start
            if i >= 2:
                worker_s.append(produced)
                learner_s.append(learned)
                steps.append(item.steps)
                sizes.append(len(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)))
        params = sum(v.numel() for m in runner.shared.values() for v in m.state_dict().values())
        role.close()
        runner.eval_envs.close()
    per_item = statistics.median(steps)
    return {
        "arch": arch,
        "env": env,
        "params": params,
        "steps_per_item": per_item,
        "worker_s_per_item": statistics.median(worker_s),
        "learner_s_per_item": statistics.median(learner_s),
        "item_bytes": statistics.median(sizes),
        "weights_bytes": 4 * params,
        "actor_sps": per_item / statistics.median(worker_s),
        "learner_sps": per_item / statistics.median(learner_s),
    }


def model(row: dict, workers: int, gbit: float, rtt_s: float) -> tuple[float, str]:
    """Env steps/s with `workers` workers and what limits it."""
    bandwidth = gbit * 1e9 / 8
    network_sps = bandwidth / ((row["item_bytes"] + row["weights_bytes"]) / row["steps_per_item"])
    cycle = row["worker_s_per_item"] + rtt_s + row["learner_s_per_item"]
    terms = {"workers": workers * row["steps_per_item"] / cycle, "learner": row["learner_sps"], "network": network_sps}
    bound = min(terms, key=terms.get)
    return terms[bound], bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--archs", default="data_parallel,grad_parallel")
    parser.add_argument("--items", type=int, default=50, help="items timed per architecture")
    parser.add_argument("--gbit", type=float, default=10.0, help="the learner's network, Gbit/s")
    parser.add_argument("--rtt-ms", type=float, default=3.0, help="round trip of one call, ms")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = [costs(arch, args.env, args.items) for arch in args.archs.split(",")]
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}
    print(f"\nA2C on {args.env}; {machine['cpu']}; one torch thread; learner network {args.gbit:g} Gbit/s; "
          f"call round trip {args.rtt_ms:g} ms\n")  # fmt: skip
    print("| architecture | params | env steps per item | worker ms/item | learner ms/item | item KB | weights KB "
          "| one worker env steps/s | learner env steps/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arch']} | {r['params']:,} | {r['steps_per_item']:.0f} | {1e3 * r['worker_s_per_item']:.2f} | "
              f"{1e3 * r['learner_s_per_item']:.2f} | {r['item_bytes'] / 1e3:.1f} | {r['weights_bytes'] / 1e3:.1f} | "
              f"{r['actor_sps']:,.0f} | {r['learner_sps']:,.0f} |")  # fmt: skip
    print("\n| architecture | " + " | ".join(f"W = {w}" for w in WORKERS) + " |")
    print("|---|" + "---|" * len(WORKERS))
    for r in rows:
        cells = []
        for w in WORKERS:
            sps, bound = model(r, w, args.gbit, args.rtt_ms / 1e3)
            cells.append(f"{sps:,.0f} ({bound})")
        print(f"| {r['arch']} | " + " | ".join(cells) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine, "args": vars(args), "costs": rows}, indent=2))


if __name__ == "__main__":
    main()
