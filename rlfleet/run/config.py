"""Run configuration and how an algorithm's config is resolved: defaults < preset < `--set key=value`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlfleet.algos import config_fields, resolve
from rlfleet.algos.env_presets import describe, env_id_of, env_preset, env_preset_names
from rlfleet.algos.options import replay_problem
from rlfleet.device import device_problem
from rlfleet.envs import ENV_TIMEOUT_S, VECTOR_MODES
from rlfleet.envs.kwargs import env_kwargs_problem, parse_env_value
from rlfleet.envs.pettingzoo import is_pettingzoo_id
from rlfleet.fields import (
    MAX_ENVS,
    MAX_ROLES,
    NAMES_ALGORITHM,
    ConfigError,
    bounded,
    check_fields,
    checked,
    non_empty,
    one_of,
    parse_count,
    single_folder_name,
)
from rlfleet.run.checkpoint import CheckpointError

__all__ = [
    "ConfigError",
    "NoOptions",
    "RunConfig",
    "build_algo_config",
    "build_options",
    "check_run_config",
    "check_sequence_replay",
    "drop_preset_normalisation",
    "fit_preset_replay",
    "parse_field",
    "parse_overrides",
    "resolve_torch_threads",
    "torch_threads_note",
]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def notes_at(level: int) -> Iterator[None]:
    """The run's notes (this module's log: the preset picked, a replay fitted to memory, ...) only from `level` up
    while the block runs: for checks that resolve the same configuration again."""
    kept = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(kept)


@contextlib.contextmanager
def notes_held() -> Iterator[None]:
    """The run's notes said in the block are held, and said at its end only if it ends without an error: a run that
    is refused says only why (a resume's "--steps ... follow the new one" before its "keeps its configuration")."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    log.addFilter(hold)
    try:
        yield
    finally:
        log.removeFilter(hold)
    for record in held:
        log.handle(record)


AUTO_THREADS = "auto"
"""`torch_threads` resolved at run start by `resolve_torch_threads`."""


def torch_threads_problem(value: Any) -> str | None:
    """A `checked` test of `torch_threads`: a count in [1, `MAX_ROLES`] or "auto"."""
    if value == AUTO_THREADS or (isinstance(value, int) and 1 <= value <= MAX_ROLES):
        return None
    return f"must be in [1, {MAX_ROLES}], or {AUTO_THREADS}"


EVAL_MAX_STEPS = 27_000
"""The default bound of an evaluation episode of an env without a time limit (`--eval-max-steps`, `--max-steps`):
the ALE's cap of 108,000 frames in agent steps (frame skip 4), the Atari evaluation convention and the longest time
limit of the envs Gymnasium registers, so that an env without a limit of its own is never cut shorter than an Atari
game; a policy that loops on a cheap env costs seconds of it."""


MAX_SEED = 2**31 - 1
"""The largest `--seed` (of a run, `rlfleet eval` and `rlfleet collect`): 31 bits, so that every env seed derived from
it stays a 32-bit seed, the seeds NumPy's legacy `RandomState` and the envs that seed one (MinAtar) take. Sub-env i
is seeded with `seed + i`, evaluation envs with `seed + 10_000 + i`, restarted envs with `seed + env_steps`, a
worker's envs with its id and its restart and resume counts times up to 10^7 added: the 2**31 left above this bound
hold them all for any run that could ever be trained (evaluation seeds are taken modulo 2**31 besides)."""


def none_or_non_empty(value: Any) -> str | None:
    """A `checked` test: None (the option is not given) or text that is not empty."""
    return None if value is None else non_empty(value)


@dataclass
class RunConfig:
    """Everything about a run that is not the algorithm's own hyperparameters.

    Each field declares the values it allows (`rlfleet.fields`); `check_run_config` checks them all before a
    run touches the disk, and its messages name a field by its command-line option (`--n-envs`)."""

    algo: str = field(metadata={"option": "ALGO"})
    """Registered algorithm name (see `rlfleet list`)."""
    env: str = checked(check=non_empty)
    """Gymnasium env id (`CartPole-v1`, `ALE/Pong-v5`, ...)."""
    env_kwargs: dict[str, Any] = checked(check=env_kwargs_problem, default_factory=dict, option="--env-kwargs")
    """Keyword arguments of the env (`--env-kwargs is_slippery=false`): they go to `gymnasium.make` (for Atari ids:
    the preprocessing options, `rlfleet.envs.ATARI_OPTIONS`) wherever the run builds its env."""
    arch: str | None = None
    """Architecture; not given: the algorithm's default (`single`; `hogwild` for a3c, `offline` for bc);
    `rlfleet list` describes each."""
    options: dict[str, Any] = field(default_factory=dict, metadata={"option": "the architecture's options"})
    """The architecture's own options (the fields of its `Options` dataclass: `workers`, `grad_sets`, ...)."""
    steps: int | None = bounded(None, ge=1)
    """Env steps to train for (rounded up to whole iterations); not given: the algorithm's `total_steps`."""
    seed: int = bounded(0, ge=0, le=MAX_SEED)
    """Seed for envs, networks and sampling."""
    n_envs: int | None = bounded(None, ge=1, le=MAX_ENVS)
    """Parallel training envs; not given: the algorithm's `n_envs`."""
    preset: str | None = None
    """Named set of defaults from the algorithm's PRESETS (or an env id with a per-env preset, or `default`: none);
    not given: the env's per-env preset (`rlfleet/algos/env_presets.toml`) if it has one, else the preset named
    after the env's family (`atari` for Atari envs, `mujoco` for MuJoCo envs, `continuous` for other envs with
    Box actions) where the algorithm has one."""
    overrides: dict[str, Any] = field(default_factory=dict, metadata={"option": "--set"})
    """Algorithm config fields to set (`--set key=value`)."""
    logdir: str = "runs"
    """Folder that holds run folders."""
    name: str | None = checked(None, single_folder_name)
    """Run folder name, one path component (the run stays inside `logdir`); default
    `<algo>-<env>-s<seed>-<timestamp>`."""
    eval_every: int | None = bounded(None, ge=0)
    """Env steps between greedy evaluations; 0 or not given: max(2,000, steps / 50) (bc on offline: max(500, gradient
    steps / 50))."""
    eval_episodes: int = bounded(10, ge=1, le=MAX_ENVS)
    """Episodes per evaluation (run side by side on separate envs)."""
    eval_max_steps: int = bounded(EVAL_MAX_STEPS, ge=1)
    """Steps an evaluation episode may take at most (CliffWalking-v1, which has no time limit of its own: a greedy
    policy may walk in circles forever); an episode cut there counts with the return it had, and the run says how
    many were (`eval/episodes_cut`, `eval_episodes_cut` in result.json). The default is the ALE's 108,000-frame
    cap in agent steps, the Atari convention and the longest limit of Gymnasium's registered envs. An env whose
    own limit (`max_episode_steps`) is shorter ends its episodes there."""
    stop_return: float | None = bounded(None, finite=False)
    """Stop once an evaluation's mean return reaches this (inf: never); default the env's reward_threshold."""
    time_limit: float | None = bounded(None, gt=0, finite=False)
    """Wall-clock seconds this invocation trains at most (checkpoint saved); a resumed run gets them again (inf: no
    limit, which is how a resume drops the one its run had)."""
    checkpoint_every: int | None = bounded(None, ge=0)
    """Env steps between checkpoints; 0 or not given: 10 evaluations' worth."""
    vector_mode: str = checked("auto", one_of(VECTOR_MODES))
    """The training envs of `single`: auto, sync, async (a process per env) or envpool; auto takes async for Atari and
    MuJoCo ids with more than one env. Evaluation envs on Atari follow it on every architecture."""
    env_timeout_s: float = bounded(ENV_TIMEOUT_S, gt=0)
    """Seconds an env process (async vector envs) may take to answer one reset or step: one that takes longer is
    killed, and the run stops cleanly (checkpoint, result.json) naming it, as it does when one dies."""
    torch_threads: int | str = checked(AUTO_THREADS, torch_threads_problem)
    """torch.set_num_threads for the training process: a count, or auto — every core this process may use for a
    CNN learner in a single-process architecture (`single`, `offline`), one thread otherwise (small nets run
    fastest on one thread, and a learner beside worker processes must leave them the cores); see
    `resolve_torch_threads`."""
    device: str = checked("auto", device_problem)
    """Where the learner runs: auto, cpu, cuda or cuda:N. auto takes the GPU for a CNN learner (image observations)
    when there is one and the architecture takes a device (single, offline, data_parallel, grad_parallel,
    async_grad, apex, allreduce, gossip, param_server), the CPU
    otherwise (see `rlfleet.device`); acting stays on the CPU for MLP policies."""
    policies: str = checked("shared", one_of(("shared", "separate")))
    """PettingZoo envs: one policy for all agents (shared) or one per agent (separate); `--policy-map` maps agents to
    policies by name instead. Each agent's index is a one-hot beside its observation."""
    policy_map: str | None = checked(None, check=none_or_non_empty)
    """PettingZoo envs: agents to policies, 'PATTERN=POLICY,...' (fnmatch patterns, the first match wins):
    'adversary_*=red,agent_*=blue'; the policy `random` picks uniformly among the legal actions."""
    freeze: str | None = checked(None, check=none_or_non_empty)
    """PettingZoo envs: policies that act but do not learn, comma-separated (they need --load-policy)."""
    load_policy: str | None = checked(None, check=none_or_non_empty)
    """PettingZoo envs: policies whose weights come from a multi-agent run's checkpoint of the same env,
    'POLICY=CHECKPOINT[#SAVED_POLICY],...' (its policy of that name, SAVED_POLICY, or its only one)."""
    progress: bool = field(default=True, metadata={"option": "progress"})
    """Show a progress bar."""


@dataclass
class NoOptions:
    """An architecture without options of its own."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where there is none)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def resolve_torch_threads(setting: int | str, *, single_process: bool, convolutional: bool) -> int:
    """The torch thread count of a run's training process: `setting` if it is a count; for "auto", every usable
    core when the learner is a CNN (`convolutional`) in a single-process architecture, else 1; never more than
    an `OMP_NUM_THREADS` the environment sets.

    Why (docs/benchmarks.md, "Atari: where the time goes"): a CNN update on minibatches of 256 runs much faster
    on two threads than on one, and in a single-process architecture the learner has the cores to itself while
    it learns (its env processes wait for the next actions), which more than pays for slower acting; a small MLP
    runs fastest on one thread, and where learners or samplers run in other processes at the same time, each
    process keeps one thread so that they do not fight over the cores."""
    if setting != AUTO_THREADS:
        return int(setting)
    threads = usable_cores() if single_process and convolutional else 1
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) >= 1:  # the user's cap for OpenMP pools, which torch's own default honours too
        threads = min(threads, int(omp))
    return threads


def torch_threads_note(setting: int | str, threads: int) -> str | None:
    """The line a run says where "auto" gave its learner more than one thread (`resolve_torch_threads`)."""
    if setting != AUTO_THREADS or threads <= 1:
        return None
    return f"torch threads: {threads} (auto: a CNN learner with the process to itself)"


RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunConfig)) - {"algo", "env", "options"}
"""The options every run has (`RunConfig`), beside its architecture's."""


def saved_run_config(payload: dict[str, Any], checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """The run config a checkpoint holds. One written by another version of rlfleet, whose run config lacks fields
    this version has or has fields it does not know, is one `CheckpointError` naming them."""
    saved = payload["run_config"]
    expected = RUN_FIELDS | {"algo", "env", "options"}
    missing, unknown = sorted(expected - set(saved)), sorted(set(saved) - expected)
    if missing or unknown:
        differ = ([f"lacks {', '.join(missing)}"] if missing else []) + (
            [f"has {', '.join(unknown)}, unknown to this version"] if unknown else []
        )
        raise CheckpointError(
            f"checkpoint {os.fspath(checkpoint)} was written by another version of rlfleet: its run config "
            + " and ".join(differ)
        )
    return dict(saved)


def run_option(f: dataclasses.Field) -> str:
    """How messages name a `RunConfig` field or an architecture option: by its command-line option."""
    return f.metadata.get("option", "--" + f.name.replace("_", "-"))


def check_known_options(
    options_cls: type, values: dict[str, Any], arch: str | None, others: dict[str, type] | None = None
) -> None:
    """A one-line `ConfigError` for options in `values` that the architecture's `Options` lacks: where `others` (the
    other architectures' `Options`, by name) has each, it says which have it; else it lists the valid ones."""
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(options_cls)})
    if not unknown:
        return
    has = ", ".join(run_option(f) for f in dataclasses.fields(options_cls)) or "none"
    where = {k: [a for a, o in (others or {}).items() if k in {f.name for f in dataclasses.fields(o)}] for k in unknown}
    if others is not None and all(where.values()):
        said = "; ".join(f"--{k.replace('_', '-')} is an option of {', '.join(a)}" for k, a in where.items())
        raise ConfigError(f"{said}, not of {arch} (its options: {has})")
    if others is not None:
        valid = sorted(RUN_FIELDS | {f.name for o in others.values() for f in dataclasses.fields(o)})
        raise ConfigError(f"unknown run option(s) {unknown}; valid: {valid}")
    flags = ", ".join("--" + name.replace("_", "-") for name in unknown)
    raise ConfigError(f"{flags} is not an option of the {arch} architecture (its options: {has})")


