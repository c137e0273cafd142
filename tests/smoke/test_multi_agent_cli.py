"""Multi-agent runs as a user starts them: bad input is one line (exit 2, nothing written), a run's per-agent
metrics and result, checkpoint -> resume -> eval (with a video) round trip, a policy loaded from an earlier run and
frozen keeps its weights, and `data_parallel` on the serial backend."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # test_cli's helpers, under --import-mode=importlib

from test_cli import check_one_error_line, run_main, tree  # noqa: E402

from rlfleet.envs.pettingzoo import make_agent_env  # noqa: E402
from rlfleet.launch import train  # noqa: E402
from rlfleet.run import evaluate  # noqa: E402
from rlfleet.run.checkpoint import load_checkpoint  # noqa: E402

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"
SPREAD = "pettingzoo:mpe2.simple_spread_v3"
DQN_TTT = ("train", "dqn", "--env", TICTACTOE, "--logdir", "runs", "--no-progress")

BAD_INPUT = {
    "module-does-not-import": (
        ("train", "ppo", "--env", "pettingzoo:pettingzoo.classic.tictactoe_v2", "--logdir", "runs"),
        ["cannot import 'pettingzoo.classic.tictactoe_v2'", "did you mean pettingzoo.classic.tictactoe_v3"],
    ),
    "not-an-env-module": (
        ("train", "ppo", "--env", "pettingzoo:json", "--logdir", "runs"),
        ["json is not a PettingZoo env module"],
    ),
    "env-kwarg": (
        ("train", "ppo", "--env", SPREAD, "--env-kwargs", "M=3", "--logdir", "runs"),
        ["rejects --env-kwargs M=3", "unexpected keyword argument 'M'"],
    ),
    "agent-without-policy": ((*DQN_TTT, "--policy-map", "player_1=red"), ["leaves agent(s) player_2 without a policy"]),
    "pattern-without-agent": ((*DQN_TTT, "--policy-map", "player_*=red,agent_*=blue"), ["'agent_*' matches no agent"]),
    "frozen-without-weights": (
        (*DQN_TTT, "--policy-map", "player_1=red,player_2=blue", "--freeze", "blue"),
        ["--freeze blue: a frozen policy needs weights"],
    ),
    "freeze-unknown-policy": ((*DQN_TTT, "--freeze", "green"), ["--freeze names green", "its policies: shared"]),
    "load-unreadable": (
        (*DQN_TTT, "--policy-map", "player_1=red,player_2=blue", "--load-policy", "blue=garbage.pt"),
        ["garbage.pt"],
    ),
    "single-agent-env": (
        ("train", "ppo", "--env", "CartPole-v1", "--policies", "separate", "--logdir", "runs"),
        ["--policies: for PettingZoo envs", "CartPole-v1 has one agent"],
    ),  # fmt: skip
    "architecture": (
        (*DQN_TTT, "--arch", "apex"),
        ["--arch apex does not take a PettingZoo env", "single, data_parallel"],
    ),
    "recurrent": (("train", "ppo", *DQN_TTT[2:], "--set", "lstm=64"), ["lstm > 0", "feed-forward"]),
    "continuous-algorithm": (("train", "sac", "--env", TICTACTOE, "--logdir", "runs"), ["sac"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_multi_agent_input_is_one_line_and_writes_nothing(tmp_path: Path, monkeypatch, capsys, case: str):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    before = tree(tmp_path)
    code = run_main(BAD_INPUT[case][0])
    out, err = capsys.readouterr()
    check_one_error_line(code, out, err, BAD_INPUT[case][1])
    assert tree(tmp_path) == before, "a refused run created or changed files"


def _metrics(run_dir: Path) -> set[str]:
    with open(run_dir / "metrics.csv") as f:
        return {row["key"] for row in csv.DictReader(f)}


def test_a_run_logs_every_agent_and_resumes_and_evaluates_with_a_video(tmp_path: Path, monkeypatch, capsys):
    opts = {"logdir": str(tmp_path), "progress": False, "eval_every": 1_000, "eval_episodes": 2}
    first = train("ppo", SPREAD, steps=1_024, seed=0, name="spread", overrides={"n_envs": 2, "rollout_len": 64}, **opts)
    keys = _metrics(first.run_dir)
    for agent in ("agent_0", "agent_1", "agent_2"):
        assert f"eval/agents/{agent}/return_mean" in keys and f"agents/{agent}/episodic_return" in keys
    assert "eval/policies/shared/return_mean" in keys and "policies/shared/episodic_return" in keys
    assert set(first["eval_agents"]) == {"agent_0", "agent_1", "agent_2"} and first["policy_map"]["agent_1"] == "shared"
    resumed = train(resume=first.run_dir, steps=2_048, progress=False)
    assert resumed["env_steps"] == 2_048 and resumed["episodes"] > first["episodes"]
    monkeypatch.chdir(tmp_path)
    live, made = [], []  # the rendering envs open at once, and the GIFs on disk as each env is made

    def counted(*args, **kwargs):
        env = make_agent_env(*args, **kwargs)
        made.append(sorted(p.name for p in (tmp_path / "video").glob("*.gif")))
        live.append(env)
        close = env.close
        env.close = lambda: (live.remove(env), close())
        assert len(live) == 1, "a rendering env for each episode, side by side: every episode's frames held at once"
        return env

    frames = []  # each GIF's frames
    save_gif = evaluate._save_gif
    monkeypatch.setattr(evaluate, "make_agent_env", counted)
    monkeypatch.setattr(
        evaluate, "_save_gif", lambda episode, *a, **k: (frames.append(len(episode)), save_gif(episode, *a, **k))
    )
    assert run_main(("eval", first.run_dir, "--episodes", "2", "--video", "video")) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["agents"]) == {"agent_0", "agent_1", "agent_2"} and len(out["returns"]) == 2
    assert sorted(p.name for p in (tmp_path / "video").iterdir()) == ["episode-0.gif", "episode-1.gif"]
    assert made == [[], ["episode-0.gif"]] and not live  # each episode's GIF written when it ended
    assert frames == [26, 26]  # the start, then each of max_cycles' 25 steps


def test_a_frozen_policy_loaded_from_an_earlier_run_keeps_its_weights(tmp_path: Path):
    """Self-play against a fixed earlier self: player_2 plays the earlier run's policy and never learns, while
    player_1's policy learns (its weights move from those it started with: a run of 100 steps, before any update,
    resumed)."""
    opts = {"logdir": str(tmp_path), "progress": False, "eval_episodes": 2}
    earlier = train("dqn", TICTACTOE, steps=600, seed=0, name="earlier", overrides={"learning_starts": 100}, **opts)
    source = load_checkpoint(earlier.run_dir)["algo"]["policies"]["shared"]
    start = train("dqn", TICTACTOE, steps=100, seed=1, name="now", policy_map="player_1=learner,player_2=old",
                  freeze="old", load_policy=f"old={earlier.run_dir}/checkpoints/latest.pt#shared",
                  overrides={"learning_starts": 100}, **opts)  # fmt: skip
    assert start["updates"] == 0
    initial = load_checkpoint(start.run_dir)["algo"]["policies"]["learner"]["q"]
    now = train(resume=start.run_dir, steps=1_500, progress=False)
    saved = load_checkpoint(now.run_dir)["algo"]["policies"]
    assert now["trained_policies"] == ["learner"] and now["frozen_policies"] == ["old"] and now["updates"] > 0
    for key, tensor in source["q"].items():
        assert torch.equal(saved["old"]["q"][key], tensor), f"the frozen policy's {key} changed"
    assert any(not torch.equal(saved["learner"]["q"][k], initial[k]) for k in initial), "the learner did not learn"


def test_a_run_with_a_loaded_policy_resumes_from_another_folder_after_its_source_moved(
    tmp_path: Path, monkeypatch, capsys
):
    """The run's checkpoint holds the loaded weights, so a resume reads no source; the source is kept as an absolute
    path. A checkpoint trained against `random` has one policy with weights, which `--load-policy P=RUN` takes
    without `#NAME`; naming `random` there is one line."""
    monkeypatch.chdir(tmp_path)
    opts = {"logdir": "runs", "progress": False, "eval_episodes": 2, "overrides": {"learning_starts": 100}}
    train("dqn", TICTACTOE, steps=200, seed=0, name="src", policy_map="player_1=learner,player_2=random", **opts)
    mapping = ("--policy-map", "player_1=learner,player_2=old", "--freeze", "old")
    code = run_main((*DQN_TTT, *mapping, "--load-policy", "old=runs/src#random", "--steps", "200"))
    out, err = capsys.readouterr()
    check_one_error_line(code, out, err, ["--load-policy old=runs/src#random", "the uniform random policy"])
    now = train("dqn", TICTACTOE, steps=200, seed=1, name="now", policy_map="player_1=learner,player_2=old",
                freeze="old", load_policy="old=runs/src", **opts)  # fmt: skip
    config = json.loads((now.run_dir / "config.json").read_text())
    assert config["run"]["load_policy"] == f"old={tmp_path / 'runs' / 'src'}"
    (tmp_path / "runs" / "src").rename(tmp_path / "runs" / "src-moved")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    resumed = train(resume=str(tmp_path / now.run_dir), steps=400, progress=False)
    assert resumed["env_steps"] >= 400 and resumed["frozen_policies"] == ["old"]


def test_an_image_observation_gets_a_cnn_and_stays_uint8_in_replay(tmp_path: Path, monkeypatch):
    """An env of pixel observations trains the CNN a single-agent run would, on uint8 frames, not an MLP on floats."""
    (tmp_path / "image_agents_v0.py").write_text(IMAGE_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = train("dqn", "pettingzoo:image_agents_v0", steps=64, seed=0, logdir=str(tmp_path), progress=False,
                   eval_every=10**9, eval_episodes=1, overrides={"learning_starts": 32, "batch_size": 8,
                   "buffer_size": 100})  # fmt: skip
    payload = load_checkpoint(result.run_dir / "checkpoints" / "latest.pt")
    q = payload["algo"]["policies"]["shared"]["q"]
    assert q["body.cnns.observation.net.0.0.weight"].dim() == 4  # a convolution over the frames
    stored = payload["buffers"]["shared"]["storage"]["obs"]
    assert stored["observation"].dtype == torch.uint8 and stored["observation"].shape[-3:] == (3, 10, 10)


IMAGE_ENV = """
import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv


