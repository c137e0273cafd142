"""Ape-X (`--arch apex`) benchmarks: throughput by number of actors, replay shard operations, and a memory soak.

  throughput  `rlfleet train dqn --env CartPole-v1 --arch apex --actors N` for N in --actors, each run for
              --seconds of wall time, --repeats times (interleaved: N = 1, 2, 4, 8, 1, 2, ...), beside
              single-process DQN on the same env: total actor env steps/s and learner updates/s over the run
              (result.json's env_steps and updates over its wall time; learning starts after 1,000 steps).
  replay      one replay shard of --capacity CartPole-sized n-step transitions, filled, then timed per
              operation: `add` (a block of 50 with priorities), `sample` (64 with importance weights),
              `update_priorities` (64): in the calling process (serial), and as a service of the local and ray
              backends (each operation a round trip from the coordinator, as the actors and the learner call it).
  model       the costs of a scaling estimate, in one process: an actor's time per env step (acting, n-step
              building, initial priorities, sending blocks), the learner's time per update (sample, update,
              priorities back), and the actors one learner keeps up with at DQN's replay ratio.
  soak        one Ape-X DQN run on CartPole-v1 (--actors, --replay-shards, --backend) for --minutes with
              logging of resident memory (the run's processes: coordinator, actors, shards; and on ray, Ray's own
              processes) and, on ray, the object store's use (plasma MiB and objects) every --every seconds.
              Memory must stay flat: the replay is at its capacity after the first minutes, at most a fixed
              number of blocks and batches are in flight, and nothing may pile up in the object store.

Results go to --out (JSON); one benchmark at a time (never two timed runs side by side on a small machine).

    python benchmarks/apex.py throughput --out benchmarks/results/apex_throughput.json
    python benchmarks/apex.py replay --out benchmarks/results/apex_replay.json
    python benchmarks/apex.py model --out benchmarks/results/apex_model.json
    python benchmarks/apex.py soak --minutes 30 --out benchmarks/results/apex_soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import RESULTS, cpu_model

RLFLEET = [sys.executable, "-m", "rlfleet.cli"]
BLOCK, BATCH = 50, 64


def machine() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}


def save(out: Path, document: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"saved {out}", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ throughput
def timed_run(workers: int | None, seconds: float, logdir: Path, name: str) -> dict[str, float]:
    """One CartPole-v1 DQN run for `seconds` (apex with `workers` actors, or single-process with None)."""
    arch = [] if workers is None else ["--arch", "apex", "--actors", str(workers)]
    command = [*RLFLEET, "train", "dqn", "--env", "CartPole-v1", *arch, "--steps", "100000000",
               "--time-limit", f"{seconds:g}", "--stop-return", "1e9", "--eval-every", "100000000",
               "--eval-episodes", "1", "--logdir", str(logdir), "--name", name, "--no-progress"]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads((logdir / name / "result.json").read_text())
    wall = float(result["wall_time_s"])
    return {"env_steps_per_s": result["env_steps"] / wall, "updates_per_s": result["updates"] / wall, "wall_s": wall}


def throughput(args: argparse.Namespace) -> None:
    actors = [int(n) for n in args.actors.split(",")]
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for n in [None, *actors]:
                label = "single" if n is None else f"apex-{n}"
                run = timed_run(n, args.seconds, Path(tmp), f"{label}-{repeat}")
                runs.setdefault(label, []).append(run)
                print(f"{label} #{repeat}: {run['env_steps_per_s']:,.0f} env steps/s, "
                      f"{run['updates_per_s']:,.0f} updates/s", file=sys.stderr)  # fmt: skip
    summary = {
        label: {key: statistics.median(r[key] for r in rs) for key in ("env_steps_per_s", "updates_per_s")}
        for label, rs in runs.items()
    }
    save(args.out, {"machine": machine(), "seconds": args.seconds, "repeats": args.repeats, "median": summary,
                    "runs": runs})  # fmt: skip
    print("| run | env steps/s | learner updates/s |\n|---|---|---|")
    for label, s in summary.items():
        print(f"| {label} | {s['env_steps_per_s']:,.0f} | {s['updates_per_s']:,.0f} |")


# ------------------------------------------------------------------------------------------------ replay
def cartpole_block(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((BLOCK, 4), dtype=np.float32),
        "act": rng.integers(0, 2, BLOCK),
        "rew": np.ones(BLOCK, np.float32),
        "next_obs": rng.standard_normal((BLOCK, 4), dtype=np.float32),
        "terminated": np.zeros(BLOCK, np.float32),
        "discount": np.full(BLOCK, 0.99**3, np.float32),
    }


class Direct:
    """A shard called in this process (what the serial backend does, minus nothing)."""

    def __init__(self, shard):
        self.shard = shard

    def call(self, method: str, *args):
        return getattr(self.shard, method)(*args)


def time_ops(handle, capacity: int, seconds: float) -> dict[str, float]:
    """Operations/s of add, sample and update_priorities on a full shard behind `handle`."""
    rng = np.random.default_rng(0)
    block = cartpole_block(rng)
    for _ in range(capacity // BLOCK):
        handle.call("add", block, rng.random(BLOCK), 0)
    sampled = handle.call("sample", BATCH)
    ops = {
        "add": lambda: handle.call("add", block, rng.random(BLOCK), 1),
        "sample": lambda: handle.call("sample", BATCH),
        "update_priorities": lambda: handle.call("update_priorities", sampled.ids, rng.random(BATCH)),
    }
    rates = {}
    for name, op in ops.items():
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            op()
            count += 1
        rates[name] = count / (time.perf_counter() - start)
    return rates


def replay(args: argparse.Namespace) -> None:
    from rlfleet.arch.apex import ReplayShard, ShardMaker
    from rlfleet.arch.parallel import ParallelOptions
    from rlfleet.backends import make_backend

    results = {"serial": time_ops(Direct(ReplayShard(0, 0, args.capacity, 0.6)), args.capacity, args.seconds)}
    for name in ("local", "ray"):
        backend = make_backend(name, ParallelOptions(backend=name, workers=1))
        services = backend.start_services(ShardMaker(args.capacity, 0.6, 0), 1, name="replay shard")
        try:
            results[name] = time_ops(services.handles[0], args.capacity, args.seconds)
        finally:
            services.stop()
            backend.close()
    save(args.out, {"machine": machine(), "capacity": args.capacity, "block": BLOCK, "batch": BATCH,
                    "ops_per_s": results})  # fmt: skip
    print("| backend | add (blocks of 50)/s | sample (64)/s | update_priorities (64)/s |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['add']:,.0f} | {r['sample']:,.0f} | {r['update_priorities']:,.0f} |")


# ------------------------------------------------------------------------------------------------ model
def model(args: argparse.Namespace) -> None:
    """The costs the scaling estimate is made of, in this process (no transport): an actor's time per env step
    (acting ε-greedily, n-step building, initial priorities, one block sent to an in-process shard; CartPole-v1,
    the default n_envs), the learner's time per update (sample a batch from a full shard, `DQN.update`, write the
    priorities back), and from them how many actors one learner keeps up with at DQN's replay ratio."""
    import gymnasium as gym
    import torch

    from rlfleet.algos import resolve
    from rlfleet.arch.apex import Actor, ReplayShard, epsilon_ladder
    from rlfleet.arch.parallel import WorkerSpec
    from rlfleet.arch.shared import share_algo
    from rlfleet.backends.shared_memory import IN_PROCESS, WeightVersion
    from rlfleet.data.batch import Batch
    from rlfleet.data.priority import importance_weights
    from rlfleet.device import host
    from rlfleet.run.config import build_algo_config

    torch.set_num_threads(1)
    cfg, _ = build_algo_config("dqn", None, {})
    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    learner = resolve("dqn")[0](cfg, *spaces, seed=0)
    shard = ReplayShard(0, 0, args.capacity, cfg.alpha)
    spec = WorkerSpec("dqn", cfg, "CartPole-v1", *spaces, seed=0, total_steps=10**9)
    weights = WeightVersion(IN_PROCESS)
    actor = Actor(spec, share_algo(learner), weights, [Direct(shard)], epsilon_ladder(3), BLOCK, 400, 1)
    try:
        while len(shard) < args.capacity:  # fill the shard (and warm up)
            actor.produce(global_steps=0)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            steps += actor.produce(global_steps=0).steps
        actor_step_s = (time.perf_counter() - start) / steps
    finally:
        actor.close()
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        sampled = shard.sample(cfg.batch_size)
        weight = importance_weights(sampled.mass, sampled.state.min_mass, cfg.beta)  # as the learner weighs it
        out = learner.update(Batch({**sampled.data, "weight": weight}))
        shard.update_priorities(sampled.ids, host(out["priorities"]))
        updates += 1
    update_s = (time.perf_counter() - start) / updates
    ratio = cfg.gradient_steps / (cfg.train_freq * cfg.n_envs)  # updates per env step
    actors_per_learner = (1 / update_s) / (ratio / actor_step_s)
    document = {"machine": machine(), "actor_step_ms": actor_step_s * 1e3, "actor_env_steps_per_s": 1 / actor_step_s,
                "learner_update_ms": update_s * 1e3, "learner_updates_per_s": 1 / update_s,
                "updates_per_env_step": ratio, "actors_per_learner": actors_per_learner}  # fmt: skip
    save(args.out, document)
    for key, value in document.items():
        if key != "machine":
            print(f"{key}: {value:,.3f}")


