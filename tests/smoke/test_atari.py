"""Every algorithm runs on Atari Pong (DQN preprocessing, `atari` presets picked automatically) and writes its run."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import subprocess
import sys
import time

import pytest

from rlfleet import train
from rlfleet.algos import REGISTRY
from rlfleet.run.checkpoint import load_checkpoint

pytestmark = [
    pytest.mark.atari,
    pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason='needs ale-py: pip install "rlfleet[atari]"'),
]

STEPS = 2_000
# DQN's atari preset starts learning after 20,000 steps; these make it learn a little within the 2,000
OVERRIDES = {"dqn": {"learning_starts": "1500", "buffer_size": "5000"}}


# algorithms for Box actions only: Pong's actions are discrete (their clean refusal is a CLI test)
BOX_ONLY = {"ddpg", "td3", "sac"}
# imitation algorithms learn from a recorded dataset, not from env steps (tests/smoke/test_imitation.py)
NEEDS_DATASET = {"bc"}


# in CI: one algorithm per CNN path (ppo: on-policy, dqn: replay, a3c: hogwild workers, nstep_q: the A3C paper's
# Q methods); the others share those paths and are slow (CI time)
CI_ALGOS = {"ppo", "dqn", "a3c", "nstep_q"}
ALGOS = sorted(set(REGISTRY) - BOX_ONLY - NEEDS_DATASET)


@pytest.mark.parametrize("algo", [a if a in CI_ALGOS else pytest.param(a, marks=pytest.mark.slow) for a in ALGOS])
def test_algorithm_runs_on_pong(algo: str, run_opts: dict):
    started = time.perf_counter()
    result = train(
        algo,
        "ALE/Pong-v5",
        steps=STEPS,
        n_envs=2,
        eval_episodes=1,
        eval_every=10 * STEPS,  # only the final evaluation: one greedy game
        overrides=OVERRIDES.get(algo, {}),
        **run_opts,
    )
    print(f"{algo} on ALE/Pong-v5: {STEPS} steps in {time.perf_counter() - started:.1f} s")
    run = result.run_dir
    saved = json.loads((run / "result.json").read_text())
    assert saved["env_steps"] >= STEPS and saved["stopped_by"] == "steps"
    assert -21 <= saved["eval_return_mean"] <= 21  # the raw game score, not a clipped sum
    assert saved["eval_return_mean"] == result["eval_return_mean"]

    config = json.loads((run / "config.json").read_text())
    assert config["preset"] == "atari"
    assert config["algo"]["n_envs"] == 2
    for key, value in OVERRIDES.get(algo, {}).items():
        assert config["algo"][key] == int(value)
    if algo == "a3c":  # the paper's Atari agent: Mnih 2013 network, asynchronous workers
        assert config["run"]["arch"] == "hogwild" and config["algo"]["encoder"] == "mnih2013"

    latest = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert latest["env_steps"] == saved["env_steps"]
    assert (run / "checkpoints" / "best.pt").is_file()
    assert (run / "curves.png").is_file()

    with open(run / "metrics.csv", newline="") as f:
        keys = {row["key"]: float(row["value"]) for row in csv.DictReader(f)}
    assert keys["eval/return_mean"] == saved["eval_return_mean"]
    losses = {k: v for k, v in keys.items() if k.startswith("losses/")}
    assert losses and all(math.isfinite(v) for v in losses.values()), keys
    if algo == "dqn":
        assert latest["algo"]["updates"] > 0  # gradient steps were taken
        assert latest["buffer"]["size"] > 0


def test_ale_banner_is_never_printed(tmp_path):
    """ALE prints a two-line banner on the first emulator of each process: a PPO run showed it 12 times."""
    code = (
        "from rlfleet.envs import env_spec_info, make_vector_env\n"
        "env_spec_info('ALE/Pong-v5')\n"
        "envs = make_vector_env('ALE/Pong-v5', 2, seed=0, mode='async')\n"  # two more processes
        "envs.reset(seed=0)\n"
        "envs.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert "A.L.E: Arcade Learning Environment" not in output and "Powered by Stella" not in output, output