class ImageAgents(ParallelEnv):
    metadata = {"name": "image_agents_v0", "render_modes": ["rgb_array"]}
    possible_agents = ["a", "b"]

    def __init__(self, render_mode=None):
        self.render_mode, self.agents, self.t = render_mode, [], 0

    def observation_space(self, agent):
        return gym.spaces.Box(0, 255, (3, 10, 10), np.uint8)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def _obs(self):
        return {a: np.full((3, 10, 10), self.t * 20, np.uint8) for a in self.agents}

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: float(actions[a]) for a in self.agents}
        obs, ended = self._obs(), self.t >= 5
        truncations = {a: ended for a in self.agents}
        terminations, infos = {a: False for a in self.agents}, {a: {} for a in self.agents}
        self.agents = [] if ended else self.agents
        return obs, rewards, terminations, truncations, infos


def parallel_env(render_mode=None):
    return ImageAgents(render_mode)
"""


def test_shared_self_play_on_a_zero_sum_game_says_its_return_tells_nothing(tmp_path: Path, capsys):
    """The default mapping on tic-tac-toe: the players' returns cancel out, so the run says so (once), and β of its
    prioritized replay anneals over the run's update passes (one per train_freq steps of the env copies, not of the
    buffer's copies × players columns)."""
    run = train("dqn", TICTACTOE, steps=1_200, seed=0, eval_every=300, n_envs=2, logdir=str(tmp_path),
                progress=False, eval_episodes=2, overrides={"learning_starts": 100, "prioritized": True})  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("add up to 0 in every evaluation episode") == 1, out
    assert run["eval_return_mean"] == 0.0  # what the note is about
    payload = load_checkpoint(run.run_dir / "checkpoints" / "latest.pt")
    cfg = payload["algo_config"]
    passes = (1_200 - cfg["learning_starts"]) // (cfg["train_freq"] * 2)
    assert payload["buffers"]["shared"]["beta_anneal_steps"] == passes * cfg["gradient_steps"]


