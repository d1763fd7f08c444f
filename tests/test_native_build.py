"""lamina.native.build trusts nothing: the folder, the file before it loads, the loaded ABI.

One real build per module (the session's, copied); the other cases reuse it through a stand-in
compiler that copies it, so each case checks the loader's rules without compiling again.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lamina.native.structs  # noqa: F401  (its import declares the structs the loader checks)
from lamina.native import build

pytestmark = pytest.mark.skipif(
    build._compiler() is None or not sys.platform.startswith("linux"),
    reason="needs a C compiler on Linux",
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder for one test; the loader's state is forgotten before and after."""
    monkeypatch.setenv("LAMINA_CACHE_DIR", str(tmp_path / "cache"))
    build.reset()
    yield tmp_path / "cache" / "native"
    build.reset()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A real build (its .so path and key), made once for the module: a copy of the test
    session's own build (tests/conftest.py gives the session a fresh cache folder, so that one
    was compiled in this session too), or a build of its own where the session has none."""
    folder = tmp_path_factory.mktemp("built") / "native"
    folder.mkdir(mode=0o700)
    cc = build._compiler()
    key = build.key_of(cc)
    session_lib = build.cache_dir() / f"decode-{key}.so"
    if build.library() is not None and session_lib.is_file():
        shutil.copyfile(session_lib, folder / session_lib.name)
    else:
        build._build(cc, key, folder)
    return folder / f"decode-{key}.so", key


@pytest.fixture
def fake_cc(built, monkeypatch):
    """The compiler, replaced by a copy of the module's build; counts its runs."""
    runs = []

    def run(args):
        runs.append(args)
        shutil.copyfile(built[0], args[args.index("-o") + 1])
        return 0, ""

    monkeypatch.setattr(build, "_run_compiler", run)
    return runs


def test_a_build_is_checked_recorded_and_private(cache, fake_cc, built):
    assert build.library() is not None, build.reason()
    target = cache / f"decode-{built[1]}.so"
    record = target.with_suffix(".sha256")
    assert record.read_text().strip() == build._sha256(target)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert len(fake_cc) == 1
    build.reset()
    assert build.library() is not None and len(fake_cc) == 1  # reused, not rebuilt


def test_no_compiler_is_a_reason(cache, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert build.library() is None
    assert build.reason() == "no C compiler (set CC, or install gcc)"


def test_a_cache_that_cannot_be_written_is_a_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("LAMINA_CACHE_DIR", "/proc/lamina-test-cache")  # read-only, even for root
    build.reset()
    try:
        assert build.library() is None
        assert "cannot make the cache folder /proc/lamina-test-cache/native" in build.reason()
        if os.getuid() != 0:  # a folder without write permission (root writes anyway)
            (tmp_path / "ro" / "native").mkdir(parents=True, mode=0o500)
            monkeypatch.setenv("LAMINA_CACHE_DIR", str(tmp_path / "ro"))
            build.reset()
            assert build.library() is None and "cannot write" in build.reason()
    finally:
        build.reset()


def test_a_folder_others_can_write_or_own_is_refused(cache, fake_cc):
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    assert build.library() is None
    assert build.reason().endswith("is refused: others can write to it")
    assert not fake_cc
    if os.getuid() == 0:
        cache.chmod(0o700)
        os.chown(cache, 4321, -1)
        build.reset()
        assert build.library() is None
        assert build.reason().endswith("is refused: it belongs to user 4321")


def test_a_planted_library_is_not_loaded_but_rebuilt(cache, fake_cc, built, tmp_path):
    """A file under the build's name without the build's record: its constructor must not
    run (dlopen would run it), and a real build replaces it."""
    marker = tmp_path / "constructor-ran"
    src = tmp_path / "planted.c"
    src.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void f(void) "
        f'{{ FILE *o = fopen("{marker}", "w"); if (o) fclose(o); }}\n'
        "int lm_build_key(void) { return 0; }\n"
    )
    cache.mkdir(parents=True, mode=0o700)
    target = cache / f"decode-{built[1]}.so"
    subprocess.run([build._compiler(), "-shared", "-fPIC", "-o", str(target), str(src)], check=True)
    assert build.library() is not None, build.reason()
    assert not marker.exists(), "the planted library's constructor ran"
    assert build._sha256(target) == build._sha256(built[0]) and len(fake_cc) == 1


def test_a_recorded_file_that_does_not_load_is_removed_and_rebuilt(cache, fake_cc, built):
    cache.mkdir(parents=True, mode=0o700)
    target = cache / f"decode-{built[1]}.so"
    target.write_bytes(b"not a library")
    target.with_suffix(".sha256").write_text(build._sha256(target))
    assert build.library() is not None, build.reason()
    assert build._sha256(target) == build._sha256(built[0]) and len(fake_cc) == 1


def test_a_stale_abi_is_refused_and_not_kept(cache, fake_cc, monkeypatch, built):
    class Lin(ctypes.Structure):  # one field fewer than decode.c's Lin
        _fields_ = [(n, ctypes.c_int32) for n in ("kind", "n", "k", "gs")] + [
            (n, ctypes.c_void_p) for n in ("w", "s", "mn")
        ]

    real = ctypes.sizeof(build._layout["Lin"])  # decode.c's Lin grows as fields are added
    monkeypatch.setitem(build._layout, "Lin", Lin)
    assert build.library() is None
    why = build.reason()
    assert "structs differ" in why and f"Lin (C {real}, ctypes 40)" in why and "Lin.bias" in why
    assert not (cache / f"decode-{built[1]}.so").exists()  # not kept under its final name
    assert len(fake_cc) == 1


def test_a_library_from_another_source_is_refused(cache, fake_cc, monkeypatch):
    monkeypatch.setattr(build, "key_of", lambda cc: "0123456789abcdef")
    assert build.library() is None
    assert "not built from this lamina's source" in build.reason()


def test_old_builds_are_removed(cache, fake_cc, built):
    cache.mkdir(parents=True, mode=0o700)
    old = [cache / "decode-0000000000000000.so", cache / "decode-0000000000000000.sha256"]
    stale, fresh = cache / ".tmp-stale.so", cache / ".tmp-fresh.so"
    for p in [*old, stale, fresh]:
        p.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert build.library() is not None, build.reason()
    assert not any(p.exists() for p in [*old, stale]) and fresh.exists()


def test_a_hanging_compiler_is_stopped_with_its_children(cache, monkeypatch, tmp_path):
    pid_file = tmp_path / "child.pid"
    cc = tmp_path / "cc"
    cc.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pid_file}\nwait\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setattr(build, "COMPILE_TIMEOUT_S", 0.5)
    assert build.library() is None
    assert "took over 0.5 s and was stopped" in build.reason()
    child = int(pid_file.read_text())
    deadline = time.time() + 5
    while time.time() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the compiler's child was left running"
    assert not list(Path(cache).glob("decode-*"))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state not in "ZX"
