"""Atari speed: where PPO's and A2C's time goes on ALE/Pong-v5 with rlfleet's own env stack, what torch's thread
count does to it, and how whole runs compare with Stable-Baselines3's.

In this process (the vector env built as a run builds it: `make_vector_env` in mode "auto", i.e. one process per
env, with the PPO `atari` preset's 8 envs; PPO's config resolved as `rlfleet train ppo --env ENV` resolves it):

  raw           the vector env stepping uniformly random actions: env steps/s, and frames/s = 4 × env steps/s
                (ALE frames, frame skip 4);
  acting-tN     rlfleet's `Collector` filling PPO rollout segments (128 steps × 8 envs) with the preset's Nature CNN
                policy in the loop, N torch threads; its ratio to raw is the collection goal (>= 0.7);
  policy-tN     `PPO.act` alone on the 8 envs' observations (the forward pass and sampling of one vector step), in
                env steps/s: acting's time is about raw's plus this one's;
  learner-tN    `PPO.update` on one collected segment (4 epochs of minibatches of 256: 4,096 samples), in samples/s;
  net-tN        the same network's forward + backward + Adam step on minibatches of 256 random frames (no PPO
                loss, no shuffling or indexing of the segment): the CPU's limit for that net.

Whole runs, one process each, one at a time (`--steps` env steps, `--frameworks`, `--algos`, every `--threads`):

  rlfleet-ALGO-tN   `rlfleet train ALGO --env ENV --steps S --torch-threads N --eval-every S --eval-episodes 1
                    --stop-return 1e9`: the algorithm's `atari` preset (PPO: 8 envs × 128 steps, 4 epochs of 256,
                    Nature CNN; A2C: 16 envs × 5 steps, RMSprop, Mnih 2013 CNN); env steps and training seconds
                    are the run's own, from the evaluation row of its `metrics.csv` (logged with the time at which
                    training stopped and the single evaluation began: the evaluation is not counted);
  sb3-ALGO-tN       `peers/sb3_atari_runner.py` in the peers' venv: SB3's A2C or PPO with the same settings
                    (`sb3_settings`: rlfleet's resolved preset, field by field), SB3's own Atari stack
                    (`ENV_STACKS` says how it differs), `model.learn(S)` timed, no evaluation.

Cases are interleaved in each of `--repeats` (in-process) and `--run-repeats` (whole runs) rounds; the table
gives medians. Results go to `--out` (JSON) and a markdown table next to it; each run's output to
`results/logs/`.

    python benchmarks/atari_speed.py --out benchmarks/results/atari_speed.json
    python benchmarks/atari_speed.py --threads 1,2 --steps 20480 --frameworks rlfleet --algos ppo
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import (
    RESULTS,
    RUNNER_ENV,
    add_peer_options,
    ensure_peers_venv,
    exit_on_signals,
    finish,
    log,
    log_dir_for,
    machine_info,
    run_runner,
    split_choices,
)
from peers.common import library_versions
from rlfleet_runner import rlfleet_executable

from rlfleet.algos.ppo import PPO
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs import make_vector_env
from rlfleet.envs.make import ATARI_FRAME_SKIP
from rlfleet.run.collector import Collector
from rlfleet.run.config import build_algo_config

FRAMEWORKS = ("rlfleet", "sb3")
ALGOS = ("ppo", "a2c")
RUN_TIMEOUT_S = 1800
ENV_STACKS = {
    "rlfleet": "ALE env with frameskip 1 and the id's sticky actions (0.25 for -v5); Gymnasium's AtariPreprocessing "
    "(up to 30 no-ops on reset, frame skip 4 with a max over the last two frames, 84x84 grayscale by cv2 INTER_AREA) "
    "-> RecordEpisodeStatistics -> FrameStackObservation(4) -> sign-clipped rewards, all in each env's process; "
    "Gymnasium's AsyncVectorEnv (spawn, one process per env, observations in shared memory, same-step autoreset)",
    "sb3": "ALE env with frameskip 1 and the id's sticky actions (0.25 for -v5); SB3's AtariWrapper (up to 30 no-ops "
    "on reset, MaxAndSkipEnv 4, FIRE pressed on reset where the game has it, 84x84 grayscale by WarpFrame (cv2 "
    "INTER_AREA), sign-clipped rewards; no life-loss terminals, as in rlfleet) -> Monitor, in each env's process; "
    "SubprocVecEnv (forkserver, one process per env, observations pickled through pipes; or DummyVecEnv with "
    "--sb3-vec-env dummy) -> VecFrameStack(4) in the learner's process -> VecTransposeImage (channels first)",
}
"""How each library turns the ALE into the agent's observations (the differences are the FIRE reset, where frames
are stacked, and how observations cross between processes)."""


# --- in-process cases ----------------------------------------------------------------------------------


def ppo_config(env: str):
    """PPO's config as `rlfleet train ppo --env ENV` resolves it (the env's preset, else the `atari` preset)."""
    cfg, _ = build_algo_config("ppo", None, {}, "atari", env)
    return cfg


def vector_env(env: str, n_envs: int):
    """The training vector env as a single-process run builds it (mode "auto": async for Atari)."""
    return make_vector_env(env, n_envs, seed=0, mode="auto", training=True)


def raw(envs, vector_steps: int) -> float:
    """Env steps/s of the vector env stepping uniformly random actions."""
    envs.reset(seed=0)
    actions = np.random.default_rng(0).integers(envs.single_action_space.n, size=(vector_steps, envs.num_envs))
    start = time.perf_counter()
    for a in actions:
        envs.step(a)
    return vector_steps * envs.num_envs / (time.perf_counter() - start)


def acting(collector: Collector, storage: RolloutStorage, segments: int) -> float:
    """Env steps/s of the Collector filling `segments` PPO rollout segments."""
    start = time.perf_counter()
    for _ in range(segments):
        collector.collect_rollout(storage)
    return segments * storage.length * storage.n_envs / (time.perf_counter() - start)


def policy(algo: PPO, obs: np.ndarray, calls: int) -> float:
    """Env steps/s of `algo.act` alone on one vector step's observations, `calls` times."""
    start = time.perf_counter()
    for _ in range(calls):
        algo.act(obs)
    return calls * len(obs) / (time.perf_counter() - start)


