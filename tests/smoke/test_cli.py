"""The `rlfleet` command as a user runs it (a real subprocess): clean usage errors, and train -> eval -> plot."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from procs import RLFLEET

from rlfleet.algos import REGISTRY
from rlfleet.cli import outcome
from rlfleet.data.demos import Demonstrations
from rlfleet.run.checkpoint import load_checkpoint, save_checkpoint

ALGOS = ("a2c", "a3c", "bc", "ddpg", "dqn", "nstep_q", "onestep_q", "pg", "ppo", "sac", "sarsa", "td3")
RESULT_KEYS = {
    *("solved", "solved_at_step", "solved_at_s", "eval_return_mean", "eval_return_std", "env_steps", "wall_time_s")
}


def rlfleet(*args: object, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RLFLEET, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its content (None for folders): to see that nothing was created or changed."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def make_workdir(folder: Path) -> Path:
    """A folder with bad inputs in it: a garbage checkpoint, a foreign torch file, a checkpoint that lies loose
    (outside a run's checkpoints/), an existing (fake) run folder, runs with corrupt metrics, bad datasets,
    a file of the user's and an empty folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "garbage.pt").write_bytes(b"this is not a checkpoint\n" * 10)
    (folder / "empty.pt").write_bytes(b"")
    torch.save({"weights": torch.zeros(3)}, folder / "foreign.pt")
    run_config = {"algo": "ppo", "env": "CartPole-v1"}
    save_checkpoint(folder / "loose.pt", {"run_config": run_config, "algo_config": {}, "algo": {}, "env_steps": 0})
    run = folder / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest.pt").write_bytes(b"\x80\x02garbage")
    (run / "config.json").write_text('{"keep": "me"}')
    (run / "metrics.csv").write_text("step,wall_time,key,value\n1,0.1,charts/episodic_return,9\n")
    (folder / "runs" / "notes.txt").write_text("a file of the user's where a run folder could go\n")
    for name, text in CORRUPT_METRICS.items():
        (folder / "runs" / name).mkdir()
        (folder / "runs" / name / "metrics.csv").write_bytes(text)
    (folder / "empty.npz").write_bytes(b"")
    (folder / "garbage.npz").write_bytes(b"PK\x03\x04 this is not a zip")
    (folder / "notes.txt").write_text("the user's notes: no rlfleet command may overwrite them\n")
    (folder / "adir").mkdir()
    obs, act, starts = np.zeros((3, 4), np.float32), np.zeros(3, np.int64), np.array([True, False, False])
    Demonstrations(obs, act, np.ones(3), starts, "CartPole-v1", gym.spaces.Discrete(2)).save(folder / "demos.npz")
    bad_datasets(folder, obs, starts)
    return folder


def bad_datasets(folder: Path, obs: np.ndarray, starts: np.ndarray) -> None:
    """Datasets whose arrays do not fit their env (actions out of range, of another dtype or shape) or whose
    env_kwargs nest thousands deep."""
    cartpole, pendulum = gym.spaces.Discrete(2), gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    pend_obs = np.zeros((3, 3), np.float32)
    for name, observations, act, env, space in (
        ("act-range", obs, np.array([0, 5, 1]), "CartPole-v1", cartpole),
        ("act-negative", obs, np.array([0, -1, 1]), "CartPole-v1", cartpole),
        ("act-float", obs, np.array([0.5, 1.0, 0.0]), "CartPole-v1", cartpole),
        ("act-shape", obs, np.zeros((3, 2), np.int64), "CartPole-v1", cartpole),
        ("box-range", pend_obs, np.full((3, 1), 5.0, np.float32), "Pendulum-v1", pendulum),
        ("box-nan", pend_obs, np.full((3, 1), np.nan, np.float32), "Pendulum-v1", pendulum),
        ("box-shape", pend_obs, np.zeros(3, np.float32), "Pendulum-v1", pendulum),
        ("obs-text", np.full((3, 4), "x"), np.zeros(3, np.int64), "CartPole-v1", cartpole),
        ("obs-nan", np.where([[0], [1], [0]], np.nan, obs).astype(np.float32), np.zeros(3, np.int64), "CartPole-v1",
         cartpole),
        ("obs-inf", np.where([[0], [0], [1]], np.inf, obs).astype(np.float32), np.zeros(3, np.int64), "CartPole-v1",
         cartpole),
    ):  # fmt: skip
        Demonstrations(observations, act, np.ones(3), starts, env, space).save(folder / f"{name}.npz")
    no_pairs = Demonstrations(obs[:0], np.zeros(0, np.int64), np.ones(0), starts[:0], "CartPole-v1", cartpole)
    no_pairs.save(folder / "no-pairs.npz")
    with np.load(folder / "demos.npz") as data:
        arrays = {k: data[k] for k in data.files}
    for name, text in (
        ("deep-dict", '{"a": ' * 5_000 + "1" + "}" * 5_000),
        ("deep-list", '{"a": ' + "[" * 200 + "]" * 200 + "}"),
    ):
        np.savez(folder / f"{name}.npz", **{**arrays, "env_kwargs": np.array(text)})


CORRUPT_METRICS = {
    "text-in-value": b"step,wall_time,key,value\n1,0.1,charts/episodic_return,abc\n",
    "no-header": b"1,0.1,charts/episodic_return,9\n",
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\n",
}


TRAIN = ("train", "ppo", "--env", "CartPole-v1", "--steps", "600", "--logdir", "runs", "--no-progress")

# (id, arguments, substrings the one error line must contain); each runs as a real `rlfleet` process
USAGE_ERRORS = {
    "unknown-algo": (("train", "ppq", "--env", "CartPole-v1", "--logdir", "runs"), ["'ppq'", *ALGOS]),
    "unknown-env": (("train", "ppo", "--env", "CartPol-v1", "--logdir", "runs"), ["'CartPol-v1'", "'CartPole-v1'"]),
    "unknown-set-key": ((*TRAIN, "--set", "learning_rate=0.1"), ["'learning_rate'", "lr", "clip", "rollout_len"]),
    "set-bad-float": ((*TRAIN, "--set", "lr=fast"), ["'fast'", "lr", "float"]),
    "unknown-preset": ((*TRAIN, "--preset", "fast"), ["'fast'", "atari"]),
    "unsupported-space": (("train", "dqn", "--env", "Pendulum-v1", "--logdir", "runs"), ["dqn", "discrete", "Box"]),
    "eval-garbage": (("eval", "garbage.pt"), ["garbage.pt", "cannot read checkpoint"]),
    "eval-missing": (("eval", "nowhere/latest.pt"), ["nowhere", "no checkpoint"]),
    "resume-garbage-run": (("train", "--resume", "runs/old", "--no-progress"), ["latest.pt", "cannot read checkpoint"]),
    "resume-missing": (("train", "--resume", "runs/nope", "--no-progress"), ["runs/nope", "no checkpoint"]),
    "set-gamma-above-one": ((*TRAIN, "--set", "gamma=1.5"), ["ppo config gamma=1.5", "must be in [0, 1]"]),
    "name-leaves-logdir": ((*TRAIN, "--name", "../escaped"), ["--name='../escaped'", "single folder name"]),
    "plot-corrupt-metrics": (("plot", "runs/text-in-value"), ["runs/text-in-value/metrics.csv", "line 2"]),
    "steps-not-a-number": (("train", "ppo", "--env", "CartPole-v1", "--steps", "many"), ["--steps", "'many'"]),
}

# more of the same, checked in-process with `rlfleet.cli.main` (a subprocess costs seconds of imports)
EARLIER_USAGE_ERRORS = {
    "set-no-equals": ((*TRAIN, "--set", "lr"), ["key=value", "'lr'"]),
    "set-bad-int": ((*TRAIN, "--set", "epochs=2.5"), ["'2.5'", "epochs", "int"]),
    "set-bad-bool": ((*TRAIN, "--set", "lr_anneal=maybe"), ["'maybe'", "lr_anneal", "bool"]),
    "set-bad-tuple": ((*TRAIN, "--set", "hidden=64,x"), ["'64,x'", "hidden"]),
    "set-negative": ((*TRAIN, "--set", "lr=-0.1"), ["lr", "negative"]),
    "set-zero-envs": ((*TRAIN, "--set", "n_envs=0"), ["n_envs"]),
    "set-bad-activation": ((*TRAIN, "--set", "activation=gelu"), ["'gelu'", "relu", "tanh"]),
    "n-envs-zero": ((*TRAIN, "--n-envs", "0"), ["--n-envs", "0"]),
    "sac-discrete": (("train", "sac", "--env", "CartPole-v1"), ["'sac'", "continuous", "Discrete(2)"]),
    "td3-discrete": (("train", "td3", "--env", "CartPole-v1"), ["'td3'", "continuous", "Discrete(2)"]),
    "ddpg-discrete": (("train", "ddpg", "--env", "CartPole-v1"), ["'ddpg'", "continuous", "Discrete(2)"]),
    "dqn-preset-unknown": (("train", "dqn", "--env", "CartPole-v1", "--preset", "paper"), ["'paper'", "atari"]),
    "unknown-arch": ((*TRAIN, "--arch", "gossamer"), ["'gossamer'", "single", "hogwild", "data_parallel"]),
    "replay-on-hogwild": (("train", "dqn", "--env", "CartPole-v1", "--arch", "hogwild"), ["dqn", "replay", "hogwild"]),
    "workers-zero": ((*TRAIN, "--arch", "hogwild", "--workers", "0"), ["--workers", "0"]),
    "unknown-optimizer": (
        ("train", "a3c", "--env", "CartPole-v1", "--optimizer", "adagrad"),
        ["'adagrad'", "shared_rmsprop"],
    ),
    "negative-eval-every": ((*TRAIN, "--eval-every", "-5"), ["--eval-every", "-5"]),
    "negative-checkpoint-every": ((*TRAIN, "--checkpoint-every", "-1"), ["--checkpoint-every", "-1"]),
    "train-without-env": (("train", "ppo"), ["--env"]),
    "set-bad-encoder": ((*TRAIN, "--set", "encoder=resnet"), ["'resnet'", "mlp", "nature"]),
    "run-folder-exists": ((*TRAIN, "--name", "old"), ["already exists", "--resume"]),
    "eval-foreign": (("eval", "foreign.pt"), ["foreign.pt", "not an rlfleet checkpoint"]),
    "plot-not-a-run": (("plot", "runs/nope", "-o", "x.png"), ["runs/nope", "metrics.csv"]),
    "eval-empty": (("eval", "empty.pt"), ["empty.pt", "cannot read checkpoint"]),
    "eval-garbage-run": (("eval", "runs/old"), ["latest.pt", "cannot read checkpoint"]),
    "resume-garbage-file": (("train", "--resume", "garbage.pt"), ["garbage.pt", "cannot read checkpoint"]),
    "env-kwargs-no-equals": ((*TRAIN, "--env-kwargs", "foo"), ["--env-kwargs expects KEY=VALUE", "'foo'"]),
    "env-kwargs-unknown": (
        (*TRAIN, "--env-kwargs", "sutton_barto_rewrd=true"),
        ["env CartPole-v1 does not take the keyword argument 'sutton_barto_rewrd'", "sutton_barto_reward, "],
    ),
    "env-kwargs-rejected": (
        ("train", "ppo", "--env", "Pendulum-v1", "--logdir", "runs", "--env-kwargs", "g=abc"),
        ["env Pendulum-v1 rejects --env-kwargs g='abc'"],
    ),
    "env-kwargs-reserved": (
        (*TRAIN, "--env-kwargs", "render_mode=human"),
        ["--env-kwargs", "cannot set 'render_mode'"],
    ),
    "env-kwargs-algo-last": (
        ("train", "--env", "CartPole-v1", "--env-kwargs", "sutton_barto_reward=true", "ppo"),
        ["'ppo'", "put ALGO first"],
    ),
}

# by category: input -> fragments of the one error line (exit 2, no traceback, nothing in the work folder changed)

# an algorithm's config fields: type, range and finiteness, declared with the field (tests/unit/test_config_fields.py
# walks every field of every algorithm; these check that the CLI says the same in one line)
CONFIG_RANGES = {
    "set-gamma-negative": ((*TRAIN, "--set", "gamma=-0.5"), ["ppo config gamma=-0.5 is negative", "in [0, 1]"]),
    "set-lr-inf": ((*TRAIN, "--set", "lr=inf"), ["ppo config lr=inf is not a finite number", ">= 0"]),
    "set-lr-nan": ((*TRAIN, "--set", "lr=nan"), ["ppo config lr=nan is not a finite number"]),
    "set-clip-zero": ((*TRAIN, "--set", "clip=0"), ["ppo config clip=0.0 is out of range", "must be > 0"]),
    "set-hidden-zero": ((*TRAIN, "--set", "hidden=64,0"), ["hidden=(64, 0)", "every entry must be >= 1"]),
    "set-int-overflow": ((*TRAIN, "--set", "n_envs=1e400"), ["'1e400'", "n_envs", "int"]),
    "set-tau-zero": (("train", "sac", "--env", "Pendulum-v1", "--set", "tau=0"), ["sac config tau=0", "(0, 1]"]),
    "set-eps-above-one": (
        ("train", "dqn", "--env", "CartPole-v1", "--set", "eps_final=2"),
        ["dqn config eps_final=2.0", "in [0, 1]"],
    ),
    "set-n-step-zero": (("train", "dqn", "--env", "CartPole-v1", "--set", "n_step=0"), ["n_step=0", ">= 1"]),
    "set-a3c-lr": (("train", "a3c", "--env", "CartPole-v1", "--set", "lr=-1"), ["a3c config lr=-1.0", "negative"]),
    # named choices, refused also where the run would not read them
    "set-log-std-on-discrete": ((*TRAIN, "--set", "log_std=foo"), ["ppo config log_std='foo'", "state_dependent"]),
    "set-log-std-valid-on-discrete": (
        (*TRAIN, "--set", "log_std=state_dependent"),
        ["--set log_std=state_dependent has no effect on Discrete(2) actions", "only Box actions have"],
    ),
    "set-init-std-on-discrete": (
        (*TRAIN, "--set", "init_std=0.3"),
        ["--set init_std=0.3 has no effect on Discrete(2)"],
    ),
    "set-optimizer-unknown": (
        ("train", "nstep_q", "--env", "CartPole-v1", "--set", "optimizer=foo"),
        ["nstep_q config optimizer='foo' must be one of: adam, rmsprop, sgd"],
    ),
    "set-target-unknown": (
        ("train", "nstep_q", "--env", "CartPole-v1", "--set", "target=foo"),
        ["nstep_q config target='foo' must be one of: onestep_q, sarsa, nstep_q"],
    ),
}

# a replay that could never hold a batch, or the transitions learning waits for: the run would never update
DQN = ("train", "dqn", "--env", "CartPole-v1", "--logdir", "runs")
REPLAY_SIZES = {
    "dqn-batch-past-buffer": (
        (*DQN, "--set", "batch_size=128", "--set", "buffer_size=100"),
        ["dqn config buffer_size=100 holds fewer transitions than a batch (batch_size=128)", "never update"],
    ),
    "dqn-learning-starts-past-buffer": (
        (*DQN, "--set", "learning_starts=2000", "--set", "buffer_size=1000"),
        ["dqn config learning_starts=2000 is more than buffer_size=1000 ever holds", "never update"],
    ),
    "dqn-preset-learning-starts-past-buffer": (
        (*DQN, "--preset", "minatar", "--set", "buffer_size=4000"),
        ["dqn config learning_starts=5000 is more than buffer_size=4000"],
    ),
    "recurrent-dqn-batch-past-buffer": (
        (*DQN, "--preset", "lstm", "--set", "buffer_size=16", "--set", "learning_starts=0"),
        ["dqn config buffer_size=16 holds fewer transitions than a batch (batch_size=32)"],
    ),
    "recurrent-dqn-sequence-past-columns": (
        (*DQN, "--preset", "lstm", "--set", "buffer_size=40", "--set", "batch_size=4", "--set", "learning_starts=0"),
        ["buffer_size=40 keeps 10 steps of each of the 4 envs, fewer than a sequence (burn_in + train_len = 16)"],
    ),
    "recurrent-dqn-sequence-past-columns-n-envs": (
        (
            *DQN,
            "--preset",
            "lstm",
            "--set",
            "buffer_size=40",
            "--set",
            "batch_size=4",
            "--set",
            "learning_starts=0",
            "--n-envs",
            "8",
        ),
        ["buffer_size=40 keeps 5 steps of each of the 8 envs", "set buffer_size >= 128"],
    ),
    "recurrent-dqn-sequence-past-data-parallel-columns": (
        (
            *DQN,
            "--preset",
            "lstm",
            "--set",
            "buffer_size=100",
            "--set",
            "batch_size=4",
            "--arch",
            "data_parallel",
            "--set",
            "learning_starts=0",
            "--workers",
            "2",
        ),
        ["buffer_size=100 keeps 12 steps of each of the 8 envs", "set buffer_size >= 128"],
    ),
    "apex-learning-starts-past-buffer": (
        (*DQN, "--arch", "apex", "--set", "buffer_size=1000", "--set", "learning_starts=1001"),
        ["dqn config learning_starts=1001 is more than buffer_size=1000"],
    ),
    "data-parallel-batch-past-buffer": (
        (*DQN, "--arch", "data_parallel", "--set", "buffer_size=32", "--set", "batch_size=33"),
        ["dqn config buffer_size=32 holds fewer transitions than a batch (batch_size=33)"],
    ),
    **{
        f"{algo}-{case}-past-buffer": (
            ("train", algo, "--env", "Pendulum-v1", "--logdir", "runs", "--set", "buffer_size=200", *sets),
            [f"{algo} config", f"{key}=300", "buffer_size=200", "never update"],
        )
        for algo in ("ddpg", "td3", "sac")
        for case, key, sets in (
            ("batch", "batch_size", ("--set", "batch_size=300")),
            ("learning-starts", "learning_starts", ("--set", "learning_starts=300", "--set", "batch_size=100")),
        )
    },
}

# run options: type, range and finiteness, declared with RunConfig's fields; eval's and collect's options
RUN_OPTIONS = {
    "time-limit-negative": ((*TRAIN, "--time-limit", "-1"), ["--time-limit=-1.0 is negative", "must be > 0"]),
    "time-limit-nan": ((*TRAIN, "--time-limit", "nan"), ["--time-limit=nan is not a number"]),
    "stop-return-nan": ((*TRAIN, "--stop-return", "nan"), ["--stop-return=nan is not a number"]),
    "steps-zero": ((*TRAIN[:4], "--steps", "0"), ["--steps=0", "must be >= 1"]),
    "seed-negative": ((*TRAIN, "--seed", "-1"), ["--seed=-1 is negative", "in [0, 2147483647]"]),
    "seed-past-64-bits": ((*TRAIN, "--seed", str(2**64)), ["--seed=18446744073709551616", "in [0, 2147483647]"]),
    "seed-past-31-bits": ((*TRAIN, "--seed", str(2**31)), ["--seed=2147483648 is out of range", "[0, 2147483647]"]),
    "eval-episodes-zero": ((*TRAIN, "--eval-episodes", "0"), ["--eval-episodes=0", "in [1, 4096]"]),
    "grad-sets-negative": ((*TRAIN, "--arch", "grad_parallel", "--grad-sets", "-2"), ["--grad-sets=-2"]),
    "torch-threads-zero": ((*TRAIN, "--torch-threads", "0"), ["--torch-threads=0", "in [1, 1024]"]),
    "eval-episodes-0": (("eval", "runs/old", "--episodes", "0"), ["--episodes=0", "in [1, 4096]"]),
    "eval-episodes-negative": (("eval", "runs/old", "--episodes", "-3"), ["--episodes=-3 is negative"]),
    "eval-episodes-huge": (("eval", "runs/old", "--episodes", "1e9"), ["--episodes=1000000000", "in [1, 4096]"]),
    "eval-seed-negative": (("eval", "runs/old", "--seed", "-1"), ["--seed=-1 is negative"]),
    "collect-episodes-0": (("collect", "runs/old", "-o", "d.npz", "--episodes", "0"), ["--episodes=0"]),
    "collect-episodes-huge": (("collect", "runs/old", "-o", "d.npz", "--episodes", "1e30"), ["in [1, 1000000]"]),
    "collect-seed-negative": (("collect", "runs/old", "-o", "d.npz", "--seed", "-1"), ["--seed=-1"]),
    "eval-max-steps-zero": ((*TRAIN, "--eval-max-steps", "0"), ["--eval-max-steps=0", "must be >= 1"]),
    "eval-max-steps-0": (("eval", "runs/old", "--max-steps", "0"), ["--max-steps=0 is out of range", ">= 1"]),
    "collect-max-steps-negative": (
        ("collect", "runs/old", "-o", "d.npz", "--max-steps", "-2"),
        ["--max-steps=-2 is negative", ">= 1"],
    ),
    "eval-max-steps-word": (("eval", "runs/old", "--max-steps", "many"), ["--max-steps", "'many'"]),
    "steps-float": (("train", "ppo", "--env", "CartPole-v1", "--steps", "2.5"), ["--steps", "'2.5'"]),
    "no-command": ((), ["command"]),
    "unknown-option": ((*TRAIN, "--stepz", "5"), ["--stepz"]),
    "env-relative-module": (("train", "ppo", "--env", "../x:Foo"), ["'../x'", "x:Foo"]),
    "obs-norm-on-images": (  # no torch-threads or placement line before it: those come once every check passed
        ("train", "ppo", "--env", "ALE/Pong-v5", "--set", "obs_norm=true", "--no-progress"),
        ["obs_norm normalises float vector observations"],
    ),
    "envpool-no-such-task": (
        ("train", "dqn", "--env", "MinAtar/Breakout-v1", "--vector-mode", "envpool"),
        ["--vector-mode envpool cannot run MinAtar/Breakout-v1", "EnvPool has no task"],
    ),
    "envpool-keyword-it-lacks": (
        (*TRAIN[:4], "--vector-mode", "envpool", "--env-kwargs", "sutton_barto_reward=true"),
        ["--vector-mode envpool cannot run CartPole-v1", "sutton_barto_reward"],
    ),
}

# run names: one path component inside --logdir
RUN_NAMES = {
    "name-parent": ((*TRAIN, "--name", ".."), ["--name='..'", "single folder name"]),
    "name-dot": ((*TRAIN, "--name", "."), ["--name='.'", "single folder name"]),
    "name-empty": ((*TRAIN, "--name", ""), ["--name=''", "single folder name"]),
    "name-separator": ((*TRAIN, "--name", "a/b"), ["--name='a/b'", "single folder name"]),
    "name-backslash": ((*TRAIN, "--name", "a\\b"), ["--name='a\\\\b'", "single folder name"]),
    "name-absolute": ((*TRAIN, "--name", "/tmp/x"), ["--name='/tmp/x'", "single folder name"]),
    "name-up-two": ((*TRAIN, "--name", "../../x"), ["--name='../../x'", "single folder name"]),
    "name-nul": ((*TRAIN, "--name", "a\0b"), ["--name='a\\x00b'", "single folder name"]),
}

# files a command reads: checkpoint, run folder, dataset, metrics; missing, empty, corrupt, wrong kind
FILE_ARGUMENTS = {
    "eval-folder-without-checkpoint": (("eval", "adir"), ["adir", "no checkpoint"]),
    "eval-incomplete-checkpoint": (("eval", "loose.pt"), ["loose.pt", "written by another version", "lacks arch"]),
    "eval-a-dataset": (("eval", "demos.npz"), ["demos.npz", "checkpoint"]),
    "eval-checkpoints-folder": (("eval", "runs/old/checkpoints"), ["checkpoints/latest.pt", "cannot read checkpoint"]),
    "expert-garbage": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "demos.npz", "--expert", "garbage.pt"),
        ["garbage.pt", "cannot read checkpoint"],
    ),
    "expert-folder-without-checkpoint": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "demos.npz", "--expert", "adir"),
        ["adir", "no checkpoint"],
    ),
    "dataset-other-env": (("train", "bc", "--env", "Acrobot-v1", "--dataset", "demos.npz"), ["'CartPole-v1'"]),
    "dataset-missing": (("train", "bc", "--env", "CartPole-v1", "--dataset", "nope.npz"), ["nope.npz", "no dataset"]),
    "dataset-empty": (("train", "bc", "--env", "CartPole-v1", "--dataset", "empty.npz"), ["empty.npz", "cannot read"]),
    "dataset-garbage": (("train", "bc", "--env", "CartPole-v1", "--dataset", "garbage.npz"), ["garbage.npz"]),
    "dataset-folder": (("train", "bc", "--env", "CartPole-v1", "--dataset", "adir"), ["adir", "is a folder"]),
    "dataset-action-out-of-range": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "act-range.npz"),
        ["does not fit CartPole-v1", "action 1 is 5, outside Discrete(2)"],
    ),
    "dataset-action-negative": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "act-negative.npz"),
        ["action 1 is -1, outside Discrete(2)"],
    ),
    "dataset-action-float": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "act-float.npz"),
        ["actions are float64, but Discrete(2) takes whole numbers"],
    ),
    "dataset-action-shape": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "act-shape.npz"),
        ["each action has shape (2,), but Discrete(2) takes shape ()"],
    ),
    "dataset-box-out-of-range": (
        ("train", "bc", "--env", "Pendulum-v1", "--dataset", "box-range.npz"),
        ["does not fit Pendulum-v1", "action 0 is [5.0], outside Box(-2.0, 2.0"],
    ),
    "dataset-box-nan": (("train", "bc", "--env", "Pendulum-v1", "--dataset", "box-nan.npz"), ["action 0 is [nan]"]),
    "dataset-box-shape": (
        ("train", "bc", "--env", "Pendulum-v1", "--dataset", "box-shape.npz"),
        ["each action has shape (), but Box(-2.0, 2.0, (1,), float32) takes shape (1,)"],
    ),
    "dataset-obs-text": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "obs-text.npz"),
        ["observations are <U1, not numbers"],
    ),
    "dataset-obs-nan": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "obs-nan.npz"),
        ["does not fit CartPole-v1", "observation 1 holds nan, not a finite number (1 of 3 observations do)"],
    ),
    "dataset-obs-inf": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "obs-inf.npz"),
        ["observation 2 holds inf, not a finite number"],
    ),
    "dataset-without-pairs": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "no-pairs.npz"),
        ["dataset no-pairs.npz holds no demonstrations"],
    ),
    "dataset-env-kwargs-deep": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "deep-dict.npz"),
        ["deep-dict.npz", "env_kwargs is nested more than 100 deep"],
    ),
    "dataset-env-kwargs-deep-list": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "deep-list.npz"),
        ["deep-list.npz", "env_kwargs is nested more than 100 deep"],
    ),
    "dataset-checkpoint": (("train", "bc", "--env", "CartPole-v1", "--dataset", "garbage.pt"), ["garbage.pt"]),
    "resume-loose-checkpoint": (("train", "--resume", "loose.pt"), ["loose.pt", "checkpoints/"]),
    "resume-folder-without-checkpoint": (("train", "--resume", "adir"), ["adir", "no checkpoint"]),
    "plot-no-header": (("plot", "runs/no-header"), ["runs/no-header/metrics.csv", "step, key, value"]),
    "plot-binary-metrics": (("plot", "runs/binary"), ["runs/binary/metrics.csv"]),
    "plot-a-file": (("plot", "notes.txt"), ["notes.txt", "not a run folder"]),
    "plot-good-and-corrupt": (("plot", "runs/old", "runs/text-in-value"), ["runs/text-in-value/metrics.csv"]),
}

