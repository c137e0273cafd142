"""Multi-agent pieces on real PettingZoo envs: the policy mapping and its errors, the AEC and parallel APIs behind
one `AgentEnv`, masks in every agent's info, `max_cycles` as a bound in steps of either API, each agent's transitions
from its own action to its next one (rewards received in between, the other player's move included), lanes that wait
for each other, shared policies' inputs (agent id, padding)."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.envs.pettingzoo import (
    AgentEnv,
    PettingZooError,
    agent_spaces,
    env_module,
    make_agent_env,
    pettingzoo_info,
)
from rlfleet.run.config import ConfigError
from rlfleet.run.multi_agent import (
    RANDOM,
    MultiAgentCollector,
    Policies,
    PolicyData,
    RandomPolicy,
    Transition,
    evaluate_agents,
    policy_mapping,
)
from rlfleet.run.multi_agent_runner import zero_sum_agents

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"
SPREAD = "pettingzoo:mpe2.simple_spread_v3"
INFO_MASKS = "pettingzoo:info_mask_turns_env"
CHANGING = "pettingzoo:changing_agents_env"
ADVERSARY = "pettingzoo:mpe2.simple_adversary_v3"
AGENTS = ["adversary_0", "agent_0", "agent_1"]
needs_envs = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("pettingzoo", "mpe2")), reason="the multiagent extra is not installed"
)


def test_shared_separate_and_mapped_policies():
    assert set(policy_mapping(AGENTS).of_agent.values()) == {"shared"}
    assert policy_mapping(AGENTS, "separate").of_agent == {a: a for a in AGENTS}
    mapping = policy_mapping(AGENTS, policy_map="adversary_*=red,*=blue")
    assert mapping.of_agent == {"adversary_0": "red", "agent_0": "blue", "agent_1": "blue"}
    assert mapping.trained == ["red", "blue"]
    mapping = policy_mapping(AGENTS, policy_map="adversary_*=random,*=blue")
    assert mapping.frozen == {RANDOM} and mapping.trained == ["blue"]
    assert policy_mapping(AGENTS, policy_map="agent_*=blue,*=red,agent_0=blue").of_agent["agent_0"] == "blue"
    frozen = policy_mapping(AGENTS, policy_map="adversary_*=red,*=blue", freeze="red", load_policy="red=x.pt#blue")
    assert frozen.trained == ["blue"] and frozen.loads == {"red": "x.pt#blue"}


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"policy_map": "adversary_*=red"}, "leaves agent(s) agent_0, agent_1 without a policy"),
        ({"policy_map": "adversary_*=red,good_*=blue,*=red"}, "'good_*' matches no agent"),
        ({"policy_map": "adversary_*"}, "takes KEY=VALUE items"),
        ({"policy_map": "*=red", "freeze": "blue", "load_policy": "red=x.pt"}, "--freeze names blue"),
        ({"policy_map": "adversary_*=red,*=blue", "freeze": "red"}, "a frozen policy needs weights"),
        ({"policy_map": "*=random"}, "nothing to train"),
        ({"policies": "each"}, "must be shared or separate"),
        ({"load_policy": "random=x.pt", "policy_map": "*=random"}, "has no weights to load"),
        ({"policy_map": "agent_*=red,agent_*=blue,*=red"}, "--policy-map gives agent_* twice"),
        (  # the catch-all first: the random opponent meant for adversary_0 silently became the learner
            {"policy_map": "*=blue,adversary_0=random"},
            "adversary_0=random maps no agent: an earlier pattern took every agent it matches (adversary_0 -> blue;",
        ),
        ({"policy_map": "adversary_*=red,*=blue", "load_policy": "red=x.pt,red=y.pt"}, "--load-policy gives red twice"),
    ],
)
def test_a_mapping_problem_is_one_line(options, says):
    with pytest.raises(ConfigError, match=says.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
        policy_mapping(AGENTS, **options)


def _greedy_game(env: AgentEnv, moves: list[int]) -> list:
    """Play `moves` in turn; every AgentStep."""
    env.reset(seed=0)
    return [env.step({env.env.agent_selection: m}) for m in moves]


def test_an_env_module_that_fails_inside_is_named_without_a_suggestion(tmp_path, monkeypatch):
    """A module that is there but imports something missing: the error is the missing import, and no "did you mean"
    lists the module itself or its neighbours."""
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "__init__.py").write_text("")
    for version in (1, 2):
        (tmp_path / "my_envs" / f"race_v{version}.py").write_text("import a_package_nobody_has\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PettingZooError) as error:
        env_module("pettingzoo:my_envs.race_v1")
    assert "No module named 'a_package_nobody_has'" in str(error.value) and "did you mean" not in str(error.value)
    # a typo still gets its suggestions
    with pytest.raises(PettingZooError, match=r"did you mean my_envs.race_v2, my_envs.race_v1\?"):
        env_module("pettingzoo:my_envs.race_v3")


@needs_envs
def test_aec_turns_rewards_and_last_observations():
    env = make_agent_env(TICTACTOE)
    first = env.reset(seed=0)
    assert list(first) == ["player_1"] and set(first["player_1"]) == {"observation", "action_mask"}
    # player_1 takes the left column (0, 1, 2), player_2 plays 3 and 4 in between: player_1 wins on its third move
    steps = _greedy_game(env, [0, 3, 1, 4, 2])
    assert [list(s.acting) for s in steps[:4]] == [["player_2"], ["player_1"], ["player_2"], ["player_1"]]
    assert steps[0].acting["player_2"]["action_mask"][0] == 0  # the square player_1 took is no longer legal
    last = steps[-1]
    assert last.over and not last.acting
    assert last.rewards == {"player_2": -1.0, "player_1": 1.0}
    assert {a: e[1:] for a, e in last.ended.items()} == {"player_1": (True, False), "player_2": (True, False)}


@needs_envs
@pytest.mark.parametrize(
    ("env", "kwargs"),
    [(INFO_MASKS, {}), (CHANGING, {"info_masks": True})],
    ids=["aec-players-in-turn", "parallel-agent-that-joins"],
)
def test_every_agents_mask_in_its_info_is_in_its_space_and_its_observations(env, kwargs):
    """An AEC env's second player (whose turn is not first) and a parallel env's agent that joins after reset have
    their masks in their spaces, as in every observation they get; a shared policy takes them all."""
    spaces = agent_spaces(env, **kwargs)
    for agent in spaces.agents:
        assert set(spaces.observation[agent].spaces) == {"observation", "action_mask"}, agent
    built, seen = make_agent_env(env, **kwargs), set()
    for episode in range(2):
        acting = built.reset(seed=episode)
        while acting:
            for agent, obs in acting.items():
                assert spaces.observation[agent].contains(obs), (agent, obs)
                seen.add(agent)
            step = built.step({a: int(np.flatnonzero(obs["action_mask"])[0]) for a, obs in acting.items()})
            assert all(spaces.observation[a].contains(e[0]) for a, e in step.ended.items() if e[0] is not None)
            assert all(r >= 0 for r in step.rewards.values())  # only legal moves were made
            acting = {} if step.over else step.acting
    assert seen == set(spaces.agents)
    for policies in ("shared", "separate"):
        Policies(spaces, policy_mapping(spaces.agents, policies), lambda *_: _Scripted(), 0)


@needs_envs
def test_max_cycles_bounds_an_episode_in_steps_of_either_api(tmp_path, monkeypatch):
    """`max_cycles` counts cycles, each a step of every agent: one step of a parallel env, a move of each agent in an
    AEC env; the bound of an evaluation episode (`max_episode_steps`) is in steps of `AgentEnv`, so no episode the
    env would end by itself is cut."""
    (tmp_path / "aec_spread.py").write_text("from mpe2.simple_spread_v3 import env  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # MPE through its AEC API only
    for env, steps in ((SPREAD, 25), ("pettingzoo:aec_spread", 75)):
        assert pettingzoo_info(env, {})["max_episode_steps"] == steps
        built, taken = make_agent_env(env), 0
        acting = built.reset(seed=0)
        while acting:
            step, taken = built.step(dict.fromkeys(acting, 0)), taken + 1
            acting = {} if step.over else step.acting
        assert taken == steps, env
    bound = pettingzoo_info(INFO_MASKS, {"max_cycles": 3})["max_episode_steps"]
    assert bound == 6
    spaces = agent_spaces(INFO_MASKS, max_cycles=3)
    policies = Policies(spaces, policy_mapping(spaces.agents), lambda *_: _Scripted(first_legal=True), 0)
    result = evaluate_agents(policies, [make_agent_env(INFO_MASKS, max_cycles=3) for _ in range(2)], 0, bound)
    assert result.cut == 0 and list(result.agents["p1"]) == [3.0, 3.0] and list(result.agents["p2"]) == [3.0, 3.0]


@needs_envs
def test_each_agent_learns_from_its_own_moves_to_its_next_one():
    """In a turn-based game a player's transition runs from its move to its next one: its next observation is the
    board after the opponent replied, its reward what it received meanwhile (the loss of the opponent's winning
    move lands on the loser's last transition, which ends there)."""
    spaces = agent_spaces(TICTACTOE)
    mapping = policy_mapping(spaces.agents, policy_map="player_1=one,player_2=two")
    policies = Policies(spaces, mapping, lambda *_: _Scripted(), seed=0)
    moves = {"player_1": iter([0, 1, 8]), "player_2": iter([4, 2, 6])}  # player_2 wins on the diagonal 2-4-6
    for name in ("one", "two"):
        policies.algos[name].moves = moves
    data = {name: PolicyData(None, lanes=1, buffer=_Rows()) for name in ("one", "two")}
    collector = MultiAgentCollector([make_agent_env(TICTACTOE)], policies, data, seed=0)
    for _ in range(6):
        collector.step()
    one, two = data["one"].buffer.rows, data["two"].buffer.rows
    assert [r["act"] for r in one] == [0, 1, 8] and [r["act"] for r in two] == [4, 2, 6]
    assert [r["rew"] for r in one] == [0, 0, -1] and [r["terminated"] for r in one] == [False, False, True]
    assert [r["rew"] for r in two] == [0, 0, 1] and [r["terminated"] for r in two] == [False, False, True]
    board = one[0]["next_obs"]["observation"]  # player_1's view after its first move and player_2's reply
    assert board[..., 0].sum() == 1 and board[..., 1].sum() == 1
    assert one[0]["next_obs"]["action_mask"].sum() == 7
    assert collector.episodes == 1 and collector.stats.agents["player_2"][-1] == 1.0


def test_columns_wait_for_each_other_so_a_row_holds_one_transition_of_every_column():
    rows = _Rows()
    data = PolicyData(None, lanes=2, buffer=rows)

    def put(stream, k, **end):
        data.put(stream, Transition(np.float32(k), k, {}, 1.0, np.float32(k + 1), **end))

    for k in range(3):
        put("a", k)
    assert rows.rows == [] and data.held["a"].act == 2  # column 1 has nothing yet; a's newest is held back
    put("b", 10)
    put("b", 11, truncated=True)  # b's episode ends: both its transitions go to its column
    assert [list(r["act"]) for r in rows.batches] == [[0, 10], [1, 11]]
    assert not data.queues[0] and not data.queues[1] and data.column == {"a": 0}
    put("c", 20)  # a new stream takes the free column
    put("c", 21)
    put("a", 3)
    assert [list(r["act"]) for r in rows.batches][-1] == [2, 20] and data.column == {"a": 0, "c": 1}


def test_a_stream_cut_short_ends_in_its_column_before_another_begins_there():
    """A restarted sampler's episodes under way end where they were: the next stream in the column starts after an
    episode end, so no return or n-step sum runs from one agent's episode into another's."""
    rows = _Rows(all_lanes=True)
    data = PolicyData(None, lanes=1, buffer=rows)
    data.put("old", Transition(np.float32(0), 0, {}, 1.0, np.float32(1)))
    data.cut(lambda stream: stream == "old")
    data.put("new", Transition(np.float32(5), 5, {}, 1.0, np.float32(6), terminated=True))
    assert [(r["act"], r["truncated"], r["terminated"]) for r in rows.rows] == [(0, True, False), (5, False, True)]


@needs_envs
def test_agents_that_leave_and_join_mid_episode_learn_from_their_own_episodes():
    """`runner` leaves after 3 steps, `late` joins at step 2, `stayer` stays 8: each agent's transitions are its own
    (rewards 1 a step for action 1), every one of its episodes ends in its column, and no column runs away."""
    env = "pettingzoo:changing_agents_env"
    spaces = agent_spaces(env)
    policies = Policies(spaces, policy_mapping(spaces.agents), lambda *_: _Scripted(always=1), 0)
    rows = _Rows(all_lanes=True)
    data = {"shared": PolicyData(None, lanes=3 * 2, buffer=rows)}
    collector = MultiAgentCollector([make_agent_env(env) for _ in range(2)], policies, data, seed=0)
    for _ in range(8 * 25):
        collector.step()
    assert collector.episodes == 50
    assert {a: set(r) for a, r in collector.stats.agents.items()} == {"stayer": {8.0}, "runner": {3.0}, "late": {6.0}}
    ends = sum(int((r["terminated"] | r["truncated"]).sum()) for r in rows.lanes)  # in rows
    ends += sum(t.terminated or t.truncated for q in data["shared"].queues for t in q)  # and still queued
    assert ends == 50 * 3 and not data["shared"].column  # every agent's every episode, ended in its column
    assert max(len(q) for q in data["shared"].queues) <= 2 * 8  # the streams balance the columns
    assert all(r["rew"].min() == 1.0 for r in rows.lanes)  # every transition is an agent's own action-1 step


@needs_envs
def test_a_shared_policy_sees_the_agent_id_and_longer_observations_are_padded():
    spaces = agent_spaces(ADVERSARY)
    assert spaces.observation["adversary_0"].shape != spaces.observation["agent_0"].shape
    seen = {}
    Policies(
        spaces,
        policy_mapping(spaces.agents),
        lambda name, obs, act, seed, lanes: seen.setdefault(name, obs) and _Scripted(),
        0,
    )
    policies = Policies(spaces, policy_mapping(spaces.agents), lambda *_: _Scripted(), 0)
    width = max(s.shape[0] for s in spaces.observation.values())
    assert seen["shared"].shape == (width + 3,)
    x = policies.inputs["shared"].one("agent_1", np.ones(spaces.observation["agent_1"].shape[0], np.float32))
    assert x.shape == (width + 3,) and list(x[-3:]) == [0, 0, 1]
    separate = Policies(spaces, policy_mapping(spaces.agents, "separate"), lambda *_: _Scripted(), 0)
    assert separate.inputs["agent_0"].space.shape == (spaces.observation["agent_0"].shape[0] + 3,)  # id, no padding
    with pytest.raises(ConfigError, match="spaces differ"):
        Policies(_unlike_spaces(), policy_mapping(["a", "b"]), lambda *_: _Scripted(), 0)


@needs_envs
def test_random_policy_never_picks_a_masked_action_and_evaluation_counts_each_agent():
    spaces = agent_spaces(TICTACTOE)
    policies = Policies(
        spaces,
        policy_mapping(spaces.agents, policy_map="player_1=me,player_2=random"),
        lambda *_: _Scripted(first_legal=True),
        0,
    )
    envs = [make_agent_env(TICTACTOE) for _ in range(20)]
    result = evaluate_agents(policies, envs, seed=0, max_steps=100)
    assert result.cut == 0 and set(result.agents) == {"player_1", "player_2"}
    assert np.all(result.agents["player_1"] == -result.agents["player_2"])  # zero-sum; an illegal move would end it
    assert np.array_equal(result.returns, result.agents["player_1"])  # the trained policy's agent


def test_an_image_keeps_its_shape_and_dtype_beside_the_agent_id_and_gets_a_cnn():
    """An image is not flattened into a float vector with the id after it: the policy sees a Dict of the image (uint8,
    (C, H, W)) and the id, and the encoder a single-agent run gives the image (a CNN) takes it."""
    from rlfleet.nets.encoders import MultiInputEncoder, make_encoder

    spaces = _image_spaces()
    for options in ({}, {"policies": "separate"}):
        policies = Policies(spaces, policy_mapping(spaces.agents, **options), lambda *_: _Scripted(), 0)
        name = policies.of_agent["b"]
        space = policies.inputs[name].space
        assert isinstance(space, gym.spaces.Dict) and space["observation"] == spaces.observation["b"]
        assert space["agent_id"].shape == (2,)
        x = policies.inputs[name].one("b", np.full((3, 10, 10), 7, np.uint8))
        assert x["observation"].dtype == np.uint8 and x["observation"].shape == (3, 10, 10)
        assert list(x["agent_id"]) == [0, 1]
        encoder = make_encoder(space)
        assert isinstance(encoder, MultiInputEncoder) and list(encoder.cnns) == ["observation"]


@pytest.mark.parametrize("space", [gym.spaces.Discrete(9), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)])
def test_the_random_policy_goes_on_with_its_draws_from_a_saved_state(space):
    """A resumed run's random player does not replay the draws of the run's start: its state holds where they are."""
    played = RandomPolicy(space, seed=3)
    obs = np.zeros((4, 1), np.float32)
    played.act(obs)
    state = played.state_dict()
    after = [played.act(obs)[0] for _ in range(3)]
    resumed = RandomPolicy(space, seed=3)
    resumed.load_state_dict(state)
    assert all(np.array_equal(a, b) for a, b in zip(after, [resumed.act(obs)[0] for _ in range(3)], strict=True))
    old = RandomPolicy(space, seed=3)
    old.load_state_dict({})  # a checkpoint from before the draws were saved: they start at the seed
    assert np.array_equal(old.act(obs)[0], RandomPolicy(space, seed=3).act(obs)[0])