def learner(algo: PPO, segment) -> float:
    """Samples/s of PPO's update on one segment (each of its epochs goes over every sample)."""
    start = time.perf_counter()
    algo.update(segment)
    return algo.cfg.epochs * algo.cfg.rollout_len * algo.cfg.n_envs / (time.perf_counter() - start)


def net_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, obs: torch.Tensor, act: torch.Tensor,
             minibatches: int) -> float:  # fmt: skip
    """Samples/s of forward + backward + optimizer step of `model` on the minibatch `obs`, `minibatches` times."""
    start = time.perf_counter()
    for _ in range(minibatches):
        dist, value = model(obs)
        loss = -dist.log_prob(act).mean() + value.pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return minibatches * len(obs) / (time.perf_counter() - start)


def in_process_cases(args: argparse.Namespace, threads: list[int]) -> tuple[dict[str, dict[str, Any]], dict]:
    """Every in-process case, `args.repeats` rounds, interleaved; each case's unit and rates."""
    cfg = ppo_config(args.env)
    raw_envs = vector_env(args.env, cfg.n_envs)
    envs = vector_env(args.env, cfg.n_envs)
    try:
        algo = PPO(cfg, envs.single_observation_space, envs.single_action_space, seed=0)
        collector = Collector(envs, algo, seed=0)
        storage = RolloutStorage(cfg.rollout_len, cfg.n_envs)
        segment = collector.collect_rollout(storage)  # what the learner cases update on
        segment = dataclasses.replace(segment, data=segment.data.apply(np.copy))  # storage is refilled by acting
        # the net cases: a copy of the same network and optimizer, random frames, one minibatch
        net_algo = PPO(cfg, envs.single_observation_space, envs.single_action_space, seed=0)
        model, optimizer = net_algo.model, net_algo.optimizer
        gen = torch.Generator().manual_seed(0)
        obs = torch.randint(0, 256, (cfg.minibatch_size, *envs.single_observation_space.shape), generator=gen,
                            dtype=torch.uint8)  # fmt: skip
        act = torch.randint(0, int(envs.single_action_space.n), (cfg.minibatch_size,), generator=gen)
        minibatches = cfg.epochs * cfg.rollout_len * cfg.n_envs // cfg.minibatch_size  # as many samples as learner
        steps, samples = "env steps/s", "samples/s"
        cases: dict[str, tuple[str, int, Callable[[], float]]] = {
            "raw": (steps, 1, functools.partial(raw, raw_envs, args.raw_steps))
        }
        for n in threads:
            cases[f"acting-t{n}"] = (steps, n, functools.partial(acting, collector, storage, args.segments))
        for n in threads:
            cases[f"policy-t{n}"] = (steps, n, functools.partial(policy, algo, segment.data.obs[0], args.raw_steps))
        for n in threads:
            cases[f"learner-t{n}"] = (samples, n, functools.partial(learner, algo, segment))
        for n in threads:
            cases[f"net-t{n}"] = (samples, n, functools.partial(net_step, model, optimizer, obs, act, minibatches))
        results: dict[str, dict[str, Any]] = {name: {"unit": unit, "runs": []} for name, (unit, _, _) in cases.items()}
        for repeat in range(args.repeats):  # interleaved, so that drift and other jobs hit every case alike
            for name, (_, n, measure) in cases.items():
                torch.set_num_threads(n)
                results[name]["runs"].append(measure())
                results[name].setdefault("load_average", []).append(os.getloadavg()[0])
            log(f"in-process round {repeat + 1}/{args.repeats}: "
                + ", ".join(f"{k} {v['runs'][-1]:,.0f}" for k, v in results.items()))  # fmt: skip
    finally:
        raw_envs.close()
        envs.close()
    for r in results.values():
        r["median"] = statistics.median(r["runs"])
    setup = {
        "ppo_config": dataclasses.asdict(cfg),
        "params": sum(p.numel() for p in algo.model.parameters()),
        "vector_env": type(envs.unwrapped).__name__,
        "raw_steps": args.raw_steps,
        "acting_segments": args.segments,
        "learner_samples": cfg.epochs * cfg.rollout_len * cfg.n_envs,
    }
    return results, setup