# where a command writes: --logdir, the run folder, --video, -o; a file where a folder goes and the reverse,
# and no overwriting of a file the command did not write
OUTPUT_PATHS = {
    "logdir-is-a-file": ((*TRAIN[:-3], "--logdir", "notes.txt"), ["--logdir notes.txt", "is a file"]),
    "logdir-below-a-file": ((*TRAIN[:-3], "--logdir", "notes.txt/runs"), ["notes.txt", "is a file"]),
    "run-folder-is-a-file": ((*TRAIN, "--name", "notes.txt"), ["runs/notes.txt", "is a file"]),
    "video-is-a-file": (("eval", "runs/old", "--video", "notes.txt"), ["--video notes.txt", "is a file"]),
    "collect-onto-a-folder": (("collect", "runs/old", "-o", "adir"), ["-o adir", "is a folder"]),
    "collect-below-a-file": (("collect", "runs/old", "-o", "notes.txt/d.npz"), ["notes.txt", "is a file"]),
    "collect-over-a-user-file": (("collect", "runs/old", "-o", "notes.txt"), ["notes.txt", "not an rlfleet dataset"]),
    "plot-onto-a-folder": (("plot", "runs/old", "-o", "adir"), ["-o adir", "is a folder"]),
    "plot-below-a-file": (("plot", "runs/old", "-o", "notes.txt/c.png"), ["notes.txt", "is a file"]),
    "plot-over-a-user-file": (("plot", "runs/old", "-o", "notes.txt"), ["notes.txt", ".png"]),
    # an empty name would be the current folder, which was not asked for
    "logdir-empty": ((*TRAIN[:-3], "--logdir", ""), ["--logdir is empty"]),
    "video-empty": (("eval", "runs/old", "--video", ""), ["--video is empty"]),
    "collect-empty": (("collect", "runs/old", "-o", ""), ["-o is empty"]),
    "plot-empty": (("plot", "runs/old", "-o", ""), ["-o is empty"]),
}

