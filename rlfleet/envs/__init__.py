"""Environments: ``make_env``/``make_vector_env`` (Gymnasium, DQN Atari preprocessing, EnvPool) and wrappers.

Vector envs from :func:`make_vector_env` use SAME_STEP autoreset: ``info["final_obs"]`` holds the real last
observation of finished sub-envs and ``info["episode"]`` their raw returns; see :mod:`rlfleet.envs.make`.

Also here: an env's keyword arguments for a run, checked before it starts (`kwargs`), snapshots of a vector env's
state for an exact resume (`snapshot`), observation and reward normalisation (`normalize`), MinAtar (`minatar`),
env processes that are watched (`processes`).
"""

from rlfleet.envs.make import (
    ATARI_OPTIONS,
    CARTPOLE_NO_VELOCITY_ID,
    VECTOR_MODES,
    UnknownEnvError,
    env_spec_info,
    finished_episodes,
    import_envpool,
    make_env,
    make_vector_env,
    resolve_env_spec,
    resolve_vector_mode,
)
from rlfleet.envs.processes import ENV_TIMEOUT_S, EnvProcessError
from rlfleet.envs.wrappers import (
    EnvPoolVectorEnv,
    LiftEpisodeStatistics,
    SeedOnFirstReset,
    TerminalOnLifeLoss,
    VelocityMaskedObservation,
    sign_reward,
)

__all__ = [
    "ATARI_OPTIONS",
    "CARTPOLE_NO_VELOCITY_ID",
    "ENV_TIMEOUT_S",
    "VECTOR_MODES",
    "EnvPoolVectorEnv",
    "EnvProcessError",
    "LiftEpisodeStatistics",
    "SeedOnFirstReset",
    "TerminalOnLifeLoss",
    "UnknownEnvError",
    "VelocityMaskedObservation",
    "env_spec_info",
    "finished_episodes",
    "import_envpool",
    "make_env",
    "make_vector_env",
    "resolve_env_spec",
    "resolve_vector_mode",
    "sign_reward",
]