# --- whole runs ---------------------------------------------------------------------------------------


def algo_config(algo: str, env: str):
    cfg, _ = build_algo_config(algo, None, {}, "atari", env)
    return cfg


def sb3_settings(algo: str, cfg) -> dict[str, Any]:
    """rlfleet's resolved config of `algo`, written as SB3's constructor arguments (read by sb3_atari_runner)."""
    common = {
        "n_envs": cfg.n_envs,
        "encoder": "nature" if cfg.encoder == "auto" else cfg.encoder,  # "auto": Nature CNN for images
        "lr_anneal": cfg.lr_anneal,
        "n_steps": cfg.rollout_len,
        "gamma": cfg.gamma,
        "gae_lambda": cfg.gae_lambda,
        "learning_rate": cfg.lr,
        "ent_coef": cfg.ent_coef,
        "vf_coef": cfg.vf_coef,
        "max_grad_norm": cfg.max_grad_norm,
        "normalize_advantage": cfg.normalize_advantage,
    }
    if algo == "ppo":
        return {**common, "batch_size": cfg.minibatch_size, "n_epochs": cfg.epochs, "clip_range": cfg.clip,
                "clip_range_vf": cfg.value_clip or None}  # fmt: skip
    if cfg.optimizer not in ("rmsprop", "adam"):
        raise SystemExit(f"a2c's optimizer {cfg.optimizer!r} has no SB3 counterpart here")
    return {**common, "use_rms_prop": cfg.optimizer == "rmsprop", "rms_prop_eps": 1e-5}


def training_span(run_dir: Path) -> tuple[int, float]:
    """(env steps, seconds of training) from the run's `metrics.csv`: its last evaluation row, logged with the
    time at which that evaluation began."""
    rows = [line.split(",") for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]]
    evals = [r for r in rows if len(r) == 4 and r[2] == "eval/return_mean"]
    if not evals:
        raise RuntimeError(f"{run_dir}/metrics.csv has no evaluation row")
    return int(evals[-1][0]), float(evals[-1][1])


