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
      .lamina                the marker of a folder lamina wrote (what --force may replace)
      .previous-run/         with --force: the run replaced, until the new one's first checkpoint

Every file is written atomically (temp file, fsync, rename). A checkpoint is several files, so
it is staged: all of them are written into `.checkpoint-tmp/`, a `READY` marker is written
last, and only then are they renamed into place (trainer_state.json last). A crash before
READY leaves the previous checkpoint untouched (the stage is discarded on the next open); a
crash after READY is rolled forward on the next open. A full disk or a permission error
becomes a LaminaError that says whether a previous checkpoint is intact (and which step).

One run directory has one writer: `create` and `open` take its lock (run_lock.py: an
exclusive flock on `.lock` holding the writer's pid, kept for the life of the RunDir; a second
process is refused naming that pid, and a pid a dead process left is `stale_pid`, for the
caller to report); `release()` gives it back. Metrics are written as strict JSON: a NaN or
infinite value becomes null.

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
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor

from lamina.checkpoint import load_tensors, save_tensors
from lamina.errors import LaminaError, LaminaWarning
from lamina.files import (
    MARKER,
    Inputs,
    atomic_write,
    fsync_dir,
    is_lamina_folder,
    mark_folder,
    read_json,
    refuse_overlap,
    write_json,
)
from lamina.schema import check
from lamina.training.formats import METRIC, OPTIMIZER_META, RUN_CONFIG, TRAINER_STATE
from lamina.training.run_lock import LOCK, RunLock, os_message, take

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
PREVIOUS = ".previous-run"  # a run replaced with --force, kept until the first checkpoint


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
        self._lock: RunLock | None = None

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        force: bool = False,
        inputs: Inputs = (),
    ) -> RunDir:
        """A fresh, locked run directory (the output rule of `lamina.files`).

        Refuses a folder that is, holds or sits inside one of `inputs` ((flag, path) pairs), and
        one that holds files lamina did not write. A lamina run is replaced only with `force`
        (or without it when it stopped before its first checkpoint: nothing there to resume),
        and only once the new run writes its first checkpoint: until then the old run's files
        wait in `.previous-run/` and come back if the new run fails (`release`, `recover`).
        """
        p = Path(path)
        if str(path) == "":
            raise LaminaError("--out must name a folder, got an empty string")
        refuse_overlap(p, inputs)
        if p.exists() and not p.is_dir():
            raise LaminaError(f"--out {p} exists and is not a folder")
        try:
            if not p.is_dir():
                p.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LaminaError(f"cannot write to --out {p}: {os_message(exc)}") from exc
        run = cls(p)
        run.lock()  # before looking inside: a second process must not see an empty folder
        try:
            run.recover()
            entries = sorted(e.name for e in p.iterdir() if e.name not in (LOCK, MARKER))
            if entries:
                run._set_aside(entries, force)
            try:
                mark_folder(p, "run")
                probe = p / ".write-test"
                probe.write_bytes(b"ok")
                probe.unlink()
            except OSError as exc:
                raise LaminaError(f"cannot write to --out {p}: {os_message(exc)}") from exc
        except BaseException:
            run.release()
            raise
        return run

    def _set_aside(self, entries: list[str], force: bool) -> None:
        """Move a previous lamina run's files into PREVIOUS (or refuse to touch the folder)."""
        p = self.path
        if not (is_lamina_folder(p) or "train_config.json" in entries):
            raise LaminaError(
                f"--out {p} holds files lamina did not write; pick a new folder (--force "
                "replaces only a lamina run)"
            )
        unfinished = "trainer_state.json" not in entries
        if not force and not unfinished:
            raise LaminaError(
                f"--out {p} already holds a training run; pass --force to replace it, or "
                f"--resume {p} to continue it"
            )
        if unfinished and not force:
            warnings.warn(
                f"--out {p}: replacing a run that stopped before its first checkpoint",
                LaminaWarning,
                stacklevel=2,
            )
        try:
            (p / PREVIOUS).mkdir()
            for name in entries:
                os.replace(p / name, p / PREVIOUS / name)
        except OSError as exc:
            self._restore()
            raise LaminaError(f"cannot write to --out {p}: {os_message(exc)}") from exc

    def _restore(self) -> None:
        """Put a previous run back (the new one never reached its first checkpoint)."""
        prev = self.path / PREVIOUS
        if not prev.is_dir():
            return
        for e in self.path.iterdir():
            if e.name in (LOCK, MARKER, PREVIOUS):
                continue
            shutil.rmtree(e) if e.is_dir() and not e.is_symlink() else e.unlink()
        for e in prev.iterdir():
            os.replace(e, self.path / e.name)
        prev.rmdir()

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
        self._lock, self.stale_pid = take(self.path)

    def release(self) -> None:
        """Empty the lock file (a clean exit) and give the lock back; safe to call twice.

        A previous run set aside by `create --force` comes back if this one has no checkpoint."""
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self.recover()
            self._lock.close()
            self._lock = None

    def recover(self) -> None:
        """Finish a checkpoint that was READY when the process died, or drop an unfinished one."""
        stage = self.path / STAGE
        if stage.is_dir():
            if (stage / READY).is_file():
                self._commit(stage)
            shutil.rmtree(stage, ignore_errors=True)
        if (self.path / PREVIOUS).is_dir() and not (self.path / "trainer_state.json").is_file():
            self._restore()

    # -- writing -------------------------------------------------------------------------------
    def write_train_config(self, data: dict[str, Any]) -> None:
        self._guard(lambda: write_json(self.path / "train_config.json", data), "the run config")

    def read_train_config(self) -> dict[str, Any]:
        """train_config.json through `RUN_CONFIG` (the fields of "train" are TrainConfig's to
        check, those of "model" the model config's)."""
        where = self.path / "train_config.json"
        data = read_json(where)
        if not isinstance(data, dict) or "train" not in data:
            raise LaminaError(f"{where} is not a lamina run config")
        return check(RUN_CONFIG, data, str(where))

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
        shutil.rmtree(self.path / PREVIOUS, ignore_errors=True)  # the new run has replaced it

    def _guard(self, write: Callable[[], None], what: str) -> None:
        try:
            write()
        except OSError as exc:
            raise LaminaError(
                f"cannot write {what} in {self.path}: {os_message(exc)}; {self._intact()}"
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
        """The records of metrics.jsonl, each checked against `METRIC`; a line that is not
        JSON (a run still writing it) is skipped, a record of the wrong shape is an error."""
        p = self.path / "metrics.jsonl"
        if not p.is_file():
            return []
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise LaminaError(f"{p} is not UTF-8 text") from exc
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            rec = check(METRIC, rec, f"{p} line {n}")
            if up_to_step is None or rec["step"] <= up_to_step:
                out.append(rec)
        return out

    def read_checkpoint(self) -> tuple[dict[str, Any], dict[str, Tensor], dict[str, Any]]:
        """(trainer state, optimizer tensors, optimizer metadata); steps must agree."""
        where = self.path / "trainer_state.json"
        state = check(TRAINER_STATE, read_json(where), str(where))
        tensors = load_tensors(self.path / "optimizer.safetensors")
        where = self.path / "optimizer.json"
        meta = check(OPTIMIZER_META, read_json(where), str(where))
        return state, tensors, meta
