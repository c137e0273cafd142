"""Vectorised returns over `[T, N]` rollouts: discounted (forward-view n-step) returns and GAE(λ); n-step
transitions built step by step (`NStepBuilder`, an Ape-X actor's local buffer).

This is the one place where `terminated` and `truncated` are combined. The rules:

- terminated at step t: the episode really ended, nothing is bootstrapped (next value 0);
- truncated at step t (time limit, not a real end): bootstrap from the value of the episode's final
  observation, passed in as `bootstrap[t]`;
- neither, and t is the last step of the segment: bootstrap from `last_value` (value of the observation
  that follows the segment);
- otherwise the next step of the same env continues the sum.

If both flags are set, termination wins.
"""

from __future__ import annotations

from collections import deque
from operator import itemgetter
from typing import Any

import numpy as np

from rlfleet.data.batch import map_obs, stack_obs


def next_state_values(
    values: np.ndarray | None,
    terminated: np.ndarray,
    truncated: np.ndarray,
    bootstrap: np.ndarray | None,
    last_value: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Value of the state after each step, and the `continues` mask (1 where the next step is the same episode).

    `values[t]` is V(obs[t]) for the segment's own observations (None when only the done/bootstrap/last
    values are needed); the result at t is the value of what follows step t under the rules above.
    """
    term = terminated.astype(bool)
    trunc = truncated.astype(bool) & ~term
    done = term | trunc
    next_v = np.zeros(terminated.shape, dtype=np.float32)
    if values is not None:
        next_v[:-1] = values[1:]
    next_v[-1] = last_value
    boot = np.zeros_like(next_v) if bootstrap is None else bootstrap
    next_v = np.where(term, 0.0, np.where(trunc, boot, next_v)).astype(np.float32)
    return next_v, (~done).astype(np.float32)


def discounted_returns(
    rew: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    last_value: np.ndarray,
    gamma: float,
    bootstrap: np.ndarray | None = None,
) -> np.ndarray:
    """Forward-view returns R_t = r_t + γ R_{t+1} up to the segment end (the A3C paper's n-step target).

    Each state gets the longest n-step return available inside the segment. Arrays are `[T, N]`;
    `last_value` is `[N]`; `bootstrap[t]` is the value of the final observation where `truncated[t]`.
    """
    next_v, cont = next_state_values(None, terminated, truncated, bootstrap, last_value)
    ret = np.empty(rew.shape, dtype=np.float32)
    running = np.asarray(last_value, dtype=np.float32)
    for t in range(rew.shape[0] - 1, -1, -1):
        running = rew[t] + gamma * (cont[t] * running + (1.0 - cont[t]) * next_v[t])
        ret[t] = running
    return ret


def gae(
    rew: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    last_value: np.ndarray,
    gamma: float,
    lam: float,
    bootstrap: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation; returns `(advantages, returns)` with returns = advantages + values."""
    next_v, cont = next_state_values(values, terminated, truncated, bootstrap, last_value)
    delta = rew + gamma * next_v - values
    adv = np.empty(rew.shape, dtype=np.float32)
    running = np.zeros(rew.shape[1:], dtype=np.float32)
    for t in range(rew.shape[0] - 1, -1, -1):
        running = delta[t] + gamma * lam * cont[t] * running
        adv[t] = running
    return adv, (adv + values).astype(np.float32)


def episode_complete_mask(terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """1 where the step's episode ends inside the segment (at or after it), 0 on each env's unfinished tail.

    REINFORCE without a critic has no value to bootstrap an unfinished episode from; its loss uses
    only the steps whose returns-to-go are complete.
    """
    done = (terminated.astype(bool) | truncated.astype(bool)).astype(np.int64)
    # cumulative count of episode ends from t to the segment end (reverse cumsum); > 0 means an end follows
    ends_after = np.flip(np.cumsum(np.flip(done, 0), 0), 0)
    return (ends_after > 0).astype(np.float32)


def td_targets(
    rew: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    last_value: np.ndarray,
    gamma: float,
    bootstrap: np.ndarray | None = None,
) -> np.ndarray:
    """One-step targets y_t = r_t + γ V(s_{t+1}) over a segment, where `values[t]` = V(obs[t])."""
    next_v, _ = next_state_values(values, terminated, truncated, bootstrap, last_value)
    return (rew + gamma * next_v).astype(np.float32)


def sequence_nstep(
    rew: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, n: int, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n-step returns for every step of `[B, T]` sequences, each kept inside its sequence and its episode.

    For step t the sum runs over steps t, t+1, … until n steps, the first done step (included) or the
    sequence end. Returns `(ret, last, bootstrap)`: the discounted reward sums, the index of the last step
    summed (the target bootstraps from the value of *that step's* next observation: the final one where it
    was truncated), and the bootstrap factor γ^k, 0 where that last step terminated.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    term = terminated.astype(bool)
    done = term | truncated.astype(bool)
    batch, steps = rew.shape
    t = np.arange(steps)
    ret = np.zeros((batch, steps), dtype=np.float64)
    last = np.broadcast_to(t, (batch, steps)).copy()
    discount = np.ones((batch, steps), dtype=np.float64)
    alive = np.ones((batch, steps), dtype=bool)
    for k in range(n):
        idx = np.minimum(t + k, steps - 1)
        alive &= t + k < steps
        ret += np.where(alive, gamma**k * rew[:, idx], 0.0)
        last = np.where(alive, idx, last)
        discount = np.where(alive, gamma ** (k + 1), discount)
        alive &= ~done[:, idx]
    ended = np.take_along_axis(term, last, axis=1)
    return ret.astype(np.float32), last, np.where(ended, 0.0, discount).astype(np.float32)


class NStepBuilder:
    """n-step transitions of `n_envs` env streams, built as they are stepped (an actor's local buffer).

    `add` takes one vector-env step (the `add` a `Collector` calls). A transition leaves once its n steps are
    known, or when its episode ends first (terminated or truncated: the sum stops at that step, as
    `ReplayBuffer` stops it): `rew` = Σ_k γ^k r_k over the m ≤ n steps used, `next_obs`/`terminated` of the last
    one, `discount` = γ^m, so that the target is `rew + discount · (1 − terminated) · V(next_obs)`.
    """

    FIELDS = ("obs", "act", "rew", "next_obs", "terminated", "discount")

    def __init__(self, n_envs: int, n_step: int, gamma: float):
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self.n_envs, self.n_step, self.gamma = n_envs, n_step, gamma
        self.windows: list[deque] = [deque() for _ in range(n_envs)]
        self.ready: list[tuple] = []

    def __len__(self) -> int:
        """Transitions ready to leave."""
        return len(self.ready)

    def add(
        self,
        obs: Any,
        act: np.ndarray,
        rew: np.ndarray,
        next_obs: Any,
        terminated: np.ndarray,
        truncated: np.ndarray,
        state: Any = None,
    ) -> None:
        for e in range(self.n_envs):
            window = self.windows[e]
            # copies: the arrays stepped are kept for up to n steps (a dict observation: each entry's)
            this, after = (map_obs(np.array, map_obs(itemgetter(e), o)) for o in (obs, next_obs))
            window.append((this, act[e], float(rew[e]), after, bool(terminated[e])))
            if terminated[e] or truncated[e]:
                while window:
                    self._emit(window)
            elif len(window) == self.n_step:
                self._emit(window)

    def _emit(self, window: deque) -> None:
        """The transition at the front of `window`, summed over the whole window; it leaves the window."""
        rew = sum(step[2] * self.gamma**k for k, step in enumerate(window))
        first, last = window[0], window[-1]
        self.ready.append((first[0], first[1], rew, last[3], float(last[4]), self.gamma ** len(window)))
        window.popleft()

    def take(self, n: int) -> dict[str, np.ndarray]:
        """The oldest `n` ready transitions as arrays (`FIELDS`); the rest stay."""
        out, self.ready = self.ready[:n], self.ready[n:]
        columns = list(zip(*out, strict=True))
        block = {key: stack_obs(col) for key, col in zip(self.FIELDS, columns, strict=True)}
        block["rew"] = block["rew"].astype(np.float32)
        block["terminated"] = block["terminated"].astype(np.float32)
        block["discount"] = block["discount"].astype(np.float32)
        return block