# ------------------------------------------------------------------------------------------------ soak
def descendants(root: int) -> dict[int, str]:
    """{pid: name} of every live process below `root` (children, their children, ...)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
            names[int(entry.name)] = cmd
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = names[child]
                frontier.append(child)
    return found


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def kind_of(cmd: str) -> str:
    if cmd.startswith("ray::RoleActor"):
        return "actors"
    if cmd.startswith("ray::ServiceActor"):
        return "shards"
    if cmd.startswith("ray::") or "/site-packages/ray/" in cmd:
        return "ray"  # Ray's servers, raylet, agents and Python helpers (dashboard, monitors)
    return "workers"  # local backend: actor and shard processes


def plasma(ray, address: str) -> tuple[float, int]:
    from ray._private.internal_api import memory_summary

    text = memory_summary(address=address, stats_only=True)
    found = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", text)
    return (float(found[1]), int(found[2])) if found else (0.0, 0)


def soak(args: argparse.Namespace) -> None:
    from rlfleet.launch import train

    ray = address = None
    if args.backend == "ray":
        from rlfleet.backends.ray_instance import start_private_instance

        ray = start_private_instance(args.actors)
        address = ray.get_runtime_context().gcs_address
    samples: list[dict[str, Any]] = []
    done = threading.Event()
    me = os.getpid()

    def monitor() -> None:
        start = time.monotonic()
        while not done.is_set():
            row: dict[str, Any] = {"t_s": round(time.monotonic() - start, 1), "coordinator": rss_mib(me)}
            for pid, cmd in descendants(me).items():
                kind = kind_of(cmd)
                row[kind] = row.get(kind, 0.0) + rss_mib(pid)
            if ray is not None:
                row["plasma_mib"], row["plasma_objects"] = plasma(ray, address)
            samples.append(row)
            print(json.dumps(row), file=sys.stderr)
            done.wait(args.every)

    thread = threading.Thread(target=monitor, daemon=True)
    thread.start()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            result = train("dqn", "CartPole-v1", arch="apex", actors=args.actors, replay_shards=args.replay_shards,
                           backend=args.backend, steps=10**9, time_limit=args.minutes * 60, stop_return=1e9,
                           eval_every=10**9, eval_episodes=1, logdir=tmp, name="soak", progress=False)  # fmt: skip
        finally:
            done.set()
            thread.join()
            if ray is not None:
                ray.shutdown()
    steady = [s for s in samples if s["t_s"] >= args.minutes * 60 / 6]  # after the first sixth: replay full
    summary = {}
    for key in sorted({k for s in samples for k in s} - {"t_s"}):
        values = [s[key] for s in steady if key in s]
        if values:
            summary[key] = {"first": values[0], "last": values[-1], "min": min(values), "max": max(values)}
    document = {"machine": machine(), "backend": args.backend, "actors": args.actors,
                "replay_shards": args.replay_shards, "minutes": args.minutes, "env_steps": result["env_steps"],
                "updates": result["updates"], "steady_state": summary, "samples": samples}  # fmt: skip
    save(args.out, document)
    print(f"{result['env_steps']:,} env steps, {result['updates']:,} updates in {args.minutes:g} min")
    print("| what | after the first sixth | at the end | min | max |\n|---|---|---|---|---|")
    for key, s in summary.items():
        print(f"| {key} | {s['first']:,.1f} | {s['last']:,.1f} | {s['min']:,.1f} | {s['max']:,.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--actors", default="1,2,4,8")
    t.add_argument("--seconds", type=float, default=40.0)
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("--out", type=Path, default=RESULTS / "apex_throughput.json")
    r = sub.add_parser("replay")
    r.add_argument("--capacity", type=int, default=100_000)
    r.add_argument("--seconds", type=float, default=3.0)
    r.add_argument("--out", type=Path, default=RESULTS / "apex_replay.json")
    m = sub.add_parser("model")
    m.add_argument("--capacity", type=int, default=100_000)
    m.add_argument("--seconds", type=float, default=10.0)
    m.add_argument("--out", type=Path, default=RESULTS / "apex_model.json")
    s = sub.add_parser("soak")
    s.add_argument("--minutes", type=float, default=30.0)
    s.add_argument("--actors", type=int, default=3)
    s.add_argument("--replay-shards", type=int, default=2)
    s.add_argument("--backend", default="ray", choices=("local", "ray"))
    s.add_argument("--every", type=float, default=15.0, help="seconds between memory samples")
    s.add_argument("--out", type=Path, default=RESULTS / "apex_soak.json")
    args = parser.parse_args()
    {"throughput": throughput, "replay": replay, "model": model, "soak": soak}[args.what](args)


if __name__ == "__main__":
    main()