# counts and sizes past what the machine or a library can take: refused before they reach the allocator or the OS
DC = ("train", "a2c", "--env", "CartPole-v1", "--arch", "data_parallel", "--logdir", "runs", "--no-progress")
ABSURD_SIZES = {
    "torch-threads-1e6": ((*TRAIN, "--torch-threads", "1e6"), ["--torch-threads=1000000", "in [1, 1024], or auto"]),
    "torch-threads-past-64-bits": ((*TRAIN, "--torch-threads", "1" + "0" * 23), ["--torch-threads=1000", "[1, 1024]"]),
    "learners-1e9": ((*TRAIN, "--arch", "gossip", "--learners", "1e9"), ["--learners=1000000000", "in [1, 1024]"]),
    "workers-1e6": ((*DC, "--workers", "1e6"), ["--workers=1000000", "in [1, 1024]"]),
    "actors-1e6": (("train", "dqn", "--env", "CartPole-v1", "--arch", "apex", "--actors", "1e6"), ["--actors=1000000"]),
    "n-envs-1e9": ((*TRAIN, "--n-envs", "1e9"), ["--n-envs=1000000000", "in [1, 4096]"]),
    "set-n-envs-1e9": ((*TRAIN, "--set", "n_envs=1e9"), ["ppo config n_envs=1000000000", "in [1, 4096]"]),
    "eval-episodes-1e7": ((*TRAIN, "--eval-episodes", "1e7"), ["--eval-episodes=10000000", "in [1, 4096]"]),
    "rollout-past-memory": ((*TRAIN, "--set", "rollout_len=1e9"), ["rollout_len=1000000000 steps of n_envs=8 envs"]),
    "priority-trees-past-memory": (
        (*TRAIN[:1], "dqn", *TRAIN[2:], "--set", "buffer_size=1e10"),
        ["buffer_size=10,000,000,000: a prioritized replay's trees take", "--set prioritized=false"],
    ),
    "huge-discrete-observations": (
        ("train", "ppo", "--env", "space_envs:HugeDiscrete-v0", "--logdir", "runs"),
        ["Discrete(10000000000000000)", "10,000,000,000,000,000 floats", "16,777,216"],
    ),
    "empty-dict-observations": (
        ("train", "dqn", "--env", "space_envs:EmptyDict-v0", "--logdir", "runs"),
        ["space_envs:EmptyDict-v0", "empty Dict observation space"],
    ),
}

