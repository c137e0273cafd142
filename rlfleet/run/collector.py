"""Collector: steps a vector env with batched `act`, fills rollouts or replay, and keeps episode statistics.

It relies on the vector-env contract of `rlfleet.envs.make_vector_env` (same-step autoreset): when a
sub-env ends, `step` returns its reset observation in `obs` and the true last observation in
`info["final_obs"]`; the episode's real (unclipped) return is read with `finished_episodes(info)`.

Recurrent policies: whatever `act` returns as its state is passed back on the next step. When it is not
None, envs whose episode just ended get a fresh state from `algo.reset_state(state, done)`, values are
asked for with that state (`algo.value(obs, state)`), rollouts store `starts` (1 where an
observation is the first of its episode) beside the segment's initial state, and replay buffers get the
state each observation was acted on from (`buffer.add(..., state=…)`, None at a run's first step). A feed-forward policy
(state None) costs nothing extra.

Exploration noise with a state per env (DDPG/TD3's Ornstein–Uhlenbeck noise): an algorithm that has
`reset_noise(done)` gets it called after every step in which an env finished, with the same mask.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from rlfleet.data.rollout import RolloutStorage, Segment
from rlfleet.envs import finished_episodes


@dataclass
class Step:
    """One vector-env step: what was seen, done and received, with `next_obs` the true next observations."""

    obs: Any
    act: np.ndarray
    extras: dict[str, np.ndarray]
    rew: np.ndarray
    next_obs: Any
    terminated: np.ndarray
    truncated: np.ndarray
    starts: np.ndarray
    """1 where `obs` is the first observation of an episode."""
    state: Any = None
    """The policy's state after acting on `obs` (before any reset): the state that goes with `next_obs`."""


def _substitute_final(obs: Any, info: dict, done: np.ndarray) -> Any:
    """Copy of `obs` with the final observation put in for every env that just ended."""
    if not done.any():
        return obs
    mask = info["_final_obs"]
    final = info["final_obs"]
    if isinstance(obs, dict):
        out = {k: v.copy() for k, v in obs.items()}
        for i in np.flatnonzero(mask):
            for k in out:
                out[k][i] = final[i][k]
        return out
    out = obs.copy()
    for i in np.flatnonzero(mask):
        out[i] = final[i]
    return out


class Collector:
    """Runs an algorithm's policy on a vector env.

    `step()` advances every env once; `collect_rollout(storage)` fills a `[T, N]` segment for
    on-policy learning (writing bootstrap values for truncated episodes); `collect(n_step=…)` or
    `collect(n_episode=…)` feeds a replay buffer. Finished episodes land in `returns`/`lengths`.
    """

    def __init__(self, envs: VectorEnv, algo: Any, seed: int | None = None, history: int = 100):
        self.envs = envs
        self.algo = algo
        self.n_envs = envs.num_envs
        self.obs, _ = envs.reset(seed=seed)
        self.state = None
        self.starts = np.ones(self.n_envs, dtype=bool)  # does self.obs begin an episode, per env
        self.env_steps = 0
        self.episodes = 0
        self.returns: deque[float] = deque(maxlen=history)
        self.lengths: deque[int] = deque(maxlen=history)
        self.new_returns: list[float] = []
        self._reset_noise = getattr(algo, "reset_noise", None)

    def restart(self, seed: int) -> None:
        """Every env begins a new episode (reset with `seed`): the recurrent state and the per-env exploration
        noise start again with them (a resume whose envs could not be restored)."""
        self.obs, _ = self.envs.reset(seed=seed)
        self.state = None
        self.starts = np.ones(self.n_envs, dtype=bool)
        if self._reset_noise is not None:
            self._reset_noise(self.starts)

    def step(self, explore: bool = True) -> Step:
        obs, starts = self.obs, self.starts
        act, extras, state = self.algo.act(obs, self.state, explore)
        next_obs, rew, terminated, truncated, info = self.envs.step(act)
        done = terminated | truncated
        true_next = _substitute_final(next_obs, info, done)
        self.state = state
        if done.any():
            self._record(info)
            if state is not None:  # recurrent policy: the envs that autoreset start from a fresh state
                self.state = self.algo.reset_state(state, done)
            if self._reset_noise is not None:  # per-env exploration noise starts again with the episode
                self._reset_noise(done)
        self.obs, self.starts = next_obs, done
        self.env_steps += self.n_envs
        return Step(obs, act, extras, rew.astype(np.float32), true_next, terminated, truncated, starts, state)

    def _value(self, obs: Any, state: Any) -> np.ndarray:
        return self.algo.value(obs) if state is None else self.algo.value(obs, state)

    def _record(self, info: dict) -> None:
        for _, ret, length in finished_episodes(info):
            self.returns.append(ret)
            self.lengths.append(length)
            self.new_returns.append(ret)
            self.episodes += 1

    def collect_rollout(self, storage: RolloutStorage) -> Segment:
        """Fill `storage` with T steps of every env and return the segment with its bootstrap values.

        For a recurrent policy the segment also holds `starts` and the policy's state before its first
        step (`initial_state`, None at the very start of a run: the algorithm's zero state).
        """
        initial_state = self.state
        zeros = np.zeros(self.n_envs, dtype=np.float32)
        for t in range(storage.length):
            s = self.step()
            bootstrap = zeros
            if s.truncated.any():
                bootstrap = np.where(s.truncated, self._value(s.next_obs, s.state), 0.0).astype(np.float32)
            storage.write(
                t,
                obs=s.obs,
                act=s.act,
                rew=s.rew,
                terminated=s.terminated,
                truncated=s.truncated,
                bootstrap=bootstrap,
                **s.extras,
            )
            if s.state is not None:
                storage.write(t, starts=s.starts)
        last_value = np.asarray(self._value(self.obs, self.state), dtype=np.float32)
        return Segment(storage.batch(), self.obs, last_value, initial_state)

    def collect(
        self, buffer: Any, n_step: int | None = None, n_episode: int | None = None, explore: bool = True
    ) -> int:
        """Add transitions to `buffer` for at least `n_step` env steps or `n_episode` finished episodes."""
        if (n_step is None) == (n_episode is None):
            raise ValueError("give exactly one of n_step and n_episode")
        start_steps, start_episodes = self.env_steps, self.episodes
        while True:
            state = self.state  # what a recurrent policy acts on self.obs from: a sequence buffer stores it
            s = self.step(explore)
            if s.state is None:
                buffer.add(s.obs, s.act, s.rew, s.next_obs, s.terminated, s.truncated)
            else:
                buffer.add(s.obs, s.act, s.rew, s.next_obs, s.terminated, s.truncated, state=state)
            if n_step is not None and self.env_steps - start_steps >= n_step:
                break
            if n_episode is not None and self.episodes - start_episodes >= n_episode:
                break
        return self.env_steps - start_steps

    def pop_new_returns(self) -> list[float]:
        out, self.new_returns = self.new_returns, []
        return out