@needs_envs
def test_each_lanes_exploration_noise_starts_again_when_its_agents_episode_does():
    """`reset_noise` (DDPG's and TD3's Ornstein–Uhlenbeck process) as a single-agent run calls it: every lane at the
    start, and a lane (copy, agent) when that agent's episode ends, by its leaving or the episode's end."""
    env = "pettingzoo:changing_agents_env"
    spaces = agent_spaces(env)
    policies = Policies(spaces, policy_mapping(spaces.agents), lambda *_: _Noisy(), 0, copies=2)
    data = {"shared": PolicyData(None, lanes=2 * 3, buffer=_Rows())}
    collector = MultiAgentCollector([make_agent_env(env) for _ in range(2)], policies, data, seed=0)
    resets = policies.algos["shared"].resets
    assert [list(np.flatnonzero(m)) for m in resets] == [[0, 1, 2, 3, 4, 5]]  # lanes: copy * 3 + [stayer, runner, late]
    for _ in range(8):
        collector.step()
    assert [list(np.flatnonzero(m)) for m in resets[1:]] == [[1], [4], [0, 1, 2], [3, 4, 5]]  # runner leaves, then ends


def test_a_zero_sum_self_play_is_told_from_a_team_and_from_a_learner_against_a_fixed_opponent():
    shared = Policies(_two_players(), policy_mapping(["p1", "p2"]), lambda *_: _Scripted(), 0)
    against = Policies(
        _two_players(), policy_mapping(["p1", "p2"], policy_map="p1=me,p2=random"), lambda *_: _Scripted(), 0
    )
    won, drawn = {"p1": np.array([1.0, -1.0]), "p2": np.array([-1.0, 1.0])}, {"p1": np.zeros(2), "p2": np.zeros(2)}
    team = {"p1": np.array([-3.0, -2.0]), "p2": np.array([-3.0, -2.0])}
    assert zero_sum_agents(won, shared) == ["p1", "p2"]
    assert zero_sum_agents(drawn, shared) is None and zero_sum_agents(team, shared) is None
    assert zero_sum_agents(won, against) is None  # one trained agent: its return is the run's


