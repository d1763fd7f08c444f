"""Compile decode.c once per machine and load it, trusting nothing: `library()` -> CDLL or None.

The C source ships with the package; the shared library is built on first use with the
system's C compiler (`$CC`, else `cc` or `gcc`) into a cache folder, named by a key (a hash of
the source, the compiler and the flags), so an edited source or a new flag builds a new file
and a second process reuses the first one's build (about a second). What is checked, in order:

  * the folder: created 0700; refused if it is a link, another user owns it, or anyone but its
    owner can write to it (a planted library would run its constructors in this process);
  * the file, BEFORE it is loaded (dlopen runs a library's constructors): owned by this user,
    writable by no one else, and its SHA-256 equal to the record the build wrote beside it
    (`decode-KEY.sha256`); a file that fails any check is rebuilt in its place;
  * the loaded library: `lm_build_key()` must be the key it was built for, and `lm_layout()`
    (the sizes and field offsets of its structs, from sizeof/offsetof) must equal those of the
    ctypes structs that lamina.native.structs declares through `expect_layout`; a library that
    fails to load or to match is removed and built once more, then refused.

The compiler runs in its own process group under a timeout; a compiler that hangs is killed
with its children. A build writes temporary files and renames them into place, so processes
starting together never load a half-written library; older builds in the folder are removed.

Where it cannot run, `library()` is None and `reason()` says why. Whether to build at all is
asked before this one: `platform_missing()` here (x86-64 Linux with AVX2, FMA and F16C, from
`cpu_flags()`; lamina.cpu and the torch-free runtime both ask it), the user's choice in lamina.cpu.

    LAMINA_CACHE_DIR=PATH     where built libraries go (default $XDG_CACHE_HOME/lamina or
                              ~/.cache/lamina), in a `native` subfolder

Deliberately unaware of models: it compiles, checks and loads a file (a leaf: it imports
nothing of lamina).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import os
import platform
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("decode.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared")
COMPILE_TIMEOUT_S = 120.0

_lock = threading.Lock()
_state: dict[str, object] = {}
_layout: dict[str, type[ctypes.Structure]] = {}


class BuildError(OSError):
    """Why the library cannot be built or trusted here (its message is the reason)."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return frozenset(next((ln for ln in f if ln.startswith("flags")), "").split()[2:])
    except OSError:
        return frozenset()


def platform_missing() -> str | None:
    """Why decode.c cannot run on this platform (None: it can)."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the native step is for x86-64 Linux, not {platform.system()} {platform.machine()}"
    missing = {"avx2", "fma", "f16c"} - cpu_flags()  # F16C: the GGML blocks' fp16 scales
    return f"this CPU lacks {' and '.join(sorted(missing))}" if missing else None


def expect_layout(**structs: type[ctypes.Structure]) -> None:
    """Declare the ctypes structs (by their C names) that the library's own must match."""
    _layout.update(structs)


