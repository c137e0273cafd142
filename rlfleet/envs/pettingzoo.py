"""PettingZoo envs (multi-agent): `pettingzoo:MODULE` ids, and one interface over the parallel and the AEC API.

An id `pettingzoo:mpe2.simple_spread_v3` names a module that PettingZoo's envs live in; its `parallel_env(**kwargs)`
is used where it has one (every agent acts at every step), else its `env(**kwargs)` (the AEC API: agents act in
turns, tic-tac-toe). Either way a run sees an `AgentEnv`:

- `reset(seed)` gives the observations of the agents that act now (all live agents of a parallel env, the agent
  whose turn it is of an AEC env);
- `step(actions)` takes one action per agent that acts now and gives an `AgentStep`: the rewards each agent
  received (in an AEC env, an agent's rewards since its last action, read when its turn comes or when it leaves:
  `env.last()`), the agents whose episode ended (with their last observation, terminated or truncated), the agents
  that act next, and whether no agent is left (the episode is over: reset).

Action masks: where an agent's observation is a `Dict` with an `"action_mask"` entry it is kept as it is; where the
env puts the mask in the agent's info (`info["action_mask"]`), the agent's observation becomes
`{"observation": obs, "action_mask": mask}`. Either way the algorithms never choose a masked action. Which agents have
their mask in their info is read at reset, from every agent's info (an AEC env's `infos`, not only the info of the
agent whose turn it is), for the spaces are read there: an env gives the masks in the infos from reset on. An agent
that is not there at reset (it joins later) is taken to have one where any agent's info has one and its actions are
`Discrete`; a step whose info has none gives a mask of ones (every action legal).

Agents may leave (terminate) or join during an episode: what `agents` holds at each step is who acts.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import pkgutil
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.envs.make import UnknownEnvError
from rlfleet.envs.wrappers import channels_first_observation, channels_first_space

PREFIX = "pettingzoo:"
INSTALL_HINT = 'pip install "rlfleet[multiagent]"'
MASK = "action_mask"


class PettingZooError(UnknownEnvError):
    """A PettingZoo id that does not import or name an env module, or an env rlfleet cannot run."""


def is_pettingzoo_id(env: object) -> bool:
    """`pettingzoo:MODULE`: a PettingZoo env (a multi-agent run)."""
    return isinstance(env, str) and env.startswith(PREFIX)


def env_module(env_id: str) -> ModuleType:
    """The module of `pettingzoo:MODULE`, which has `parallel_env` or `env`; a `PettingZooError` naming what is wrong
    (the id does not import, or the module builds no env)."""
    name = env_id.removeprefix(PREFIX)
    if not name:
        raise PettingZooError(
            f"{env_id!r} names no module: give pettingzoo:MODULE, e.g. pettingzoo:mpe2.simple_spread_v3"
        )
    try:
        with warnings.catch_warnings():  # PettingZoo's modules warn that a registry will replace them: they are our ids
            warnings.filterwarnings("ignore", "The old environment creation API", DeprecationWarning)
            module = importlib.import_module(name)
    except ImportError as exc:
        top = name.split(".")[0]
        missing = top in ("pettingzoo", "mpe2") and importlib.util.find_spec(top) is None
        hint = f" ({INSTALL_HINT}: PettingZoo, and MPE in the mpe2 package)" if missing else ""
        parent = name.rpartition(".")[0]
        close = _close_modules(parent, name) if parent else []
        suggestion = f"; did you mean {', '.join(close)}?" if close else ""
        raise PettingZooError(f"cannot import {name!r}, the module of env {env_id}: {exc}{suggestion}{hint}") from None
    if not callable(getattr(module, "parallel_env", None)) and not callable(getattr(module, "env", None)):
        raise PettingZooError(f"{name} is not a PettingZoo env module (it has neither parallel_env() nor env())")
    return module


def _close_modules(parent: str, name: str) -> list[str]:
    """Env modules beside the one asked for whose names are close to it (a version typo: tictactoe_v2); none where
    it is there (what failed to import is inside it: a dependency of its own)."""
    try:
        package = importlib.import_module(parent)
    except ImportError:
        return []
    found = {m.name for m in pkgutil.iter_modules(getattr(package, "__path__", []))} | set(dir(package))
    if name.rpartition(".")[2] in found:
        return []
    names = [f"{parent}.{n}" for n in found if not n.startswith("_")]
    return difflib.get_close_matches(name, names, n=3, cutoff=0.7)


@dataclass
class AgentStep:
    """What one `AgentEnv.step` gave."""

    rewards: dict[str, float]
    ended: dict[str, tuple[Any, bool, bool]]
    """Agents whose episode ended: (last observation, or None where the env gave none; terminated, truncated)."""
    acting: dict[str, Any]
    """Agents that act next, and their observations (empty when `over`)."""
    over: bool
    """No agent is left: the episode is over."""


@dataclass
class AgentEnv:
    """One PettingZoo env, parallel or AEC, behind one interface (see the module's docstring)."""

    env: Any
    parallel: bool
    possible_agents: list[str] = field(init=False)
    _masked_in_info: dict[str, int] = field(init=False, default_factory=dict)
    """Agents whose mask the env puts in their info, and the number of their actions."""

    def __post_init__(self) -> None:
        self.possible_agents = list(self.env.possible_agents)

    # ------------------------------------------------------------------------------------------ spaces
    def observation_space(self, agent: str) -> gym.Space:
        """The agent's observations as it sees them: channels-last frames channels first (as a single-agent env's:
        `ChannelsFirstImages`), with the mask its info carries."""
        space = channels_first_space(self.env.observation_space(agent))
        if agent in self._masked_in_info:
            n = self._masked_in_info[agent]
            return gym.spaces.Dict({"observation": space, MASK: gym.spaces.Box(0, 1, (n,), np.int8)})
        return space

    def action_space(self, agent: str) -> gym.Space:
        return self.env.action_space(agent)

    def _mask_in_obs(self, agent: str) -> bool:
        """The agent's observations carry their mask themselves (tic-tac-toe's)."""
        space = self.env.observation_space(agent)
        return isinstance(space, gym.spaces.Dict) and MASK in space.spaces

    def _find_masks(self, infos: dict[str, Any]) -> None:
        """At reset, note the agents whose mask is in their info (`infos`: every agent's, for the spaces are read
        there: `agent_spaces`). Agents not there yet are taken to have one where any agent has one and their actions
        are `Discrete`: a mask of ones, while their info has none, changes nothing, whereas a mask the spaces lack
        would change the agent's observations in the middle of a run."""
        for agent, info in infos.items():
            if info and MASK in info and not self._mask_in_obs(agent):
                self._masked_in_info[agent] = len(np.asarray(info[MASK]))
        if not self._masked_in_info:
            return
        for agent in self.possible_agents:
            action_space = self.env.action_space(agent)
            if agent not in infos and isinstance(action_space, gym.spaces.Discrete) and not self._mask_in_obs(agent):
                self._masked_in_info.setdefault(agent, int(action_space.n))

    def _observe(self, agent: str, obs: Any, info: dict[str, Any] | None) -> Any:
        obs = channels_first_observation(self.env.observation_space(agent), obs)
        if info and MASK in info and not (isinstance(obs, dict) and MASK in obs):
            mask = np.asarray(info[MASK], dtype=np.int8)
            self._masked_in_info[agent] = len(mask)
            return {"observation": obs, MASK: mask}
        if agent in self._masked_in_info:  # a step without a mask in the info: every action is legal
            return {"observation": obs, MASK: np.ones(self._masked_in_info[agent], np.int8)}
        return obs

    # ------------------------------------------------------------------------------------------ episodes
    def reset(self, seed: int | None = None) -> dict[str, Any]:
        if self.parallel:
            obs, infos = self.env.reset(seed=seed)
            self._find_masks(infos)
            return {a: self._observe(a, obs[a], infos.get(a)) for a in self.env.agents}
        self.env.reset(seed=seed)
        self._find_masks({a: self.env.infos.get(a) for a in self.env.agents})  # every agent's, not only the first's
        step = AgentStep({}, {}, {}, False)
        self._next_turn(step)
        return step.acting

    def step(self, actions: dict[str, Any]) -> AgentStep:
        if self.parallel:
            obs, rewards, terminations, truncations, infos = self.env.step(actions)
            done = [
                a for a in dict.fromkeys([*terminations, *truncations]) if terminations.get(a) or truncations.get(a)
            ]
            ended = {  # an agent that left without a last observation gets None: it ends on the one it acted on
                a: (
                    self._observe(a, obs[a], infos.get(a)) if a in obs else None,
                    bool(terminations.get(a, False)),
                    bool(truncations.get(a, False)),
                )
                for a in done
            }
            acting = {a: self._observe(a, obs[a], infos.get(a)) for a in self.env.agents if a not in ended}
            rewards = {a: float(r) for a, r in rewards.items()}
            return AgentStep(rewards, ended, acting, not self.env.agents)
        ((agent, action),) = actions.items()
        if agent != self.env.agent_selection:
            raise RuntimeError(f"{agent} acted out of turn ({self.env.agent_selection}'s turn)")
        self.env.step(action)
        step = AgentStep({}, {}, {}, False)
        self._next_turn(step)
        return step

    def _next_turn(self, step: AgentStep) -> None:
        """Go on to the next agent that acts: agents whose turn comes after their episode ended leave (stepped
        with None, as the AEC API asks), each giving its rewards and last observation."""
        env = self.env
        while env.agents:
            agent = env.agent_selection
            obs, reward, terminated, truncated, info = env.last()
            step.rewards[agent] = step.rewards.get(agent, 0.0) + float(reward)
            obs = self._observe(agent, obs, info)
            if terminated or truncated:
                step.ended[agent] = (obs, bool(terminated), bool(truncated))
                env.step(None)
                continue
            step.acting = {agent: obs}
            return
        step.over = True

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def make_agent_env(env_id: str, render_mode: str | None = None, **env_kwargs: Any) -> AgentEnv:
    """The `AgentEnv` of `pettingzoo:MODULE` built with `env_kwargs` (and `render_mode` where given)."""
    module = env_module(env_id)
    kwargs = dict(env_kwargs, **({"render_mode": render_mode} if render_mode is not None else {}))
    parallel = callable(getattr(module, "parallel_env", None))
    env = module.parallel_env(**kwargs) if parallel else module.env(**kwargs)
    return AgentEnv(env, parallel)


@dataclass
class AgentSpaces:
    """The agents of a PettingZoo env and their spaces (as an agent sees them: masks included)."""

    agents: list[str]
    observation: dict[str, gym.Space]
    action: dict[str, gym.Space]
    parallel: bool
    max_cycles: int | None
    """The env's `max_cycles` (None where it has none): the cycles after which its episodes are truncated, a cycle
    being a step of every agent."""

    @property
    def max_steps(self) -> int | None:
        """The most steps (`AgentEnv.step` calls) an episode takes by the env's `max_cycles`: a cycle is one step of
        a parallel env (every agent acts in it), and one move of each agent in an AEC env (MPE simple_spread's 25
        cycles are 75 moves of its 3 agents there)."""
        if self.max_cycles is None:
            return None
        return self.max_cycles if self.parallel else self.max_cycles * len(self.agents)


def agent_spaces(env_id: str, **env_kwargs: Any) -> AgentSpaces:
    """Build the env, reset it once (a mask in the infos shows there) and read every agent's spaces."""
    built = make_agent_env(env_id, **env_kwargs)
    try:
        built.reset(seed=0)
        agents = built.possible_agents
        cycles = getattr(built.env.unwrapped, "max_cycles", None)
        return AgentSpaces(
            agents,
            {a: built.observation_space(a) for a in agents},
            {a: built.action_space(a) for a in agents},
            built.parallel,
            int(cycles) if isinstance(cycles, int) else None,
        )
    finally:
        built.close()


def pettingzoo_info(env_id: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What `env_spec_info` says of a Gymnasium env, for a PettingZoo one: `agents` (`AgentSpaces`), the family
    `multi_agent`, as `observation_space`/`action_space` those of its first agent, and as `max_episode_steps` (what
    bounds an evaluation episode) the steps its `max_cycles` comes to (`AgentSpaces.max_steps`). A keyword the env
    does not take or a value it rejects is a `ValueError` with one line."""
    env_module(env_id)  # an id that does not import says so first
    try:
        spaces = agent_spaces(env_id, **env_kwargs)
    except Exception as exc:  # an env may raise anything for a keyword or value it does not expect
        given = " ".join(f"{k}={v!r}" for k, v in env_kwargs.items())
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"env {env_id} rejects --env-kwargs {given}: {type(exc).__name__}: {detail}") from None
    first = spaces.agents[0]
    return {
        "id": env_id,
        "reward_threshold": None,
        "max_episode_steps": spaces.max_steps,
        "is_atari": False,
        "family": "multi_agent",
        "observation_space": spaces.observation[first],
        "action_space": spaces.action[first],
        "agents": spaces,
    }
