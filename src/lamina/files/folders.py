"""Folders lamina builds (rule 4 of lamina.files): built beside their final name, swapped in
once complete, and replaced only when lamina wrote them (the MARKER file) or they are empty.

    build_folder(out, build, kind=, force=, inputs=)   rule 4
    check_output_folder(out, force=, inputs=)          what build_folder would refuse, up front
    mark_folder(folder, kind) / is_lamina_folder(folder)   the marker

Deliberately unaware of what goes into a folder (the `build` callback's business).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lamina.errors import LaminaError
from lamina.files.output_rule import (
    Inputs,
    atomic_write,
    check_writable,
    fsync_dir,
    real_path,
    refuse_overlap,
)

MARKER = ".lamina"  # left in every folder lamina builds: `--force` replaces only those


def mark_folder(folder: str | os.PathLike[str], kind: str) -> None:
    """Leave the marker that says lamina wrote `folder` (what `--force` may replace)."""
    atomic_write(Path(folder) / MARKER, lambda f: f.write(f"written by lamina: {kind}\n".encode()))


def is_lamina_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether `folder` holds the marker lamina leaves in what it builds."""
    return (Path(folder) / MARKER).is_file()


def check_output_folder(
    out: str | os.PathLike[str], *, force: bool, inputs: Inputs = (), flag: str = "--out"
) -> Path:
    """Rules 2 and 4 before any work: refuse what `build_folder` would refuse; the real path."""
    p = Path(out)
    if str(out) == "":
        raise LaminaError(f"{flag} must name a folder, got an empty string")
    refuse_overlap(p, inputs, flag)
    target = real_path(p)
    if target.exists() and not target.is_dir():
        raise LaminaError(f"{flag} {p} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()):
        if not is_lamina_folder(target):
            raise LaminaError(
                f"{flag} {p} holds files lamina did not write; pick a new folder "
                "(--force replaces only a folder lamina wrote)"
            )
        if not force:
            raise LaminaError(f"{flag} {p} already exists; pick a new folder or pass --force")
    check_writable(target, flag, shown=p)
    return target


def build_folder(
    out: str | os.PathLike[str],
    build: Callable[[Path], Any],
    *,
    kind: str,
    force: bool = False,
    inputs: Inputs = (),
    flag: str = "--out",
) -> Path:
    """Call ``build(tmp)`` on a new folder beside `out`, mark it, then swap it into place.

    An existing `out` (a symlink: its target) is replaced only once the new folder is complete,
    only with `force`, and only if lamina wrote it or it is empty. A failure (an error, a full
    disk, Ctrl-C) removes the new folder and leaves `out` as it was.
    """
    target = check_output_folder(out, force=force, inputs=inputs, flag=flag)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    old: Path | None = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        build(tmp)
        mark_folder(tmp, kind)
        check_output_folder(out, force=force, inputs=inputs, flag=flag)  # still ours to replace
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / "previous")
        os.replace(tmp, target)
    except BaseException:
        if old is not None and not target.exists():
            os.replace(old / "previous", target)
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(target.parent)
    return Path(out)