def test_eval_seed_draws_the_random_players_moves(tmp_path: Path, monkeypatch, capsys):
    """`rlfleet eval --seed` reaches the `random` policy: tic-tac-toe's reset ignores its seed, so its games against
    a random player differ from seed to seed by that player's draws alone, and one seed plays the same games again."""
    run = train("dqn", TICTACTOE, policy_map="player_1=learner,player_2=random", steps=300, seed=0,
                overrides={"learning_starts": 100}, logdir=str(tmp_path), progress=False, eval_episodes=2)  # fmt: skip
    assert "add up to 0" not in capsys.readouterr().out  # a learner against a fixed opponent: its return is the run's
    monkeypatch.chdir(tmp_path)
    games = []
    for seed in (1, 2, 1):
        assert run_main(("eval", str(run.run_dir), "--episodes", "20", "--seed", str(seed))) == 0
        games.append(json.loads(capsys.readouterr().out)["agent_returns"]["player_1"])
    assert games[0] == games[2] and games[0] != games[1]


def test_data_parallel_on_the_serial_backend_feeds_every_trained_policy(tmp_path: Path):
    result = train("dqn", TICTACTOE, arch="data_parallel", workers=2, backend="serial", steps=2_000, seed=0,
                   policies="separate", overrides={"learning_starts": 200}, logdir=str(tmp_path), progress=False,
                   eval_episodes=2)  # fmt: skip
    assert result["env_steps"] >= 2_000 and result["trained_policies"] == ["player_1", "player_2"]
    assert result["updates"] > 0 and set(result["eval_agents"]) == {"player_1", "player_2"}


