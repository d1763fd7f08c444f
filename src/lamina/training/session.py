"""A training session: the model, optimizer, task and run directory of one run, fresh or resumed.

    new_session(cfg, out, force, command) -> Session        builds everything, writes
                                                             train_config.json
    resume_session(run_dir, given, command) -> Session      reads the run back; `given` holds
                                                             the flags typed on this command
                                                             line, and any that conflict with
                                                             the run are named in the error
    save_checkpoint(session) ; restore(session, state, tensors, meta)

A checkpoint holds the model, the optimizer moments (safetensors) and hyperparameters (JSON),
and trainer_state.json: step, tokens seen, torch RNG state, the task's RNG/sampler state, the
training seconds used and a fingerprint of the corpus. Nothing is pickled.

Deliberately unaware of how steps are computed and of progress output.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lamina.checkpoint import load_state, save_model
from lamina.errors import LaminaError
from lamina.files import read_json
from lamina.models.config import EncoderConfig, GPTConfig
from lamina.training.config import TrainConfig
from lamina.training.optim import build_optimizer, load_optimizer_tensors, optimizer_tensors
from lamina.training.run_dir import RunDir
from lamina.training.setup import (
    build_first_last,
    build_lm,
    load_text,
    resolve_defaults,
    resolve_device,
    text_fingerprint,
    use_bf16,
)
from lamina.training.tasks import TrainTask
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


@dataclass
class Session:
    cfg: TrainConfig
    model: nn.Module
    task: TrainTask
    opt: torch.optim.Optimizer
    device: torch.device
    bf16: bool
    run: RunDir | None
    write_model: Callable[[Path], None]
    fingerprint: str = ""
    step: int = 0
    tokens: int = 0
    seconds_used: float = 0.0  # training wall time of earlier invocations
    metrics: list[dict[str, Any]] = field(default_factory=list)


def _classifier_writer(model: nn.Module) -> Callable[[Path], None]:
    def write(d: Path) -> None:
        save_model(d, model)  # kind "classifier": lamina.load rebuilds the SequenceClassifier

    return write


def _build(cfg: TrainConfig, run: RunDir | None, model_cfg: dict[str, Any] | None) -> Session:
    device = resolve_device(cfg.device)
    if cfg.task == "first-last":
        ec = EncoderConfig.from_dict(model_cfg) if model_cfg else None
        task, model, ec = build_first_last(cfg, ec)
        writer = _classifier_writer(model)
        fp, width = "first-last", ec.d_model
    else:
        text, _ = load_text(cfg)
        tokenizer = None
        if run is not None and (run.path / "tokenizer.json").is_file() and model_cfg:
            from lamina.data.tokenizers import load_tokenizer

            tokenizer = load_tokenizer(run.path / "tokenizer.json")
        mc = GPTConfig.from_dict(model_cfg) if model_cfg else None
        task, model, tok, mc = build_lm(cfg, text, device, mc, tokenizer)
        fp, width = text_fingerprint(text), mc.d_model
        writer = lambda d: save_model(d, model, tok)  # noqa: E731
    model.to(device)
    opt = build_optimizer(model, cfg.lr or 1e-3, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    return Session(
        cfg, model, task, opt, device, use_bf16(cfg.dtype, device, width), run, writer, fp
    )


def new_session(
    cfg: TrainConfig,
    *,
    out: str | Path | None,
    force: bool = False,
    command: list[str] | None = None,
) -> Session:
    """A fresh run: defaults resolved, model seeded, run directory created (unless out=None)."""
    cfg = resolve_defaults(cfg, resolve_device(cfg.device))
    run = RunDir.create(out, force=force) if out is not None else None
    session = _build(cfg.replace(out=str(out) if out is not None else None), run, None)
    if run is not None:
        model_dict = session.model.config.to_dict()
        run.write_train_config(
            {
                "train": session.cfg.to_dict(),
                "model": model_dict,
                "command": command or sys.argv,
                "lamina": __version__,
                "data_fingerprint": session.fingerprint,
            }
        )
    return session


def resume_session(
    run_dir: str | Path, given: dict[str, Any], command: list[str] | None = None
) -> Session:
    """Reopen a run at its last checkpoint; flags in `given` must agree with the run."""
    run = RunDir.open(run_dir)
    saved = run.read_train_config()
    cfg = TrainConfig.from_dict(saved["train"])
    model_cfg = dict(saved.get("model") or {})
    conflicts, changes = [], {}
    for name, value in given.items():
        if name == "model_overrides":
            for k, v in value.items():
                if model_cfg.get(k) != v:
                    conflicts.append(f"{k} (run: {model_cfg.get(k)!r}, given: {v!r})")
        elif name in RESUMABLE:
            changes[name] = value
        elif getattr(cfg, name, None) != value:
            conflicts.append(f"{name} (run: {getattr(cfg, name, None)!r}, given: {value!r})")
    if conflicts:
        raise LaminaError(
            f"--resume {run.path}: flags conflict with the run: {'; '.join(conflicts)}"
        )
    changes.pop("out", None)
    cfg = cfg.replace(**changes)
    session = _build(cfg, run, model_cfg)
    state, tensors, meta = run.load_checkpoint()
    if state.get("data_fingerprint") != session.fingerprint:
        raise LaminaError(
            f"--resume {run.path}: the training data differs from the run's "
            f"({state.get('data_fingerprint')} vs {session.fingerprint})"
        )
    restore(session, state, tensors, meta)
    session.metrics = run.read_metrics(up_to_step=session.step)
    return session


def _rng_text() -> str:
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")


def save_checkpoint(session: Session, seconds_used: float | None = None) -> None:
    """Write model, optimizer and trainer state (and the metrics so far) to the run directory."""
    s = session
    if s.run is None:
        return
    state = {
        "step": s.step,
        "tokens_seen": s.tokens,
        "seconds_used": s.seconds_used if seconds_used is None else seconds_used,
        "torch_rng": _rng_text(),
        "cuda_rng": [
            base64.b64encode(t.numpy().tobytes()).decode("ascii")
            for t in torch.cuda.get_rng_state_all()
        ]
        if torch.cuda.is_available()
        else [],
        "task": s.task.state_dict(),
        "data_fingerprint": s.fingerprint,
        "lamina": __version__,
    }
    s.run.save_checkpoint(s.write_model, optimizer_tensors(s.opt), state)
    s.run.write_metrics(s.metrics)


def restore(session: Session, state: dict[str, Any], tensors: dict, meta: dict) -> None:
    """Load model weights, optimizer, RNGs and the task position from a checkpoint."""
    s = session
    from lamina.checkpoint import load_tensors

    load_state(s.model, load_tensors(s.run.path / "model.safetensors"), "model.safetensors")
    load_optimizer_tensors(s.opt, tensors, meta)
    try:
        raw = np.frombuffer(base64.b64decode(state["torch_rng"]), dtype=np.uint8).copy()
        torch.set_rng_state(torch.from_numpy(raw))
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(
                [
                    torch.from_numpy(np.frombuffer(base64.b64decode(t), dtype=np.uint8).copy())
                    for t in state["cuda_rng"]
                ]
            )
        s.task.load_state_dict(state["task"])
    except (KeyError, ValueError, RuntimeError) as exc:
        raise LaminaError(f"{s.run.path / 'trainer_state.json'} is damaged: {exc}") from exc
    s.step, s.tokens = int(state["step"]), int(state["tokens_seen"])
    s.seconds_used = float(state.get("seconds_used", 0.0))


def read_train_config(run_dir: str | Path) -> dict[str, Any]:
    return read_json(Path(run_dir) / "train_config.json")
