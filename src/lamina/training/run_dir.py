"""The run directory: what a training run writes, and how a checkpoint is made crash-proof.

    run/
      train_config.json      resolved training config + command line (written at start)
      config.json            model config     \
      model.safetensors      model weights     |  `lamina.load(run)` reads these three
      tokenizer.json         tokenizer         /
      labels.json            a classifier's label names (id = index)
      optimizer.safetensors  AdamW moments (tensors) + optimizer.json (hyperparameters)
      trainer_state.json     step, tokens seen, RNG states, sampler position, budget used
      metrics.jsonl          one JSON object per logged step / evaluation
      loss.png               train and validation curves
      confusion.png          a classifier's validation confusion matrix
      .lock                  the pid of the process that trains in it (flock-ed while it runs)

Every file is written atomically (temp file, fsync, rename). A checkpoint is several files, so
it is staged: all of them are written into `.checkpoint-tmp/`, a `READY` marker is written
last, and only then are they renamed into place (trainer_state.json last). A crash before
READY leaves the previous checkpoint untouched (the stage is discarded on the next open); a
crash after READY is rolled forward on the next open. A full disk or a permission error
becomes a LaminaError that says whether a previous checkpoint is intact (and which step).

One run directory has one writer: `create` and `open` take an exclusive `fcntl.flock` on
`.lock` (kept for the life of the RunDir; the kernel drops it when the process dies) and write
the holder's pid into it; a second process is refused in one line naming that pid. `release()`
empties the file, so a pid still in it when the lock is next taken names a process that died
(`stale_pid`, for the caller to report). Within one process a run already locked may be opened
again (a test, or a resume after a run in the same Python session): the lock is shared, not
taken twice. Metrics are written as strict JSON: a NaN or infinite
value becomes null.

    RunDir.create(path, force) / RunDir.open(path)     a fresh run / an existing one (recovered),
                                                       both locked (lock=False: read only)
    release()                                          give the lock back
    write_train_config(data) / read_train_config()
    write_checkpoint(write_model, (tensors, meta), state) / read_checkpoint()
    write_metrics(records) / read_metrics(up_to_step) ; write_bytes(name, blob)

Deliberately unaware of models, optimizers and training: it moves files and JSON (what goes into
a checkpoint is `session.save_checkpoint`'s business).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor

from lamina.checkpoint import load_tensors, save_tensors
from lamina.errors import LaminaError
from lamina.files import atomic_write, fsync_dir, read_json, write_json

STAGE = ".checkpoint-tmp"
READY = "READY"
CHECKPOINT_FILES = (
    "model.safetensors",
    "adapters.safetensors",  # a LoRA run: the adapters instead of the model
    "tokenizer.json",
    "optimizer.safetensors",
    "optimizer.json",
    "labels.json",  # a classifier's label names
    "config.json",
    "trainer_state.json",  # last: its step is the commit point
)
RUN_FILES = (*CHECKPOINT_FILES, "train_config.json", "metrics.jsonl", "loss.png", "confusion.png")
LOCK = ".lock"


class _Lock:
    """An open, flock-ed lock file; shared by the RunDirs of one process on one folder."""

    def __init__(self, fd: int, key: tuple[int, int]) -> None:
        self.fd: int | None = fd
        self.key = key

    def close(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)  # closing the last descriptor drops the flock
        self.fd = None
        if _HELD.get(self.key) is self:
            del _HELD[self.key]


_HELD: dict[tuple[int, int], _Lock] = {}  # (device, inode) of a run folder -> this process's lock


def _os_message(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _finite_json(record: dict[str, Any]) -> dict[str, Any]:
    """NaN / infinity -> None: metrics.jsonl stays strict JSON."""
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()
    }


class RunDir:
    """A run directory on disk; see the module docstring for its layout."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.stale_pid: int | None = None  # set by lock(): a holder that died without release
        self._lock: _Lock | None = None

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike[str], *, force: bool = False) -> RunDir:
        """A fresh, locked run directory; refuses one that holds anything else unless `force`.

        Without `force` nothing is removed; with it, only lamina's own run files are.
        """
        p = Path(path)
        if str(path) == "":
            raise LaminaError("--out must name a folder, got an empty string")
        if p.exists() and not p.is_dir():
            raise LaminaError(f"--out {p} exists and is not a folder")
        try:
            if not p.is_dir():
                p.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LaminaError(f"cannot write to --out {p}: {_os_message(exc)}") from exc
        run = cls(p)
        run.lock()  # before looking inside: a second process must not see an empty folder
        try:
            entries = sorted(e.name for e in p.iterdir() if e.name != LOCK)
            if entries and not force:
                what = "a training run" if "train_config.json" in entries else "other files"
                raise LaminaError(
                    f"--out {p} already holds {what}; pass --force to overwrite, or "
                    f"--resume {p} to continue a run"
                )
            try:
                for name in RUN_FILES if entries else ():  # clear our own files, never the user's
                    if (p / name).is_file():
                        (p / name).unlink()
                if (p / STAGE).is_dir():
                    shutil.rmtree(p / STAGE)
                probe = p / ".write-test"
                probe.write_bytes(b"ok")
                probe.unlink()
            except OSError as exc:
                raise LaminaError(f"cannot write to --out {p}: {_os_message(exc)}") from exc
        except BaseException:
            run.release()
            raise
        return run

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, lock: bool = True) -> RunDir:
        """An existing run with at least one checkpoint (a staged one is finished or dropped).

        lock=False: for a process that only reads it (ranks other than 0 under torchrun).
        """
        p = Path(path)
        if str(path) == "":
            raise LaminaError("--resume must name a run folder, got an empty string")
        if not p.is_dir():
            raise LaminaError(f"--resume {p}: no such folder")
        if not (p / "train_config.json").is_file():
            raise LaminaError(f"--resume {p} is not a lamina run (no train_config.json)")
        run = cls(p)
        if lock:
            run.lock()
        try:
            if lock:
                run.recover()
            if not (p / "trainer_state.json").is_file():
                raise LaminaError(
                    f"--resume {p}: the run stopped before its first checkpoint; start it "
                    "again with --force"
                )
        except BaseException:
            run.release()
            raise
        return run

    # -- the lock ------------------------------------------------------------------------------
    def lock(self) -> None:
        """Take the run's exclusive lock (or refuse, naming the pid that holds it)."""
        import fcntl

        path = self.path / LOCK
        try:
            st = os.stat(self.path)
            key = (st.st_dev, st.st_ino)
            if key in _HELD:  # this process holds it already
                self._lock = _HELD[key]
                return
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LaminaError(f"cannot write to {self.path}: {_os_message(exc)}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise LaminaError(
                f"{self.path} is in use by another lamina train ({who}); wait for it to "
                "finish or choose another folder"
            ) from None
        self.stale_pid = _read_pid(fd)  # a pid left in the file: its process died holding it
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise LaminaError(f"cannot write to {self.path}: {_os_message(exc)}") from exc
        self._lock = _HELD[key] = _Lock(fd, key)

    def release(self) -> None:
        """Empty the lock file (a clean exit) and give the lock back; safe to call twice."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def recover(self) -> None:
        """Finish a checkpoint that was READY when the process died, or drop an unfinished one."""
        stage = self.path / STAGE
        if not stage.is_dir():
            return
        if (stage / READY).is_file():
            self._commit(stage)
        shutil.rmtree(stage, ignore_errors=True)

    # -- writing -------------------------------------------------------------------------------
    def write_train_config(self, data: dict[str, Any]) -> None:
        self._guard(lambda: write_json(self.path / "train_config.json", data), "the run config")

    def read_train_config(self) -> dict[str, Any]:
        data = read_json(self.path / "train_config.json")
        if not isinstance(data, dict) or "train" not in data:
            raise LaminaError(f"{self.path / 'train_config.json'} is not a lamina run config")
        return data

    def write_checkpoint(
        self,
        write_model: Callable[[Path], None],
        optimizer: tuple[dict[str, Tensor], dict[str, Any]],
        state: dict[str, Any],
    ) -> None:
        """Stage model, optimizer and trainer state, then move them into place together."""
        stage = self.path / STAGE
        shutil.rmtree(stage, ignore_errors=True)

        def write_all() -> None:
            stage.mkdir()
            write_model(stage)
            tensors, meta = optimizer
            save_tensors(stage / "optimizer.safetensors", tensors, {"step": str(state["step"])})
            write_json(stage / "optimizer.json", meta)
            write_json(stage / "trainer_state.json", state)
            atomic_write(stage / READY, lambda f: f.write(b"ok\n"))

        try:
            self._guard(write_all, f"the checkpoint at step {state['step']}")
        except LaminaError:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        self._commit(stage)
        shutil.rmtree(stage, ignore_errors=True)

    def _commit(self, stage: Path) -> None:
        for name in CHECKPOINT_FILES:
            if (stage / name).is_file():
                os.replace(stage / name, self.path / name)
        fsync_dir(self.path)

    def _guard(self, write: Callable[[], None], what: str) -> None:
        try:
            write()
        except OSError as exc:
            raise LaminaError(
                f"cannot write {what} in {self.path}: {_os_message(exc)}; {self._intact()}"
            ) from exc

    def _intact(self) -> str:
        """What survives a failed write: the last checkpoint on disk, if there is one."""
        try:
            step = read_json(self.path / "trainer_state.json")["step"]
        except (LaminaError, KeyError, TypeError, OSError):
            return "no checkpoint has been written yet"
        return f"the previous checkpoint (step {step}) is intact"

    def write_metrics(self, records: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(_finite_json(r), allow_nan=False) + "\n" for r in records).encode(
            "utf-8"
        )
        self._guard(
            lambda: atomic_write(self.path / "metrics.jsonl", lambda f: f.write(text)), "metrics"
        )

    def write_bytes(self, name: str, blob: bytes) -> None:
        self._guard(lambda: atomic_write(self.path / name, lambda f: f.write(blob)), name)

    # -- reading -------------------------------------------------------------------------------
    def read_metrics(self, up_to_step: int | None = None) -> list[dict[str, Any]]:
        p = self.path / "metrics.jsonl"
        if not p.is_file():
            return []
        out = []
        for line in p.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rec = json.loads(line)
                if up_to_step is None or rec.get("step", 0) <= up_to_step:
                    out.append(rec)
        return out

    def read_checkpoint(self) -> tuple[dict[str, Any], dict[str, Tensor], dict[str, Any]]:
        """(trainer state, optimizer tensors, optimizer metadata); steps must agree."""
        state = read_json(self.path / "trainer_state.json")
        tensors = load_tensors(self.path / "optimizer.safetensors")
        meta = read_json(self.path / "optimizer.json")
        if not isinstance(state, dict) or "step" not in state:
            raise LaminaError(f"{self.path / 'trainer_state.json'} has no 'step'")
        return state, tensors, meta