def test_data_parallel_replays_as_often_as_single_with_as_many_env_copies(tmp_path: Path):
    """One pass of gradient_steps updates follows every train_freq steps of all workers × n_envs copies, as on
    `single` with that many copies (it followed each sampler's item: twice as often with two samplers)."""
    opts = dict(policy_map="player_1=learner,player_2=random", steps=3_000, seed=0, eval_every=10**9,
                overrides={"learning_starts": 200}, logdir=str(tmp_path), progress=False, eval_episodes=2)  # fmt: skip
    single = train("dqn", TICTACTOE, n_envs=4, name="single", **opts)
    parallel = train("dqn", TICTACTOE, arch="data_parallel", workers=2, n_envs=2, backend="serial", name="dp", **opts)
    passes = json.loads((single.run_dir / "config.json").read_text())["algo"]["gradient_steps"]  # per pass
    assert single["env_steps"] == parallel["env_steps"] and single["updates"] > 20 * passes
    assert abs(parallel["updates"] - single["updates"]) <= passes, (single.result, parallel.result)


@pytest.mark.parametrize(
    ("env", "policies"),
    [
        ("pettingzoo:changing_agents_env", "shared"),  # agents leave and join mid-episode
        ("pettingzoo:mpe2.simple_adversary_v3", "separate"),  # agents of different spaces, a policy each
        ("pettingzoo:mpe2.simple_adversary_v3", "shared"),  # the same, their observations padded to one width
        ("pettingzoo:info_mask_turns_env", "separate"),  # AEC players whose masks are in their infos
        ("pettingzoo:info_mask_turns_env", "shared"),  # the same players' alike spaces, masks included
    ],
)
def test_agents_that_change_or_differ_train_without_a_crash(tmp_path: Path, env: str, policies: str):
    """Every evaluation episode ends by itself: an env's `max_cycles` (MPE's, and the AEC env's 4 cycles of 2 moves)
    bounds no episode short of its end."""
    result = train("ppo", env, policies=policies, steps=600, seed=0, overrides={"n_envs": 2, "rollout_len": 25},
                   logdir=str(tmp_path), progress=False, eval_episodes=2)  # fmt: skip
    assert result["updates"] > 0 and result["env_steps"] >= 600
    assert set(result["eval_agents"]) == set(result["policy_map"])
    assert result["eval_episodes_cut"] == 0


DISCRETE = ("a2c", "dqn", "nstep_q", "onestep_q", "pg", "ppo", "sarsa")
CONTINUOUS = ("ddpg", "sac", "td3")


@pytest.mark.parametrize("algo", DISCRETE + CONTINUOUS)
def test_every_rollout_and_replay_algorithm_learns_each_policy(tmp_path: Path, algo: str):
    """Two policies (one per team of MPE simple_adversary), each the run's algorithm, both updated (their losses in
    the log row at 1,000 steps); continuous algorithms on its continuous-action variant."""
    env_kwargs = {"continuous_actions": True} if algo in CONTINUOUS else {}
    overrides = {"learning_starts": 50, "batch_size": 32} if algo in ("dqn", *CONTINUOUS) else {"rollout_len": 10}
    result = train(algo, "pettingzoo:mpe2.simple_adversary_v3", env_kwargs=env_kwargs, steps=1_050, seed=0,
                   policy_map="adversary_*=red,agent_*=blue", overrides={"n_envs": 2, **overrides},
                   logdir=str(tmp_path), progress=False, eval_episodes=2)  # fmt: skip
    assert result["trained_policies"] == ["red", "blue"] and result["updates"] > 0
    keys = _metrics(result.run_dir)
    assert any(k.startswith("losses/red/") for k in keys) and any(k.startswith("losses/blue/") for k in keys)


def test_a_policy_loaded_from_a_run_on_another_env_says_so(tmp_path: Path, caplog):
    """Networks that fit loaded without a word from a run on another env (here other keyword arguments)."""
    opts = {"logdir": str(tmp_path), "progress": False, "eval_episodes": 1, "steps": 100}
    train("ppo", SPREAD, name="src", env_kwargs={"max_cycles": 10}, **opts)
    with caplog.at_level(logging.INFO, logger="rlfleet"):
        train("ppo", SPREAD, name="same", env_kwargs={"max_cycles": 10}, load_policy=f"shared={tmp_path / 'src'}",
              **opts)  # fmt: skip
        assert "trained on" not in caplog.text
        train("ppo", SPREAD, name="other", load_policy=f"shared={tmp_path / 'src'}", **opts)
    said = f"--load-policy shared={tmp_path / 'src'}: trained on {SPREAD} {{'max_cycles': 10}}, loaded into this run on"
    assert said in caplog.text and caplog.text.count("trained on") == 1