def build_options(options_cls: type, values: dict[str, Any], arch: str | None) -> Any:
    """An architecture's `Options` from `values`, each checked (type, range); an option the architecture does
    not have is a one-line `ConfigError` that lists the ones it has (`check_known_options`)."""
    check_known_options(options_cls, values, arch)
    options = options_cls(**values)
    check_fields(options, run_option)
    return options


def check_run_config(cfg: RunConfig) -> None:
    """A one-line `ConfigError` for the first run option of a wrong type, not finite or out of its range, or a
    multi-agent option given for an env with one agent."""
    check_fields(cfg, run_option)
    if not is_pettingzoo_id(cfg.env):
        given = [k for k in MULTI_AGENT_FIELDS if getattr(cfg, k) != RUN_DEFAULTS[k]]
        if given:
            options = ", ".join("--" + k.replace("_", "-") for k in given)
            raise ConfigError(f"{options}: for PettingZoo envs (--env pettingzoo:MODULE); {cfg.env} has one agent")


MULTI_AGENT_FIELDS = ("policies", "policy_map", "freeze", "load_policy")
"""The run options of multi-agent runs (`rlfleet.run.multi_agent`)."""
RUN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}


def parse_value(text: str, annotation: Any, key: str) -> Any:
    """Turn `--set` text (or any option's text) into the type `annotation` declares."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"tuple": tuple, "int": int, "float": float, "str": str, "bool": bool})  # noqa: S307
    origin = typing.get_origin(annotation)
    try:
        if annotation is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if annotation is int:
            return parse_count(text)
        if annotation is float:
            return float(text)
        if origin is tuple:
            inner = typing.get_args(annotation)[0]
            parts = [p for p in text.replace("(", "").replace(")", "").split(",") if p.strip()]
            return tuple(parse_count(p.strip()) if inner is int else inner(p.strip()) for p in parts)
        if origin is dict:  # keyword arguments: a dict literal, its values typed as --env-kwargs types them
            return parse_env_value(text)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if text.lower() == "none":
                return None
            return parse_value(text, args[0], key)
    except (ValueError, OverflowError):
        expected = annotation.__name__ if isinstance(annotation, type) else annotation
        raise ConfigError(f"bad value {text!r} for {key} (expected {expected})") from None
    return text


def parse_field(algo: str, key: str, text: str) -> Any:
    """`--set key=text` parsed as algorithm `algo`'s config field `key` (an unknown key: one `ConfigError`)."""
    _, config_cls, _, _ = resolve(algo)
    fields = config_fields(config_cls)
    if key not in fields:
        raise ConfigError(f"unknown config key {key!r} for {algo}; valid keys: {', '.join(sorted(fields))}")
    return parse_value(text, typing.get_type_hints(config_cls)[key], key)


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """`--set KEY=VALUE` items as a dict; a key given twice with different values is one `ConfigError` (the last
    one would win in silence)."""
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        key, value = (part.strip() for part in pair.split("=", 1))
        if key in out and out[key] != value:
            raise ConfigError(f"--set {key}={out[key]} and --set {key}={value} disagree: give one")
        out[key] = value
    return out