# the options of the architectures and the ray backend: what cannot be met is found before anything starts
ARCH_OPTIONS = {
    "placement-empty-names": ((*DC, "--backend", "ray", "--placement", ",,"), ["--placement ',,'", "empty name"]),
    "placement-one-empty-name": ((*DC, "--backend", "ray", "--placement", "a,,b"), ["'a,,b'", "empty name"]),
    "placement-on-private-instance": (
        (*DC, "--backend", "ray", "--placement", "node0"),
        ["--placement node0", "private Ray instance", "--address"],
    ),
    "cpus-per-role-1e9": ((*DC, "--backend", "ray", "--cpus-per-role", "1e9"), ["--cpus-per-role", "[0.0001, 1024]"]),
    "cpus-per-role-1e-9": ((*DC, "--backend", "ray", "--cpus-per-role", "1e-9"), ["--cpus-per-role=1e-09", "0.0001"]),
    "gpus-per-role-1e-9": ((*DC, "--backend", "ray", "--gpus-per-role", "1e-9"), ["--gpus-per-role=1e-09", "0.0001"]),
    "address-not-host-port": ((*DC, "--backend", "ray", "--address", "nowhere"), ["'nowhere'", "HOST:PORT"]),
    "apex-block-past-budget": (
        ("train", "dqn", "--env", "CartPole-v1", "--arch", "apex", "--steps", "2000", "--block", "1e5"),
        ["--block 100000 is more than the run's 2000 steps", "--block 1 to 2000"],
    ),
    "apex-buffer-below-a-batch": (
        ("train", "dqn", "--env", "CartPole-v1", "--arch", "apex", "--set", "buffer_size=10"),
        ["dqn config buffer_size=10 holds fewer transitions than a batch (batch_size=64)"],
    ),
    "gossip-one-learner-two-peers": (
        (*TRAIN, "--arch", "gossip", "--learners", "1", "--peers", "2"),
        ["--peers 2 needs at least 3 learners", "--learners 1"],
    ),
    "workers-past-the-machine": ((*DC, "--workers", "1000"), ["--workers 1000 asks for 1000 CPUs", "--oversubscribe"]),
    "learners-past-the-machine": (
        (*TRAIN, "--arch", "gossip", "--learners", "1000"),
        ["--learners 1000 asks for 1000 CPUs", "--oversubscribe"],
    ),
    "unknown-optimizer-async-grad": (
        ("train", "a2c", "--env", "CartPole-v1", "--arch", "async_grad", "--optimizer", "adam"),
        ["unknown optimizer 'adam'; choose one of algo, shared_rmsprop, rmsprop, momentum_sgd, shared_adam", "algo:"],
    ),
    "gossip-exp-one-learner-two-peers": (
        (*TRAIN, "--arch", "gossip", "--topology", "exp", "--learners", "1", "--peers", "2"),
        ["--peers 2: one learner has no peers"],
    ),
}

