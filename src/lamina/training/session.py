"""A training session: one run's model, optimizer, objective and run directory, and how it is
saved.

    new_session(cfg, out, force, command, world_size, fsdp, micro_given) -> Session
                                                             defaults resolved (registry.resolve),
                                                             model seeded, train_config.json
                                                             written
    resume_session(run_dir, given, command) -> Session      the run read back at its last
                                                             checkpoint; `given` holds the flags
                                                             typed on this command line, and any
                                                             that conflict with the run are named
                                                             (a config.json edited by hand too)
    save_checkpoint(session, placement, seconds_used)       the one way a run is saved
    Session (built once, frozen) + RunState (step, tokens, seconds, metrics: what advances)
    Placement(model, opt, rank, world_size, gather)         what trains in this process
                                                             (`distributed.place` makes it)

A checkpoint holds the model, the optimizer moments (safetensors) and hyperparameters (JSON),
and trainer_state.json: step, tokens seen, torch RNG state, the task's RNG/sampler state, the
training seconds used and a fingerprint of the corpus. Nothing is pickled. Resuming restores
all of it before the model is wrapped for several processes, so a run saved under any number of
processes resumes under any other.

Every process calls `save_checkpoint`: where the model is sharded, `placement.gather` (made by
`distributed.place`) first collects the full model and optimizer from all processes; then the
process of rank 0 writes, through `RunDir.write_checkpoint` (staged, atomic).

Paths are recorded absolute and resolved (`data`, `out`), so a run can be evaluated or resumed
from any working directory, and a --data given again on --resume is compared as a file (the
same file by another spelling agrees), not as a string. The run directory is locked for the
life of the session (`RunDir.lock`); the caller releases it (`session.run.release()`).

Deliberately unaware of how steps are computed, of process groups and of progress output.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lamina.data.spec import is_kind
from lamina.errors import LaminaError
from lamina.files import read_json
from lamina.modes import check_finite
from lamina.tokenizers.kinds import Tokenizer
from lamina.training.config import TrainConfig
from lamina.training.device import resolve_device, use_bf16
from lamina.training.lora_option import hold_base, restore_run_model, save_run_model
from lamina.training.objectives import Objective, rng_state, rng_text
from lamina.training.optim import load_optimizer_tensors, make_optimizer, optimizer_tensors
from lamina.training.recompute import checkpoint_blocks
from lamina.training.registry import build, load_config, resolve
from lamina.training.run_dir import RunDir
from lamina.version import __version__

# flags that may differ on --resume (they do not change what the next steps compute)
RESUMABLE = {
    "out",
    "max_steps",
    "max_time",
    "compile",
    "activation_checkpointing",
    "log_every",
    "device",
    "eval_every",
    "checkpoint_every",
    "quiet",
}

Gather = Callable[[], "tuple[nn.Module, torch.optim.Optimizer] | None"]


@dataclass
class RunState:
    """Where a run stands: what the loop advances and a checkpoint records."""

    step: int = 0
    tokens: int = 0
    seconds_used: float = 0.0  # training wall time of earlier invocations
    metrics: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Session:
    """One run's parts, built once: nothing here is swapped while it trains (the placement
    among processes comes back from `distributed.place` as a `Placement`)."""

    cfg: TrainConfig  # resolved: no None left that the loop reads
    model: nn.Module  # the plain model (checkpoints restore into it)
    objective: Objective
    opt: torch.optim.Optimizer
    device: torch.device
    bf16: bool
    run: RunDir | None  # None: nothing is written (e.g. `lamina task`, or ranks other than 0)
    tokenizer: Tokenizer | None = None  # saved beside the model
    fingerprint: str = ""
    origin: dict[str, Any] | None = None  # --init-from: the model the run started from
    state: RunState = field(default_factory=RunState)
    estimates: dict[str, float] = field(default_factory=dict)  # probed seconds: step, eval


@dataclass(frozen=True)
class Placement:
    """A session placed among processes: what trains, and how a checkpoint collects it."""

    model: nn.Module  # the session's model, or its DDP / FSDP2 wrapper
    opt: torch.optim.Optimizer  # the optimizer over `model`'s parameters
    rank: int = 0  # this process among `world_size`
    world_size: int = 1
    gather: Gather | None = None  # sharded: the full (model, optimizer) on rank 0, else None

    @classmethod
    def alone(cls, s: Session) -> Placement:
        """One process: the session's own model and optimizer."""
        return cls(s.model, s.opt)


def writer(s: Session, p: Placement) -> bool:
    """Whether this process writes the run directory, metrics and plots."""
    return p.rank == 0 and s.run is not None


def _build(cfg: TrainConfig, run: RunDir | None, model_cfg: dict[str, Any] | None) -> Session:
    device = resolve_device(cfg.device)
    built = build(cfg, run.path if run is not None else None, model_cfg)
    if built.recorded:
        cfg = cfg.replace(**built.recorded)  # e.g. the tokenizer a prepared folder used
    built.model.to(device)
    if cfg.activation_checkpointing:
        checkpoint_blocks(built.model)
    opt = make_optimizer(built.model, cfg)
    bf16 = use_bf16(cfg.dtype, device, built.width)
    hold_base(built.model, bf16)  # a LoRA base computes in bf16 anyway: held so
    return Session(cfg, built.model, built.objective, opt, device, bf16, run, built.tokenizer,
                   built.fingerprint, built.origin)  # fmt: skip