def resolve_stop_return(
    given: float | None, threshold: float | None, env: str, env_kwargs: dict[str, Any]
) -> float | None:
    """The return a run stops at: `given` (`--stop-return`), else the env id's `reward_threshold` (None: never).
    The id's threshold was registered for the env as the id builds it; for a variant (`env_kwargs`) the run says
    where its threshold comes from, since the variant's returns may differ (FrozenLake's 8x8 map, a reward
    option)."""
    if given is not None:
        return given
    if threshold is not None and env_kwargs:
        log.info(
            f"stop return {threshold:g}: the reward_threshold of {env} without --env-kwargs; "
            "set --stop-return if this variant's returns differ"
        )
    return threshold


NORMALISATION = ("obs_norm", "reward_norm")
"""Config fields whose running statistics live beside the training envs (`rlfleet.envs.normalize`)."""


def drop_preset_normalisation(algo_cfg: Any, overrides: dict[str, Any], arch: str | None, preset: str | None) -> None:
    """On an architecture whose workers step their own envs, switch off the normalisation a preset turned on (the
    user did not ask for it; a plain `rlfleet train ppo --env Pendulum-v1 --arch data_parallel` must run) and say
    so in one line. What the user set with `--set` is left for the architecture to refuse."""
    dropped = [k for k in NORMALISATION if getattr(algo_cfg, k, False) and k not in overrides]
    if not dropped:
        return
    for key in dropped:
        setattr(algo_cfg, key, False)
    names = " and ".join(dropped)
    log.info(
        f"{names}: off on the {arch} architecture (each worker steps its own envs; the preset {preset!r} sets "
        f"{'them' if len(dropped) > 1 else 'it'} for --arch single)"
    )