# ---------------------------------------------------------------------------------------------------- helpers
class _Noisy:
    """A stand-in policy with exploration noise per lane: records each `reset_noise` mask."""

    data = "replay"

    def __init__(self):
        self.resets = []

    def act(self, obs, state=None, explore=True):
        return np.zeros(len(obs), np.int64), {}, None

    def reset_noise(self, done):
        self.resets.append(np.array(done))

    def schedule(self, *_):
        pass


class _Scripted:
    """A stand-in policy: plays the next move of its agent's script, the first legal square, or `always`."""

    data = "replay"

    def __init__(self, first_legal: bool = False, always: int | None = None):
        self.moves: dict = {}
        self.first_legal, self.always = first_legal, always

    def act(self, obs, state=None, explore=True):
        if self.always is not None:
            return np.full(len(obs), self.always), {}, None
        if self.first_legal:
            return np.argmax(obs["action_mask"], axis=1), {}, None
        agent = "player_1" if obs["observation"].sum() % 2 == 0 else "player_2"
        return np.asarray([next(self.moves[agent])]), {}, None

    def schedule(self, *_):
        pass


class _Rows:
    """A replay buffer's `add`, kept row by row: lane 0's transitions as dicts (`rows`), every row's actions
    (`batches`), and with `all_lanes` every row's rewards and ends (`lanes`)."""

    def __init__(self, all_lanes: bool = False):
        self.rows, self.batches, self.lanes, self.all_lanes = [], [], [], all_lanes

    def add(self, obs, act, rew, next_obs, terminated, truncated):
        self.batches.append({"act": act})
        if self.all_lanes:
            self.lanes.append({"rew": rew, "terminated": terminated, "truncated": truncated})
        lane0 = lambda v: {k: x[0] for k, x in v.items()} if isinstance(v, dict) else v[0]  # noqa: E731
        self.rows.append({"obs": lane0(obs), "act": int(act[0]), "rew": float(rew[0]), "next_obs": lane0(next_obs),
                          "terminated": bool(terminated[0]), "truncated": bool(truncated[0])})  # fmt: skip

    def mark_boundary(self, columns):
        pass


