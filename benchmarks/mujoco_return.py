"""Greedy return after a fixed budget of env steps on MuJoCo: rlfleet side by side with Stable-Baselines3 and Tianshou.

For every (framework, algo, env, seed) of ``--frameworks`` x ``--algos`` (sac, ppo) x ``--envs`` (Hopper-v5,
HalfCheetah-v5) x ``--seeds``, one runner process trains for ``--steps`` env steps (default 100,000, the same
for every framework) and then evaluates the greedy policy once: 10 episodes, one in each env of a vector env of
10 separate envs, seeded ``seed + 10000`` (by the peer runners as by rlfleet's evaluator). The record is that
evaluation's mean and (population) standard deviation of the undiscounted return, with the env steps actually
taken, the wall-clock seconds from the start of training to the end of the evaluation, and the libraries'
versions. Runs go to ``--out`` (JSON, saved after each run); ``--resume`` skips those already there, so a long
table can be filled over several sessions; ``--jobs N`` runs N at once (allowed here: the figure is a return,
not a time, but the wall times of parallel runs are not comparable with serial ones). The markdown table
(median and min–max of the final return per framework, algo and env) is printed and written next to ``--out``.
See benchmarks/README.md.

Protocol, identical for every framework: one process per run, CPU only, one torch thread
(``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``); no evaluation before the end; training stops at the
first point of the framework's loop at or past the budget (PPO collects whole 2,048- or 512-step segments:
100,352 steps for 100,000), and the budget includes every env step, random warm-up steps too; greedy = the
Gaussian's mean (SAC: tanh of it), scaled to the action range. What each framework is run with:

rlfleet (``rlfleet_runner.py``): ``rlfleet train ALGO --env ENV --seed S --steps N --eval-every N
--eval-episodes 10 --stop-return 1e9``, no ``--preset`` or ``--set``: the CLI picks the algorithm's ``mujoco``
preset for MuJoCo envs, or the env's per-env preset where ``rlfleet/algos/env_presets.toml`` has one (ppo on
Hopper-v5 and HalfCheetah-v5: the rl-zoo3 entries listed under SB3 below, carried over; constant learning
rates) (docs/continuous_control.md). ``--steps N`` sets the run's ``total_steps`` to N, and the schedules run
over that: with the ``mujoco`` preset PPO's learning rate anneals linearly from 3e-4 to 0 over the N steps, not
over the preset's 1M. ``--stop-return 1e9`` keeps the env's reward threshold from ending the run early.

- sac ``mujoco``: 1 env, replay 1M, 10,000 uniformly random steps then learning (learning_starts 10,000), one
  gradient step per env step, batch 256, Adam 3e-4 (actor, critics, alpha), gamma 0.99, tau 0.005, 256-256 ReLU
  MLPs, alpha tuned toward -|A|, no observation normalisation.
- ppo ``mujoco``: 1 env, 2,048-step segments, 10 epochs of minibatches of 64, Adam 3e-4 annealed to 0 over the
  budget, gamma 0.99, GAE lambda 0.95, clip 0.2, no value clip, ent_coef 0, vf_coef 0.5, grad clip 0.5,
  per-minibatch advantage normalisation, separate 64-64 tanh MLPs, state-independent log sigma (sigma 1 at
  start), running observation normalisation, rewards scaled by the running std of the discounted return.

Stable-Baselines3 2.9.2 (``peers/sb3_runner.py``): the ``Hopper-v4`` and ``HalfCheetah-v4`` entries of
``rl_zoo3/hyperparams/{sac,ppo}.yml`` of the installed rl-zoo3 2.9.2 (the zoo has no -v5 entries: the -v4
entries are used for the -v5 envs), read at run time and pre-processed like rl-zoo3's ``ExperimentManager``,
except that the entries' ``n_timesteps`` (1e6) is replaced by the budget: ``model.learn(total_timesteps=N)``
(none of these entries has a schedule). ``normalize: true`` -> ``VecNormalize`` of observations and rewards
(clip 10, with the entry's gamma), the evaluation env reading the training env's observation statistics,
frozen, and reporting raw rewards. With rl-zoo3 2.9.2:

- sac, both envs (one shared entry): ``n_timesteps: 1e6, policy: MlpPolicy, learning_starts: 10000``;
  everything else SB3's SAC defaults: 1 env, buffer 1M, uniformly random actions for the first 10,000 steps,
  batch 256, lr 3e-4, gamma 0.99, tau 0.005, train_freq 1, gradient_steps 1, ent_coef "auto" (initial alpha 1,
  target entropy -|A|), net_arch [256, 256] ReLU.
- ppo, Hopper-v4 (tuned): ``normalize: true, n_envs: 1, n_steps: 512, batch_size: 32, gamma: 0.999,
  learning_rate: 9.80828e-05, ent_coef: 0.00229519, clip_range: 0.2, n_epochs: 5, gae_lambda: 0.99,
  max_grad_norm: 0.7, vf_coef: 0.835671``; ppo, HalfCheetah-v4 (tuned): ``normalize: true, n_envs: 1,
  n_steps: 512, batch_size: 64, gamma: 0.98, learning_rate: 2.0633e-05, ent_coef: 0.000401762, clip_range: 0.1,
  n_epochs: 20, gae_lambda: 0.92, max_grad_norm: 0.8, vf_coef: 0.58096``; both with ``policy_kwargs:
  dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256]))``
  and constant learning rates (512-step collections: 100,352 steps for 100,000).

Tianshou 2.0.1 (``peers/tianshou_runner.py``): the ``get_args()`` defaults of ``examples/mujoco/mujoco_sac.py``
and ``mujoco_ppo.py`` (thu-ml/tianshou; not in the 2.0.1 wheel or sdist). The values were read from revision
002ffd9 of these two files, still on the 1.x API (``tianshou.policy``, ``step_per_epoch``): their 2.0
revisions (and the v2.0.1 tag) could not be consulted. 2.0-API versions of two other files of that folder,
found by text search (``mujoco_ppo_multi.py``, the low-level counterpart of ``mujoco_ppo_hl_multi.py``, and
``mujoco_redq.py``, whose SAC-family arguments are mujoco_sac.py's), keep the same defaults under the 2.0 names.
Written with the 2.0 API, one builder per (algo, env):

- sac (mujoco_sac.py): 1 train env, replay 1M, 10,000 uniformly random steps first (``start_timesteps``,
  collected with ``random=True`` before the trainer), then 1-step collections with 1 update per step, batch
  256, actor and critic lr 1e-3 (Adam), gamma 0.99, tau 0.005, fixed alpha 0.2 (``--auto_alpha`` is off by
  default), 1-step returns, Gaussian actor with state-dependent sigma (``conditioned_sigma``, unbounded, tanh
  squashed by SACPolicy) and two critics on Net [256, 256] ReLU; no observation normalisation.
- ppo (mujoco_ppo.py): 8 train envs, 2,048 env steps per collection, 10 repetitions, batch 64, buffer 4096,
  Adam 3e-4 decayed linearly to 0 over the budget (``lr_decay``: over ``ceil(N / 2048)`` updates), gamma 0.99,
  gae_lambda 0.95, vf_coef 0.25, ent_coef 0, eps_clip 0.2, max_grad_norm 0.5, return scaling on, no
  advantage normalisation, advantage recomputed each repetition, no value clip, no dual clip; separate actor
  and critic on Net [64, 64] tanh, orthogonal init (gain sqrt 2, zero bias), last actor layer scaled by 0.01,
  state-independent sigma starting at exp(-0.5); actions clipped to [-1, 1] and scaled to the action range;
  running observation normalisation of the train envs (``VectorEnvNormObs``), read, frozen, by the
  evaluation envs.

What the Tianshou runner changes from the examples, for the shared protocol: CPU, one torch thread; the
budget instead of ``epoch x step_per_epoch`` (1M SAC, 3M PPO), the PPO learning-rate decay following it; a
``DummyVectorEnv`` instead of the examples' ``ShmemVectorEnv`` subprocesses (same envs, stepped in the run's
process); the examples' periodic 10-episode test is replaced by the one greedy evaluation at the end
(``deterministic_eval=True``: SACPolicy's default, set for PPO, whose example samples its test actions).
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import harness
from harness import log
from peers.common import DEFAULT_BUDGET_STEPS, EVAL_EPISODES, MUJOCO_ALGOS, MUJOCO_ENV_IDS

RUN_TIMEOUT_S = 6 * 3600.0
"""A runner still running after this is killed (SAC: about 30 min per 100k steps on one core of a busy machine)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default=",".join(MUJOCO_ENV_IDS), help="comma-separated")
    parser.add_argument("--algos", default=",".join(MUJOCO_ALGOS), help="comma-separated")
    parser.add_argument("--frameworks", default=",".join(harness.FRAMEWORKS), help="comma-separated")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds: 0 .. N-1")
    parser.add_argument("--steps", type=int, default=DEFAULT_BUDGET_STEPS, help="env steps of training per run")
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "mujoco.json")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out and skip them")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (their wall times are then not serial)")
    harness.add_peer_options(parser)
    args = parser.parse_args()
    args.envs = harness.split_choices(parser, "--envs", args.envs, MUJOCO_ENV_IDS)
    args.algos = harness.split_choices(parser, "--algos", args.algos, MUJOCO_ALGOS)
    args.frameworks = harness.split_choices(parser, "--frameworks", args.frameworks, harness.FRAMEWORKS)
    if args.steps < 1 or args.seeds < 1 or args.jobs < 1:
        parser.error("--steps, --seeds and --jobs must be at least 1")
    return args


