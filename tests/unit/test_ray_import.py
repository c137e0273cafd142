"""`--backend ray` without Ray: one `ConfigError` naming the extra, also where something else answers to `import ray`
(a folder named ray on the import path is a namespace package, not Ray)."""

from __future__ import annotations

import sys
import types

import pytest

from rlfleet.backends.ray_instance import LOOPBACK_ENV, import_ray
from rlfleet.fields import ConfigError


@pytest.fixture(autouse=True)
def _keep_the_loopback_setting(monkeypatch):
    monkeypatch.setenv(LOOPBACK_ENV, "0")  # import_ray sets it for a private instance: restored afterwards


def test_without_ray_the_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"needs Ray, an extra: pip install -e '\.\[ray\]'$"):
        import_ray(private=True)


def test_a_folder_named_ray_is_not_taken_for_ray(tmp_path, monkeypatch):
    folder = types.ModuleType("ray")
    folder.__path__ = [str(tmp_path / "ray")]  # what `import ray` gives for a folder ray/ without Ray installed
    monkeypatch.setitem(sys.modules, "ray", folder)
    with pytest.raises(ConfigError, match=r"needs Ray, an extra.*'import ray' found .*/ray, which is not Ray"):
        import_ray(private=True)
