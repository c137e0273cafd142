"""Replay buffers over parallel env streams: uniform and prioritized transitions (n-step returns, frame stacks)
and uniform fixed-length sequences with stored recurrent states."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Protocol

import numpy as np
import torch

from rlfleet.data.batch import Batch, map_obs, map_obs_pair
from rlfleet.data.priority import PriorityIndex
from rlfleet.data.segment_tree import MinTree, SumTree
from rlfleet.device import host

Obs = np.ndarray | dict[str, np.ndarray]
_FIELDS = ("obs", "act", "rew", "next_obs", "terminated", "truncated")


class SampleNormalizer(Protocol):
    """What a run with running normalisation statistics sets as `ReplayBuffer.normalizer`
    (`rlfleet.envs.normalize.ReplayNormalizer`)."""

    obs_stats: Any
    """The observations' running statistics; None where only rewards are normalised."""

    def observations(self, obs: Any) -> Any: ...

    def rewards(self, rew: np.ndarray) -> np.ndarray: ...


def _leaves(name: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return [(f"{name}[{key!r}]", value[key]) for key in sorted(value)]
    return [(name, value)]


class ReplayBuffer:
    """Uniform replay over ``n_envs`` parallel env streams, stored as ``[capacity // n_envs, n_envs, ...]``.

    Every ``add`` writes one row: one transition per env. Env ``e`` owns column ``e``, so n-step sums and
    frame stacks look only along one env's own stream. A transition's flat index is ``row * n_envs + env``.

    ``sample`` returns a Batch with ``obs, act, rew, next_obs, terminated, discount, weight, index`` where the
    one-step-or-n-step target is ``rew + discount * (1 - terminated) * V(next_obs)``. ``rew``, ``terminated``
    (0.0 / 1.0), ``discount`` and ``weight`` are float32, ``index`` int64; ``obs`` and ``act`` keep the dtype
    of the first data added (e.g. uint8 frames stay uint8), but float64 observations are stored as float32
    (`_stored_dtype`).
    """

    def __init__(
        self,
        capacity: int,
        n_envs: int = 1,
        n_step: int = 1,
        gamma: float = 0.99,
        frame_stack: int = 1,
        seed: int | None = None,
    ) -> None:
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        if capacity < n_envs:
            raise ValueError(f"capacity ({capacity}) must be >= n_envs ({n_envs}): each env needs a row")
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
        if frame_stack < 1:
            raise ValueError(f"frame_stack must be >= 1, got {frame_stack}")
        self.n_envs = int(n_envs)
        self.rows = int(capacity) // self.n_envs
        self.capacity = self.rows * self.n_envs  # rounded down to a multiple of n_envs
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.frame_stack = int(frame_stack)
        self._rng = np.random.default_rng(seed)
        self._ptr = 0  # next row to write
        self._size = 0  # number of written rows; written rows are always rows [0, _size)
        self._storage: dict[str, Any] | None = None
        self.normalizer: SampleNormalizer | None = None
        """Set by a run with `obs_norm` or `reward_norm`: the stored observations and rewards are raw, and each
        sample's are normalised with the statistics as they are when it is drawn (rewards before n-step sums)."""

    def __len__(self) -> int:
        return self._size * self.n_envs

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(len={len(self)}, capacity={self.capacity}, n_envs={self.n_envs}, "
            f"n_step={self.n_step}, gamma={self.gamma}, frame_stack={self.frame_stack})"
        )

    # ---- writing ------------------------------------------------------------------------------
    def add(
        self,
        obs: Obs,
        act: np.ndarray,
        rew: np.ndarray,
        next_obs: Obs,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> np.ndarray:
        """Store one vector-env step (every argument has leading dim ``n_envs``); returns the indices written.

        ``next_obs`` is the true next observation (the final observation when the episode ended there).
        """
        data: dict[str, Any] = {
            "obs": map_obs(np.asarray, obs),
            "act": np.asarray(act),
            "rew": np.asarray(rew, dtype=np.float32),
            "next_obs": map_obs(np.asarray, next_obs),
            "terminated": np.asarray(terminated, dtype=bool),
            "truncated": np.asarray(truncated, dtype=bool),
        }
        if isinstance(data["obs"], dict) != isinstance(data["next_obs"], dict) or (
            isinstance(data["obs"], dict) and data["obs"].keys() != data["next_obs"].keys()
        ):
            raise ValueError("obs and next_obs must both be arrays or both dicts with the same keys")
        for field in _FIELDS:
            for name, value in _leaves(field, data[field]):
                if value.ndim == 0 or value.shape[0] != self.n_envs:
                    raise ValueError(
                        f"{name} has shape {value.shape}; its leading dim must be n_envs={self.n_envs} "
                        "(one transition per env)"
                    )
        for field in ("rew", "terminated", "truncated"):
            if data[field].ndim != 1:
                raise ValueError(f"{field} must have shape ({self.n_envs},), got {data[field].shape}")
        if self._storage is None:
            self._storage = {field: map_obs(partial(self._empty_column, field), data[field]) for field in _FIELDS}
        self._check_matches_storage(data)
        for field in _FIELDS:
            for (_, dst), (_, src) in zip(
                _leaves(field, self._storage[field]), _leaves(field, data[field]), strict=True
            ):
                dst[self._ptr] = src
        indices = self._ptr * self.n_envs + np.arange(self.n_envs, dtype=np.int64)
        self._ptr = (self._ptr + 1) % self.rows
        self._size = min(self._size + 1, self.rows)
        return indices

    def mark_boundary(self, columns: Any) -> None:
        """End the stored stream of the env ``columns`` at its newest step, which becomes truncated (unless it
        terminated): their envs went on elsewhere and what is added next starts new episodes (a restarted
        sampler, a resume whose envs could not be restored). n-step sums, frame stacks and sequences stop
        there; the newest step bootstraps from its own ``next_obs``, as at a time limit."""
        cols = np.unique(np.asarray(columns, dtype=np.int64).reshape(-1))
        if cols.size and (cols.min() < 0 or cols.max() >= self.n_envs):
            raise ValueError(f"columns must lie in [0, n_envs={self.n_envs}), got {cols.tolist()}")
        if self._storage is None or self._size == 0:
            return
        newest = (self._ptr - 1) % self.rows
        self._storage["truncated"][newest, cols] |= ~self._storage["terminated"][newest, cols]

    def _empty_column(self, field: str, value: np.ndarray) -> np.ndarray:
        """Zeroed storage for `field`'s rows, each shaped like one step's `value`, of `_stored_dtype`."""
        return np.zeros((self.rows, *value.shape), self._stored_dtype(field, value))

    def _stored_dtype(self, field: str, value: np.ndarray) -> np.dtype:
        """The dtype `field`'s `value` is stored as: its own, but float32 for float64 observations (MuJoCo's), which
        the networks take as float32, at half the memory (a million Humanoid transitions: 2.8 GB, not 5.6). With
        `obs_norm` they stay float64: they are normalised when sampled, and an observation far from zero (a
        timestamp) keeps the small changes the normalised one shows."""
        keep = field not in ("obs", "next_obs") or (
            self.normalizer is not None and self.normalizer.obs_stats is not None
        )
        return value.dtype if keep or value.dtype != np.float64 else np.dtype(np.float32)

    def _check_matches_storage(self, data: dict[str, Any]) -> None:
        """Check everything before writing, so a bad call never leaves a half-written row."""
        assert self._storage is not None
        for field in _FIELDS:
            stored, new = self._storage[field], data[field]
            if isinstance(stored, dict) != isinstance(new, dict) or (
                isinstance(stored, dict) and stored.keys() != new.keys()
            ):
                raise ValueError(f"{field} does not match the structure (array or dict keys) of earlier data")
            for (name, dst), (_, src) in zip(_leaves(field, stored), _leaves(field, new), strict=True):
                if dst.shape[1:] != src.shape:
                    raise ValueError(f"{name} has shape {src.shape}; earlier data had {dst.shape[1:]}")

    # ---- reading ------------------------------------------------------------------------------
    def ready(self, batch_size: int, learning_starts: int = 0) -> bool:
        """Whether learning can start: at least ``learning_starts`` and ``batch_size`` transitions are stored, or
        the replay is full (its capacity, `buffer_size` rounded down to whole rows of ``n_envs``, may fall below
        both), and, for sequences, a whole sequence in every env column, so ``sample(batch_size)`` can draw."""
        return len(self) >= min(max(batch_size, learning_starts, 1), self.capacity)

    def _all_indices(self) -> np.ndarray:
        """Flat indices of every stored transition, oldest row first, envs in order within a row."""
        rows = (self._ptr - self._size + np.arange(self._size)) % self.rows
        return (rows[:, None] * self.n_envs + np.arange(self.n_envs)).reshape(-1)

    def _draw_indices(self, batch_size: int) -> np.ndarray:
        return self._rng.integers(0, len(self), size=batch_size, dtype=np.int64)

    def sample(self, batch_size: int) -> Batch:
        """``batch_size`` transitions drawn uniformly (with replacement); ``sample(0)``: all, oldest first."""
        indices = self._indices_for(batch_size)
        batch = self._gather(indices)
        batch["weight"] = np.ones(len(indices), dtype=np.float32)
        batch["index"] = indices
        return batch

    def _indices_for(self, batch_size: int) -> np.ndarray:
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0 (0 = everything), got {batch_size}")
        if len(self) == 0:
            raise ValueError("cannot sample from an empty buffer; add transitions first")
        return self._all_indices() if batch_size == 0 else self._draw_indices(batch_size)

    def _observations(self, obs: Any) -> Any:
        return obs if self.normalizer is None else self.normalizer.observations(obs)

    def _rewards(self, rew: np.ndarray) -> np.ndarray:
        return rew if self.normalizer is None else self.normalizer.rewards(rew)

    def _done(self, rows: np.ndarray, env: np.ndarray) -> np.ndarray:
        assert self._storage is not None
        return self._storage["terminated"][rows, env] | self._storage["truncated"][rows, env]

    def _stack_rows(self, rows: np.ndarray, env: np.ndarray, age: np.ndarray) -> np.ndarray:
        """Rows ``[B, frame_stack]`` (oldest first) of the frames to stack for the obs at ``rows``.

        Looks back along the same env stream; at an episode start (a done transition just before) or at the
        oldest stored row, the earliest usable frame is repeated.
        """
        back = np.arange(1, self.frame_stack)
        back_rows = (rows[:, None] - back) % self.rows  # [B, k - 1]
        usable = (back <= age[:, None]) & ~self._done(back_rows, env[:, None])
        n_usable = np.cumprod(usable, axis=1).sum(axis=1)  # how far back the same episode reaches
        offsets = np.minimum(np.arange(self.frame_stack - 1, -1, -1), n_usable[:, None])
        return (rows[:, None] - offsets) % self.rows

    def _gather(self, indices: np.ndarray) -> Batch:
        """The n-step, frame-stacked transitions starting at the flat ``indices``."""
        storage = self._storage
        assert storage is not None
        rows, env = np.divmod(indices, self.n_envs)
        age = (rows - (self._ptr - self._size)) % self.rows  # 0 = oldest stored row

        # n-step: sum rewards until the first done transition or the newest written row
        steps = np.arange(self.n_step)
        step_rows = (rows[:, None] + steps) % self.rows  # [B, n]
        written = steps < (self._size - age)[:, None]
        done = self._done(step_rows, env[:, None])  # read past the newest row only where masked out below
        used = written & ((np.cumsum(done, axis=1) - done) == 0)
        n_used = used.sum(axis=1)
        rewards = np.where(used, self._rewards(storage["rew"][step_rows, env[:, None]]), 0.0)
        rew = (rewards * self.gamma ** steps.astype(np.float64)).sum(axis=1)
        last = step_rows[np.arange(len(indices)), n_used - 1]

        if self.frame_stack == 1:
            obs = map_obs(lambda a: a[rows, env], storage["obs"])
            next_obs = map_obs(lambda a: a[last, env], storage["next_obs"])
        else:
            obs_rows = self._stack_rows(rows, env, age)
            next_rows = self._stack_rows(last, env, age + n_used - 1)[:, 1:]
            obs = map_obs(lambda a: a[obs_rows, env[:, None]], storage["obs"])
            # the next stack is the obs stack of the last used transition shifted by one, plus its next frame
            next_obs = map_obs_pair(
                lambda a, n: np.concatenate([a[next_rows, env[:, None]], n[last, env][:, None]], axis=1),
                storage["obs"],
                storage["next_obs"],
            )
        return Batch(
            obs=self._observations(obs),
            act=storage["act"][rows, env],
            rew=rew.astype(np.float32),
            next_obs=self._observations(next_obs),
            terminated=storage["terminated"][last, env].astype(np.float32),
            discount=(self.gamma**n_used).astype(np.float32),
        )

    # ---- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain dict (ints, dicts, torch tensors) loadable with ``torch.load(..., weights_only=True)``.

        The tensors share memory with the buffer (like ``nn.Module.state_dict``); only written rows are kept.
        Includes the sampling RNG state, so a loaded buffer continues the same sample sequence.
        """
        storage = None
        if self._storage is not None:
            storage = {
                field: map_obs(lambda a: torch.from_numpy(a[: self._size]), self._storage[field]) for field in _FIELDS
            }
        return {
            "capacity": self.capacity,
            "n_envs": self.n_envs,
            "ptr": self._ptr,
            "size": self._size,
            "storage": storage,
            "rng_state": self._rng.bit_generator.state,
        }

    def schedule_state(self) -> dict[str, Any]:
        """The part of ``state_dict`` that schedules sampling over the run rather than holding data (empty here;
        a prioritized buffer's β annealing): a run that does not save its data still resumes it."""
        return {}

    def load_schedule_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``schedule_state`` returned."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore contents, write position and RNG state; ``capacity`` and ``n_envs`` must match."""
        if state["capacity"] != self.capacity or state["n_envs"] != self.n_envs:
            raise ValueError(
                f"state is for capacity={state['capacity']}, n_envs={state['n_envs']}; this buffer has "
                f"capacity={self.capacity}, n_envs={self.n_envs}: build the buffer with the same sizes"
            )
        size = int(state["size"])

        def restore(t: torch.Tensor) -> np.ndarray:
            written = t.numpy()
            full = np.zeros((self.rows, *written.shape[1:]), dtype=written.dtype)
            full[:size] = written
            return full

        stored = state["storage"]
        self._storage = None if stored is None else {f: map_obs(restore, stored[f]) for f in _FIELDS}
        self._ptr = int(state["ptr"])
        self._size = size
        self._rng.bit_generator.state = state["rng_state"]


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) with stratified sampling and importance weights.

    A transition with priority ``p`` is drawn with probability ``p**alpha / sum(p**alpha)``. Priorities are
    ``|td| + eps``; new transitions get the largest priority seen so far (1.0 at first) unless ``add`` is
    given explicit ones. ``weight = (N * P(i)) ** -beta / max_j (N * P(j)) ** -beta`` (float32, max 1).
    With ``beta_anneal_steps > 0`` beta moves linearly from ``beta`` to ``beta_final`` over that many
    ``sample`` calls.
    """

    def __init__(
        self,
        capacity: int,
        n_envs: int = 1,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_final: float = 1.0,
        beta_anneal_steps: int = 0,
        eps: float = 1e-6,
        n_step: int = 1,
        gamma: float = 0.99,
        frame_stack: int = 1,
        seed: int | None = None,
    ) -> None:
        super().__init__(capacity, n_envs, n_step=n_step, gamma=gamma, frame_stack=frame_stack, seed=seed)
        self._priority = PriorityIndex(self.capacity, alpha, eps)  # checks alpha and eps
        if beta < 0 or beta_final < 0:
            raise ValueError(f"beta and beta_final must be >= 0, got {beta} and {beta_final}")
        if beta_anneal_steps < 0:
            raise ValueError(f"beta_anneal_steps must be >= 0 (0 = constant beta), got {beta_anneal_steps}")
        self.alpha = self._priority.alpha
        self.eps = self._priority.eps
        self._beta_start = float(beta)
        self._beta_final = float(beta_final)
        self._beta_anneal_steps = int(beta_anneal_steps)
        self._sample_calls = 0

    @property
    def _sum_tree(self) -> SumTree:
        return self._priority.sum_tree

    @property
    def _min_tree(self) -> MinTree:
        return self._priority.min_tree

    @property
    def _max_priority(self) -> float:
        return self._priority.max_priority

    @property
    def beta(self) -> float:
        """The beta the next ``sample`` call will use."""
        if self._beta_anneal_steps == 0:
            return self._beta_start
        frac = min(self._sample_calls / self._beta_anneal_steps, 1.0)
        return self._beta_start + frac * (self._beta_final - self._beta_start)

    def set_beta(self, beta: float) -> None:
        """Fix beta from now on (stops the built-in annealing, for callers that run their own schedule)."""
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        self._beta_start = float(beta)
        self._beta_anneal_steps = 0

    def _checked_priorities(self, priorities: np.ndarray, n: int) -> np.ndarray:
        return self._priority.checked(priorities, n)

    def add(
        self,
        obs: Obs,
        act: np.ndarray,
        rew: np.ndarray,
        next_obs: Obs,
        terminated: np.ndarray,
        truncated: np.ndarray,
        priority: np.ndarray | None = None,
    ) -> np.ndarray:
        """As ``ReplayBuffer.add``; ``priority`` (``[n_envs]``, e.g. actor-side |td|) replaces the max."""
        indices = super().add(obs, act, rew, next_obs, terminated, truncated)
        if priority is None:
            self._priority.set_max(indices)
        else:
            self._priority.set(indices, priority)
        return indices

    def _draw_indices(self, batch_size: int) -> np.ndarray:
        """One draw per equal slice of the total priority mass (stratified)."""
        return self._priority.draw(batch_size, self._rng)

    def sample(self, batch_size: int) -> Batch:
        """``batch_size`` transitions drawn in proportion to ``priority**alpha``, with importance weights."""
        beta = self.beta
        self._sample_calls += 1
        indices = self._indices_for(batch_size)
        batch = self._gather(indices)
        batch["weight"] = self._priority.weights(indices, beta)
        batch["index"] = indices
        return batch

    def update_priorities(self, index: np.ndarray, priorities: np.ndarray) -> None:
        """Set priorities ``|priorities| + eps`` of the transitions at flat ``index`` (``batch.index``)."""
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        p = self._checked_priorities(priorities, idx.size)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise ValueError(f"indices must be stored transitions in [0, {len(self)}); pass batch.index")
        if idx.size:
            self._priority.max_priority = max(self._priority.max_priority, float(p.max()))
            self._priority.set_checked(idx, p)

    def schedule_state(self) -> dict[str, Any]:
        """β's annealing: its start, end, length and how far it has gone (``sample`` calls)."""
        return {
            "beta_start": self._beta_start,
            "beta_final": self._beta_final,
            "beta_anneal_steps": self._beta_anneal_steps,
            "sample_calls": self._sample_calls,
        }

    def load_schedule_state(self, state: Mapping[str, Any]) -> None:
        """How far β's annealing has gone (``sample`` calls); its start, end and length stay as this buffer was
        built, from the resumed run's config and budget: a run resumed with more steps anneals β over them."""
        self._sample_calls = int(state["sample_calls"])

    def anneal_beta_over(self, sample_calls: int) -> None:
        """Anneal β from its start to its end over ``sample_calls`` calls of ``sample`` (0: β stays at its start)."""
        if sample_calls < 0:
            raise ValueError(f"sample_calls must be >= 0, got {sample_calls}")
        self._beta_anneal_steps = int(sample_calls)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(
            sum_tree=torch.from_numpy(self._sum_tree.state()),
            min_tree=torch.from_numpy(self._min_tree.state()),
            max_priority=self._max_priority,
            **self.schedule_state(),
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._sum_tree.load_state(state["sum_tree"].numpy())
        self._min_tree.load_state(state["min_tree"].numpy())
        self._priority.max_priority = float(state["max_priority"])
        self.load_schedule_state(state)


class SequenceReplayBuffer(ReplayBuffer):
    """Uniform replay of ``seq_len`` consecutive steps of one env's stream, for recurrent Q-learning (R2D2).

    The storage is the ring buffer's (``[capacity // n_envs, n_envs, ...]``, preallocated), plus, with
    ``state_size`` > 0, the policy's recurrent state ``(h, c)`` before it acted on each observation (the
    "stored state"; ``add(..., state=None)`` stores zeros). A sequence may start at any stored row whose
    ``seq_len`` rows are all stored and in order (it never runs past the newest row, and the ring's
    wrap-around is followed), in any env column: every such start is equally likely.

    Sequences are cut from the stream without regard to episodes: they may cross episode ends. ``starts``
    marks the steps that begin an episode (a done step just before), where a recurrent network zeroes its
    state, as for on-policy segments; n-step sums must stop at done steps
    (`rlfleet.data.returns.sequence_nstep`), so no step has to be masked out and every step trains. The
    first step of a sequence counts as a start when the step before it is done or is none (the run's first
    step), or is no longer stored where the buffer keeps no states (with states, it goes on from the stored one:
    fresh where an episode began). A
    boundary (`mark_boundary`: a column's env was replaced) is a truncation, so it starts the next step too.

    ``sample(B)`` returns a Batch with ``[B, seq_len, ...]`` leaves ``obs, act, rew, next_obs, terminated,
    truncated, starts`` (``rew``, ``terminated``, ``truncated``, ``starts`` float32), ``h0``/``c0``
    ``[B, state_size]`` (only when ``state_size`` > 0), ``weight`` ``[B]`` (ones) and ``index`` ``[B]`` (flat
    index of each sequence's first step).
    """

    def __init__(
        self, capacity: int, n_envs: int = 1, seq_len: int = 1, state_size: int = 0, seed: int | None = None
    ) -> None:
        super().__init__(capacity, n_envs, seed=seed)
        if not 1 <= seq_len <= self.rows:
            raise ValueError(
                f"seq_len must lie in [1, capacity // n_envs = {self.rows}], got {seq_len}; "
                "raise the capacity or shorten the sequences"
            )
        if state_size < 0:
            raise ValueError(f"state_size must be >= 0 (0: no stored states), got {state_size}")
        self.seq_len = int(seq_len)
        self.state_size = int(state_size)
        self._states = np.zeros((2, self.rows, self.n_envs, self.state_size), dtype=np.float32) if state_size else None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(len={len(self)}, capacity={self.capacity}, n_envs={self.n_envs}, "
            f"seq_len={self.seq_len}, state_size={self.state_size})"
        )

    def add(
        self,
        obs: Obs,
        act: np.ndarray,
        rew: np.ndarray,
        next_obs: Obs,
        terminated: np.ndarray,
        truncated: np.ndarray,
        state: Any = None,
    ) -> np.ndarray:
        """As ``ReplayBuffer.add``; ``state`` is the recurrent state ``(h, c)`` (each ``[n_envs, state_size]``,
        NumPy or torch) the policy acted on ``obs`` from; None stores zeros."""
        row = self._ptr
        if self._states is not None and state is not None:
            h, c = (np.asarray(host(x) if isinstance(x, torch.Tensor) else x, dtype=np.float32) for x in state)
            if h.shape != (self.n_envs, self.state_size) or c.shape != h.shape:
                raise ValueError(
                    f"state must be (h, c) of shape ({self.n_envs}, {self.state_size}) each, got {h.shape} "
                    f"and {c.shape}"
                )
        indices = super().add(obs, act, rew, next_obs, terminated, truncated)
        if self._states is not None:
            if state is None:
                self._states[:, row] = 0.0
            else:
                self._states[0, row], self._states[1, row] = h, c
        return indices

    def _valid_starts(self) -> int:
        """Rows at which a whole sequence begins (the oldest ``_size - seq_len + 1`` stored rows)."""
        return max(0, self._size - self.seq_len + 1)

    def ready(self, batch_size: int, learning_starts: int = 0) -> bool:
        """As ``ReplayBuffer.ready``, and every env column holds ``seq_len`` steps (``learning_starts`` counts
        transitions over all columns: many envs reach it before one column holds a sequence)."""
        return self._valid_starts() > 0 and super().ready(batch_size, learning_starts)

    def _all_indices(self) -> np.ndarray:
        rows = (self._ptr - self._size + np.arange(self._valid_starts())) % self.rows
        return (rows[:, None] * self.n_envs + np.arange(self.n_envs)).reshape(-1)

    def _draw_indices(self, batch_size: int) -> np.ndarray:
        age, env = np.divmod(self._rng.integers(0, self._valid_starts() * self.n_envs, size=batch_size), self.n_envs)
        return ((self._ptr - self._size + age) % self.rows) * self.n_envs + env

    def sample(self, batch_size: int) -> Batch:
        """``batch_size`` sequences with uniformly drawn starts (with replacement); ``sample(0)``: one per start."""
        if self._valid_starts() == 0 and self._size > 0:
            raise ValueError(
                f"the buffer holds {self._size} steps per env, fewer than seq_len={self.seq_len}; add more first"
            )
        indices = self._indices_for(batch_size)
        batch = self._gather_sequences(indices)
        batch["weight"] = np.ones(len(indices), dtype=np.float32)
        batch["index"] = indices
        return batch

    def _gather_sequences(self, indices: np.ndarray) -> Batch:
        storage = self._storage
        assert storage is not None
        first, env = np.divmod(indices, self.n_envs)
        rows = (first[:, None] + np.arange(self.seq_len)) % self.rows  # [B, L]
        col = env[:, None]
        terminated = storage["terminated"][rows, col]
        truncated = storage["truncated"][rows, col]
        starts = np.empty(rows.shape, dtype=np.float32)
        starts[:, 1:] = terminated[:, :-1] | truncated[:, :-1]
        age = (first - (self._ptr - self._size)) % self.rows
        # the oldest stored step: the run's first (a start), or one whose predecessor is overwritten, which may or
        # may not have ended an episode; its stored state is the one the policy acted from (fresh where an episode
        # began), so it goes on from that where the buffer keeps states
        oldest_starts = self._states is None or self._size < self.rows
        starts[:, 0] = np.where(age > 0, self._done((first - 1) % self.rows, env), oldest_starts)
        batch = Batch(
            obs=self._observations(map_obs(lambda a: a[rows, col], storage["obs"])),
            act=storage["act"][rows, col],
            rew=self._rewards(storage["rew"][rows, col]),
            next_obs=self._observations(map_obs(lambda a: a[rows, col], storage["next_obs"])),
            terminated=terminated.astype(np.float32),
            truncated=truncated.astype(np.float32),
            starts=starts,
        )
        if self._states is not None:
            batch["h0"] = self._states[0, first, env]
            batch["c0"] = self._states[1, first, env]
        return batch

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["seq_len"] = self.seq_len
        if self._states is not None:
            state["states"] = torch.from_numpy(self._states[:, : self._size])
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        stored = state.get("states")
        if (stored is None) != (self._states is None) or (stored is not None and stored.shape[-1] != self.state_size):
            raise ValueError(
                f"state is for another state_size; this buffer has state_size={self.state_size}: build the "
                "buffer with the same recurrent size"
            )
        if int(state["seq_len"]) != self.seq_len:
            raise ValueError(f"state is for seq_len={state['seq_len']}; this buffer has seq_len={self.seq_len}")
        super().load_state_dict(state)
        if self._states is not None:
            assert stored is not None  # checked above: a buffer with states loads only a state that has them
            self._states[:] = 0.0
            self._states[:, : self._size] = stored.numpy()
