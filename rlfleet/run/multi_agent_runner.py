"""What a run on a PettingZoo env adds to `RunBase` (`MultiAgentRunBase`): the policies of its mapping as the run's
`algo`, weights loaded from checkpoints, each trained policy's data and updates, greedy evaluation of every agent,
and each agent's and each policy's returns in metrics.csv, TensorBoard and `result.json`. The architectures that take
a multi-agent env (`single`, `data_parallel`) build their loops on it; the others refuse such an env in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.algos.options import beta_anneal_steps
from rlfleet.envs.pettingzoo import AgentEnv, AgentSpaces, make_agent_env
from rlfleet.run.checkpoint import CheckpointError, load_algo_state, load_checkpoint
from rlfleet.run.config import ConfigError, RunConfig
from rlfleet.run.config import log as notes
from rlfleet.run.logger import RunLogger
from rlfleet.run.multi_agent import RANDOM, Policies, PolicyData, PolicyMapping, evaluate_agents, policy_mapping
from rlfleet.run.runner import ResolvedConfig, RunBase, build_algorithm


class AgentEnvs(list[AgentEnv]):
    """Copies of a PettingZoo env, closed together."""

    def close(self) -> None:
        for env in self:
            env.close()


def make_agent_envs(cfg: RunConfig, copies: int, render_mode: str | None = None) -> AgentEnvs:
    return AgentEnvs(make_agent_env(cfg.env, render_mode, **cfg.env_kwargs) for _ in range(copies))


def run_mapping(cfg: RunConfig, spaces: AgentSpaces) -> PolicyMapping:
    return policy_mapping(spaces.agents, cfg.policies, cfg.policy_map, cfg.freeze, cfg.load_policy)


def absolute_source(source: str) -> str:
    """`CHECKPOINT[#POLICY]` with the checkpoint (a file or a run folder) as an absolute path."""
    path, sep, saved = source.partition("#")
    return str(Path(path).resolve()) + sep + saved


def load_policy_weights(
    algo: Any, source: str, policy: str, algo_name: str, env: tuple[str, dict[str, Any]] | None = None
) -> None:
    """Put the weights of `source` (`CHECKPOINT[#SAVED_POLICY]`) into policy `policy`'s algorithm: a multi-agent
    checkpoint's policy of that name (or `SAVED_POLICY`, or its only one with weights: `random` has none), a
    single-agent checkpoint's agent. A checkpoint of another algorithm, a policy it does not have (`random` among
    them), or networks that do not fit: one line. One trained on another env than this run's `env` (its id and
    keyword arguments), whose networks fit, loads with a line that says so."""
    path, _, saved = source.partition("#")
    payload = load_checkpoint(path)
    trained_with = payload["run_config"].get("algo")
    trained_on = (payload["run_config"].get("env"), payload["run_config"].get("env_kwargs") or {})
    if trained_with != algo_name:
        raise CheckpointError(
            f"--load-policy {policy}={source}: that checkpoint is of {trained_with}, this run's policies are "
            f"{algo_name}"
        )
    state = payload["algo"]
    if isinstance(state.get("policies"), dict):
        policies = {n: s for n, s in state["policies"].items() if n != RANDOM}  # the random policy has no weights
        if saved == RANDOM:
            raise CheckpointError(
                f"--load-policy {policy}={source}: {RANDOM} is the uniform random policy, it has no weights to load "
                f"(map the agents to {RANDOM} instead)"
            )
        key = saved or (policy if policy in policies else None)
        if key is None and len(policies) == 1:
            key = next(iter(policies))
        if key not in policies:
            raise CheckpointError(
                f"--load-policy {policy}={source}: that checkpoint has no policy {key or policy!r} (its policies: "
                f"{', '.join(policies)}; name one with {path}#POLICY)"
            )
        state = policies[key]
    elif saved:
        raise CheckpointError(
            f"--load-policy {policy}={source}: that checkpoint is a single-agent run's, it has no policy {saved!r}"
        )
    load_algo_state(algo, {"algo": state}, path, f"{algo_name} (policy {policy})")
    if env is not None and trained_on != env:
        shown = [f"{e}{f' {kwargs}' if kwargs else ''}" for e, kwargs in (trained_on, env)]
        notes.info(f"--load-policy {policy}={source}: trained on {shown[0]}, loaded into this run on {shown[1]} "
                   "(its networks fit)")  # fmt: skip


def zero_sum_agents(returns: dict[str, np.ndarray], policies: Policies) -> list[str] | None:
    """The trained agents, where there are several and their returns add up to 0 in every evaluation episode
    (`returns`: each agent's, episode by episode) though not all are 0: self-play in a zero-sum game (the default
    `--policies shared` on tic-tac-toe), whose run's return, their mean, is 0 whatever they learn. None otherwise."""
    trained = [a for a in policies.of_agent if policies.of_agent[a] in policies.trained]
    if len(trained) < 2:
        return None
    each = np.stack([returns[a] for a in trained])
    return trained if np.allclose(each.sum(axis=0), 0.0) and np.any(each != 0) else None


