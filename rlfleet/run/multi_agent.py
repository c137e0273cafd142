"""Multi-agent runs on PettingZoo envs: which policy acts for which agent, and a collector that steps the envs.

The pieces, in the order a run uses them (Tianshou's `MultiAgentPolicyManager` and RLlib's policy mapping are the
models):

- `policy_mapping`: every agent's policy, from `--policies shared|separate` or `--policy-map 'adversary_*=red,
  agent_*=blue'` (patterns as `fnmatch` reads them, the first that matches an agent wins), with the policies that
  are frozen (`--freeze red`) and those loaded from a checkpoint (`--load-policy red=RUN/checkpoints/best.pt`).
  `random` is a policy every mapping may name: uniform over the legal actions, never trained.
- `Policies`: one algorithm per policy (the run's algorithm, built for the spaces of the policy's agents). Every
  policy sees the agent's index among the env's agents beside its observation (a one-hot, `agent_id`: appended to
  a vector, an entry beside an image or in a `Dict`): a shared policy tells alike agents apart by it, and a
  policy's weights fit any mapping of the env; agents with different 1-D Box observations and one action space
  share a policy with their observations padded with zeros to the longest; other differences need separate
  policies. `act` batches the agents of one policy across env copies.
- `MultiAgentCollector`: steps `n` copies of the env. A trained policy learns from its agents' own transitions:
  an agent's transition runs from one of its actions to its next one (in a turn-based game the other players move
  in between), with every reward it received meanwhile. The policy's data (`PolicyData`) has a column per
  (copy, agent) pair; each agent's episode goes into one column, so returns and n-step sums stay inside it as they
  stay inside one env's in a single-agent run, and a row holds one transition of every column.
- `evaluate_agents`: greedy episodes, each agent's return.

A run's `charts/episodic_return` and its evaluation return are the mean return of the trained policies' agents;
each agent's and each policy's return are logged beside it (`agents/<agent>/...`, `policies/<policy>/...`). In
self-play on a zero-sum game that mean is 0 whatever the players learn, and the run says so in one line
(`multi_agent_runner.zero_sum_agents`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlfleet.data.batch import stack_obs
from rlfleet.data.rollout import RolloutStorage, Segment
from rlfleet.envs.pettingzoo import AgentEnv, AgentSpaces
from rlfleet.nets.encoders import is_image
from rlfleet.nets.heads import action_mask_of
from rlfleet.run.config import ConfigError

RANDOM = "random"
"""The policy that picks uniformly among the legal actions; it has no weights and is never trained."""
SHARED = "shared"
AGENT_ID = "agent_id"
OBSERVATION = "observation"
"""The observation's entry in a policy's `Dict` input where it is not a `Dict` itself (an image, a `Discrete`)."""


# ---------------------------------------------------------------------------------------------------- the mapping
@dataclass(frozen=True)
class PolicyMapping:
    """Every agent's policy, and which policies are frozen or loaded."""

    of_agent: dict[str, str]
    frozen: frozenset[str]
    loads: dict[str, str]
    """Policy -> `CHECKPOINT[#POLICY]` its weights come from."""

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(self.of_agent.values()))

    @property
    def trained(self) -> list[str]:
        return [n for n in self.names if n not in self.frozen]


def _pairs(text: str | None, option: str, example: str) -> dict[str, str]:
    """'KEY=VALUE,KEY=VALUE' as a dict (in order); one line for an item that is not KEY=VALUE, and for a key given
    twice (which of the two was meant is not for rlfleet to guess)."""
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise ConfigError(f"{option} takes KEY=VALUE items separated by commas ({example}), got {item.strip()!r}")
        if key in out:
            raise ConfigError(f"{option} gives {key} twice ({key}={out[key]}, {key}={value}): give it once")
        out[key] = value
    return out