def run_rlfleet(algo: str, env: str, steps: int, threads: int, log_path: Path) -> dict[str, Any]:
    """One `rlfleet train` run; its record (or an error record)."""
    record: dict[str, Any] = {"framework": "rlfleet", "algo": algo, "threads": threads, "log": str(log_path)}
    with tempfile.TemporaryDirectory(prefix="rlfleet-atari-") as tmp:
        command = [rlfleet_executable(), "train", algo, "--env", env, "--seed", "0", "--steps", str(steps),
                   "--eval-every", str(steps), "--eval-episodes", "1", "--stop-return", "1e9",
                   "--torch-threads", str(threads), "--logdir", tmp, "--name", "run", "--no-progress"]  # fmt: skip
        with log_path.open("w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=out, env={**os.environ, **RUNNER_ENV},
                                    start_new_session=True)  # fmt: skip
            try:
                proc.wait(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # the run and its env processes go
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return {**record, "error": "killed"}
            except BaseException:  # Ctrl-C or SIGTERM: the same, and the driver stops
                os.killpg(proc.pid, signal.SIGKILL)
                raise
        if proc.returncode != 0:
            return {**record, "error": f"exit status {proc.returncode}"}
        run_dir = Path(tmp) / "run"
        env_steps, seconds = training_span(run_dir)
        config = json.loads((run_dir / "config.json").read_text())
        result = json.loads((run_dir / "result.json").read_text())
    return {**record, "env_steps": env_steps, "wall_time_s": seconds, "env_steps_per_s": env_steps / seconds,
            "torch_threads_resolved": config["torch_threads"],
            "result_wall_time_s": result["wall_time_s"]}  # fmt: skip


def run_sb3(algo: str, env: str, steps: int, threads: int, python: Path, vec_env: str, log_path: Path) -> dict:
    settings = sb3_settings(algo, algo_config(algo, env))
    runner_args = ["--algo", algo, "--env", env, "--steps", str(steps), "--threads", str(threads),
                   "--vec-env", vec_env, "--settings", json.dumps(settings)]  # fmt: skip
    identity = {"framework": "sb3", "algo": algo, "threads": threads}
    return {**run_runner(python, "sb3-atari", runner_args, RUN_TIMEOUT_S, log_path, identity), **identity}


def whole_runs(args: argparse.Namespace, threads: list[int], peers_python: Path | None, logs: Path) -> dict:
    plan = [(fw, algo, n) for algo in args.algos for fw in args.frameworks for n in threads]
    results: dict[str, dict[str, Any]] = {f"{fw}-{algo}-t{n}": {"records": []} for fw, algo, n in plan}
    for repeat in range(args.run_repeats):
        for fw, algo, n in plan:
            name = f"{fw}-{algo}-t{n}"
            log_path = logs / f"atari_speed_{name}_r{repeat}.log"
            log(f"run {name} ({repeat + 1}/{args.run_repeats}) ...")
            if fw == "rlfleet":
                record = run_rlfleet(algo, args.env, args.steps, n, log_path)
            else:
                assert peers_python is not None
                record = run_sb3(algo, args.env, args.steps, n, peers_python, args.sb3_vec_env, log_path)
            record["load_average"] = os.getloadavg()[0]
            results[name]["records"].append(record)
            log(f"  {record.get('env_steps_per_s', float('nan')):,.0f} env steps/s" + (f"  ERROR {record['error']}"
                if "error" in record else ""))  # fmt: skip
    for r in results.values():
        rates = [rec["env_steps_per_s"] for rec in r["records"] if "error" not in rec]
        r["unit"] = "env steps/s"
        r["runs"] = rates
        r["median"] = statistics.median(rates) if rates else None
    return results


# --- report ------------------------------------------------------------------------------------------


def ratios(cases: dict[str, dict[str, Any]], threads: list[int]) -> dict[str, float]:
    out = {}
    for n in threads:
        out[f"acting-t{n} / raw"] = cases[f"acting-t{n}"]["median"] / cases["raw"]["median"]
        # acting against raw and policy one after the other (their times per env step added): below 1, the
        # Collector's own work and the contention between the policy and the env processes
        in_series = 1 / (1 / cases["raw"]["median"] + 1 / cases[f"policy-t{n}"]["median"])
        out[f"acting-t{n} / (raw + policy-t{n} in series)"] = cases[f"acting-t{n}"]["median"] / in_series
        out[f"learner-t{n} / net-t{n}"] = cases[f"learner-t{n}"]["median"] / cases[f"net-t{n}"]["median"]
    return out


def table(document: dict[str, Any]) -> str:
    m = document["machine"]
    lines = [
        f"# Atari speed on {document['config']['env']}",
        "",
        f"Machine: {m['cpu_model']}, {m['cpu_cores']} cores ({m['affinity_cores']} usable); Python {m['python']}, "
        f"torch {m['torch']}; load average {m['load_average_at_start'][0]:.2f} at start, "
        f"{m['load_average_at_end'][0]:.2f} at end; rlfleet commit "
        f"{(m.get('rlfleet_commit') or 'unknown')[:12]}; started {document['started']}.",
        "",
        "| case | median | unit | frames/s | runs | ratio |",
        "|---|---|---|---|---|---|",
    ]
    cases, r = document["cases"], document["ratios"]
    for name, c in {**cases, **document["runs"]}.items():
        if c["median"] is None:
            lines.append(f"| {name} | failed | | | | |")
            continue
        stepping = c["unit"] == "env steps/s" and not name.startswith("policy")  # the policy steps no env
        frames = f"{ATARI_FRAME_SKIP * c['median']:,.0f}" if stepping else ""
        runs = ", ".join(f"{x:,.0f}" for x in c["runs"])
        ratio = "; ".join(f"{v:.2f} ({k})" for k, v in r.items() if k.startswith(name + " "))
        lines.append(f"| {name} | {c['median']:,.0f} | {c['unit']} | {frames} | {runs} | {ratio} |")
    return "\n".join(lines) + "\n"


def parse_threads(parser: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        threads = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        parser.error(f"--threads: expected comma-separated counts >= 1, got {text!r}")
    return threads


def main() -> None:
    exit_on_signals()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of the in-process cases")
    parser.add_argument("--raw-steps", type=int, default=512, help="vector steps per raw and policy measurement")
    parser.add_argument("--segments", type=int, default=2, help="rollout segments per acting measurement")
    parser.add_argument("--steps", type=int, default=10_240, help="env steps of each whole run")
    parser.add_argument("--run-repeats", type=int, default=1, help="rounds of the whole runs")
    parser.add_argument("--frameworks", default="rlfleet,sb3", help="whole runs of: rlfleet,sb3")
    parser.add_argument("--algos", default="ppo,a2c", help="whole runs of: ppo,a2c")
    parser.add_argument("--no-runs", action="store_true", help="in-process cases only")
    parser.add_argument("--sb3-vec-env", choices=("subproc", "dummy"), default="subproc")
    parser.add_argument("--out", type=Path, default=RESULTS / "atari_speed.json")
    add_peer_options(parser)
    args = parser.parse_args()
    threads = parse_threads(parser, args.threads)
    args.frameworks = [] if args.no_runs else split_choices(parser, "--frameworks", args.frameworks, FRAMEWORKS)
    args.algos = split_choices(parser, "--algos", args.algos, ALGOS)
    for flag in ("repeats", "raw_steps", "segments", "steps", "run_repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    peers_python = None
    if args.setup_only or "sb3" in args.frameworks:
        peers_python = ensure_peers_venv(args.peers_venv)
    if args.setup_only:
        raise SystemExit(0)
    logs = log_dir_for(args.out)
    machine = machine_info(peers_python)
    machine.update(
        affinity_cores=len(os.sched_getaffinity(0)),
        torch=torch.__version__,
        libraries=library_versions("gymnasium", "ale-py", "numpy", "opencv-python-headless"),
    )
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    document: dict[str, Any] = {
        "benchmark": "atari_speed",
        "config": {**config, "threads": threads},
        "machine": machine,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "env_stacks": ENV_STACKS,
        "frame_skip": ATARI_FRAME_SKIP,
    }
    cases, setup = in_process_cases(args, threads)
    document.update(cases=cases, ratios=ratios(cases, threads), setup=setup)
    settings = {algo: dataclasses.asdict(algo_config(algo, args.env)) for algo in args.algos}
    document["run_settings"] = {"rlfleet": settings, "sb3": {a: sb3_settings(a, algo_config(a, args.env))
                                                              for a in args.algos}}  # fmt: skip
    document["runs"] = whole_runs(args, threads, peers_python, logs) if args.frameworks else {}
    document["machine"]["load_average_at_end"] = list(os.getloadavg())
    finish(document, args.out, table(document))


if __name__ == "__main__":
    main()