def new_session(
    cfg: TrainConfig,
    *,
    out: str | Path | None,
    force: bool = False,
    command: list[str] | None = None,
    world_size: int = 1,
    fsdp: bool = False,
    micro_given: bool = False,
) -> Session:
    """A fresh run: defaults resolved (`registry.resolve` for `world_size` processes), model
    seeded, run directory created (unless out=None)."""
    cfg = _absolute_paths(resolve(cfg, world_size=world_size, fsdp=fsdp, micro_given=micro_given))
    fresh = out is not None and not Path(out).exists()
    val_data = getattr(cfg.options, "val_data", None)  # a task's own input (classify's)
    inputs = [("--data", cfg.data), ("--val-data", val_data), ("--init-from", cfg.init_from)]
    inputs.append(("--tokenizer", cfg.tokenizer))  # a path (a run, a file); a kind never exists
    if cfg.init_from is not None:  # every file opening it reads (a LoRA run's base, ...)
        from lamina.interop.origin import model_inputs

        inputs += model_inputs(cfg.init_from, "--init-from")
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
    world_size: int = 1,
    fsdp: bool = False,
    micro_given: bool = False,
) -> Session:
    """Reopen a run at its last checkpoint; flags in `given` must agree with the run.

    lock=False: open it without taking the run's lock (ranks other than 0 under torchrun).
    """
    run = RunDir.open(run_dir, lock=lock)
    try:
        cfg, model_cfg = _resumed_config(run, given)
        cfg = resolve(cfg, world_size=world_size, fsdp=fsdp, micro_given=micro_given, fill=False)
        session = _build(cfg, run, model_cfg)
        _restore(session, run)
        session.state.metrics = run.read_metrics(up_to_step=session.state.step)
        return session
    except BaseException:
        run.release()
        raise


def _absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """Paths recorded absolute and resolved: data, init_from, a path tokenizer spec, and the
    task's own path options (any option named *_data)."""
    changes: dict[str, Any] = {}
    for name in ("data", "init_from"):
        if getattr(cfg, name) is not None:
            changes[name] = absolute(getattr(cfg, name))
    if not is_kind(cfg.tokenizer) and Path(cfg.tokenizer).expanduser().exists():
        changes["tokenizer"] = absolute(cfg.tokenizer)
    extra = {f.name: absolute(getattr(cfg.options, f.name))
             for f in dataclasses.fields(cfg.options)
             if f.name.endswith("_data") and getattr(cfg.options, f.name) is not None}  # fmt: skip
    if extra:
        changes["options"] = dataclasses.replace(cfg.options, **extra)
    return cfg.replace(**changes)


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


def _resumed_config(run: RunDir, given: dict[str, Any]) -> tuple[TrainConfig, dict[str, Any]]:
    """The run's config with the resumable flags of `given` applied; conflicts are refused."""
    saved = run.read_train_config()
    cfg = load_config(saved["train"])
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
        elif cfg.get(name) != value:
            conflicts.append(f"{name} (run: {cfg.get(name)!r}, given: {value!r})")
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
    return cfg.replace(**changes), model_cfg


def save_checkpoint(
    s: Session, placement: Placement | None = None, seconds_used: float | None = None
) -> None:
    """Write model, optimizer and trainer state (and the metrics so far) to the run directory.

    Every process calls this (with its placement; None: one process); only rank 0 of a session
    with a run directory writes. seconds_used: the training time to record (default:
    `s.state.seconds_used`).
    """
    p = placement or Placement.alone(s)
    model, opt = p.model, p.opt
    if p.gather is not None:
        full = p.gather()  # collective: every process takes part
        if full is None:
            return
        model, opt = full
    if not writer(s, p):
        return
    st = s.state
    state = {
        "step": st.step,
        "tokens_seen": st.tokens,
        "seconds_used": st.seconds_used if seconds_used is None else seconds_used,
        "torch_rng": rng_text(torch.get_rng_state()),
        "cuda_rng": [rng_text(t) for t in torch.cuda.get_rng_state_all()]
        if torch.cuda.is_available()
        else [],
        "task": s.objective.state_dict(),
        "data_fingerprint": s.fingerprint,
        "lamina": __version__,
    }
    s.run.write_checkpoint(
        lambda d: save_run_model(d, model, s.tokenizer, s.origin), optimizer_tensors(opt), state
    )
    s.run.write_metrics(st.metrics)


def _restore(s: Session, run: RunDir) -> None:
    """Load model weights, optimizer, RNGs and the task position from the run's checkpoint."""
    state, tensors, meta = run.read_checkpoint()
    if state.get("data_fingerprint") != s.fingerprint:
        raise LaminaError(
            f"--resume {run.path}: the training data differs from the run's "
            f"({state.get('data_fingerprint')} vs {s.fingerprint})"
        )
    restore_run_model(s.model, run.path, s.origin)
    check_finite(s.model, f"--resume {run.path}")  # a diverged checkpoint is not resumed
    load_optimizer_tensors(s.opt, tensors, meta)
    try:
        torch.set_rng_state(rng_state(state["torch_rng"]))
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([rng_state(t) for t in state["cuda_rng"]])
        s.objective.load_state_dict(state["task"])
        s.state.step, s.state.tokens = int(state["step"]), int(state["tokens_seen"])
        s.state.seconds_used = float(state.get("seconds_used", 0.0))
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise LaminaError(f"{run.path / 'trainer_state.json'} is damaged: {exc}") from exc