def _image_spaces():
    from rlfleet.envs.pettingzoo import AgentSpaces

    image = gym.spaces.Box(0, 255, (3, 10, 10), np.uint8)
    return AgentSpaces(["a", "b"], {"a": image, "b": image}, dict.fromkeys("ab", gym.spaces.Discrete(2)), True, None)


def _two_players():
    from rlfleet.envs.pettingzoo import AgentSpaces

    box = gym.spaces.Box(0, 1, (2,), np.float32)
    return AgentSpaces(
        ["p1", "p2"], {"p1": box, "p2": box}, dict.fromkeys(["p1", "p2"], gym.spaces.Discrete(2)), True, None
    )


def _unlike_spaces():
    from rlfleet.envs.pettingzoo import AgentSpaces

    box, image = gym.spaces.Box(0, 1, (4,)), gym.spaces.Box(0, 255, (3, 8, 8), np.uint8)
    return AgentSpaces(
        ["a", "b"], {"a": box, "b": image}, {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)}, True, None
    )


class PixelPair:
    """A parallel PettingZoo env of two agents seeing `(H, W, 3)` uint8 frames (red: the row, green: the column),
    one of them with its action mask in its info."""

    possible_agents = ["a", "b"]

    def __init__(self):
        self.agents = list(self.possible_agents)

    def observation_space(self, agent):
        return gym.spaces.Box(0, 255, (12, 10, 3), np.uint8)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        frame = np.zeros((12, 10, 3), np.uint8)
        frame[..., 0], frame[..., 1] = np.arange(12)[:, None], np.arange(10)[None, :]
        return {a: frame for a in self.agents}, {"a": {}, "b": {"action_mask": np.array([1, 0], np.int8)}}


def test_channels_last_frames_reach_every_agent_channels_first():
    """As in a single-agent env, a `(H, W, 3)` frame is `(3, H, W)` for the agent (the CNN encoders' layout), pixel
    for pixel, with or without the mask its info carries."""
    env = AgentEnv(PixelPair(), parallel=True)
    acting = env.reset(seed=0)
    assert env.observation_space("a").shape == (3, 12, 10)
    assert env.observation_space("b")["observation"].shape == (3, 12, 10)
    for frame in (acting["a"], acting["b"]["observation"]):
        assert frame.shape == (3, 12, 10) and frame.dtype == np.uint8
        assert (frame[0] == np.arange(12)[:, None]).all() and (frame[1] == np.arange(10)[None, :]).all()
    assert env.observation_space("b").contains(acting["b"])