# a network of the user's own (`--net`, tests/user_nets.py): refused before anything is written
USER_NETS = {
    "net-does-not-import": (
        (*TRAIN, "--net", "nowhere_pkg.nets:encoder"),
        ["net='nowhere_pkg.nets:encoder' does not import", "'nowhere_pkg'", "No module named"],
    ),
    "net-without-colon": ((*TRAIN, "--net", "user_nets.mlp"), ["user_nets.mlp", "package.module:factory"]),
    "net-missing-name": ((*TRAIN, "--net", "user_nets:nope"), ["module 'user_nets' has no 'nope'"]),
    "net-not-callable": ((*TRAIN, "--net", "user_nets:NOT_CALLABLE"), ["names an object of type int, not a callable"]),
    "net-factory-raises": (
        (*TRAIN, "--net", "user_nets:raising"),
        ["--net user_nets:raising: the factory raised ValueError: width must be even, got 3"],
    ),
    "net-factory-bad-kwarg": (
        (*TRAIN, "--net", "user_nets:mlp", "--net-kwargs", "widht=8"),
        ["the factory raised TypeError", "'widht'"],
    ),
    "net-not-a-module": ((*TRAIN, "--net", "user_nets:not_a_module"), ["returned a list, not a torch.nn.Module"]),
    "net-output-3d": (
        (*TRAIN, "--net", "user_nets:ThreeDimensional"),
        ["maps observations [1, 4] float32 to [1, 2, 3] float32", "[batch, features]"],
    ),
    "net-returns-state": ((*TRAIN, "--net", "user_nets:WithState"), ["returned a tuple", "--set lstm=N"]),
    "net-fixed-batch": (
        (*TRAIN, "--net", "user_nets:FixedBatch"),
        ["maps observations [1, 4] float32 to [2, 4] float32", "[batch, features]"],
    ),
    "net-float64-features": (
        (*TRAIN, "--net", "user_nets:Double"),
        ["maps observations [1, 4] float32 to [1, 16] float64", "the heads need float32 features"],
    ),
    "net-squeezed-batch-of-one": ((*TRAIN, "--net", "user_nets:Squeezy"), ["to [16] float32", "[batch, features]"]),
    "net-not-copyable": (
        ("train", "dqn", "--env", "CartPole-v1", "--net", "user_nets:Locked", "--logdir", "runs"),
        ["--net user_nets:Locked: its module cannot be copied for a target network", "cannot pickle"],
    ),
    "net-not-picklable-for-processes": (
        (*DC, "--net", "user_nets:Lambda", "--workers", "2"),
        ["--net user_nets:Lambda: its module cannot be sent to another process", "runs its roles as processes"],
    ),
    "net-no-features": ((*TRAIN, "--net", "user_nets:no_features"), ["to [1, 0] float32", "at least one feature"]),
    "actor-net-outputs": (
        ("train", "sac", "--env", "Pendulum-v1", "--logdir", "runs", "--actor-net", "user_nets:Actor"),
        ["--actor-net user_nets:Actor", "maps observations [1, 3] float32 to [1, 1] float32", "[batch, 2]"],
    ),
    "critic-net-two-values": (
        ("train", "td3", "--env", "Pendulum-v1", "--logdir", "runs", "--critic-net", "user_nets:PairCritic"),
        ["--critic-net user_nets:PairCritic", "to [1, 2] float32", "[batch] or [batch, 1]"],
    ),
    "actor-net-with-sde": (
        (
            "train",
            "sac",
            "--env",
            "Pendulum-v1",
            "--logdir",
            "runs",
            "--set",
            "sde=true",
            "--actor-net",
            "user_nets:Actor",
            "--actor-net-kwargs",
            "gaussian=true",
        ),
        ["sde makes its noise from the actor's features"],
    ),  # fmt: skip
    "actor-net-on-ppo": ((*TRAIN, "--actor-net", "user_nets:Actor"), ["unknown config key 'actor_net' for ppo"]),
    "net-kwargs-malformed": (
        (*TRAIN, "--net", "user_nets:mlp", "--net-kwargs", "width"),
        ["--net-kwargs expects KEY=VALUE items", "'width'"],
    ),
    # settings of a user network that would do nothing, or that contradict each other
    "net-kwargs-without-net": (
        (*TRAIN, "--net-kwargs", "width=3"),
        ["net_kwargs={'width': 3} has no effect while net=''", "set net too"],
    ),
    "actor-net-kwargs-without-actor-net": (
        ("train", "td3", "--env", "Pendulum-v1", "--logdir", "runs", "--actor-net-kwargs", "width=8"),
        ["actor_net_kwargs={'width': 8} has no effect while actor_net=''"],
    ),
    "critic-net-kwargs-without-critic-net": (
        ("train", "sac", "--env", "Pendulum-v1", "--logdir", "runs", "--set", "critic_net_kwargs={'width': 8}"),
        ["critic_net_kwargs={'width': 8} has no effect while critic_net=''"],
    ),
    "net-beside-whole-actor-and-critics": (
        (
            "train",
            "ddpg",
            "--env",
            "Pendulum-v1",
            "--logdir",
            "runs",
            "--net",
            "user_nets:mlp",
            "--actor-net",
            "user_nets:Actor",
            "--critic-net",
            "user_nets:Critic",
        ),
        ["--net user_nets:mlp has no effect with both --actor-net and --critic-net"],
    ),  # fmt: skip
    "net-and-set-net": (
        (*TRAIN, "--net", "user_nets:mlp", "--set", "net=user_nets:Scaled"),
        ["--net user_nets:mlp and --set net=user_nets:Scaled disagree"],
    ),
    "net-kwargs-and-set-net-kwargs": (
        (*TRAIN, "--net", "user_nets:mlp", "--net-kwargs", "width=8", "--set", "net_kwargs={'width': 4}"),
        ["--net-kwargs {'width': 8} and --set net_kwargs={'width': 4} disagree"],
    ),
    "activation-under-a-user-net": (
        (*TRAIN, "--net", "user_nets:mlp", "--set", "activation=foo"),
        ["ppo config activation='foo' must be one of: relu, tanh, elu"],
    ),
    "hidden-under-a-user-net": (
        (*TRAIN, "--net", "user_nets:mlp", "--set", "hidden=32,32"),
        ["--set hidden=32,32 has no effect while net='user_nets:mlp'", "leave hidden out, or net"],
    ),
    "valid-activation-under-a-user-net": (
        ("train", "dqn", "--env", "CartPole-v1", "--net", "user_nets:mlp", "--set", "activation=tanh"),
        ["--set activation=tanh has no effect while net='user_nets:mlp'"],
    ),
    "encoder-under-a-user-net": (
        (*TRAIN, "--net", "user_nets:mlp", "--set", "encoder=foo"),
        ["ppo config encoder='foo' must be one of: auto, minatar, mlp, mnih2013, nature"],
    ),
    "activation-under-a-user-actor-and-critic": (
        (
            "train",
            "td3",
            "--env",
            "Pendulum-v1",
            "--logdir",
            "runs",
            "--actor-net",
            "user_nets:Actor",
            "--critic-net",
            "user_nets:Critic",
            "--set",
            "activation=gelu",
        ),
        ["td3 config activation='gelu'"],
    ),  # fmt: skip
}