def run_key(record: dict[str, Any]) -> tuple[str, str, str, int]:
    return record["framework"], record["algo"], record["env"], record["seed"]


def run_one(
    python: Path, framework: str, algo: str, env_id: str, seed: int, steps: int, log_dir: Path, label: str
) -> dict[str, Any]:
    """One fixed-budget run of a framework's runner: its JSON record, or an error record if it failed."""
    log(f"{label} {framework} {algo} {env_id} seed {seed}: started")
    record = harness.run_runner(
        python,
        framework,
        ["--algo", algo, "--env", env_id, "--seed", str(seed), "--steps", str(steps)],
        RUN_TIMEOUT_S,
        log_dir / f"{framework}_{algo}_{env_id}_seed{seed}.log",
        {"framework": framework, "algo": algo, "env": env_id, "seed": seed, "steps": steps},
    )
    log(f"{label} {describe(record)}")
    return record


def describe(record: dict[str, Any]) -> str:
    what = f"{record['framework']} {record['algo']} {record['env']} seed {record['seed']}"
    if "error" in record:
        return f"{what}: failed, {record['error']} (log: {record['log']})"
    return (
        f"{what}: final return {record['eval_return_mean']:.1f} ± {record['eval_return_std']:.1f} after "
        f"{record['env_steps']:,} env steps, {record['wall_time_s']:.0f} s "
        f"({record['env_steps'] / record['wall_time_s']:.0f} steps/s)"
    )


