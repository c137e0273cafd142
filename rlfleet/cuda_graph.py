"""An update replayed as a CUDA graph (`StepGraph`): one launch instead of the few hundred small kernels it is made of.

A small network's update on a GPU is bound by launching its kernels, not by their arithmetic: SAC's update at
HalfCheetah's sizes (256-256 MLPs, minibatch 256) is some 250 kernels of a few microseconds of work each, and
took 7.8 ms on an H100, longer than on 16 CPU threads (docs/devices.md). A CUDA graph records those kernels once
and replays them with one call (PyTorch's "whole-network capture").

An algorithm whose update has a part that only does tensor work on the device (no reading of values on the
host, no shapes that depend on values, one optimizer made with `optimizer_options`) runs that part through
`StepGraph(fn, batch, optimizer)`:

- on the CPU (or with the graph turned off) it is `fn(batch)`;
- on CUDA the first `warmup` calls of each kind run eagerly on a side stream (they create the optimizer's
  state, cuBLAS's workspaces and autograd's streams, which a capture cannot), the next call captures `fn` on
  static copies of the batch's tensors, and every later call copies its batch into them and replays.

A graph is kept per kind of call: the batch's shapes and dtypes, the learning rates (a capture fixes them), the
optimizer and its state, and a `variant` the algorithm names for steps that differ (TD3's update with and
without its delayed policy step). Random numbers drawn inside (the policy's samples) come from PyTorch's CUDA
generator, whose offset every replay advances as the eager calls would. A graph replays its kernels on the
tensors it was captured with: networks are loaded in place, and an optimizer state that `load_state_dict`
replaced makes a new kind of call (the algorithm calls `reset()` there to free the old graphs). The parameters a
replay writes get their version counters bumped, as `optimize` does after an eager step, so the CPU copies that
act (`rlfleet.device.acting`) see the new weights.

An update that reads a value on the host (`.item()`, a copy to the CPU) cannot be captured, and a capture that
fails leaves the process's CUDA state unusable (the caching allocator and the random generator stay in capture
mode). So the last warm-up call of each kind runs under PyTorch's sync debug mode: an update that synchronizes
there is never captured (one warning; it stays eager). A capture that fails all the same raises, naming the
setting that turns graphs off.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import Any, cast

import torch
from torch.autograd.graph import increment_version

from rlfleet.algos.contract import Metrics
from rlfleet.data.batch import Batch
from rlfleet.optim.step import gradient_hook

WARMUP = 3
"""Eager calls of each kind before its capture."""
KINDS = 8
"""Kinds of call a `StepGraph` captures at most; the calls of any further kind (batches of ever new sizes, a learning
rate changed at every update) run eagerly."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _leaves(batch: Batch) -> list[torch.Tensor]:
    """The batch's tensors, nested ones included, in a fixed order."""
    out: list[torch.Tensor] = []
    for value in batch.values():
        out.extend(_leaves(value) if isinstance(value, Batch) else [cast(torch.Tensor, value)])
    return out


