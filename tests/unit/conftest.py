"""Fixtures of the unit tests: `meta_device`, which accepts `--device meta`, and `meta_learner`, which stands in
for a GPU's host reads of a learner on PyTorch's `meta` device (`test_device.py`, `test_device_inputs.py`)."""

from __future__ import annotations

import pytest
import torch

import rlfleet.device

T = torch.Tensor


def _host_zeros(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype)


@pytest.fixture
def meta_device(monkeypatch):
    """`--device meta` accepted, as a run option (it is the tests' own: refused otherwise)."""
    monkeypatch.setattr(rlfleet.device, "TEST_DEVICES", frozenset({"meta"}))


@pytest.fixture
def meta_learner(meta_device, monkeypatch):
    """Reads of a meta tensor's values from the host (`.item()`, `.cpu()`, `.to("cpu")`, a copy into a CPU tensor,
    `int()`, `bool()`) give zeros, as a GPU would give its values. Yields the number of `.item()`, `float()`,
    `int()`, `.cpu()` and `.tolist()` reads so far (a list of one count)."""
    reads = [0]
    orig = {
        name: getattr(T, name) for name in ("item", "cpu", "to", "copy_", "tolist", "__float__", "__int__", "__bool__")
    }

    def to(self, *args, **kwargs):
        if self.is_meta:
            target = kwargs.get("device", args[0] if args and isinstance(args[0], str | torch.device) else None)
            if target is not None and torch.device(target).type == "cpu":
                dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
                out = _host_zeros(self)
                return out if dtype is None else out.to(dtype)
        return orig["to"](self, *args, **kwargs)

    def copy_(self, src, *args, **kwargs):
        if isinstance(src, T) and src.is_meta and not self.is_meta:
            return self.zero_()
        return orig["copy_"](self, src, *args, **kwargs)

    def read(name):
        def reading(self, *a, **k):
            reads[0] += self.is_meta
            return orig[name](_host_zeros(self) if self.is_meta else self, *a, **k)

        return reading

    patches = {name: read(name) for name in ("item", "cpu", "tolist", "__float__", "__int__")}
    patches |= {"to": to, "copy_": copy_, "__bool__": lambda self: True if self.is_meta else orig["__bool__"](self)}
    for name, fn in patches.items():
        monkeypatch.setattr(T, name, fn)
    return reads