# --- summary -----------------------------------------------------------------------------------------


def summarize(document: dict[str, Any]) -> str:
    """The markdown summary of a results document: every (env, algo, framework) that has runs in it."""
    config, runs = document["config"], document["runs"]
    jobs = sorted({r.get("jobs", 1) for r in runs} or {config["jobs"]})

    def present(key: str, canonical: tuple[str, ...]) -> list[str]:
        """Those of ``canonical`` that this session asked for or that have runs, in the canonical order."""
        wanted = {*config[f"{key}s"], *(r[key] for r in runs)}
        return [item for item in canonical if item in wanted]

    envs, algos = present("env", MUJOCO_ENV_IDS), present("algo", MUJOCO_ALGOS)
    frameworks = present("framework", harness.FRAMEWORKS)
    lines = [
        f"# Greedy return after {config['steps']:,} env steps ({', '.join(envs)})",
        "",
        harness.machine_line(document["machine"], document["started"]),
        "",
        f"Protocol: one process per run, 1 torch thread, CPU; {config['steps']:,} env steps of training "
        f"(the first loop boundary at or past them), then one greedy evaluation of {EVAL_EPISODES} episodes; "
        f"final return = its mean. Runs at once (`--jobs`): {' or '.join(map(str, jobs))}"
        + (" (the wall times of parallel runs are not serial ones)." if max(jobs) > 1 else "."),
        "",
        "| env | algo | framework | version | median final return | min–max | runs | median wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env in envs:
        for algo in algos:
            for framework in frameworks:
                mine = [r for r in runs if (r["framework"], r["algo"], r["env"]) == (framework, algo, env)]
                if not mine:
                    continue
                done = [r for r in mine if "error" not in r]
                failed = len(mine) - len(done)
                count = f"{len(done)}" + (f" (+{failed} failed)" if failed else "")
                if not done:
                    lines.append(f"| {env} | {algo} | {framework} | ? | – | – | {count} | – |")
                    continue
                returns = [r["eval_return_mean"] for r in done]
                lines.append(
                    f"| {env} | {algo} | {framework} | {done[0]['version']} | {round(statistics.median(returns))} | "
                    f"{round(min(returns))} – {round(max(returns))} | {count} | "
                    f"{round(statistics.median(r['wall_time_s'] for r in done))} |"
                )
    lines.append("")
    lines.append(
        "Final return: mean over the evaluation's episodes; median and range over the seeds. Failed runs (see "
        "`error` and `log` in the JSON) are left out of both and rerun by `--resume`."
    )
    return "\n".join(lines) + "\n"


# --- main --------------------------------------------------------------------------------------------


def main() -> None:
    harness.exit_on_signals()  # SIGTERM too stops every run (the except below)
    args = parse_args()
    peers_python, log_dir = harness.start(args)
    config = {key: getattr(args, key) for key in ("envs", "algos", "frameworks", "seeds", "steps", "jobs")}
    header = {
        "benchmark": "greedy return after a fixed budget (MuJoCo)",
        "protocol": {
            "steps": args.steps,
            "eval_episodes": EVAL_EPISODES,
            "evaluation": "greedy, once, after training",
            "torch_threads": 1,
            "device": "cpu",
        },
    }
    document = harness.open_results(args.out, args.resume, config, header, peers_python, ("steps", "--steps"))
    document["runs"] = [r for r in document["runs"] if "error" not in r]  # failed runs are run again
    done = {run_key(r) for r in document["runs"]}
    # seeds outermost and the frameworks interleaved, so that a partial table covers every framework
    plan = [
        (framework, algo, env, seed)
        for seed in range(args.seeds)
        for env in args.envs
        for algo in args.algos
        for framework in args.frameworks
        if (framework, algo, env, seed) not in done
    ]
    log(f"{len(plan)} runs to do, {args.jobs} at a time; {len(done)} already in {args.out}")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(
                run_one,
                harness.runner_python(framework, peers_python),
                framework,
                algo,
                env,
                seed,
                args.steps,
                log_dir,
                f"[{index}/{len(plan)}]",
            )
            for index, (framework, algo, env, seed) in enumerate(plan, start=1)
        ]
        try:
            for future in as_completed(futures):
                record = {**future.result(), "jobs": args.jobs}
                document["runs"].append(record)
                harness.save(document, args.out)
        except BaseException:  # e.g. Ctrl-C or SIGTERM: no run may go on, unseen, after the driver
            pool.shutdown(wait=False, cancel_futures=True)
            harness.kill_running()
            raise

    harness.finish(document, args.out, summarize(document))


if __name__ == "__main__":
    main()
