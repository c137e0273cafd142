"""Architectures: how actors and learners are laid out, and how data, weights and gradients flow between them.

An architecture runs any compatible algorithm through the algorithm contract (`rlfleet.algos`) only:

- `single`: one process steps a vector env and learns (`rlfleet.arch.single`);
- `hogwild`: the A3C paper's asynchronous actor-learners, lock-free updates of shared parameters
  (`rlfleet.arch.hogwild`);
- `data_parallel`: sampler processes feed experience to one learner (`rlfleet.arch.data_parallel`);
- `grad_parallel`: workers send gradients, the centre steps the shared model (`rlfleet.arch.grad_parallel`);
- `async_grad`: asynchronous gradients, each applied as it arrives (RLlib's AsyncGradients; `rlfleet.arch.async_grad`);
- `param_server`: a sharded parameter server, workers push gradient shards to S server roles and pull parameter
  shards from them (`rlfleet.arch.param_server`);
- `allreduce`: synchronous all-reduce learners, DD-PPO's decentralised form: each learner runs the algorithm's own
  update, its gradients averaged with the others' in every optimizer step (`rlfleet.arch.allreduce`);
- `gossip`: K learners, each a complete agent, average their parameters with their neighbours' in a graph after
  every update (GALA on the `local` backend, PALA on `ray`; `rlfleet.arch.gossip`);
- `apex`: Ape-X, actors with a ladder of exploration rates send prioritized n-step transitions to replay shards,
  one learner samples them (`rlfleet.arch.apex`);
- `offline`: an imitation algorithm learns from a dataset of demonstrations, DAgger with an expert
  (`rlfleet.arch.offline`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rlfleet.algos import DEFAULT_ARCH
from rlfleet.run.config import ConfigError

if TYPE_CHECKING:
    from rlfleet.run.runner import RunBase

# name -> (module, runner class, one-line description)
ARCHITECTURES: dict[str, tuple[str, str, str]] = {
    "single": ("rlfleet.arch.single", "SingleRunner", "one process, vectorised envs"),
    "hogwild": ("rlfleet.arch.hogwild", "HogwildRunner", "asynchronous actor-learners on shared parameters (A3C)"),
    "data_parallel": ("rlfleet.arch.data_parallel", "DataParallelRunner", "samplers feed one learner"),
    "grad_parallel": ("rlfleet.arch.grad_parallel", "GradParallelRunner", "workers send gradients to the centre"),
    "async_grad": ("rlfleet.arch.async_grad", "AsyncGradRunner", "each worker's gradient applied as it arrives"),
    "param_server": ("rlfleet.arch.param_server", "ParamServerRunner", "workers push gradient shards to S servers"),
    "allreduce": ("rlfleet.arch.allreduce", "AllReduceRunner", "learners average gradients by all-reduce (DD-PPO)"),
    "gossip": ("rlfleet.arch.gossip", "GossipRunner", "learners average parameters with graph neighbours (GALA/PALA)"),
    "apex": ("rlfleet.arch.apex", "ApexRunner", "actors with an ε ladder feed sharded prioritized replay (Ape-X)"),
    "offline": ("rlfleet.arch.offline", "OfflineRunner", "learns from demonstrations (bc; DAgger with --expert)"),
}


MULTI_AGENT: dict[str, tuple[str, str]] = {
    "single": ("rlfleet.arch.single", "MultiAgentSingleRunner"),
    "data_parallel": ("rlfleet.arch.data_parallel", "MultiAgentDataParallelRunner"),
}
"""The architectures that take a PettingZoo env (multi-agent), and their runners."""


def architecture_names() -> list[str]:
    return list(ARCHITECTURES)


def default_arch(algo: str) -> str:
    return DEFAULT_ARCH.get(algo, "single")


def runner_class(arch: str, multi_agent: bool = False) -> type[RunBase]:
    """The runner class of an architecture (on a multi-agent env: its multi-agent runner), or a clear error naming
    the valid ones."""
    if arch not in ARCHITECTURES:
        raise ConfigError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    module_name, cls_name, _ = ARCHITECTURES[arch]
    if multi_agent:
        if arch not in MULTI_AGENT:
            raise ConfigError(
                f"--arch {arch} does not take a PettingZoo env (several agents); the architectures that do: "
                f"{', '.join(MULTI_AGENT)}"
            )
        module_name, cls_name = MULTI_AGENT[arch]
    cls: type[RunBase] = getattr(importlib.import_module(module_name), cls_name)
    return cls