# a setting that would do nothing in the run it is given to: refused, not ignored
APEX = ("train", "dqn", "--env", "CartPole-v1", "--arch", "apex", "--logdir", "runs", "--no-progress")
MA = ("train", "ppo", "--env", "pettingzoo:mpe2.simple_spread_v3", "--preset", "default", "--logdir", "runs")
FIXED_ALPHA = ("train", "sac", "--env", "Pendulum-v1", "--set", "auto_alpha=false", "--logdir", "runs")
IDLE_SETTINGS = {
    "algo-optimizer-under-shared-rmsprop": (
        ("train", "a3c", "--env", "CartPole-v1", "--set", "optimizer=adam", "--logdir", "runs"),
        ["--set optimizer=adam has no effect on --arch hogwild", "--optimizer (shared_rmsprop)", "--optimizer algo"],
    ),
    "apex-uniform-replay": ((*APEX, "--set", "prioritized=false"), ["prioritized=false has no effect on --arch apex"]),
    "apex-epsilon-schedule": ((*APEX, "--set", "eps_final=0"), ["eps_final=0 has no effect", "--epsilon-alpha"]),
    "apex-unpaced-train-freq": (
        (*APEX, "--unpaced", "--set", "train_freq=4"),
        ["train_freq=4 has no effect on --arch apex", "--unpaced updates as fast as it can"],
    ),
    "serial-heartbeat": (
        (*DC, "--backend", "serial", "--heartbeat-s", "5"),
        ["--heartbeat-s is for roles that run as processes", "--backend serial runs them in this process"],
    ),
    "serial-max-restarts": ((*DC, "--backend", "serial", "--max-restarts", "0"), ["--max-restarts is for roles"]),
    "policies-beside-a-policy-map": (
        (*MA, "--policies", "separate", "--policy-map", "*=blue"),
        ["--policies separate has no effect with --policy-map"],
    ),
    "n-envs-twice": ((*TRAIN, "--n-envs", "4", "--set", "n_envs=2"), ["--n-envs 4 and --set n_envs=2 disagree"]),
    "steps-twice": ((*TRAIN, "--set", "total_steps=100"), ["--steps 600 and --set total_steps=100 disagree"]),
    "set-twice": ((*TRAIN, "--set", "lr=1e-3", "--set", "lr=5e-2"), ["--set lr=1e-3 and --set lr=5e-2 disagree"]),
    "box-preset-on-discrete-actions": (
        (*TRAIN, "--preset", "continuous"),
        ["--preset continuous sets log_std=state_independent, which has no effect on Discrete(2) actions"],
    ),
    "ou-noise-setting-with-gaussian-noise": (
        ("train", "td3", "--env", "Pendulum-v1", "--set", "ou_theta=0.5", "--logdir", "runs"),
        ["--set ou_theta=0.5 has no effect while action_noise='gaussian'", "set action_noise=ou too"],
    ),
    "priority-setting-with-uniform-replay": (
        (*TRAIN[:1], "dqn", *TRAIN[2:], "--set", "prioritized=false", "--set", "alpha=0.9"),
        ["--set alpha=0.9 has no effect while prioritized=False", "set prioritized too"],
    ),
    "vector-mode-of-workers": (
        (*DC, "--vector-mode", "async"),
        ["--vector-mode async has no effect on --arch data_parallel", "only --arch single"],
    ),
    "vector-mode-multi-agent": ((*MA, "--vector-mode", "sync"), ["--vector-mode sync has no effect on a PettingZoo"]),
    "env-timeout-without-env-processes": ((*TRAIN, "--env-timeout-s", "5"), ["--env-timeout-s 5 has no effect"]),
    "obs-clip-without-obs-norm": (
        (*TRAIN, "--set", "obs_clip=1"),
        ["--set obs_clip=1 has no effect while obs_norm=False", "set obs_norm too"],
    ),
    "sde-sample-freq-without-sde": (
        ("train", "ppo", "--env", "Pendulum-v1", "--set", "sde_sample_freq=4", "--logdir", "runs"),
        ["sde_sample_freq=4 has no effect while sde=False"],
    ),
    "burn-in-without-lstm": (
        ("train", "dqn", "--env", "CartPole-v1", "--set", "burn_in=3", "--logdir", "runs"),
        ["burn_in=3 has no effect while lstm=0"],
    ),
    "pg-vf-coef-without-baseline": (
        ("train", "pg", "--env", "CartPole-v1", "--set", "vf_coef=3", "--logdir", "runs"),
        ["vf_coef=3 has no effect while baseline=False"],
    ),
    "sac-alpha-lr-with-a-fixed-alpha": (
        (*FIXED_ALPHA, "--set", "alpha_lr=0.1"),
        ["--set alpha_lr=0.1 has no effect while auto_alpha=False", "set auto_alpha too"],
    ),
    "sac-target-entropy-with-a-fixed-alpha": (
        (*FIXED_ALPHA, "--set", "target_entropy_scale=0.5"),
        ["target_entropy_scale=0.5 has no effect while auto_alpha=False"],
    ),
    "log-std-with-sde": (
        ("train", "ppo", "--env", "Pendulum-v1", "--set", "sde=true", "--set", "log_std=softplus", "--logdir", "runs"),
        ["--set log_std=softplus has no effect while sde=True", "set sde=False too"],
    ),
    "priority-setting-with-recurrent-dqn": (
        ("train", "dqn", "--env", "CartPole-v1", "--preset", "lstm", "--set", "alpha=0.9", "--logdir", "runs"),
        ["--set alpha=0.9 has no effect while lstm=64", "set lstm=0 too"],
    ),
    "prioritized-with-recurrent-dqn": (
        ("train", "dqn", "--env", "CartPole-v1", "--set", "lstm=16", "--set", "prioritized=true", "--logdir", "runs"),
        ["--set prioritized=true has no effect while lstm=16"],
    ),
    "another-algorithm-s-target": (
        ("train", "sarsa", "--env", "CartPole-v1", "--set", "target=nstep_q", "--logdir", "runs"),
        ["sarsa config target='nstep_q' would run nstep_q under the name sarsa", "train nstep_q instead"],
    ),
    "gossip-order-of-one-learner": (
        (*TRAIN, "--arch", "gossip", "--learners", "1", "--gossip-order", "pala"),
        ["--gossip-order has no effect with --learners 1"],
    ),
    "group-timeout-of-one-learner": (
        (*TRAIN, "--arch", "allreduce", "--workers", "1", "--group-timeout-s", "5"),
        ["--group-timeout-s has no effect with --workers 1"],
    ),
    "ladder-of-one-actor": (
        (*APEX, "--actors", "1", "--epsilon-alpha", "3"),
        ["--epsilon-alpha has no effect with --actors 1"],
    ),
    "dagger-without-expert": (
        ("train", "bc", "--env", "CartPole-v1", "--dataset", "demos.npz", "--set", "dagger_iterations=3"),
        ["--set dagger_iterations=3 has no effect without --expert"],
    ),
}

