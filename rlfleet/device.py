"""Where a learner runs (`--device`), and how its networks reach the CPU that acts and the processes that sample.

An algorithm is built on a device (`__init__(..., device=...)`): its networks, target networks and optimizer
state live there, and each update moves its batch there once (`Batch.to_torch(device)`, through pinned memory
on CUDA). Acting stays on the CPU for MLP policies, whose NumPy forward (`rlfleet.nets.fast`) is faster there than
any GPU call for the few envs a process steps: `acting(module)` is then a CPU copy of the learner's network,
refreshed from it whenever its weights changed since (PyTorch's per-tensor version counters tell: a
`load_state_dict`, a gossip average or any other in-place write bumps them, and `optimize` bumps them after each
optimizer step, whose fused kernels do not: `note_step`). CNN policies act on the
learner's device (`acts_on_device`), where a forward over a batch of frames is far faster than on the CPU
(docs/benchmarks.md, "Learners on a GPU"). Architectures that share the learner's networks with worker processes
share these CPU copies (`host_modules`) and refresh them (`sync_host`) inside each weight version.

`auto` (the default) takes the GPU for CNN learners (image observations) when CUDA is there, the CPU otherwise:
measured, a 64x64 MLP updates faster on the CPU than on an H100 (a kernel launch costs more than its whole
update), a Nature CNN many times faster on the GPU. The `meta` device (tensors with shapes and no values) runs
every operation of an update without computing it: the test suite uses it to catch a tensor left on the wrong
device on machines without a GPU.
"""

from __future__ import annotations

import copy
import re
import weakref
from collections.abc import Iterable
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import nn
from torch.autograd.graph import increment_version

from rlfleet.fields import ConfigError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
TEST_DEVICES: frozenset[str] = frozenset()  # devices a test suite adds (`meta`: no values, see the module's docstring)

# architectures whose learner (or centre; allreduce's and gossip's learners; param_server's servers) takes a device;
# hogwild learns in CPU shared memory
DEVICE_ARCHS = (
    "single",
    "offline",
    "data_parallel",
    "grad_parallel",
    "async_grad",
    "apex",
    "allreduce",
    "gossip",
    "param_server",
)


def device_problem(value: object) -> str | None:
    """A `checked` test of `--device`'s syntax (whether the machine has it is `resolve_device`'s)."""
    if isinstance(value, str) and (_DEVICE.match(value) or value in TEST_DEVICES):
        return None
    return f"must be one of {DEVICE_CHOICES}"


def resolve_device(setting: str, convolutional: bool, arch: str) -> torch.device:
    """The learner's device for `--device setting`: `auto` gives CUDA to a CNN learner (`convolutional`) when
    there is a GPU and the architecture takes a device, the CPU otherwise. A device the machine lacks or the
    architecture cannot use is a `ConfigError` naming it. A CUDA device comes with its index, and becomes the
    process's current one (`current_cuda`)."""
    if setting == "auto":  # not param_server's: an elementwise optimizer's step on a flat shard gains nothing there
        use = convolutional and arch in DEVICE_ARCHS and arch != "param_server" and torch.cuda.is_available()
        setting = "cuda" if use else "cpu"
    device = torch.device(setting)
    if device.type == "cpu":
        return device
    if arch not in DEVICE_ARCHS:
        raise ConfigError(
            f"--device {setting}: the {arch} architecture learns on the CPU; "
            f"a learner on a device runs with --arch {', '.join(DEVICE_ARCHS)}"
        )
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {setting}: this machine has no CUDA device (PyTorch sees none)")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"--device {setting}: this machine has {count} CUDA device{'s' * (count != 1)} "
                f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
            )
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return current_cuda(device)


