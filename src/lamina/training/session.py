"""A training session: one run's model, optimizer, task and run directory, and how it is saved.

    new_session(cfg, out, force, command) -> Session        defaults resolved, model seeded,
                                                             train_config.json written
    resume_session(run_dir, given, command) -> Session      the run read back at its last
                                                             checkpoint; `given` holds the flags
                                                             typed on this command line, and any
                                                             that conflict with the run are named
                                                             (a config.json edited by hand too)
    save_checkpoint(session, seconds_used)                  the one way a run is saved

A checkpoint holds the model, the optimizer moments (safetensors) and hyperparameters (JSON),
and trainer_state.json: step, tokens seen, torch RNG state, the task's RNG/sampler state, the
training seconds used and a fingerprint of the corpus. Nothing is pickled. Resuming restores
all of it before the model is wrapped for several processes, so a run saved under any number of
processes resumes under any other.

Every process calls `save_checkpoint`: where the model is sharded, `session.gather` (set by
`distributed.prepare`) first collects the full model and optimizer from all processes; then the
process of rank 0 writes, through `RunDir.write_checkpoint` (staged, atomic).

Paths are recorded absolute and resolved (`data`, `out`), so a run can be evaluated or resumed
from any working directory, and a --data given again on --resume is compared as a file (the
same file by another spelling agrees), not as a string. The run directory is locked for the
life of the session (`RunDir.lock`); the caller releases it (`session.run.release()`).

Deliberately unaware of how steps are computed, of process groups and of progress output.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lamina.checkpoint import load_state, load_tensors, save_model
from lamina.data.tokenizers import Tokenizer
from lamina.errors import LaminaError
from lamina.files import read_json
from lamina.models.config import EncoderConfig
from lamina.modes import check_finite
from lamina.training.build import (
    build_first_last,
    make_optimizer,
    resolve_device,
    use_bf16,
)
from lamina.training.config import BEFORE_RECORDED, TrainConfig, resolve_defaults
from lamina.training.inputs import lm_inputs
from lamina.training.optim import load_optimizer_tensors, optimizer_tensors
from lamina.training.run_dir import RunDir
from lamina.training.tasks import TrainTask, rng_state, rng_text
from lamina.version import __version__

# flags that may differ on --resume (they do not change what the next steps compute)
RESUMABLE = {
    "out",
    "max_steps",
    "max_time",
    "compile",
    "log_every",
    "device",
    "eval_every",
    "checkpoint_every",
    "quiet",
}

Gather = Callable[[], "tuple[nn.Module, torch.optim.Optimizer] | None"]


@dataclass
class Session:
    cfg: TrainConfig  # resolved: no None left that the loop reads
    model: nn.Module  # what trains (wrapped for DDP or sharded for FSDP by distributed.prepare)
    task: TrainTask
    opt: torch.optim.Optimizer
    device: torch.device
    bf16: bool
    run: RunDir | None  # None: nothing is written (e.g. `lamina task`, or ranks other than 0)
    tokenizer: Tokenizer | None = None  # saved beside a language model
    fingerprint: str = ""
    step: int = 0
    tokens: int = 0
    seconds_used: float = 0.0  # training wall time of earlier invocations
    metrics: list[dict[str, Any]] = field(default_factory=list)
    rank: int = 0  # this process among `world_size` (set by distributed.prepare)
    world_size: int = 1
    gather: Gather | None = None  # sharded runs: the full (model, optimizer) on rank 0, else None
    origin: dict[str, Any] | None = None  # --init-from: the model the run started from

    @property
    def writer(self) -> bool:
        """Whether this process writes the run directory, metrics and plots."""
        return self.rank == 0 and self.run is not None


def _build(cfg: TrainConfig, run: RunDir | None, model_cfg: dict[str, Any] | None) -> Session:
    device = resolve_device(cfg.device)
    tok: Tokenizer | None = None
    origin = None
    if cfg.task == "first-last":
        ec = EncoderConfig.from_dict(model_cfg) if model_cfg else None
        task, model, ec = build_first_last(cfg, ec)
        fp, width = "first-last", ec.d_model
    elif cfg.task == "classify":
        from lamina.training.classify import build_classify

        ec = EncoderConfig.from_dict(model_cfg) if model_cfg else None
        task, model, tok, fp = build_classify(cfg, run.path if run else None, ec)
        width = model.config.d_model
    else:
        lm = lm_inputs(cfg, run.path if run is not None else None, model_cfg)
        task, model, tok, origin = lm.task, lm.model, lm.tokenizer, lm.origin
        fp, width = lm.fingerprint, lm.config.d_model
        if lm.spec is not None:
            cfg = cfg.replace(tokenizer=lm.spec)  # record what the prepared folder used
    model.to(device)
    opt = make_optimizer(model, cfg)
    bf16 = use_bf16(cfg.dtype, device, width)
    return Session(cfg, model, task, opt, device, bf16, run, tok, fp, origin=origin)


def new_session(
    cfg: TrainConfig,
    *,
    out: str | Path | None,
    force: bool = False,
    command: list[str] | None = None,
) -> Session:
    """A fresh run: defaults resolved, model seeded, run directory created (unless out=None)."""
    cfg = resolve_defaults(cfg, resolve_device(cfg.device).type)
    if cfg.data is not None:
        cfg = cfg.replace(data=absolute(cfg.data))
    if cfg.init_from is not None:
        cfg = cfg.replace(init_from=absolute(cfg.init_from))
    if cfg.val_data is not None:
        cfg = cfg.replace(val_data=absolute(cfg.val_data))
    fresh = out is not None and not Path(out).exists()
    inputs = [("--data", cfg.data), ("--val-data", cfg.val_data), ("--init-from", cfg.init_from)]
    inputs.append(("--tokenizer", cfg.tokenizer))  # a path (a run, a file); a kind never exists
    run = RunDir.create(out, force=force, inputs=inputs) if out is not None else None
    try:
        session = _build(cfg.replace(out=absolute(out) if out is not None else None), run, None)
    except BaseException:
        if run is not None:
            run.release()
        if fresh and run is not None:  # bad data or --init-from: leave no empty run behind
            shutil.rmtree(run.path, ignore_errors=True)
        raise
    if run is not None:
        run.write_train_config(
            {
                "train": session.cfg.to_dict(),
                "model": session.model.config.to_dict(),
                "command": command or sys.argv,
                "lamina": __version__,
                "data_fingerprint": session.fingerprint,
                **({"init_from": session.origin} if session.origin else {}),
            }
        )
    return session


def resume_session(
    run_dir: str | Path,
    given: dict[str, Any],
    command: list[str] | None = None,
    *,
    lock: bool = True,
) -> Session:
    """Reopen a run at its last checkpoint; flags in `given` must agree with the run.

    lock=False: open it without taking the run's lock (ranks other than 0 under torchrun).
    """
    run = RunDir.open(run_dir, lock=lock)
    try:
        return _resume(run, given)
    except BaseException:
        run.release()
        raise


def absolute(path: str | os.PathLike[str]) -> str:
    """`path` made absolute and resolved (symlinks followed; `~` expanded)."""
    return str(Path(path).expanduser().resolve())


def _same_file(a: str | None, b: str | None, base: Path) -> bool:
    """Whether two --data values name the same file or folder (a relative one read from base)."""
    if a is None or b is None:
        return a == b
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    pa, pb = (p if p.is_absolute() else base / p for p in (pa, pb))
    try:
        return os.path.samefile(pa, pb)
    except OSError:
        return pa.resolve() == pb.resolve()


def _edited_model_fields(run: RunDir, model_cfg: dict[str, Any]) -> list[str]:
    """Fields of config.json that differ from the model recorded in train_config.json."""
    path = run.path / "config.json"
    if not path.is_file() or not model_cfg:
        return []
    data = read_json(path)
    on_disk = data.get("model") if isinstance(data, dict) else None
    if not isinstance(on_disk, dict):
        return ["model (config.json has no model object)"]
    return [
        f"{k} (train_config.json: {model_cfg.get(k)!r}, config.json: {on_disk.get(k)!r})"
        for k in sorted(set(model_cfg) & set(on_disk))  # a field only one knows: versions
        if model_cfg[k] != on_disk[k]
    ]


def _resume(run: RunDir, given: dict[str, Any]) -> Session:
    saved = run.read_train_config()
    cfg = TrainConfig.from_dict(saved["train"])
    older = {k: v for k, v in BEFORE_RECORDED.items() if getattr(cfg, k) is None}
    cfg = cfg.replace(**older)  # a run recorded before these fields existed
    model_cfg = dict(saved.get("model") or {})
    conflicts, changes = [], {}
    for name, value in given.items():
        if name == "model_overrides":
            for k, v in value.items():
                if model_cfg.get(k) != v:
                    conflicts.append(f"{k} (run: {model_cfg.get(k)!r}, given: {v!r})")
        elif name in RESUMABLE:
            changes[name] = value
        elif name == "data" and _same_file(cfg.data, value, Path.cwd()):
            continue
        elif getattr(cfg, name, None) != value:
            conflicts.append(f"{name} (run: {getattr(cfg, name, None)!r}, given: {value!r})")
    if conflicts:
        raise LaminaError(
            f"--resume {run.path}: flags conflict with the run: {'; '.join(conflicts)}"
        )
    edited = _edited_model_fields(run, model_cfg)
    if edited:
        raise LaminaError(
            f"--resume {run.path}: config.json was changed after the run started: "
            f"{'; '.join(edited)}; a run resumes with the model it was trained with"
        )
    if cfg.data is not None and not Path(cfg.data).exists():
        raise LaminaError(f"--resume {run.path}: the run's data {cfg.data} no longer exists")
    changes.pop("out", None)
    session = _build(cfg.replace(**changes), run, model_cfg)
    _restore(session, run)
    session.metrics = run.read_metrics(up_to_step=session.step)
    return session


def save_checkpoint(s: Session, seconds_used: float | None = None) -> None:
    """Write model, optimizer and trainer state (and the metrics so far) to the run directory.

    Every process calls this; only rank 0 of a session with a run directory writes.
    seconds_used: the training time to record (default: `s.seconds_used`).
    """
    model, opt = s.model, s.opt
    if s.gather is not None:
        full = s.gather()  # collective: every process takes part
        if full is None:
            return
        model, opt = full
    if not s.writer:
        return
    state = {
        "step": s.step,
        "tokens_seen": s.tokens,
        "seconds_used": s.seconds_used if seconds_used is None else seconds_used,
        "torch_rng": rng_text(torch.get_rng_state()),
        "cuda_rng": [rng_text(t) for t in torch.cuda.get_rng_state_all()]
        if torch.cuda.is_available()
        else [],
        "task": s.task.state_dict(),
        "data_fingerprint": s.fingerprint,
        "lamina": __version__,
    }
    s.run.write_checkpoint(
        lambda d: save_model(d, model, s.tokenizer), optimizer_tensors(opt), state
    )
    s.run.write_metrics(s.metrics)


def _restore(s: Session, run: RunDir) -> None:
    """Load model weights, optimizer, RNGs and the task position from the run's checkpoint."""
    state, tensors, meta = run.read_checkpoint()
    if state.get("data_fingerprint") != s.fingerprint:
        raise LaminaError(
            f"--resume {run.path}: the training data differs from the run's "
            f"({state.get('data_fingerprint')} vs {s.fingerprint})"
        )
    load_state(s.model, load_tensors(run.path / "model.safetensors"), "model.safetensors")
    check_finite(s.model, f"--resume {run.path}")  # a diverged checkpoint is not resumed
    load_optimizer_tensors(s.opt, tensors, meta)
    try:
        torch.set_rng_state(rng_state(state["torch_rng"]))
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([rng_state(t) for t in state["cuda_rng"]])
        s.task.load_state_dict(state["task"])
        s.step, s.tokens = int(state["step"]), int(state["tokens_seen"])
        s.seconds_used = float(state.get("seconds_used", 0.0))
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise LaminaError(f"{run.path / 'trainer_state.json'} is damaged: {exc}") from exc