MORE_USAGE_ERRORS = {
    **EARLIER_USAGE_ERRORS,
    **CONFIG_RANGES,
    **REPLAY_SIZES,
    **RUN_OPTIONS,
    **RUN_NAMES,
    **FILE_ARGUMENTS,
    **OUTPUT_PATHS,
    **ABSURD_SIZES,
    **ARCH_OPTIONS,
    **USER_NETS,
    **IDLE_SETTINGS,
}
assert len(MORE_USAGE_ERRORS) == sum(
    map(
        len,
        (
            EARLIER_USAGE_ERRORS,
            CONFIG_RANGES,
            REPLAY_SIZES,
            RUN_OPTIONS,
            RUN_NAMES,
            FILE_ARGUMENTS,
            OUTPUT_PATHS,
            ABSURD_SIZES,
            ARCH_OPTIONS,
            USER_NETS,
            IDLE_SETTINGS,
        ),
    )
), "a case id is used twice"


def check_one_error_line(returncode: int, stdout: str, stderr: str, expected: list[str]) -> None:
    lines = stderr.strip().splitlines()
    assert returncode == 2, f"exit {returncode}\n{stderr}"
    assert "Traceback" not in stderr
    assert len(lines) == 1, f"expected one error line, got:\n{stderr}"
    assert lines[0].startswith("rlfleet: error: "), lines[0]
    for text in expected:
        assert text in lines[0], f"{text!r} missing from: {lines[0]}"
    assert stdout == ""


@pytest.fixture(scope="module")
def usage_error_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, dict, dict]]:
    """Every USAGE_ERRORS command, three at a time, each in its own fresh work folder: (process, before, after)."""

    def run(case: str):
        folder = make_workdir(tmp_path_factory.mktemp(case))
        before = tree(folder)
        proc = rlfleet(*USAGE_ERRORS[case][0], cwd=folder, timeout=90)
        return case, (proc, before, tree(folder))

    tmp_path_factory.getbasetemp()  # made once, before the threads: its first call empties the folder xdist gives
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(run, USAGE_ERRORS))


@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_usage_error_is_one_clean_line(usage_error_runs, case: str):
    proc, before, after = usage_error_runs[case]
    check_one_error_line(proc.returncode, proc.stdout, proc.stderr, USAGE_ERRORS[case][1])
    assert after == before, "a failed command created or changed files"


@pytest.mark.timeout(60)  # a bad interval once made training loop forever
@pytest.mark.parametrize("case", list(MORE_USAGE_ERRORS))
def test_more_usage_errors_in_process(tmp_path: Path, monkeypatch, capsys, case: str):
    folder = make_workdir(tmp_path / "work")
    monkeypatch.chdir(folder)
    before = tree(tmp_path)  # the work folder's parent too: a run name with ".." must not reach it
    args, expected = MORE_USAGE_ERRORS[case]
    code = run_main(args)
    out, err = capsys.readouterr()
    check_one_error_line(code, out, err, expected)
    assert tree(tmp_path) == before, "a failed command created or changed files"


def run_main(args) -> int:
    """`rlfleet.cli.main` as the `rlfleet` command runs it: argparse's own errors exit through SystemExit."""
    from rlfleet.cli import main

    try:
        return main([str(a) for a in args])
    except SystemExit as exit_:
        return exit_.code


# a folder the user may not write to (tests run as root, for whom every folder is writable: refused by os.access)
UNWRITABLE = {
    "logdir": ((*TRAIN[:-3], "--logdir", "locked/runs"), ["--logdir locked/runs", "not writable"]),
    "video": (("eval", "runs/old", "--video", "locked/video"), ["--video locked/video", "not writable"]),
    "collect-output": (("collect", "runs/old", "-o", "locked/d.npz"), ["-o locked/d.npz", "not writable"]),
    "plot-output": (("plot", "runs/old", "-o", "locked/c.png"), ["-o locked/c.png", "not writable"]),
}


@pytest.mark.parametrize("case", list(UNWRITABLE))
def test_an_unwritable_output_is_one_line(tmp_path: Path, monkeypatch, capsys, case: str):
    import os

    folder = make_workdir(tmp_path)
    (folder / "locked").mkdir()
    monkeypatch.chdir(folder)
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p).name != "locked" and access(p, mode, **kw))
    before = tree(folder)
    args, expected = UNWRITABLE[case]
    code = run_main(args)
    out, err = capsys.readouterr()
    check_one_error_line(code, out, err, expected)
    assert tree(folder) == before, "a failed command created or changed files"


# an env, or a vector mode, whose optional package is not installed: (package hidden, arguments, expected)
MISSING_EXTRAS = {
    "atari": ("ale_py", ("train", "ppo", "--env", "ALE/Pong-v5"), ["ALE/Pong-v5", 'pip install "rlfleet[atari]"']),
    "minatar": ("minatar", ("train", "dqn", "--env", "MinAtar/Breakout-v1"), ['pip install "rlfleet[minatar]"']),
    "mujoco": ("mujoco", ("train", "sac", "--env", "HalfCheetah-v5"), ['pip install "rlfleet[mujoco]"']),
    "envpool": ("envpool", ("train", "ppo", "--env", "CartPole-v1", "--vector-mode", "envpool"), ['rlfleet[envpool]"']),
}


@pytest.mark.parametrize("case", list(MISSING_EXTRAS))
def test_a_missing_extra_is_one_line(tmp_path: Path, case: str):
    """A fresh `rlfleet` process in which the extra's package cannot be imported (as on a machine without it)."""
    hidden, args, expected = MISSING_EXTRAS[case]
    command = f"import sys; sys.modules[{hidden!r}] = None; from rlfleet.cli import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", command, *args, "--steps", "100", "--logdir", "runs", "--no-progress"], cwd=tmp_path,
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    check_one_error_line(proc.returncode, proc.stdout, proc.stderr, expected)
    assert not any(tmp_path.iterdir()), "a failed command created files"