REPLAY_MEMORY_SHARE = 0.5
"""The share of this machine's memory a replay a preset sized may take once full (`fit_preset_replay`)."""


def machine_memory() -> int:
    """Bytes of physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fit_preset_replay(algo_cfg: Any, overrides: dict[str, Any], obs_space: Any, preset: str | None) -> None:
    """Shrink a replay that a preset sized (not the user's `--set buffer_size`) to what fits in
    `REPLAY_MEMORY_SHARE` of this machine's memory once full, and say so in one line: the paper's 2M Atari
    transitions (each an observation and its next, 2 x 28 KB of frames) take ~110 GB, and a plain command must not
    end, hours in, out of memory. The rows are written as they come, so nothing is allocated up front either way.

    A replay that holds fewer transitions than `learning_starts` never starts learning: the preset's
    `learning_starts` shrinks with it (said in the same line); the user's own is one `ConfigError`. Then, with the
    run's env count final (`--n-envs`), a sequence replay whose env columns are shorter than one sequence is one
    `ConfigError` too (`check_sequence_replay`)."""
    if getattr(algo_cfg, "buffer_size", None) is None:
        return
    if "buffer_size" not in overrides:
        _fit_to_memory(algo_cfg, overrides, obs_space, preset)
    check_sequence_replay(algo_cfg)


def _fit_to_memory(algo_cfg: Any, overrides: dict[str, Any], obs_space: Any, preset: str | None) -> None:
    """`fit_preset_replay`'s shrinking of a preset's replay (and of a preset's `learning_starts` with it)."""
    size = algo_cfg.buffer_size
    per_transition = 2 * sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in _leaf_spaces(obs_space)) + 64
    fits = int(REPLAY_MEMORY_SHARE * machine_memory() // per_transition)
    if size <= fits:
        return
    algo_cfg.buffer_size = max(fits, getattr(algo_cfg, "batch_size", 1))
    starts = getattr(algo_cfg, "learning_starts", 0)
    if starts > algo_cfg.buffer_size and "learning_starts" in overrides:
        raise ConfigError(
            f"learning_starts={starts} is more than the {algo_cfg.buffer_size:,} transitions that buffer_size "
            f"{size:,} (preset {preset!r}) fitted to half of this machine's memory holds, so the run would never "
            "update: set a smaller learning_starts, or --set buffer_size=N"
        )
    lowered = ""
    if starts > algo_cfg.buffer_size:
        algo_cfg.learning_starts = algo_cfg.buffer_size
        lowered = f", and learning starts once it is full (the preset's learning_starts: {starts:,})"
    log.info(
        f"buffer_size {size:,} (preset {preset!r}) would take ~{size * per_transition / 1e9:.0f} GB once full, more "
        f"than half of this machine's {machine_memory() / 1e9:.0f} GB: the replay holds {algo_cfg.buffer_size:,} "
        f"transitions{lowered} (--set buffer_size=N to choose)"
    )


OBSERVATION_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")
"""The observation spaces rlfleet's networks take (and Dict and Tuple spaces of them)."""


def check_observation_space(obs_space: Any) -> None:
    """An observation space (or a part of a Dict one) that no network here takes — Text, Graph, Sequence — is one
    `ConfigError`, before anything reads its shape."""
    for leaf in _leaf_spaces(obs_space):
        if type(leaf).__name__ not in OBSERVATION_SPACES or getattr(leaf, "shape", None) is None:
            raise ConfigError(
                f"observation space {leaf} is not one rlfleet's networks take: {', '.join(OBSERVATION_SPACES)}, and "
                "Dict and Tuple spaces of them (wrap the env in a gymnasium.ObservationWrapper that gives one)"
            )


def check_upfront_memory(algo_cfg: Any, obs_space: Any) -> None:
    """What a run allocates before its first step, against this machine's memory: an on-policy rollout
    (`rollout_len` steps of `n_envs` envs) and a prioritized replay's two segment trees (16 bytes a leaf each, leaves
    rounded up to a power of two). Either past the machine is one `ConfigError`, before anything is written, where
    it would be a `MemoryError` once the run folder is made."""
    memory = machine_memory()
    steps = getattr(algo_cfg, "rollout_len", 0) * getattr(algo_cfg, "n_envs", 0)
    per_step = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in _leaf_spaces(obs_space)) + 64
    if steps * per_step > memory:
        raise ConfigError(
            f"rollout_len={algo_cfg.rollout_len} steps of n_envs={algo_cfg.n_envs} envs take ~"
            f"{steps * per_step / 1e9:,.0f} GB, more than this machine's {memory / 1e9:.0f} GB: give fewer of either"
        )
    size = getattr(algo_cfg, "buffer_size", None)
    if getattr(algo_cfg, "prioritized", False) and size is not None:
        trees = 2 * 16 * (1 << (size - 1).bit_length())
        if trees > memory:
            raise ConfigError(
                f"buffer_size={size:,}: a prioritized replay's trees take ~{trees / 1e9:,.0f} GB up front, more than "
                f"this machine's {memory / 1e9:.0f} GB: a smaller buffer_size, or --set prioritized=false"
            )


def check_sequence_replay(algo_cfg: Any, sources: int = 1) -> None:
    """A sequence replay (recurrent dqn: `lstm` > 0) keeps `buffer_size // envs` steps of each env (`n_envs` of each
    of `sources`: a data_parallel learner's samplers) and draws sequences of `burn_in + train_len` steps from one
    env's column: a column shorter than that holds none, which is one `ConfigError` before the run starts (the buffer
    would refuse it once the run folder is made)."""
    if not getattr(algo_cfg, "lstm", 0) or getattr(algo_cfg, "buffer_size", None) is None:
        return
    length, n_envs = algo_cfg.burn_in + algo_cfg.train_len, algo_cfg.n_envs * sources
    if algo_cfg.buffer_size // n_envs < length:
        raise ConfigError(
            f"buffer_size={algo_cfg.buffer_size} keeps {algo_cfg.buffer_size // n_envs} steps of each of the {n_envs} "
            f"envs, fewer than a sequence (burn_in + train_len = {length}): set buffer_size >= {length * n_envs}"
        )


def _leaf_spaces(space: Any) -> list[Any]:
    """The entries of a (Dict) observation space."""
    return [s for sub in space.spaces.values() for s in _leaf_spaces(sub)] if hasattr(space, "spaces") else [space]


DEFAULT_PRESET = "default"
"""`--preset default`: the algorithm's own defaults, neither a per-env nor a family preset."""


def build_algo_config(
    algo: str,
    preset: str | None,
    overrides: dict[str, Any],
    env_family: str | None = None,
    env: str | None = None,
    arch: str | None = None,
    arch_presets: Mapping[str, str] | None = None,
) -> tuple[Any, str | None]:
    """The algorithm's Config with preset and overrides applied (string values are parsed by field type).

    With no preset given, the env's entry in the per-env presets (`rlfleet.algos.env_presets`, by `env` id) is
    used if there is one (and logged at INFO level once the config is valid: "preset for ENV: ..."), else an
    env family (`env_spec_info(...)["family"]`: "atari", "mujoco", "continuous") picks the algorithm's preset
    of the same name, if it has one; before it, an architecture's own preset for that family (`arch_presets`:
    family -> preset name, e.g. apex's paper settings for Atari envs), if the algorithm has one of that name (and
    logged at INFO level: "preset apex for --arch apex on atari envs"). A preset may also name an env with an entry
    (its tuned settings on another env), or be "default" (no preset). Returns the config and the preset's
    name (an env id for a per-env preset; None for none)."""
    _, config_cls, presets, variant = resolve(algo)
    tuned = env_preset(algo, env) if preset is None and env is not None else None
    picked = tuned is not None
    for_arch = (
        (arch_presets or {}).get(env_family) if preset is None and not picked and env_family is not None else None
    )
    if picked:
        assert env is not None  # found the env's own preset
        preset = env_id_of(env)
    elif for_arch is not None and for_arch in presets:
        preset = for_arch
    elif preset is None and env_family is not None and env_family in presets:
        preset = env_family
    elif preset == DEFAULT_PRESET:
        preset = None
    elif preset is not None and preset not in presets:
        tuned = env_preset(algo, preset)
        if tuned is None:
            names = [*sorted(presets), *env_preset_names(algo), DEFAULT_PRESET]
            raise ConfigError(f"unknown preset {preset!r} for {algo}; choose one of: {', '.join(names)}")
    named = tuned if tuned is not None else presets.get(preset, {}) if preset else {}
    values: dict[str, Any] = {**variant, **named}
    fields = config_fields(config_cls)
    for key, value in overrides.items():
        if key not in fields:
            raise ConfigError(f"unknown config key {key!r} for {algo}; valid keys: {', '.join(sorted(fields))}")
        values[key] = parse_field(algo, key, value) if isinstance(value, str) else value
    cfg = config_cls(**values)
    check_fields(cfg, lambda f: f"{algo} config {f.name}")  # type, finiteness and range, as each field declares
    for key in overrides:
        if fields[key].metadata.get(NAMES_ALGORITHM) and values[key] != variant.get(key, fields[key].default):
            raise ConfigError(
                f"{algo} config {key}={values[key]!r} would run {values[key]} under the name {algo}: train "
                f"{values[key]} instead, or leave {key} out"
            )
    problem = replay_problem(cfg)
    if problem is not None:
        raise ConfigError(f"{algo} config {problem}")
    if picked:  # once the config is valid: the run says which tuned settings it starts from
        assert env is not None and tuned is not None
        log.info(describe(algo, env, tuned))
    elif preset is not None and preset == for_arch:
        log.info(
            f"preset {preset} for --arch {arch} on {env_family} envs (--preset default or another --preset instead)"
        )
    return cfg, preset
