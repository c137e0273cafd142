"""Every algorithm on Blackjack-v1 (a Tuple observation) for a few hundred steps on every architecture that takes
it; the continuous-control algorithms on a Dict observation; bc from demonstrations of Dict observations; a
Dict-observation run resumed and evaluated from its checkpoint; factorised actions through processes.

The multi-process architectures run on the serial backend here (their roles in this process, the same code
paths but for the transport); a few runs go through real worker processes too."""

import json

import numpy as np
import pytest
import space_envs  # noqa: F401 (registers the tasks)

from rlfleet import train
from rlfleet.algos import algorithm_names
from rlfleet.algos.spaces import UnsupportedSpaceError
from rlfleet.cli import main
from rlfleet.run.config import ConfigError
from rlfleet.run.recording import collect_demonstrations

SERIAL = {
    "single": {},
    "hogwild": dict(workers=1, backend="serial"),
    "data_parallel": dict(workers=1, backend="serial"),
    "grad_parallel": dict(workers=1, backend="serial"),
    "async_grad": dict(workers=1, backend="serial"),
    "param_server": dict(workers=1, backend="serial"),
    "allreduce": dict(workers=1, backend="serial"),
    "gossip": dict(learners=2, backend="serial"),
    "apex": dict(actors=1, backend="serial"),
}
# what each architecture takes of the algorithms with Discrete actions (the others refuse them with a reason)
TAKES = {
    "single": {"a2c", "a3c", "dqn", "nstep_q", "onestep_q", "pg", "ppo", "sarsa"},
    "hogwild": {"a2c", "a3c", "nstep_q", "onestep_q", "sarsa"},
    "data_parallel": {"a2c", "a3c", "dqn", "nstep_q", "onestep_q", "pg", "ppo", "sarsa"},
    "grad_parallel": {"a2c", "a3c", "nstep_q", "onestep_q", "sarsa"},
    "async_grad": {"a2c", "a3c", "nstep_q", "onestep_q", "sarsa"},
    "param_server": {"a2c", "a3c", "nstep_q", "onestep_q", "sarsa"},
    "allreduce": {"a2c", "a3c", "nstep_q", "onestep_q", "ppo", "sarsa"},
    "gossip": {"a2c", "a3c", "nstep_q", "onestep_q", "pg", "ppo", "sarsa"},
    "apex": {"dqn"},
}
CONTINUOUS = {"ddpg", "td3", "sac"}


@pytest.mark.parametrize("arch", list(SERIAL))
def test_every_algorithm_runs_on_a_tuple_observation_on_each_architecture_that_takes_it(arch, run_opts):
    ran, refused = set(), {}
    for algo in algorithm_names():
        if algo == "bc":  # learns from a dataset: test_bc_learns_from_demonstrations_of_dict_observations
            continue
        try:
            r = train(algo, "Blackjack-v1", arch=arch, steps=300, eval_every=300, eval_episodes=2, **SERIAL[arch],
                      **run_opts)  # fmt: skip
        except (ConfigError, UnsupportedSpaceError) as exc:
            refused[algo] = str(exc)
            continue
        assert r.result["env_steps"] >= 300 and r.result["eval_return_mean"] is not None
        ran.add(algo)
    assert ran == TAKES[arch], refused
    for algo in CONTINUOUS:  # continuous actions only: refused for Blackjack's Discrete(2), saying which take it
        assert "takes continuous (1-D Box) actions" in refused[algo] and "ppo" in refused[algo]


@pytest.mark.parametrize("algo", sorted(CONTINUOUS))
def test_continuous_control_runs_on_a_dict_observation_with_its_box_entries_normalized(algo, run_opts):
    r = train(algo, "space_envs:DictPendulum-v0", steps=400, eval_every=400, eval_episodes=2,
              overrides={"obs_norm": True, "learning_starts": 100, "random_steps": 100}, **run_opts)  # fmt: skip
    assert r.result["env_steps"] >= 400 and np.isfinite(r.result["eval_return_mean"])


@pytest.mark.parametrize(
    "algo, env, options",
    [
        ("dqn", "Blackjack-v1", dict(arch="data_parallel", workers=2)),  # transitions through pipes
        ("dqn", "space_envs:DictCue-v0", dict(arch="apex", actors=2)),  # n-step blocks into replay shard services
        ("ppo", "space_envs:JointChoice-v0", dict(arch="data_parallel", workers=2)),  # MultiDiscrete actions
        ("a2c", "space_envs:BitMatch-v0", dict(arch="hogwild", workers=2)),  # MultiBinary observations and actions
    ],
)
def test_spaces_through_worker_processes(algo, env, options, run_opts):
    r = train(algo, env, steps=1_000, eval_every=1_000, eval_episodes=2, **options, **run_opts)
    assert r.result["env_steps"] >= 1_000 and r.result["eval_return_mean"] is not None


def test_a_dict_observation_run_resumes_and_evaluates_from_its_checkpoint(tmp_path, capsys):
    logdir = str(tmp_path)
    assert main(["train", "ppo", "--env", "Blackjack-v1", "--steps", "600", "--eval-every", "300", "--logdir", logdir,
                 "--name", "bj", "--no-progress", "--set", "n_envs=2", "--set", "rollout_len=64"]) == 0  # fmt: skip
    assert main(["train", "--resume", f"{logdir}/bj", "--steps", "1200", "--no-progress"]) == 0
    result = json.loads((tmp_path / "bj" / "result.json").read_text())
    assert result["env_steps"] >= 1200
    capsys.readouterr()
    assert main(["eval", f"{logdir}/bj", "--episodes", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["returns"]) == 20 and set(out["returns"]) <= {-1.0, 0.0, 1.0, 1.5}


def test_bc_learns_from_demonstrations_of_dict_observations(tmp_path, run_opts):
    expert = train("ppo", "space_envs:DictCue-v0", steps=2_000, eval_every=2_000, name="expert", **run_opts)
    demos, _ = collect_demonstrations(expert.run_dir, episodes=40, output=tmp_path / "cue.npz")
    assert isinstance(demos.obs, dict) and set(demos.obs) == {"goal", "heading"} and len(demos) == 40
    r = train("bc", "space_envs:DictCue-v0", dataset=str(tmp_path / "cue.npz"), steps=200, eval_every=100, name="bc",
              **run_opts)  # fmt: skip
    assert r.result["eval_return_mean"] is not None
    # the expert labels the learner's own states (DAgger): Dict observations aggregated and checkpointed
    r = train("bc", "space_envs:DictCue-v0", dataset=str(tmp_path / "cue.npz"), expert=str(expert.run_dir),
              steps=200, eval_every=100, name="dagger", **run_opts)  # fmt: skip
    assert r.result["eval_return_mean"] is not None