def test_python_dash_m_rlfleet_is_the_command_with_worker_processes_too(tmp_path: Path):
    """`python -m rlfleet` where the scripts folder is not on PATH; its spawned workers import `rlfleet.__main__`
    again without running the command."""
    proc = subprocess.run(
        [sys.executable, "-m", "rlfleet", "train", "a2c", "--env", "CartPole-v1", "--arch", "data_parallel",
         "--workers", "2", "--steps", "2000", "--eval-episodes", "1", "--name", "m", "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "runs" / "m" / "result.json").read_text())
    assert result["arch"] == "data_parallel" and result["env_steps"] >= 2000


def test_list_shows_every_algorithm(tmp_path: Path):
    proc = rlfleet("list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ") and line.split()}
    assert set(ALGOS) == set(REGISTRY) <= listed
    for name in ALGOS:
        assert f"  {name} " in proc.stdout
    for arch in ("single", "hogwild", "data_parallel", "grad_parallel", "offline"):
        assert f"  {arch} " in proc.stdout


def test_train_help_says_what_each_optimizer_is_and_each_architectures_default(capsys):
    """One `--optimizer` for four architectures with two defaults: its help names every choice and both defaults."""
    assert run_main(("train", "--help")) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "algo (the algorithm's own, the class and hyperparameters its single-process update steps with" in text
    for choice in ("shared_rmsprop (", "rmsprop (", "momentum_sgd (", "shared_adam."):
        assert choice in text
    assert "(default: hogwild: shared_rmsprop; grad_parallel, async_grad, param_server: algo)" in text


def test_help_shows_a_default_of_0_and_names_no_internal_constant(capsys):
    """A default of 0 or 0.0 (`--seed`, `--grad-sets`, `--gpus-per-role`) was left out, as equal to False."""
    assert run_main(("train", "--help")) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Seed for envs, networks and sampling. (default: 0)" in text
    assert "OVERSUBSCRIBE_LIMIT times" not in text and "None or 0" not in text and "None takes" not in text
    shown = {"eval": "(default: 12345)", "collect": "(default: 20)", "plot": "(default: curves.png)"}
    for command, said in shown.items():
        assert run_main((command, "--help")) == 0
        assert said in " ".join(capsys.readouterr().out.split()), command


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """`rlfleet train ppo` for 3,000 steps, done once for the tests that read its run folder."""
    root = tmp_path_factory.mktemp("cli")
    args = ("train", "ppo", "--env", "CartPole-v1", "--steps", 3000, "--logdir", root / "TMP", "--name", "x")
    proc = rlfleet(*args, "--no-progress", cwd=root, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    run = root / "TMP" / "x"
    assert str(run) in proc.stdout
    return run


def test_train_writes_the_run_folder(trained_run: Path):
    for name in ("config.json", "metrics.csv", "curves.png", "result.json", "checkpoints/latest.pt"):
        assert (trained_run / name).is_file(), f"{name} missing"
    assert (trained_run / "checkpoints" / "best.pt").is_file()
    assert (trained_run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = list((trained_run / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100

    config = json.loads((trained_run / "config.json").read_text())
    assert config["run"]["algo"] == "ppo" and config["run"]["env"] == "CartPole-v1"
    assert config["total_steps"] == 3000

    result = json.loads((trained_run / "result.json").read_text())
    assert set(result) >= RESULT_KEYS, RESULT_KEYS - set(result)
    assert 3000 <= result["env_steps"] < 3000 + 8 * 32  # stops within one PPO iteration (8 envs x 32 steps)
    assert isinstance(result["solved"], bool)
    if not result["solved"]:
        assert result["solved_at_step"] is None and result["solved_at_s"] is None
    assert math.isfinite(result["eval_return_mean"]) and result["eval_return_mean"] >= 8  # CartPole lasts >= 8 steps
    assert math.isfinite(result["eval_return_std"]) and result["eval_return_std"] >= 0
    assert result["wall_time_s"] > 0
    assert result["stopped_by"] == "steps"

    with open(trained_run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    keys = {row["key"] for row in rows}
    assert {"charts/episodic_return", "eval/return_mean", "charts/SPS"} <= keys
    assert any(k.startswith("losses/") for k in keys)
    final_eval = [float(r["value"]) for r in rows if r["key"] == "eval/return_mean"][-1]
    assert final_eval == pytest.approx(result["eval_return_mean"], rel=1e-5)

    latest = load_checkpoint(trained_run)
    assert latest["env_steps"] == result["env_steps"]
    assert latest["run_config"]["algo"] == "ppo"
    best = load_checkpoint(trained_run / "checkpoints" / "best.pt")
    assert best["algo"].keys() == latest["algo"].keys()


def test_eval_prints_json(trained_run: Path):
    proc = rlfleet("eval", trained_run, "--episodes", 3, cwd=trained_run.parent)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["algo"] == "ppo" and out["env"] == "CartPole-v1" and out["episodes"] == 3
    assert len(out["returns"]) == 3 and all(1 <= r <= 500 for r in out["returns"])
    assert out["return_mean"] == pytest.approx(sum(out["returns"]) / 3)
    assert out["video_dir"] is None


def test_eval_records_a_gif(trained_run: Path, tmp_path: Path):
    from PIL import Image

    video = tmp_path / "video"
    proc = rlfleet("eval", trained_run, "--episodes", 1, "--video", video, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    gifs = sorted(video.glob("*.gif"))
    assert len(gifs) == 1 and out["video_dir"] == str(video)
    with Image.open(gifs[0]) as gif:
        assert gif.format == "GIF" and gif.n_frames > 1


def test_training_on_an_env_without_time_limit_ends(tmp_path: Path):
    """CliffWalking-v1 has no time limit and a greedy policy may walk in circles there forever: its evaluations end
    at --eval-max-steps (default 27,000), and the run says how many episodes were cut."""
    args = ("train", "ppo", "--env", "CliffWalking-v1", "--steps", 2000, "--name", "cliff", "--no-progress")
    proc = rlfleet(*args, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "runs" / "cliff" / "result.json").read_text())
    assert result["eval_max_steps"] == 27_000 and 0 <= result["eval_episodes_cut"] <= 10
    assert result["eval_return_mean"] >= -27_000 * 100  # at most 27,000 steps of at most -100 each
    if result["eval_episodes_cut"]:
        assert f"{result['eval_episodes_cut']} of 10 episodes were cut at 27000 steps" in proc.stdout
    proc = rlfleet("eval", "runs/cliff", "--episodes", 2, "--max-steps", 40, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["max_steps"] == 40 and out["episodes_cut"] <= 2


def test_plot_writes_a_png(trained_run: Path, tmp_path: Path):
    out = tmp_path / "plots" / "out.png"
    proc = rlfleet("plot", trained_run, "-o", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out) in proc.stdout


def test_the_last_line_says_the_step_of_an_evaluation_the_workers_stepped_past():
    """A hogwild run solved at step 2295 and stopped with 2765 steps taken; its line read "eval return 500.0 after
    2765 steps", as if the evaluation had been there."""
    r = {"algo": "a3c", "env": "CartPole-v1", "eval_return_mean": 500.0, "eval_return_std": 0.0, "solved": True,
         "solved_at_step": 2295, "solved_at_s": 10.4, "stopped_by": "solved", "env_steps": 2765,
         "eval_at_step": 2295}  # fmt: skip
    assert outcome(r) == (
        "a3c on CartPole-v1: eval return 500.0 ± 0.0 at step 2295 of 2765, solved at step 2295 (10.4 s); stopped by "
        "solved"
    )
    assert "after 2765 steps, solved" in outcome({**r, "eval_at_step": 2765})
    assert "before any evaluation" in outcome({**r, "eval_return_mean": None})