def zero_sum_note(agents: list[str]) -> str:
    """The line for a run whose trained agents' returns cancel out (`zero_sum_agents`)."""
    return (
        f"note: the trained agents' returns ({', '.join(agents)}) add up to 0 in every evaluation episode (self-play "
        "in a zero-sum game), so the run's return, their mean, is 0 whatever they learn: --stop-return, best.pt and "
        "sweeps have nothing to go on; to score a side, play it against a fixed opponent (--policy-map with random, "
        "or --load-policy and --freeze)"
    )


class MultiAgentRunBase(RunBase):
    """A run on a PettingZoo env: `self.algo` is the run's `Policies`, and a subclass (the architecture) steps a
    `MultiAgentCollector` (or several) and learns with `learn(data)`."""

    runs_normalisation = False  # running statistics per agent are not kept: obs_norm and reward_norm are refused
    algo: Policies
    eval_envs: AgentEnvs  # type: ignore[assignment]

    @classmethod
    def resolve_config(cls, cfg: RunConfig, resuming: bool = False) -> ResolvedConfig:
        resolved = super().resolve_config(cfg, resuming)
        run_mapping(cfg, resolved.env_info["agents"])  # a mapping problem is one line before anything is built
        return resolved

    def build_algo(self, seed: int) -> Policies:
        """The run's policies, each the run's algorithm built for its agents' spaces; loaded weights put in. A new
        run keeps its `--load-policy` checkpoints as absolute paths (config.json: found from any folder); a resumed
        one reads none of them, its own checkpoint holds every policy's weights (a source moved or deleted since
        does not matter)."""
        spaces: AgentSpaces = self.env_info["agents"]
        mapping = run_mapping(self.cfg, spaces)

        def build(name: str, obs_space: Any, action_space: Any, policy_seed: int, lanes: int) -> Any:
            info = {**self.env_info, "observation_space": obs_space, "action_space": action_space}
            cfg = dataclasses.replace(self.algo_cfg, n_envs=lanes)
            return build_algorithm(self.cfg, cfg, info, policy_seed, self.device)

        policies = Policies(spaces, mapping, build, seed, copies=self.algo_cfg.n_envs)
        if mapping.loads and not self.resuming:
            env = (self.cfg.env, self.cfg.env_kwargs)
            for name, source in mapping.loads.items():
                load_policy_weights(policies.algos[name], source, name, self.cfg.algo, env)
            self.cfg.load_policy = ",".join(f"{n}={absolute_source(source)}" for n, source in mapping.loads.items())
        return policies

    def check_config(self) -> None:
        cfg = self.algo_cfg
        if self.algo.data not in ("rollout", "replay"):
            raise ConfigError(
                f"{self.cfg.algo} learns from demonstrations; a PettingZoo env trains rollout or replay algorithms"
            )
        if getattr(cfg, "lstm", 0):
            raise ConfigError(
                f"{self.cfg.algo} with lstm > 0: multi-agent runs take feed-forward policies (set lstm=0)"
            )
        for key in ("obs_norm", "reward_norm"):
            if getattr(cfg, key, False):
                raise ConfigError(
                    f"--set {key}=true: multi-agent runs keep no running statistics per agent (leave {key} off)"
                )

    def make_eval_envs(self) -> AgentEnvs:  # type: ignore[override]
        return make_agent_envs(self.cfg, self.cfg.eval_episodes)

    def policy_data(self, copies: int) -> dict[str, PolicyData]:
        """Where each trained policy's experience from `copies` env copies goes: a replay buffer or rollout storage with
        a lane per (copy, agent)."""
        data = {}
        for name in self.algo.trained:
            algo = self.algo.algos[name]
            lanes = copies * len(self.algo.agents_of[name])
            if algo.data == "replay":
                buffer = algo.make_buffer(lanes, self.total_steps, seed=self.cfg.seed)
                if buffer.schedule_state().get("beta_anneal_steps"):  # β over the run's update passes: one per
                    # train_freq steps of the copies, not of the lanes
                    buffer.anneal_beta_over(beta_anneal_steps(algo.cfg, copies, self.total_steps))
                data[name] = PolicyData(algo, lanes, buffer=buffer)
            else:
                data[name] = PolicyData(algo, lanes, rollout_len=self.algo_cfg.rollout_len)
        return data

    def learn(self, data: dict[str, PolicyData]) -> tuple[dict[str, Any], int]:
        """Each trained policy learns from what its data holds (every finished segment; `gradient_steps` replay updates
        once its buffer is ready); the metrics (prefixed with the policy's name where several learn) and how many
        updates were made."""
        metrics: dict[str, Any] = {}
        updates = 0
        for name, d in data.items():
            algo = self.algo.algos[name]
            m: dict[str, Any] = {}
            if d.buffer is not None and d.buffer.ready(self.algo_cfg.batch_size, self.algo_cfg.learning_starts):
                m = self.replay_updates(algo=algo, buffer=d.buffer)
                updates += self.algo_cfg.gradient_steps
            while d.segments:
                m = algo.update(d.segments.pop(0))
                updates += 1
            metrics.update(m if len(data) == 1 else {f"{name}/{k}": v for k, v in m.items()})
        return metrics, updates

    def run_evaluation(self, step: int) -> tuple[np.ndarray, int, dict[str, float]]:
        result = evaluate_agents(self.algo, self.eval_envs, self.eval_seed(step), self.eval_max_steps)
        self._zero_sum_agents = zero_sum_agents(result.agents, self.algo)
        agents = {a: float(r.mean()) for a, r in result.agents.items()}
        policies = {
            name: float(np.mean([agents[a] for a in self.algo.agents_of[name]])) for name in self.algo.mapping.names
        }
        self.state["last_eval_agents"] = {"agents": agents, "policies": policies}
        more = {f"eval/agents/{a}/return_mean": r for a, r in agents.items()}
        more.update({f"eval/policies/{p}/return_mean": r for p, r in policies.items()})
        return result.returns, result.cut, more

    _zero_sum_agents: list[str] | None = None
    _zero_sum_noted = False

    def _evaluate(self, logger: RunLogger, start: float) -> float:
        """The run's evaluation; and once per invocation, the line that says the run's return cannot tell anything
        where the trained agents' returns cancel out (`zero_sum_note`)."""
        mean = super()._evaluate(logger, start)
        if self._zero_sum_agents and not self._zero_sum_noted:
            self._zero_sum_noted = True
            logger.note(zero_sum_note(self._zero_sum_agents))
        return mean

    def agent_returns(self) -> dict[str, list[float]]:
        """Each agent's training returns of the episodes finished since the last log row (the architecture's)."""
        return {}

    def log_row(self) -> dict[str, float]:
        returns = self.agent_returns()
        row = {f"agents/{a}/episodic_return": float(np.mean(r)) for a, r in returns.items() if r}
        for name, agents in self.algo.agents_of.items():
            mine = [x for a in agents for x in returns.get(a, [])]
            if mine:
                row[f"policies/{name}/episodic_return"] = float(np.mean(mine))
        return row

    def _exploration_hint(self, result: dict[str, Any]) -> str | None:
        return None  # the do-nothing baseline of a single-agent env has no counterpart with several agents

    def _result(self, stopped_by: str, wall: float) -> dict[str, Any]:
        result = super()._result(stopped_by, wall)
        last = self.state.get("last_eval_agents") or {"agents": None, "policies": None}
        mapping = self.algo.mapping
        result.update(
            eval_agents=last["agents"],
            eval_policies=last["policies"],
            policy_map=mapping.of_agent,
            trained_policies=mapping.trained,
            frozen_policies=sorted(mapping.frozen),
        )
        return result

    def _write_config(self, extra: dict[str, Any] | None = None) -> None:
        mapping = self.algo.mapping
        super()._write_config(
            {"policy_map": mapping.of_agent, "frozen_policies": sorted(mapping.frozen), **(extra or {})}
        )