def cache_dir() -> Path:
    root = os.environ.get("LAMINA_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    base = Path(root) if root else Path.home() / ".cache"
    return (base if os.environ.get("LAMINA_CACHE_DIR") else base / "lamina") / "native"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc")


def key_of(cc: str) -> str:
    """The build's key: the source, the compiler and the flags."""
    return hashlib.sha256(SOURCE.read_bytes() + " ".join((cc, *FLAGS)).encode()).hexdigest()[:16]


def _not_ours(st: os.stat_result) -> str | None:
    if st.st_uid != os.getuid():
        return f"it belongs to user {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "others can write to it"
    return None


def _folder() -> Path:
    """The cache folder, created 0700, refused unless it is this user's alone."""
    folder = cache_dir()
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        st = folder.lstat()
    except OSError as e:
        raise BuildError(f"cannot make the cache folder {folder}: {e.strerror or e}") from e
    why = "it is a link" if stat.S_ISLNK(st.st_mode) else _not_ours(st)
    if why:
        raise BuildError(f"the cache folder {folder} is refused: {why}")
    return folder


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _trusted(target: Path, record: Path) -> bool:
    """Whether target is this user's build as recorded (checked before it is loaded)."""
    try:
        st = target.lstat()
        if not stat.S_ISREG(st.st_mode) or _not_ours(st):
            return False
        return record.read_text(encoding="ascii").strip() == _sha256(target)
    except OSError:
        return False


def _run_compiler(args: list[str]) -> tuple[int, str]:
    """Run the compiler in its own process group; past the timeout the group is killed."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise BuildError(f"{args[0]} took over {COMPILE_TIMEOUT_S:g} s and was stopped") from None
    return proc.returncode, err


def _write_temp(folder: Path, data: bytes, suffix: str) -> str:
    fd, tmp = tempfile.mkstemp(suffix=suffix, prefix=".tmp-", dir=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return tmp


def _build(cc: str, key: str, folder: Path) -> None:
    """Compile into temporary files, then rename the library and its record into place."""
    target, record = folder / f"decode-{key}.so", folder / f"decode-{key}.sha256"
    try:
        fd, tmp = tempfile.mkstemp(suffix=".so", prefix=".tmp-", dir=folder)
    except OSError as e:
        raise BuildError(f"cannot write to the cache folder {folder}: {e.strerror}") from e
    os.close(fd)
    tmp_record = None
    try:
        code, err = _run_compiler(
            [cc, *FLAGS, f'-DLM_BUILD_KEY="{key}"', "-o", tmp, str(SOURCE), "-lm"]
        )
        if code != 0:
            raise BuildError(f"{cc} failed: {err.strip().splitlines()[-1:]}")
        os.chmod(tmp, 0o700)
        tmp_record = _write_temp(folder, _sha256(Path(tmp)).encode() + b"\n", ".sha256")
        os.replace(tmp_record, record)
        os.replace(tmp, target)
    finally:
        for t in (tmp, tmp_record):
            if t and os.path.exists(t):
                os.unlink(t)


def _remove_old(folder: Path, key: str, stale_s: float = 3600.0) -> None:
    """Remove other keys' builds, and temporary files older than stale_s (a killed build's)."""
    now = time.time()
    for p in folder.iterdir():
        old_build = p.name.startswith("decode-") and not p.name.startswith(f"decode-{key}.")
        old_temp = p.name.startswith(".tmp-") and now - p.lstat().st_mtime > stale_s
        if old_build or old_temp:
            try:
                p.unlink()
            except OSError:
                pass


class _Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_int64)]


def layout_of(structs: dict[str, type[ctypes.Structure]]) -> dict[str, int]:
    """{"Lin": size, "Lin.kind": offset, ...} of ctypes structs, as lm_layout() lists C's."""
    out: dict[str, int] = {}
    for name, s in structs.items():
        out[name] = ctypes.sizeof(s)
        out |= {f"{name}.{f[0]}": getattr(s, f[0]).offset for f in s._fields_}
    return out


def _library_layout(lib: ctypes.CDLL) -> dict[str, int]:
    lib.lm_layout.restype = ctypes.POINTER(_Entry)
    entries, out = lib.lm_layout(), {}
    for i in range(10_000):
        if entries[i].name is None:
            return out
        out[entries[i].name.decode()] = entries[i].value
    raise BuildError("the library's layout table has no end")


def _check(lib: ctypes.CDLL, key: str) -> None:
    lib.lm_build_key.restype = ctypes.c_char_p
    if lib.lm_build_key() != key.encode():
        raise BuildError("the library was not built from this lamina's source")
    if not _layout:
        raise BuildError("lamina.native.structs has not declared its structs (expect_layout)")
    c, py = _library_layout(lib), layout_of(_layout)
    differ = sorted(n for n in c.keys() | py.keys() if c.get(n) != py.get(n))
    if differ:
        shown = ", ".join(f"{n} (C {c.get(n)}, ctypes {py.get(n)})" for n in differ[:4])
        raise BuildError(f"the library's structs differ from lamina's: {shown}")