def _watched(fn: Callable[[Batch], Metrics], batch: Batch) -> tuple[Metrics, list[warnings.WarningMessage]]:
    """`fn(batch)` under PyTorch's sync debug mode: its metrics, and the warnings of the operations in it that
    waited for the device (any other warning is shown as usual)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchronizing" in str(w.message)]
    for w in caught:
        if w not in syncs:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return out, syncs


class _Captured:
    """One captured graph: the static batch it reads, the metrics it writes, the parameters it steps."""

    def __init__(
        self,
        graph: torch.cuda.CUDAGraph,
        static: Batch,
        out: Metrics,
        stepped: list[torch.Tensor],
        optimizer: torch.optim.Optimizer,
    ):
        self.graph = graph
        self.holds = (optimizer, optimizer.state)  # alive while the graph is: their ids in its key stay theirs
        self.inputs = _leaves(static)
        self.out = out
        self.stepped = stepped

    def replay(self, batch: Batch) -> Metrics:
        for dst, src in zip(self.inputs, _leaves(batch), strict=True):
            dst.copy_(src, non_blocking=True)
        self.graph.replay()
        increment_version(self.stepped)
        # the metrics are overwritten by the next replay: the caller gets copies
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.out.items()}


class StepGraph:
    """Runs an update's device part `fn(batch) -> Metrics` eagerly, or, on CUDA, as a replayed CUDA graph."""

    def __init__(self, device: torch.device, enabled: bool = True, warmup: int = WARMUP):
        if warmup < 1:
            raise ValueError(f"a CUDA graph needs at least one eager call before its capture, got warmup={warmup}")
        self.on = enabled and device.type == "cuda"
        self.device = device  # the learner's: its streams are that GPU's (`cuda:1`), not the current device's
        self.warmup = warmup
        self.failed: str | None = None
        """Why the update is not captured (it synchronizes with the host: it stays eager); None while it may be."""
        self.captures = 0
        """Graphs captured so far (a reset or a new kind of call captures again)."""
        self._graphs: dict[Hashable, _Captured] = {}
        self._eager: dict[Hashable, int] = {}
        self._side: torch.cuda.Stream | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickled, deep-copied) starts without graphs: they belong to the tensors they were captured on."""
        return {**self.__dict__, "_graphs": {}, "_eager": {}, "_side": None}

    @property
    def optimizer_options(self) -> dict[str, Any]:
        """What the algorithm's optimizer is made with: `capturable` state (its step counts on the device), which a
        capture needs, from the first step on, so that the eager steps before it take the same kernels."""
        return {"capturable": True} if self.on else {}

    def reset(self, optimizer: torch.optim.Optimizer) -> None:
        """After `optimizer.load_state_dict`: forget the captured graphs (the next calls warm up and capture again on
        the tensors there are now), and make the optimizer as this graph needs it again. A checkpoint brings the
        options of the run that wrote it: `capturable` from a GPU run, which a learner on the CPU cannot step with,
        or not from a CPU run, which a capture needs, with its step counts on the parameters' device."""
        self._graphs.clear()
        self._eager.clear()
        for group in optimizer.param_groups:
            if "capturable" not in group:
                continue
            group["capturable"] = self.on
            for p in group["params"] if self.on else ():
                state = optimizer.state.get(p, {})
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].to(p.device)

    def __call__(
        self, fn: Callable[[Batch], Metrics], batch: Batch, optimizer: torch.optim.Optimizer, variant: Hashable = None
    ) -> Metrics:
        if not self.on or self.failed is not None or gradient_hook(optimizer) is not None:
            return fn(batch)  # an architecture's gradient hook is Python that runs between backward and step
        key = (
            variant,
            id(optimizer),
            id(optimizer.state),  # a new object after `load_state_dict`: its tensors are new too
            tuple(float(g["lr"]) for g in optimizer.param_groups),
            tuple((tuple(t.shape), t.dtype, t.device) for t in _leaves(batch)),
        )
        captured = self._graphs.get(key)
        if captured is None:
            if key not in self._eager and len(self._eager) >= KINDS:
                return fn(batch)
            eager = self._eager.get(key, 0)
            if eager < self.warmup:
                self._eager[key] = eager + 1
                return self._on_side_stream(fn, batch, watch=eager + 1 == self.warmup)
            captured = self._capture(fn, batch, optimizer, key)
        return captured.replay(batch)

    def _on_side_stream(self, fn: Callable[[Batch], Metrics], batch: Batch, watch: bool) -> Metrics:
        """`fn(batch)` on a stream of its own, ordered after and before the current stream's work (PyTorch's
        warm-up before a capture). `watch`: under sync debug mode, and if `fn` synchronizes with the host, it is
        never captured (`failed` says why)."""
        current, side = torch.cuda.current_stream(self.device), self._side_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            out, syncs = _watched(fn, batch) if watch else (fn(batch), [])
        current.wait_stream(side)
        if syncs:
            self.failed = f"it synchronizes with the host at {syncs[0].filename}:{syncs[0].lineno}"
            warnings.warn(
                f"the update cannot be replayed as a CUDA graph ({self.failed}); it runs without one",
                RuntimeWarning,
                stacklevel=4,
            )
        return out

    def _side_stream(self) -> torch.cuda.Stream:
        """The stream the warm-up calls and the captures run on: one, so that what the CUDA libraries set up per
        stream in the warm-up is there for the capture."""
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return self._side

    def _capture(
        self, fn: Callable[[Batch], Metrics], batch: Batch, optimizer: torch.optim.Optimizer, key: Hashable
    ) -> _Captured:
        static = batch.apply(lambda t: cast(torch.Tensor, t).clone())
        params = [p for g in optimizer.param_groups for p in g["params"]]
        versions = [p._version for p in params]  # the steps a capture records bump them (`optimize`)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream(self.device)
        try:
            # thread-local: a thread of an architecture (a sampler pinning memory) may use CUDA meanwhile
            with torch.cuda.graph(graph, stream=self._side_stream(), capture_error_mode="thread_local"):
                out = fn(static)
        except RuntimeError as e:
            torch.cuda.set_stream(stream)  # the capture's own stream stays current when ending it fails
            cause = e.__context__ or e  # capture_end's own error hides the operation that broke the capture
            raise RuntimeError(
                f"capturing the update as a CUDA graph failed ({_first_line(cause)}); "
                "train without graphs: --set cuda_graph=false"
            ) from e
        stepped = [p for p, v in zip(params, versions, strict=True) if p._version != v]
        captured = self._graphs[key] = _Captured(graph, static, out, stepped, optimizer)
        self.captures += 1
        return captured