def current_cuda(device: torch.device) -> torch.device:
    """`device`, made the process's current CUDA device when it is one: what PyTorch allocates pinned memory and
    CUDA graphs' pools for, and synchronizes before a capture, is the current device (cuda:0 unless set), so a
    learner on cuda:1 would otherwise hold a context on cuda:0 and wait for the wrong device."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def worker_device(setting: str) -> torch.device:
    """The device of a learner in a worker process, for the run's resolved device `setting`: the same device where
    the process sees it. A process that sees fewer GPUs (a Ray role sees the ones it reserved, numbered from 0)
    takes its first; one that sees none cannot learn on CUDA, which is a `RuntimeError` naming the remedy."""
    device = torch.device(setting)
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if count == 0:
        raise RuntimeError(
            f"this learner's process sees no CUDA device for --device {setting} (with --backend ray: reserve one per "
            "learner with --gpus-per-role)"
        )
    return current_cuda(device if device.index is not None and device.index < count else torch.device("cuda", 0))


def placement_note(
    device: torch.device, algo: object, workers_act: bool, arch: str = "single", workers_learn: bool = False
) -> str | None:
    """The line a run starts with when a GPU is in play: where the learner runs and where acting happens
    (`workers_act`: worker processes act, on the CPU; `workers_learn`: gradient workers compute on GPUs of their
    own). None on a machine without CUDA learning on the CPU."""
    if device.type == "cpu":
        if not torch.cuda.is_available():
            return None
        return "learner on the CPU (auto: an MLP learner updates faster there; --device cuda puts it on the GPU)"
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    if arch == "param_server":
        return (
            f"parameter servers on {device}{name}: each shard and its optimizer state; the workers compute gradients "
            "on the CPU, and pulls and pushes cross in host memory"
        )
    cnn = algorithm_acts_on_device(algo)
    if arch in ("allreduce", "gossip"):
        exchange = "gradients are averaged" if arch == "allreduce" else "parameters gossip"
        acts = "acts on it too (a CNN policy)" if cnn else "acts on the CPU with a copy of its weights"
        return (
            f"learners on {device}{name}, one per learner process (with --backend ray, the GPU each reserved); each "
            f"{acts}; {exchange} through host memory"
        )
    if workers_learn:
        where = "each gradient worker computes on the GPU its Ray role reserved, with the weights it publishes"
    elif workers_act:
        where = "the workers act on the CPU with the weights it publishes"
    elif cnn:
        where = "acting on it too (a CNN policy)"
    else:
        where = "acting on the CPU with a copy of its weights refreshed after each update"
    return f"learner on {device}{name}; {where}"


def place(algo: object, device: torch.device | str) -> torch.device:
    """Move every network (`nn.Module` attribute, but those marked `host_only`, which the host reads) and free
    parameter (SAC's log α) of `algo` to `device`; returns the device. Called once the networks are built and
    before anything holds their parameters (optimizer, parameter lists): a parameter may come back as a new object
    (PyTorch keeps it for CUDA, not for `meta`)."""
    device = torch.device(device)
    if device.type == "cpu":
        return device
    for name, value in list(vars(algo).items()):
        if isinstance(value, nn.Module) and not getattr(value, "host_only", False):
            value.to(device)
        elif isinstance(value, nn.Parameter):
            setattr(algo, name, nn.Parameter(value.detach().to(device), requires_grad=value.requires_grad))
    return device


def acts_on_device(module: nn.Module) -> bool:
    """Whether a network acts on the learner's device rather than through a CPU copy: CNNs do."""
    return any(isinstance(m, nn.Conv2d) for m in module.modules())


def algorithm_acts_on_device(algo: object) -> bool:
    """Whether an algorithm's policy acts on its learner's device (one of its networks is a CNN, `acts_on_device`):
    its recurrent state is kept there too."""
    return any(acts_on_device(m) for m in vars(algo).values() if isinstance(m, nn.Module))


def _state_tensors(module: nn.Module) -> list[torch.Tensor]:
    return list(module.state_dict(keep_vars=True).values())


class HostCopy:
    """A CPU copy of a network on another device, refreshed from it when its tensors have changed."""

    def __init__(self, source: nn.Module):
        self.source = weakref.ref(source)
        self.module = _cpu_clone(source)
        self.pairs = list(zip(_state_tensors(self.module), _state_tensors(source), strict=True))
        self.versions: tuple[int, ...] | None = None

    def refresh(self, force: bool = False) -> nn.Module:
        """The copy, its values first copied from the source if any of the source's tensors changed (or `force`)."""
        versions = tuple(src._version for _, src in self.pairs)
        if force or versions != self.versions:
            with torch.no_grad():
                for dst, src in self.pairs:
                    dst.copy_(src)
            self.versions = versions
        return self.module


def _cpu_clone(source: nn.Module) -> nn.Module:
    """A CPU module with the structure of `source`, its values not copied yet (`HostCopy.refresh` does)."""
    clone = copy.deepcopy(source).to_empty(device="cpu")
    for m in clone.modules():
        m.__dict__.pop("_np", None)  # a NumPy forward compiled for the source (None on a device) is rebuilt
    return clone


_HOST_COPIES: weakref.WeakKeyDictionary[nn.Module, HostCopy] = weakref.WeakKeyDictionary()
_ACTS_THROUGH: weakref.WeakKeyDictionary[nn.Module, HostCopy | None] = weakref.WeakKeyDictionary()


def host_copy(module: nn.Module) -> HostCopy:
    """The one `HostCopy` of `module` (made on first use)."""
    held = _HOST_COPIES.get(module)
    if held is None:
        held = _HOST_COPIES[module] = HostCopy(module)
    return held


def module_device(module: nn.Module) -> torch.device:
    """Where a module's tensors are (the CPU for one without any)."""
    first: torch.Tensor | None = next(module.parameters(), None)
    if first is None:
        first = next(module.buffers(), None)
    return torch.device("cpu") if first is None else first.device


def on_cpu(module: nn.Module) -> bool:
    return module_device(module).type == "cpu"


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def acting(module: ModuleT) -> ModuleT:
    """The network to act with: `module` itself on the CPU or where it acts on its device (`acts_on_device`),
    else its CPU copy, current with its weights. Decided on a module's first call (it stays where it was put)."""
    try:
        through = _ACTS_THROUGH[module]
    except KeyError:
        through = None if on_cpu(module) or acts_on_device(module) else host_copy(module)
        _ACTS_THROUGH[module] = through
    return module if through is None else cast(ModuleT, through.refresh())  # a copy: of the module's class


def metric(t: torch.Tensor) -> float | torch.Tensor:
    """A 0-dim tensor as an update reports it (`Metrics`): its float on the CPU, where reading it costs nothing; the
    detached tensor on a device, where reading it would wait for every kernel queued before it and leave the device
    idle while the next step's kernels are launched. The logger reads it when it writes."""
    return t.item() if t.device.type == "cpu" else t.detach()


def read_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """An update's metrics as floats (reading those left on a device): what a learner in a worker process sends,
    since a tensor on a GPU would cross to the coordinator as a CUDA handle whose memory the learner must keep."""
    return {k: float(v) for k, v in metrics.items()}


def host(t: torch.Tensor | np.ndarray) -> np.ndarray:
    """A tensor's values as a NumPy array on the host (a view for a CPU tensor); an array as it is."""
    return t if isinstance(t, np.ndarray) else t.detach().cpu().numpy()


def host_modules(modules: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """The networks as worker processes see them: each on the CPU (a `HostCopy` of one on a device)."""
    return {name: m if on_cpu(m) else host_copy(m).refresh(force=True) for name, m in modules.items()}


def sync_host(modules: Iterable[nn.Module]) -> None:
    """Copy the networks that have a CPU copy (`host_modules`) into it, changed or not: an architecture publishing a
    weight version calls it, and its optimizer may be one whose kernels leave the version counters alone."""
    for m in modules:
        held = _HOST_COPIES.get(m)
        if held is not None:
            held.refresh(force=True)


def note_step(optimizer: torch.optim.Optimizer) -> None:
    """After an optimizer step: bump the version counters of the parameters it stepped (those with a gradient) when
    they are on a device. Fused kernels (`Adam(fused=True)`, what CUDA learners step with) write them without bumping
    them, and the CPU copies that act (`acting`) refresh when a counter moves. The others are left alone: a graph
    built on them before this step (SAC samples its policy step's actions before the critics step, in one optimizer)
    stays valid. A CPU learner has no copies: nothing to do."""
    groups = optimizer.param_groups
    if not groups or not groups[0]["params"] or groups[0]["params"][0].device.type == "cpu":
        return
    increment_version([p for group in groups for p in group["params"] if p.grad is not None])