def _declare(lib: ctypes.CDLL) -> None:
    """The C functions' signatures (structs pass as addresses)."""
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.lm_step.argtypes = [p, i, p, p, p, p, p, p, i]
    lib.lm_step_last.argtypes = [p, i, p, p, p, p, p, p, i, i]
    lib.lm_linear.argtypes = lib.lm_linear_bf16.argtypes = [p, i, p, p, i]
    lib.lm_linear_i8.argtypes = lib.lm_linear.argtypes
    lib.lm_dequant.argtypes = [i, p, i, i, p]
    lib.lm_dequant_bf16.argtypes = [i, p, i, i, p, i]
    lib.lm_dequant_i8_bf16.argtypes = [p, p, i, i, i, p, i]
    lib.lm_dequant_i8.argtypes = [i, p, p, p, i, i, i, p, p, p, p, i, p, i, i, p, p, p, i]
    lib.lm_colmax_i8.argtypes = [i, p, p, p, i, i, i, p, i]
    lib.lm_colmax.argtypes = [p, i, i, p, i]
    lib.lm_quant_rows_i8.argtypes = [p, i, i, p, p, p, i, p, p, i]
    lib.lm_i8_scale.argtypes = [p, p, p, p, i, i, p, p, i]
    lib.lm_pack16.argtypes = lib.lm_unpack16.argtypes = [p, p, p, p]
    lib.lm_kq_pack16.argtypes = [p, p, i]
    lib.lm_pack_i8.argtypes = [p, p, p]
    lib.lm_dequant_lanes_bf16.argtypes = [i, p, i, i, p, i]
    lib.lm_prefill_attention.argtypes = [p, p, p, p, *[i] * 6, ctypes.c_float, p, i]
    lib.lm_prefill_attention_bf16.argtypes = lib.lm_prefill_attention.argtypes
    lib.lm_train_attention_fwd.argtypes = [*[p] * 5, *[i] * 5, ctypes.c_float, i, p, i]
    lib.lm_train_attention_bwd.argtypes = [*[p] * 8, *[i] * 5, ctypes.c_float, i, p, i]
    lib.lm_tatt_wide.argtypes = [i]
    for name in ("lm_step", "lm_step_last", "lm_linear", "lm_linear_bf16", "lm_linear_i8", "lm_dequant", "lm_dequant_bf16",
                 "lm_dequant_i8_bf16", "lm_pack16", "lm_unpack16", "lm_kq_pack16", "lm_pack_i8",
                 "lm_dequant_lanes_bf16",
                 "lm_prefill_attention", "lm_prefill_attention_bf16", "lm_train_attention_fwd", "lm_train_attention_bwd",
                 "lm_tatt_wide", "lm_dequant_i8", "lm_colmax_i8", "lm_colmax",
                 "lm_quant_rows_i8", "lm_i8_scale"):  # fmt: skip
        getattr(lib, name).restype = i


def _open(target: Path, record: Path, key: str) -> ctypes.CDLL:
    """Load a build that was checked first, and check what it says of itself; a build that
    fails is removed (never kept under its final name)."""
    if not _trusted(target, record):
        raise BuildError(f"the build {target.name} is not the one recorded beside it")
    try:
        lib = ctypes.CDLL(str(target))
        _check(lib, key)
    except (OSError, AttributeError) as e:
        for p in (target, record):
            p.unlink(missing_ok=True)
        raise BuildError(f"the built library does not load or match: {e}") from e
    _declare(lib)
    return lib


def _load(cc: str) -> ctypes.CDLL:
    key, folder = key_of(cc), _folder()
    target, record = folder / f"decode-{key}.so", folder / f"decode-{key}.sha256"
    if _trusted(target, record):
        try:
            return _open(target, record, key)
        except BuildError:
            pass  # removed: built again below
    _build(cc, key, folder)
    _remove_old(folder, key)
    return _open(target, record, key)


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
                if not _layout:  # the structs _check compares (their module calls expect_layout)
                    importlib.import_module("lamina.native.structs")
                lib = _load(cc)
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
