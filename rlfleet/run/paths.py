"""Checks of the folders and files a command writes, made before it writes anything: one `ConfigError` line
for a file where a folder must go (or the reverse), a folder that cannot be written, an existing file the
command did not write.

`what` names the path in the message as the user gave it (`--logdir`, `-o`, `run folder`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from rlfleet.fields import ConfigError


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists (for a relative path, at worst `.`)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(".")


def _check_writable_folder(path: Path, what: str) -> None:
    """The folder `path` exists or can be made (with its parents) by this user."""
    existing = _nearest_existing(path)
    if not existing.is_dir():
        if existing == path:
            raise ConfigError(f"{what} {path} is a file, not a folder")
        raise ConfigError(f"{what} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        shown = "" if existing == path else f" ({existing} is not writable)"
        raise ConfigError(f"{what} {path} is not writable{shown}")


def check_output_folder(path: str | Path, what: str) -> Path:
    """A folder the command writes into, made with its parents if missing: not a file, not below a file,
    writable. An empty name is refused: it would be the current folder, which was not asked for."""
    check_named(path, what, "give a folder to write into")
    path = Path(path)
    _check_writable_folder(path, what)
    return path


def check_named(path: str | Path, what: str, hint: str) -> None:
    """An output path the user gave empty is one `ConfigError` (`hint`: what to give instead): `Path("")` would be the
    current folder, which was not asked for."""
    if isinstance(path, str) and not path.strip():
        raise ConfigError(f"{what} is empty: {hint}")


def check_output_file(
    path: str | Path, what: str, ours: Callable[[Path], bool] | None = None, kind: str = "a file this command wrote"
) -> Path:
    """A file the command writes (its missing parent folders are made): not a folder, not below a file, in a
    writable folder; an existing file is replaced only if `ours(path)` says the command wrote it (`kind`
    names such a file in the message)."""
    check_named(path, what, "give the name of a file to write")
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder; give the name of a file to write")
    existing = _nearest_existing(path.parent)
    if not existing.is_dir():
        raise ConfigError(f"{what} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path} is not writable ({existing} is not writable)")
    if path.exists():
        if ours is not None and not ours(path):
            raise ConfigError(f"{what} {path} exists and is not {kind}; refusing to overwrite it")
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{what} {path} is not writable")
    return path


def name_part(text: str) -> str:
    """`text` as a part of a folder name: every run of characters other than letters, digits, `.`, `_` and `-` one
    `_` (`ALE/Pong-v5` -> `ALE_Pong-v5`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)