def policy_mapping(
    agents: Sequence[str],
    policies: str = SHARED,
    policy_map: str | None = None,
    freeze: str | None = None,
    load_policy: str | None = None,
) -> PolicyMapping:
    """The mapping of a run's options (`RunConfig.policies`, `policy_map`, `freeze`, `load_policy`); every problem is
    one `ConfigError` line: a pattern that matches no agent, an agent without a policy, a frozen or loaded policy the
    mapping does not have, a frozen policy without weights, nothing left to train, a pattern or a loaded policy
    given twice, a pattern whose every agent an earlier one took for another policy."""
    load = _pairs(load_policy, "--load-policy", "red=runs/old/checkpoints/best.pt") if load_policy else {}
    freeze_names = [n.strip() for n in (freeze or "").split(",") if n.strip()]
    if policy_map and policies != SHARED:
        raise ConfigError(f"--policies {policies} has no effect with --policy-map, which names each agent's policy")
    if policy_map:
        of_agent: dict[str, str] = {}
        for pattern, name in _pairs(policy_map, "--policy-map", "'adversary_*=red,agent_*=blue'").items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ConfigError(f"--policy-map: {pattern}={name!r} names no policy (a name like red or blue)")
            matched = [a for a in agents if fnmatch.fnmatchcase(a, pattern)]
            if not matched:
                raise ConfigError(
                    f"--policy-map: {pattern!r} matches no agent of this env (its agents: {', '.join(agents)})"
                )
            taken = {a: of_agent[a] for a in matched if a in of_agent}
            if len(taken) == len(matched) and any(policy != name for policy in taken.values()):
                held = ", ".join(f"{a} -> {policy}" for a, policy in taken.items())
                raise ConfigError(
                    f"--policy-map: {pattern}={name} maps no agent: an earlier pattern took every agent it matches "
                    f"({held}; the first match wins): put the more specific pattern first"
                )
            for agent in matched:
                of_agent.setdefault(agent, name)
        missing = [a for a in agents if a not in of_agent]
        if missing:
            raise ConfigError(
                f"--policy-map leaves agent(s) {', '.join(missing)} without a policy (add a pattern, or *=NAME)"
            )
        of_agent = {a: of_agent[a] for a in agents}
    elif policies == SHARED:
        of_agent = dict.fromkeys(agents, SHARED)
    elif policies == "separate":
        of_agent = {a: a for a in agents}
    else:
        raise ConfigError(f"--policies must be shared or separate, got {policies!r}")
    names = list(dict.fromkeys(of_agent.values()))
    for option, given in (("--freeze", freeze_names), ("--load-policy", list(load))):
        unknown = [n for n in given if n not in names]
        if unknown:
            raise ConfigError(
                f"{option} names {', '.join(unknown)}, which the mapping does not have "
                f"(its policies: {', '.join(names)})"
            )
    if RANDOM in load:
        raise ConfigError(f"--load-policy: {RANDOM} is the uniform random policy, it has no weights to load")
    frozen = frozenset(freeze_names) | ({RANDOM} & set(names))
    without = [n for n in sorted(frozen) if n != RANDOM and n not in load]
    if without:
        raise ConfigError(
            f"--freeze {', '.join(without)}: a frozen policy needs weights (--load-policy {without[0]}=CHECKPOINT)"
        )
    if all(n in frozen for n in names):
        raise ConfigError(f"every policy is frozen ({', '.join(names)}): nothing to train")
    return PolicyMapping(of_agent, frozen, load)


