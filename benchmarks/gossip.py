"""Gossip learners (`--arch gossip`) against single-process A2C and A3C: time and env steps to solve CartPole-v1,
and the share of time the learners spend averaging.

Runs, one at a time, interleaved within each seed (a2c, a3c, gala-K, local-pala-K and pala-K for K in
--learners, then the next seed): `rlfleet train a2c --env CartPole-v1 [--arch hogwild | --arch gossip
--learners K --gossip-order O [--backend ray --address A --placement node0,node1]] --seed S --eval-every E
--time-limit T`, each a process of its own (start-up excluded: rlfleet's clock starts with training; the
learners' own start-up is inside it). GALA (`gala-K`): learner processes on this machine (`local`) in GALA's
order (`--gossip-order gala`, the default staleness bound). `local-pala-K`: the same processes in PALA's
order (every round's own messages), which isolates what the order costs. PALA: learners as Ray actors on a simulated
2-node Ray cluster (`ray.cluster_utils.Cluster`, both nodes on 127.0.0.1, token authentication on) started
once by this script, half the learners on each node. Solved: the first greedy evaluation (10 episodes of the
averaged model) with mean return >= 475. From each gossip run's `metrics.csv`: the mean over its log lines of
`gossip/compute_share`, `gossip/wait_share` and `gossip/average_share` (time computing, waiting for peers and
posting/averaging parameters, over the learners), `gossip/skip_share` (rounds that mixed nothing) and
`gossip/staleness` (rounds the mixed messages were behind); frames/s is env steps over wall time. With
`--throughput` every run takes exactly --steps env steps (no stop at the solved return, no evaluation): frames/s
of the learners alone, and the median `charts/SPS` of its log lines after the first.

    python benchmarks/gossip.py --seeds 5 --out benchmarks/results/gossip.json
    python benchmarks/gossip.py --configs gala-4,local-pala-4,gala-8,local-pala-8 \
        --out benchmarks/results/gossip_order.json
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
from pathlib import Path
from typing import Any

from harness import RESULTS, counts, cpu_model

RLFLEET = [sys.executable, "-m", "rlfleet.cli"]
SHARES = ("compute", "wait", "average")
CONFIG = re.compile(r"a2c|a3c|(gala|local-pala|pala)-[0-9]+")
"""The runs `--configs` names: a2c, a3c, and gossip with K learners (on one machine, or pala-K on two nodes)."""
EXTRA = ("skip_share", "staleness")


def run(config: str, seed: int, args: argparse.Namespace, address: str | None, logdir: Path) -> dict[str, Any]:
    """One run of `config` (a2c, a3c, gala-K, pala-K); its result.json fields and the gossip shares."""
    arch: list[str] = []
    if config == "a3c":
        arch = ["--arch", "hogwild"]
    elif config.startswith(("gala-", "pala-", "local-pala-")):
        order = "gala" if config.startswith("gala-") else "pala"
        arch = ["--arch", "gossip", "--learners", config.split("-")[-1], "--gossip-order", order]
        if config.startswith("pala-"):
            arch += ["--backend", "ray", "--address", address, "--placement", "node0,node1"]
    name = f"{config}-seed{seed}"
    algo = "a3c" if config == "a3c" else "a2c"
    command = [*RLFLEET, "train", algo, "--env", "CartPole-v1", *arch, "--seed", str(seed),
               "--steps", str(args.steps), "--eval-every", str(args.eval_every), "--time-limit", f"{args.time_limit:g}",
               "--logdir", str(logdir), "--name", name, "--no-progress"]  # fmt: skip
    if args.throughput:
        command += ["--stop-return", "inf", "--eval-every", str(10 * args.steps)]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    record: dict[str, Any] = {"config": config, "seed": seed}
    if done.returncode != 0:
        return {**record, "solved": False, "error": done.stderr[-2000:]}
    result = json.loads((logdir / name / "result.json").read_text())
    record.update(solved=bool(result["solved"]), solved_at_s=result["solved_at_s"],
                  solved_at_step=result["solved_at_step"], env_steps=result["env_steps"],
                  wall_time_s=result["wall_time_s"], fps=result["env_steps"] / result["wall_time_s"])  # fmt: skip
    if arch and arch[1] == "gossip":
        keys = {f"gossip/{share}_share": share for share in SHARES} | {f"gossip/{key}": key for key in EXTRA}
        keys["charts/SPS"] = "sps"
        values: dict[str, list[float]] = {key: [] for key in keys.values()}
        for line in (logdir / name / "metrics.csv").read_text().splitlines()[1:]:
            _, _, key, value = line.split(",")
            if key in keys:
                values[keys[key]].append(float(value))
        sps = values.pop("sps")[1:]  # the first line's window holds the learners' start
        record["sps"] = statistics.median(sps) if sps else None
        record["shares"] = {key: statistics.mean(v) for key, v in values.items() if v}
    return record


def summarize(runs: list[dict[str, Any]], configs: list[str], limit: float) -> str:
    lines = ["| run | median time to solve (s) | min–max (s) | median env steps | solved | frames/s (SPS) | "
             "averaging share | waiting share | rounds mixing nothing | staleness (rounds) |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for config in configs:
        rs = [r for r in runs if r["config"] == config]
        if not rs:
            continue
        times = [r["solved_at_s"] if r["solved"] else limit for r in rs]
        steps = [r["solved_at_step"] for r in rs if r["solved"]]
        shares = [r["shares"] for r in rs if r.get("shares")]

        def median(key: str, form: str, shares=shares) -> str:
            values = [s[key] for s in shares if key in s]
            return format(statistics.median(values), form) if values else "–"

        fps = [r["fps"] for r in rs if "fps" in r]
        sps = [r["sps"] for r in rs if r.get("sps")]
        fps_text = f"{statistics.median(fps):,.0f}" if fps else "–"
        fps_text += f" ({statistics.median(sps):,.0f})" if sps else ""
        tail = (f"{fps_text} | {median('average', '.1%')} | {median('wait', '.1%')} | {median('skip_share', '.1%')} | "
                f"{median('staleness', '.2f')} |")  # fmt: skip
        lines.append(f"| {config} | {statistics.median(times):.1f} | {min(times):.1f}–{max(times):.1f} | "
                     f"{statistics.median(steps):,.0f} | {len(steps)}/{len(rs)} | {tail}"
                     if steps else f"| {config} | – | – | – | 0/{len(rs)} | {tail}")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, with `config_list` (the runs, in order) and `ks` (their learner counts) added."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learners", default="2,4,8", help="K of GALA and PALA, comma-separated")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=500_000, help="budget of each run (env steps)")
    parser.add_argument("--eval-every", type=int, default=4_000)
    parser.add_argument("--time-limit", type=float, default=180.0, help="wall-clock s per run")
    parser.add_argument("--no-pala", action="store_true", help="skip the Ray runs")
    parser.add_argument("--throughput", action="store_true", help="exactly --steps per run: frames/s, no solving")
    parser.add_argument("--configs", default=None, help="only these runs, comma-separated (e.g. gala-4,local-pala-4)")
    parser.add_argument("--out", type=Path, default=RESULTS / "gossip.json")
    args = parser.parse_args(argv)
    ks = counts(parser, "--learners", args.learners, least=2)  # a gossip needs peers
    configs = ["a2c", "a3c", *(f"gala-{k}" for k in ks), *(f"local-pala-{k}" for k in ks),
               *([] if args.no_pala else [f"pala-{k}" for k in ks])]  # fmt: skip
    if args.configs:
        configs = args.configs.split(",")
        unknown = [c for c in configs if not CONFIG.fullmatch(c) or (c[0] != "a" and int(c.split("-")[-1]) < 2)]
        if unknown:
            parser.error(f"--configs: unknown {', '.join(map(repr, unknown))}; runs are a2c, a3c, gala-K, "
                         "local-pala-K and pala-K (K >= 2 learners)")  # fmt: skip
        args.no_pala = not any(c.startswith("pala-") for c in configs)
    args.config_list = configs
    args.ks = [int(c.split("-")[-1]) for c in configs if c[0] != "a"] or [2]
    return args


def main() -> None:
    args = parse_args()
    configs = args.config_list
    cluster = None
    if not args.no_pala:
        os.environ.update(RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")  # before ray's import
        from ray.cluster_utils import Cluster

        from rlfleet.backends.ray_instance import system_config

        cpus = max(args.ks) // 2 + 1  # learners reserve a CPU each: half of the largest K per node (oversubscribed)
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": cpus, "resources": {"node0": 8}, "_system_config": system_config()},
        )
        cluster.add_node(num_cpus=cpus, resources={"node1": 8})
        cluster.wait_for_nodes()
    runs: list[dict[str, Any]] = []
    document = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()},
                "config": {k: str(v) for k, v in vars(args).items()}, "runs": runs}  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for seed in range(args.seeds):
                for config in configs:
                    record = run(config, seed, args, cluster.address if cluster else None, Path(tmp))
                    runs.append(record)
                    print(json.dumps({k: v for k, v in record.items() if k != "error"}), file=sys.stderr)
                    if "error" in record:
                        print(record["error"], file=sys.stderr)
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps(document, indent=1) + "\n")
    finally:
        if cluster is not None:
            cluster.shutdown()
    table = summarize(runs, configs, args.time_limit)
    document["table"] = table
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(table)


if __name__ == "__main__":
    main()
