"""Compile decode.c once per machine and load it: `library()` -> ctypes.CDLL, or None.

The C source ships with the package; the shared library is built on first use with the
system's C compiler (`$CC`, else `cc` or `gcc`) into a cache folder, named by a hash of the
source and the flags, so an edited source or a new flag builds a new file and a second process
reuses the first one's build (it takes about a second). The build writes a temporary file and
renames it into place, so processes starting together never load a half-written library.

Where it cannot, `library()` is None and `reason()` says why: no compiler or a failed build.
Whether to build at all (the platform, the CPU's flags, the user's choice) is lamina.cpu's
question, asked before this one; callers then use PyTorch: the native step is an
accelerator, never a requirement.

    LAMINA_CACHE_DIR=PATH     where built libraries go (default $XDG_CACHE_HOME/lamina or
                              ~/.cache/lamina), in a `native` subfolder

Deliberately unaware of models: it compiles and loads a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).with_name("decode.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared")
ABI_VERSION = 2  # lm_abi_version() of the source this module's structs match

_lock = threading.Lock()
_state: dict[str, object] = {}


def cache_dir() -> Path:
    root = os.environ.get("LAMINA_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    base = Path(root) if root else Path.home() / ".cache"
    return (base if os.environ.get("LAMINA_CACHE_DIR") else base / "lamina") / "native"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or cc
    return shutil.which("cc") or shutil.which("gcc")


def _build(cc: str) -> Path:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join((cc, *FLAGS)).encode()).hexdigest()[:16]
    folder = cache_dir()
    target = folder / f"decode-{key}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise OSError(f"{cc} failed: {done.stderr.strip().splitlines()[-1:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _declare(lib: ctypes.CDLL) -> None:
    """The C functions' signatures (structs pass as addresses)."""
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.lm_step.argtypes = [p, i, p, p, p, p, p, p, i]
    lib.lm_linear.argtypes = [p, i, p, p, i]
    lib.lm_step.restype = lib.lm_linear.restype = i


def library() -> ctypes.CDLL | None:
    """The loaded library (built first if needed), or None where it cannot be; see reason()."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]  # type: ignore[return-value]
        lib, why = None, None
        cc = _compiler()
        if cc is None:
            why = "no C compiler (set CC, or install gcc)"
        else:
            try:
                lib = ctypes.CDLL(str(_build(cc)))
                if lib.lm_abi_version() != ABI_VERSION:
                    lib, why = None, "the built library does not match this lamina"
                else:
                    _declare(lib)
            except (OSError, subprocess.SubprocessError) as e:
                why = f"could not build the native step: {e}"
        _state["lib"], _state["reason"] = lib, why
        return lib


def reason() -> str | None:
    """Why `library()` is None (None when it loads)."""
    library()
    return _state.get("reason")  # type: ignore[return-value]


def reset() -> None:
    """Forget the loaded state, so the next `library()` looks again (tests, env changes)."""
    with _lock:
        _state.clear()