# ---------------------------------------------------------------------------------------------------- policies
class RandomPolicy:
    """Uniform over the legal actions (all of them without a mask)."""

    data = "none"

    def __init__(self, action_space: gym.Space, seed: int):
        if not isinstance(action_space, gym.spaces.Discrete | gym.spaces.Box):
            raise ConfigError(f"the {RANDOM} policy takes Discrete or Box actions, got {action_space}")
        self.space = action_space
        self.space.seed(seed)
        self.rng = np.random.default_rng(seed)

    def act(self, obs: Any, state: Any = None, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        n = len(next(iter(obs.values()))) if isinstance(obs, dict) else len(obs)
        if isinstance(self.space, gym.spaces.Discrete):
            legal = action_mask_of(obs)
            if legal is None:
                legal = np.ones((n, int(self.space.n)), bool)
            choice = [self.rng.choice(np.flatnonzero(row)) for row in legal]
            return np.asarray(choice, dtype=np.int64) + int(self.space.start), {}, None
        return np.stack([self.space.sample() for _ in range(n)]), {}, None

    def schedule(self, env_steps: int, total_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """Where its draws have got to (its own generator's and the action space's, which samples `Box` actions):
        a resumed run's random player goes on with new moves rather than replaying those of the run's start."""
        return {"rng": self.rng.bit_generator.state, "space_rng": self.space.np_random.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:  # a checkpoint from before the draws were saved: they go on from the seed
            return
        self.rng.bit_generator.state = state["rng"]
        self.space.np_random.bit_generator.state = state["space_rng"]


@dataclass
class PolicyInput:
    """What an agent's observation becomes for its policy: padded to `width` (a 1-D Box shared with longer ones),
    with the agent's index among the env's agents as a one-hot of `n_ids` (0: none, an env with one agent). Every
    policy of an env sees the id, shared or not, so that a policy's weights fit any mapping of that env: a policy
    trained shared plays one side against another later (`--load-policy`). The id goes after a `Box` observation
    and into a `Dict` one as an entry; an image gets a `Dict` of itself and the id, so that it keeps its shape and
    dtype (uint8 in replay) and gets the CNN a single-agent run gives it (`MultiInputEncoder`)."""

    space: gym.Space
    index: dict[str, int]
    n_ids: int
    width: int | None

    def one(self, agent: str, obs: Any) -> Any:
        """The policy's input for one observation of `agent` (a copy: it may wait in a queue while the env reuses its
        arrays)."""
        obs = {k: np.array(v) for k, v in obs.items()} if isinstance(obs, dict) else np.array(obs)
        if self.width is not None:
            obs = np.pad(np.asarray(obs, np.float32), (0, self.width - np.shape(obs)[0]))
        if self.n_ids <= 1:
            return obs
        one_hot = np.zeros(self.n_ids, np.float32)
        one_hot[self.index[agent]] = 1.0
        if isinstance(obs, dict):
            return {**obs, AGENT_ID: one_hot}
        if isinstance(self.space, gym.spaces.Box):  # the id appended (not an image: that is a Dict's entry)
            return np.concatenate([np.asarray(obs, np.float32).ravel(), one_hot])
        return {OBSERVATION: obs, AGENT_ID: one_hot}


def _policy_input(name: str, agents: list[str], spaces: AgentSpaces) -> PolicyInput:
    """The input of a policy of `agents` (one line where they differ in a way no padding mends)."""
    obs = [spaces.observation[a] for a in agents]
    acts = [spaces.action[a] for a in agents]
    space, width = obs[0], None
    if any(s != space for s in obs):
        boxes = all(isinstance(s, gym.spaces.Box) and len(s.shape) == 1 for s in obs)
        if not boxes or any(a != acts[0] for a in acts):
            kinds = "; ".join(f"{a}: {spaces.observation[a]}, {spaces.action[a]}" for a in agents)
            raise ConfigError(
                f"policy {name} is shared by agents whose spaces differ ({kinds}): give them separate policies "
                "(--policies separate, or --policy-map); only 1-D Box observations with one action space are padded"
            )
        width = max(s.shape[0] for s in obs)  # type: ignore[index]
        lows = [np.pad(np.asarray(s.low, np.float32), (0, width - s.shape[0])) for s in obs]  # type: ignore[attr-defined,index]
        highs = [np.pad(np.asarray(s.high, np.float32), (0, width - s.shape[0])) for s in obs]  # type: ignore[attr-defined,index]
        space = gym.spaces.Box(np.minimum.reduce(lows), np.maximum.reduce(highs), dtype=np.float32)
    elif any(a != acts[0] for a in acts):
        raise ConfigError(
            f"policy {name} is shared by agents with different action spaces: give them separate policies"
        )
    n_ids = len(spaces.agents) if len(spaces.agents) > 1 else 0
    if n_ids:
        one_hot = gym.spaces.Box(0.0, 1.0, (n_ids,), np.float32)
        if isinstance(space, gym.spaces.Dict):
            space = gym.spaces.Dict({**space.spaces, AGENT_ID: one_hot})
        elif isinstance(space, gym.spaces.Box) and not is_image(space):
            flat = gym.spaces.Box(np.asarray(space.low, np.float32).ravel(), np.asarray(space.high, np.float32).ravel())
            space = gym.spaces.Box(
                np.concatenate([flat.low, one_hot.low]), np.concatenate([flat.high, one_hot.high]), dtype=np.float32
            )
        else:  # an image (a CNN's input only as it is), or a space of another kind
            space = gym.spaces.Dict({OBSERVATION: space, AGENT_ID: one_hot})
    return PolicyInput(space, {a: spaces.agents.index(a) for a in agents}, n_ids, width)


Builder = Callable[[str, gym.Space, gym.Space, int, int], Any]
"""(policy name, observation space, action space, seed, lanes) -> the run's algorithm built for them, acting on
`lanes` rows at a time (its `n_envs`: what it keeps per env, such as nstep_q's ε of each, is kept per lane)."""


@dataclass
class Acted:
    """One agent's action in one env copy: what its policy saw (`obs`, the policy's input), chose and reported."""

    copy: int
    agent: str
    policy: str
    obs: Any
    act: Any
    extras: dict[str, Any]


class Policies:
    """The run's policies: an algorithm per policy (`random`: `RandomPolicy`), the agents each one acts for."""

    def __init__(self, spaces: AgentSpaces, mapping: PolicyMapping, build: Builder, seed: int, copies: int = 1):
        self.mapping = mapping
        self.of_agent = mapping.of_agent
        self.agents_of: dict[str, list[str]] = defaultdict(list)
        for agent, name in self.of_agent.items():
            self.agents_of[name].append(agent)
        self.inputs: dict[str, PolicyInput] = {}
        self.algos: dict[str, Any] = {}
        for i, name in enumerate(mapping.names):
            agents = self.agents_of[name]
            action_space = spaces.action[agents[0]]
            if name == RANDOM:
                if any(spaces.action[a] != action_space for a in agents):
                    raise ConfigError(f"the {RANDOM} policy acts for agents whose action spaces differ: map them apart")
                self.inputs[name] = PolicyInput(spaces.observation[agents[0]], {}, 0, None)
                self.algos[name] = RandomPolicy(action_space, seed + i)
                continue
            self.inputs[name] = _policy_input(name, agents, spaces)
            self.algos[name] = build(name, self.inputs[name].space, action_space, seed + i, copies * len(agents))
        self.trained = mapping.trained
        self.data: str = self.algos[self.trained[0]].data
        for name, algo in self.algos.items():  # every policy's networks and optimizers as attributes "policy/name":
            for attr, value in vars(algo).items():  # what is read off an algorithm object (`algo_modules`, and the
                if isinstance(value, nn.Module | torch.optim.Optimizer):  # optimizers `load_algo_state` keeps the
                    setattr(self, f"{name}/{attr}", value)  # hyperparameters of) is read off this one

    def act(self, acting: Sequence[dict[str, Any]], explore: bool) -> tuple[list[dict[str, Any]], list[Acted]]:
        """The actions of every agent that acts now in each env copy (`acting[c]`: agent -> observation), each
        policy acting once on all of its agents; and what each one saw, chose and reported. Frozen policies act
        greedily.

        A policy acts on one row per lane, (copy, agent) in order, whichever agents act now: the rows of those that
        do not (their turn has not come, they left) repeat an acting agent's observation and their actions are
        dropped. So an algorithm's state per env (nstep_q's ε of each, Ornstein–Uhlenbeck noise, gSDE's matrices)
        stays with one agent of one copy, as it stays with one env in a single-agent run."""
        by_policy: dict[str, dict[int, tuple[int, str, Any]]] = defaultdict(dict)
        for c, agents in enumerate(acting):
            for agent, obs in agents.items():
                name = self.of_agent[agent]
                lane = c * len(self.agents_of[name]) + self.agents_of[name].index(agent)
                by_policy[name][lane] = (c, agent, self.inputs[name].one(agent, obs))
        actions: list[dict[str, Any]] = [{} for _ in acting]
        acted: list[Acted] = []
        for name, items in by_policy.items():
            filler = next(iter(items.values()))[2]
            if name == RANDOM:
                lanes = list(items)
                rows = [items[lane][2] for lane in lanes]
            else:
                lanes = list(range(len(acting) * len(self.agents_of[name])))
                rows = [items[lane][2] if lane in items else filler for lane in lanes]
            act, extras, _ = self.algos[name].act(stack_obs(rows), None, explore and name not in self.mapping.frozen)
            for i, lane in enumerate(lanes):
                if lane in items:
                    c, agent, obs = items[lane]
                    actions[c][agent] = act[i]
                    acted.append(Acted(c, agent, name, obs, act[i], {k: v[i] for k, v in extras.items()}))
        return actions, acted

    def schedule(self, env_steps: int, total_steps: int) -> None:
        for name in self.trained:
            self.algos[name].schedule(env_steps, total_steps)

    def state_dict(self) -> dict[str, Any]:
        return {"policies": {name: algo.state_dict() for name, algo in self.algos.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Every policy's saved state; the `random` policy's draws where saved (else they follow its seed)."""
        saved = state["policies"]
        missing = [n for n in self.algos if n not in saved and n != RANDOM]
        if missing:
            raise KeyError(f"no saved state of policy {missing[0]}")
        for name, algo in self.algos.items():
            algo.load_state_dict(saved.get(name, {}))


# ---------------------------------------------------------------------------------------------------- the data
@dataclass
class Transition:
    obs: Any
    act: Any
    extras: dict[str, Any]
    rew: float
    next_obs: Any = None
    terminated: bool = False
    truncated: bool = False


class PolicyData:
    """A trained policy's experience, in `lanes` columns (as many as the (env copy, agent) pairs it acts for): a row of
    its rollout storage or replay buffer holds one transition of every column, `rollout_len` rows make a `Segment`
    (in `segments`).

    An agent's episode (a *stream*, keyed by (copy, agent)) goes into one column from its first transition to its
    last (terminated or truncated), so returns and n-step sums stay inside it; the stream that begins next takes the
    free column whose queue is shortest. A stream's newest transition is held back until its next one comes (or its
    episode ends there), so that a stream cut short (`cut`) still ends in its column. A column waits in its queue
    until every column has a transition for the next row: agents that act more often (or live longer) than others
    fill rows as fast as the slowest column allows, and with columns handed out where they are shortest, none runs
    ahead for long."""

    def __init__(self, algo: Any, lanes: int, rollout_len: int | None = None, buffer: Any = None):
        self.algo, self.lanes, self.rollout_len, self.buffer = algo, lanes, rollout_len, buffer
        self.queues: list[deque[Transition]] = [deque() for _ in range(lanes)]
        self.column: dict[Hashable, int] = {}
        """The column of each stream under way."""
        self.held: dict[Hashable, Transition] = {}
        """Each stream's newest transition, until its next one comes."""
        self.segments: list[Segment] = []
        self._storage: RolloutStorage | None = None
        self._t = 0

    def put(self, stream: Hashable, transition: Transition) -> None:
        column = self.column.get(stream)
        if column is None:
            busy = set(self.column.values())
            free = [i for i in range(self.lanes) if i not in busy]
            if not free:
                raise RuntimeError(f"{len(busy)} streams under way, more than the {self.lanes} columns of the data")
            column = self.column[stream] = min(free, key=lambda i: len(self.queues[i]))
        held = self.held.pop(stream, None)
        if held is not None:
            self.queues[column].append(held)
        if transition.terminated or transition.truncated:
            self.queues[column].append(transition)
            del self.column[stream]
        else:
            self.held[stream] = transition
        self._rows()

    def cut(self, streams: Callable[[Hashable], bool]) -> None:
        """End the streams under way that `streams` picks (their envs begin new episodes: a restarted sampler's): the
        newest transition of each ends truncated there (its next observation is the real one)."""
        for stream, column in list(self.column.items()):
            if streams(stream):
                held = self.held.pop(stream, None)
                if held is not None:
                    held.truncated = True
                    self.queues[column].append(held)
                del self.column[stream]
        self._rows()

    def _rows(self) -> None:
        while all(self.queues):
            self._row([q.popleft() for q in self.queues])

    def _row(self, row: list[Transition]) -> None:
        obs, next_obs = stack_obs([t.obs for t in row]), stack_obs([t.next_obs for t in row])
        act = np.stack([np.asarray(t.act) for t in row])
        rew = np.asarray([t.rew for t in row], np.float32)
        terminated = np.asarray([t.terminated for t in row])
        truncated = np.asarray([t.truncated for t in row])
        if self.buffer is not None:
            self.buffer.add(obs, act, rew, next_obs, terminated, truncated)
            return
        assert self.rollout_len is not None  # a rollout policy's data has its length
        if self._storage is None:
            self._storage, self._t = RolloutStorage(self.rollout_len, self.lanes), 0
        bootstrap = np.zeros(self.lanes, np.float32)
        if truncated.any():
            bootstrap = np.where(truncated, self.algo.value(next_obs), 0.0).astype(np.float32)
        extras = {k: np.stack([np.asarray(t.extras[k]) for t in row]) for k in row[0].extras}
        self._storage.write(
            self._t,
            obs=obs,
            act=act,
            rew=rew,
            terminated=terminated,
            truncated=truncated,
            bootstrap=bootstrap,
            **extras,
        )
        self._t += 1
        if self._t == self.rollout_len:
            last_value = np.asarray(self.algo.value(next_obs), np.float32)
            self.segments.append(Segment(self._storage.batch(), next_obs, last_value))
            self._storage = None  # the next segment gets storage of its own: this one is learned from later

    def restart(self) -> None:
        """Drop what was queued (the envs start new episodes: a resumed run)."""
        for q in self.queues:
            q.clear()
        self.column.clear()
        self.held.clear()
        self._storage = None
        if self.buffer is not None:
            self.buffer.mark_boundary(np.arange(self.lanes))


class TransitionLog:
    """A trained policy's transitions as they come, each with its stream: what a `data_parallel` sampler sends; the
    learner puts them into its `PolicyData` (whose columns serve every sampler's streams)."""

    def __init__(self) -> None:
        self.items: list[tuple[Hashable, Transition]] = []

    def put(self, stream: Hashable, transition: Transition) -> None:
        self.items.append((stream, transition))

    def take(self) -> list[tuple[Hashable, Transition]]:
        out, self.items = self.items, []
        return out

    def restart(self) -> None:
        self.items.clear()


# ---------------------------------------------------------------------------------------------------- collecting
@dataclass
class EpisodeStats:
    """Finished episodes: the run's return (mean over the trained policies' agents) and each agent's."""

    history: int = 100
    returns: deque[float] = field(init=False)
    agents: dict[str, deque[float]] = field(default_factory=dict)
    new_returns: list[float] = field(default_factory=list)
    new_agents: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    episodes: int = 0

    def __post_init__(self) -> None:
        self.returns = deque(maxlen=self.history)

    def add(self, returns: dict[str, float], trained_agents: set[str]) -> None:
        for agent, ret in returns.items():
            self.agents.setdefault(agent, deque(maxlen=self.history)).append(ret)
            self.new_agents[agent].append(ret)
        mine = [r for a, r in returns.items() if a in trained_agents] or list(returns.values())
        self.returns.append(float(np.mean(mine)))
        self.new_returns.append(float(np.mean(mine)))
        self.episodes += 1


class MultiAgentCollector:
    """Steps `len(envs)` copies of a PettingZoo env (`AgentEnv`) with the run's policies; the trained policies'
    transitions go to their `PolicyData` (`data`), finished episodes to `stats`. `env_steps` counts env steps: one
    per copy and `step` (one move in a turn-based game)."""

    def __init__(
        self,
        envs: list[AgentEnv],
        policies: Policies,
        data: dict[str, PolicyData] | dict[str, TransitionLog],
        seed: int,
    ):
        self.envs, self.policies, self.data = envs, policies, data
        self.trained_agents = {a for n in policies.trained for a in policies.agents_of[n]}
        self.stats = EpisodeStats()
        self.env_steps = 0
        self.restart(seed)

    def restart(self, seed: int) -> None:
        """Every copy begins a new episode (copy c reset with `seed + c`); nothing pending is kept, and every lane's
        exploration noise starts again."""
        self.acting = [env.reset(seed=seed + c) for c, env in enumerate(self.envs)]
        self.pending: dict[tuple[int, str], Transition] = {}
        self.episode_returns: list[dict[str, float]] = [defaultdict(float) for _ in self.envs]
        for d in self.data.values():
            d.restart()
        self._reset_noise([(c, a) for c in range(len(self.envs)) for a in self.policies.of_agent])

    def _reset_noise(self, ended: Sequence[tuple[int, str]]) -> None:
        """The exploration noise (`reset_noise`: DDPG's and TD3's Ornstein–Uhlenbeck process) of each (copy, agent)
        in `ended` back at its start, as a single-agent run's is for an env whose episode ended: each policy's lanes
        are (copy, agent) pairs, and the agent's next action begins an episode of its own."""
        if not ended:
            return
        for name in self.policies.trained:
            reset = getattr(self.policies.algos[name], "reset_noise", None)
            agents = self.policies.agents_of[name]
            lanes = [c * len(agents) + agents.index(a) for c, a in ended if a in agents]
            if reset is not None and lanes:
                mask = np.zeros(len(self.envs) * len(agents), bool)
                mask[lanes] = True
                reset(mask)

    @property
    def episodes(self) -> int:
        return self.stats.episodes

    def step(self, explore: bool = True) -> None:
        actions, acted = self.policies.act(self.acting, explore)
        for a in acted:
            if a.policy in self.data:
                self.pending[(a.copy, a.agent)] = Transition(a.obs, a.act, a.extras, 0.0)
        for c, env in enumerate(self.envs):
            result = env.step(actions[c])
            for agent, reward in result.rewards.items():
                self.episode_returns[c][agent] += reward
                if (c, agent) in self.pending:
                    self.pending[(c, agent)].rew += reward
            for agent, obs in result.acting.items():
                self._close(c, agent, obs, False, False)
            for agent, (obs, terminated, truncated) in result.ended.items():
                self._close(c, agent, obs, terminated, truncated)
            if result.over:
                for copy, agent in list(self.pending):  # gone without a word: cut on what it acted on
                    if copy == c:
                        self._close(c, agent, None, False, True)
                self.stats.add(dict(self.episode_returns[c]), self.trained_agents)
                self.episode_returns[c] = defaultdict(float)
                self.acting[c] = env.reset()
                self._reset_noise([(c, a) for a in self.policies.of_agent])
            else:
                self.acting[c] = result.acting
                self._reset_noise([(c, a) for a in result.ended])
        self.env_steps += len(self.envs)

    def _close(self, c: int, agent: str, obs: Any, terminated: bool, truncated: bool) -> None:
        """End the transition agent `agent` of copy `c` began with its last action: `obs` its next observation (None:
        the env gave none, the one it acted on stands in)."""
        pending = self.pending.pop((c, agent), None)
        if pending is None:
            return
        name = self.policies.of_agent[agent]
        pending.next_obs = pending.obs if obs is None else self.policies.inputs[name].one(agent, obs)
        pending.terminated, pending.truncated = terminated, truncated
        self.data[name].put((c, agent), pending)

    def pop_new_returns(self) -> list[float]:
        out, self.stats.new_returns = self.stats.new_returns, []
        return out

    def pop_agent_returns(self) -> dict[str, list[float]]:
        out, self.stats.new_agents = self.stats.new_agents, defaultdict(list)
        return dict(out)


# ---------------------------------------------------------------------------------------------------- evaluation
@dataclass(frozen=True)
class AgentEvaluation:
    """Each agent's return in each greedy episode, the run's return (mean over the trained policies' agents), and
    how many episodes were cut at the step bound."""

    agents: dict[str, np.ndarray]
    returns: np.ndarray
    cut: int


def evaluate_agents(
    policies: Policies,
    envs: list[AgentEnv],
    seed: int,
    max_steps: int,
    on_frame: Callable[[int], None] | None = None,
) -> AgentEvaluation:
    """One greedy episode in each env copy (copy c reset with `seed + c`), each at most `max_steps` steps;
    `on_frame(c)` after the reset of copy c and after each of its steps (rendering: a video's first frame is the
    episode's start)."""
    acting = [env.reset(seed=seed + c) for c, env in enumerate(envs)]
    if on_frame is not None:
        for c in range(len(envs)):
            on_frame(c)
    returns: list[dict[str, float]] = [defaultdict(float) for _ in envs]
    steps = np.zeros(len(envs), int)
    done = np.zeros(len(envs), bool)
    cut = 0
    while not done.all():
        live = [acting[c] if not done[c] else {} for c in range(len(envs))]
        actions, _ = policies.act(live, explore=False)
        for c, env in enumerate(envs):
            if done[c]:
                continue
            result = env.step(actions[c])
            for agent, reward in result.rewards.items():
                returns[c][agent] += reward
            steps[c] += 1
            acting[c] = result.acting
            if on_frame is not None:
                on_frame(c)
            if result.over or steps[c] >= max_steps:
                cut += not result.over
                done[c] = True
    trained = {a for n in policies.trained for a in policies.agents_of[n]}
    agents = {a: np.asarray([r.get(a, 0.0) for r in returns]) for a in policies.of_agent}
    run = np.mean([agents[a] for a in policies.of_agent if a in trained], axis=0)
    return AgentEvaluation(agents, np.asarray(run, np.float64), cut)


def checkpoint_policies(
    algo_cls: Any, algo_cfg: Any, run: dict[str, Any], spaces: AgentSpaces, state: dict[str, Any], seed: int
) -> Policies:
    """The policies of a multi-agent run's checkpoint (its run config `run`, its algorithm's class and config, its
    saved `state`), rebuilt for the env's `spaces` on the CPU. `seed` is the evaluation's (`rlfleet eval --seed`):
    the `random` policy's draws follow it, and so do the games against it where the env's reset ignores its seed
    (tic-tac-toe's)."""
    mapping = policy_mapping(spaces.agents, run["policies"], run["policy_map"], run["freeze"], run["load_policy"])

    def build(_: str, obs: gym.Space, act: gym.Space, seed: int, lanes: int) -> Any:
        return algo_cls(dataclasses.replace(algo_cfg, n_envs=lanes), obs, act, seed=seed)

    policies = Policies(spaces, mapping, build, seed=seed, copies=algo_cfg.n_envs)
    saved = {name: s for name, s in state["policies"].items() if name != RANDOM}  # its draws: the evaluation's seed's
    policies.load_state_dict({**state, "policies": saved})
    return policies
