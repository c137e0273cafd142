"""Time-to-solve CartPole-v1, Pendulum-v1 and MountainCarContinuous-v0: rlfleet side by side with Stable-Baselines3
and Tianshou.

Creates (or reuses) the peers' venv, then runs one process per (framework, algo, env, seed), never two at
once, interleaving the frameworks within each seed so that drift in the machine's speed affects them all
alike. Each algorithm is timed on its own env (``env_for``: Pendulum-v1 for ddpg, td3 and sac, CartPole-v1
for the others) unless ``--env`` names one. Raw results are saved to ``--out`` (JSON) after every run;
``--resume`` continues the file's benchmark, with its options: it skips the runs already there and reruns the
failed ones. The summary table is printed and written next to it as markdown. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from harness import (
    FRAMEWORKS,
    RESULTS,
    add_peer_options,
    exit_on_signals,
    finish,
    log,
    machine_line,
    open_results,
    run_runner,
    runner_python,
    save,
    split_choices,
    start,
)
from peers.common import (
    ALGOS_BY_ENV,
    CONTINUOUS_ENV_ID,
    DEFAULT_TIME_LIMIT_S,
    ENV_ID,
    ENV_IDS,
    EVAL_EPISODES,
    EVAL_EVERY_STEPS,
    SOLVED_RETURN,
    SOLVED_RETURNS,
    SPARSE_ENV_ID,
    env_for,
)

DEFAULT_ALGOS = {
    ENV_ID: ("ppo", "a2c", "dqn", "pg", "a3c"),
    CONTINUOUS_ENV_ID: ("sac", "td3", "ddpg", "ppo"),
    SPARSE_ENV_ID: ("td3", "sac", "ppo"),
}
"""``--algos``' default: with ``--env``, that env's; without, CartPole-v1's (each algorithm on its own env)."""
UNSUPPORTED = {
    ("sb3", "pg", ENV_ID),  # SB3 has no vanilla policy gradient
    ("sb3", "a3c", ENV_ID),  # a3c (hogwild A2C) is rlfleet's only
    ("tianshou", "a3c", ENV_ID),
    ("sb3", "apex-dqn", ENV_ID),  # Ape-X: rlfleet's only (RLlib dropped it)
    ("tianshou", "apex-dqn", ENV_ID),
    ("sb3", "apex-td3", CONTINUOUS_ENV_ID),
    ("tianshou", "apex-td3", CONTINUOUS_ENV_ID),
    ("sb3", "a2c", CONTINUOUS_ENV_ID),  # no Pendulum-v1 settings in the peer runners
    ("sb3", "a3c", CONTINUOUS_ENV_ID),
    ("tianshou", "a2c", CONTINUOUS_ENV_ID),
    ("tianshou", "a3c", CONTINUOUS_ENV_ID),
    ("tianshou", "td3", SPARSE_ENV_ID),  # rl-zoo3's entries are the reference on MountainCarContinuous-v0
    ("tianshou", "sac", SPARSE_ENV_ID),
    ("tianshou", "ppo", SPARSE_ENV_ID),
}
"""(framework, algo, env) with no implementation in that framework or no settings in its runner: reported as
n/a, never run. Every (algo, env) of ``ALGOS_BY_ENV`` not listed here is run by every framework."""
RUN_GRACE_S = 300.0
"""A runner is killed after time limit + this (imports, construction, the last evaluation)."""
DEFAULT_SEEDS = 5
ALGOS = tuple(dict.fromkeys(algo for env in ENV_IDS for algo in ALGOS_BY_ENV[env]))
"""Every algorithm that can be timed, on some env."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_algos = "; ".join(f"{env}: {','.join(algos)}" for env, algos in DEFAULT_ALGOS.items())
    parser.add_argument(
        "--env",
        choices=ENV_IDS,
        default=argparse.SUPPRESS,
        help="time every algo on this env (default: each on its own)",
    )
    parser.add_argument("--algos", help=f"comma-separated (default, by --env: {default_algos})")
    parser.add_argument("--frameworks", help=f"comma-separated, run in this order (default {','.join(FRAMEWORKS)})")
    parser.add_argument("--seeds", type=int, help=f"number of seeds: 0 .. N-1 (default {DEFAULT_SEEDS})")
    parser.add_argument("--time-limit", type=float, help=f"wall-clock s per run (default {DEFAULT_TIME_LIMIT_S:g})")
    parser.add_argument(
        "--out",
        type=Path,
        help="default: results/pendulum.json when every algo is timed on Pendulum-v1, results/mountaincar.json on "
        "MountainCarContinuous-v0, else results/cartpole.json",
    )
    add_peer_options(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs already in --out and skip them (failed ones are run again); the options not given are "
        "the file's, those given must be the file's (--seeds may add seeds)",
    )
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    if args.time_limit is not None and not 0 < args.time_limit < float("inf"):
        parser.error(f"--time-limit must be a positive number of seconds, got {args.time_limit:g}")
    given_env = "env" in vars(args)
    args.env = getattr(args, "env", None)
    if args.out is None:
        algos = split_choices(parser, "--algos", args.algos or ",".join(DEFAULT_ALGOS[args.env or ENV_ID]), ALGOS)
        on_pendulum = all(env_of(args.env, algo) == CONTINUOUS_ENV_ID for algo in algos)
        on_mountaincar = args.env == SPARSE_ENV_ID
        args.out = RESULTS / (
            "mountaincar.json" if on_mountaincar else "pendulum.json" if on_pendulum else "cartpole.json"
        )
    if args.resume and args.out.exists():
        take_resumed_config(parser, args, given_env)
    # without --env, any algorithm, each on its own env; with --env, those that can be timed on it
    envs = ENV_IDS if args.env is None else (args.env,)
    choices = tuple(dict.fromkeys(algo for env in envs for algo in ALGOS_BY_ENV[env]))
    default = ",".join(DEFAULT_ALGOS[args.env or ENV_ID])
    args.algos = split_choices(parser, "--algos", args.algos or default, choices)
    args.frameworks = split_choices(parser, "--frameworks", args.frameworks or ",".join(FRAMEWORKS), FRAMEWORKS)
    args.seeds = DEFAULT_SEEDS if args.seeds is None else args.seeds
    args.time_limit = DEFAULT_TIME_LIMIT_S if args.time_limit is None else args.time_limit
    return args


def take_resumed_config(parser: argparse.ArgumentParser, args: argparse.Namespace, given_env: bool) -> None:
    """``--resume``: the options not given take the values of the configuration in ``--out``; one given with
    another value is refused (the table covers the file's algorithms and frameworks only, and every run of a file
    has the same time limit), except ``--seeds``, which may add seeds."""
    try:
        config = json.loads(args.out.read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        parser.error(f"--resume: cannot read the configuration of {args.out}: {error}")

    def refuse(option: str, file_value: object, given: object) -> None:
        parser.error(f"--resume: {args.out} was run with {option} {file_value}, not {given} (leave {option} out)")

    file_env = config.get("env")
    if given_env and args.env != file_env:
        refuse("--env", file_env or "(none: each algo on its own env)", args.env)
    args.env = file_env
    for option, key in (("--algos", "algos"), ("--frameworks", "frameworks")):
        value = getattr(args, key)
        if value is not None and [item.strip() for item in value.split(",") if item.strip()] != config[key]:
            refuse(option, ",".join(config[key]), value)
        setattr(args, key, ",".join(config[key]))
    if args.time_limit is not None and args.time_limit != config["time_limit_s"]:
        refuse("--time-limit", f"{config['time_limit_s']:g}", f"{args.time_limit:g}")
    args.time_limit = config["time_limit_s"]
    if args.seeds is not None and args.seeds < config["seeds"]:
        parser.error(f"--resume: {args.out} has {config['seeds']} seeds: --seeds may add seeds, not leave some out")
    args.seeds = config["seeds"] if args.seeds is None else args.seeds


def env_of(env: str | None, algo: str) -> str:
    """The env ``algo`` is timed on: ``env`` (the ``--env`` option / the config's ``env``), else its own."""
    return env or env_for(algo)


def solved_in_time(record: dict[str, Any], limit: float) -> bool:
    """Whether a run solved within the time limit. The limit is checked at each evaluation, so an evaluation that
    starts before it can end, solving, past it: such a run counts as not solved, at the limit, like one that never
    solved, for every framework alike (the runners' records say so; older records are judged here)."""
    return bool(record["solved"]) and record["solved_at_s"] is not None and record["solved_at_s"] <= limit


def run_env(record: dict[str, Any]) -> str:
    """The env of a run record; records written before envs were recorded are on the algorithm's own env."""
    return record.get("env") or env_for(record["algo"])


# --- runs --------------------------------------------------------------------------------------------


def run_once(
    python: Path, framework: str, algo: str, env_id: str, seed: int, time_limit: float, log_dir: Path
) -> dict[str, Any]:
    """Run one runner process to completion; return its JSON record, or an error record if it failed."""
    runner_args = ["--algo", algo, "--env", env_id, "--seed", str(seed), "--time-limit", f"{time_limit:g}"]
    return run_runner(
        python,
        framework,
        runner_args,
        time_limit + RUN_GRACE_S,
        log_dir / f"{framework}_{algo}_{env_id}_seed{seed}.log",
        {"framework": framework, "algo": algo, "env": env_id, "seed": seed, "solved": False},
    )


# --- summary -----------------------------------------------------------------------------------------


def summarize(document: dict[str, Any]) -> str:
    """The markdown summary of a results document."""
    config, machine = document["config"], document["machine"]
    limit = config["time_limit_s"]
    timed = [(algo, env_of(config.get("env"), algo)) for algo in config["algos"]]
    envs = list(dict.fromkeys(env for _, env in timed))
    solved_at = " / ".join(f"{SOLVED_RETURNS[env]:g}" + (f" ({env})" if len(envs) > 1 else "") for env in envs)
    lines = [
        f"# Time-to-solve {' and '.join(envs)}",
        "",
        machine_line(machine, document["started"]),
        "",
        f"Protocol: one process per run, 1 torch thread, CPU; greedy evaluation of {EVAL_EPISODES} episodes "
        f"every {EVAL_EVERY_STEPS:,} env steps, its time counting; solved at the first evaluation with mean "
        f"return >= {solved_at}, ending within the wall-clock limit of {limit:g} s; "
        f"{config['seeds']} seed{'s' if config['seeds'] != 1 else ''}.",
        "",
        "| algo | framework | version | median time-to-solve (s) | min–max (s) | median env steps | "
        "solved/seeds | ratio vs faster peer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    notes: set[str] = set()
    for algo, env in timed:
        medians: dict[str, float] = {}
        rows: dict[str, list[str]] = {}
        label = algo if len(envs) == 1 else f"{algo} ({env})"
        for framework in config["frameworks"]:
            if (framework, algo, env) in UNSUPPORTED:
                rows[framework] = [label, framework, "n/a", "n/a", "n/a", "n/a", "n/a", ""]
                continue
            runs = [
                r
                for r in document["runs"]
                if (r["framework"], r["algo"], run_env(r)) == (framework, algo, env) and r["seed"] < config["seeds"]
            ]
            if not runs:
                continue
            solved = [r for r in runs if solved_in_time(r, limit)]
            times = [r["solved_at_s"] if solved_in_time(r, limit) else limit for r in runs]
            if any(r["solved"] and not solved_in_time(r, limit) for r in runs):
                notes.add("A run that solved only past the time limit counts as not solved.")
            failed = sum(1 for r in runs if "error" in r)
            mark = "*" if len(solved) < len(runs) else ""
            if mark:
                notes.add(
                    f"\\* some seeds did not solve: each counts as the time limit ({limit:g} s) "
                    "in the median and the range."
                )
            if failed:
                notes.add(
                    "Failed runs (crash or kill, see the `error` and `log` fields in the JSON) count as not solved."
                )
            medians[framework] = statistics.median(times)
            version = next((r["version"] for r in runs if "version" in r), "?")
            steps = f"{statistics.median(r['solved_at_step'] for r in solved):,.0f}" if solved else "–"
            rows[framework] = [
                label,
                framework,
                version,
                f"{medians[framework]:.1f}{mark}",
                f"{min(times):.1f}–{max(times):.1f}{mark}",
                steps,
                f"{len(solved)}/{len(runs)}" + (f" ({failed} failed)" if failed else ""),
                "",
            ]
        peers = {fw: median for fw, median in medians.items() if fw != "rlfleet"}
        if "rlfleet" in medians and peers:
            faster = min(peers, key=peers.__getitem__)
            rows["rlfleet"][7] = f"{medians['rlfleet'] / peers[faster]:.2f}× ({faster})"
        lines.extend("| " + " | ".join(row) + " |" for row in rows.values())
    lines.append("")
    lines.append("Median env steps: over the seeds that solved. Ratio: rlfleet's median / the faster peer's.")
    lines.extend(sorted(notes))
    return "\n".join(lines) + "\n"


# --- main --------------------------------------------------------------------------------------------


def plan_runs(args: argparse.Namespace, document: dict[str, Any]) -> list[tuple[int, str, str, str]]:
    """The runs to do, as ``(seed, algo, env, framework)``: those of the options not in ``document`` yet. Failed
    runs are dropped from it, to be run again."""
    document["runs"] = [r for r in document["runs"] if "error" not in r]
    done = {(r["framework"], r["algo"], run_env(r), r["seed"]) for r in document["runs"]}
    return [
        (seed, algo, env, fw)
        for seed in range(args.seeds)
        for algo, env in ((algo, env_of(args.env, algo)) for algo in args.algos)
        for fw in args.frameworks
        if (fw, algo, env) not in UNSUPPORTED and (fw, algo, env, seed) not in done
    ]


def main() -> None:
    exit_on_signals()  # SIGTERM stops the run going on, as Ctrl-C does (run_runner's except)
    args = parse_args()
    peers_python, log_dir = start(args)
    config = {
        "algos": args.algos,
        "env": args.env,
        "frameworks": args.frameworks,
        "seeds": args.seeds,
        "time_limit_s": args.time_limit,
    }
    header = {
        "benchmark": "time-to-solve " + " and ".join(dict.fromkeys(env_of(args.env, a) for a in args.algos)),
        "protocol": {
            "eval_every_steps": EVAL_EVERY_STEPS,
            "eval_episodes": EVAL_EPISODES,
            "solved_return": SOLVED_RETURN,
            "solved_returns": SOLVED_RETURNS,
            "torch_threads": 1,
            "device": "cpu",
        },
    }
    document = open_results(args.out, args.resume, config, header, peers_python, ("time_limit_s", "--time-limit"))
    plan = plan_runs(args, document)
    for index, (seed, algo, env, framework) in enumerate(plan, start=1):
        log(f"[{index}/{len(plan)}] {framework} {algo} {env} seed {seed}")
        record = run_once(runner_python(framework, peers_python), framework, algo, env, seed, args.time_limit, log_dir)
        document["runs"].append(record)
        save(document, args.out)
        if "error" in record:
            log(f"    failed: {record['error']} (log: {record['log']})")
        elif record["solved"]:
            log(f"    solved in {record['solved_at_s']:.1f} s at {record['solved_at_step']:,} env steps")
        else:
            log(
                f"    not solved ({record['stop_reason']}, {record['wall_time_s']:.0f} s, "
                f"{record['env_steps']:,} env steps, last eval {record['eval_return_mean']})"
            )

    finish(document, args.out, summarize(document))


if __name__ == "__main__":
    main()
