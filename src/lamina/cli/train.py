"""`lamina train`: train a GPT on your text (or the encoder classifier on a toy task).

Every flag is read from a config field (`train_flags`): TrainConfig's shared fields and each
task's own options (`lamina.training.registry`), with the help, argparse extras and default
written once beside the field (`config.option`); `flags_markdown()` is the README's list of
them (a test holds the two equal). Every flag defaults to None here so the command knows which
flags were typed: those become the `given` set that `--resume` checks against the run. The rest
are resolved by `registry.resolve` (from `config.DEFAULTS`, the table each option's help reads
its default from) and recorded in train_config.json. Types and choices come from the fields'
annotations (`lamina.cli.flags`).

Refused up front, in one line: --nproc below 1, --fsdp without --nproc >= 2, an empty --out or
--resume; by the registry, --data or --tokenizer with --task first-last (it has no corpus) and a
task's option given to another task; a negative --seed (TrainConfig: seeds are >= 0). The run directory is locked while training (a second `lamina
train` on it is refused naming the first one's pid). Progress survives a broken stdout (e.g.
`| head`): output stops, training and checkpoints go on. A run that ends before its first step
(a --max-time shorter than the setup) exits 1 and says so. On a CPU with glibc the loop runs
inside `training.heap.lean_heap` (the heap's freed pages handed back during a step; off with
--no-heap-trim), and (without --compile) the probe and the loop inside
`frozen_linear.kept_dequantization` (a quantized base's weights dequantized into kept buffers,
not fresh tensors). With --max-time (and neither
--batch-size nor --micro-batch-size typed, one process, not a resume) a probe step sizes the
batch, the evaluations and the warmup to the budget first (`training.sizing`); the budget
counts from the process's start.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
import typing
from typing import Any

from lamina.cli.flags import add_config_overrides, config_overrides, field_flag
from lamina.training.lora_option import base_note
from lamina.training.schedule import parse_duration


def train_flags() -> list[tuple[str, str, dict[str, Any], str]]:
    """(field name, help, argparse keywords, default in words) for every `lamina train` flag:
    TrainConfig's shared fields, then each task's own (lamina.training.registry), read from the
    fields themselves (`config.option`: help, argparse extras, what None means)."""
    from lamina.training.config import TrainConfig, default_text
    from lamina.training.registry import TASKS, option_fields

    out = []
    shared = [(f.name, f, TrainConfig) for f in dataclasses.fields(TrainConfig)]
    for name, f, owner in shared + option_fields():
        extra = f.metadata.get("flag")
        if extra is None:
            continue
        kw = {**field_flag(typing.get_type_hints(owner)[name]), **extra}
        text = f.metadata["help"]
        if name == "task":
            kw["choices"] = list(TASKS)
            text += ": " + "; ".join(f"{t}: {e.summary}" for t, e in TASKS.items())
        out.append((name, text, kw, default_text(name, owner)))
    return out


def flags_markdown() -> str:
    """The README's list of training flags, generated from the same fields as --help."""
    rows = ["| flag | what it does | default |", "| --- | --- | --- |"]
    for name, text, kw, default in train_flags():
        flag = "--" + name.replace("_", "-")
        if kw.get("action") is argparse.BooleanOptionalAction:
            flag += f" / --no-{name.replace('_', '-')}"
        elif "choices" in kw:
            flag += " {" + ",".join(str(c) for c in kw["choices"]) + "}"
        else:
            flag += " " + kw.get("metavar", name.upper())
        cell, said = (t.replace("|", "\\|") for t in (text, default))
        rows.append(f"| `{flag}` | {cell} | {said} |")
    return "\n".join(rows) + "\n"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model on a text file or folder (default: built-in Shakespeare)",
        description="Train a GPT language model on your text, with a progress bar, periodic "
        "evaluation, checkpoints, Ctrl-C to stop and --resume to continue. Everything is "
        "written to the run directory (--out); `lamina sample RUN` and `lamina eval RUN` "
        "read it. Unset options are chosen for the task, device and budget as each option "
        "says, and recorded in RUN/train_config.json.",
    )
    for name, text, kw, default in train_flags():
        p.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            help=f"{text} (default: {default})".replace("%", "%%"),
            **kw,
        )
    a = p.add_argument
    a("--out", metavar="DIR", help="run directory (default: runs/<date-time>)")
    a("--force", action="store_true", help="write into --out even if it holds other files")
    a("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    a("--quiet", action="store_true", help="plain periodic lines instead of a progress bar")
    a(
        "--nproc",
        type=int,
        metavar="N",
        help="train in N processes on this machine (DDP; one per GPU, or sharing the CPU "
        "cores), launched through torchrun; the batch is the same for any N (default: 1)",
    )
    a(
        "--fsdp",
        action="store_true",
        help="with several processes, shard parameters, gradients and optimizer state "
        "(FSDP2) instead of replicating them (DDP)",
    )
    a(
        "--no-heap-trim",
        dest="heap_trim",
        action="store_false",
        help="on a CPU with glibc, do not hand the heap's freed pages back during a step "
        "(malloc_trim every few blocks of the forward, which keeps them out of the peak RSS)",
    )
    add_config_overrides(p)
    p.set_defaults(func=run)


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields (and model overrides) typed on this command line."""
    names = [name for name, *_ in train_flags()]
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    overrides = config_overrides(args)
    if overrides:
        given["model_overrides"] = overrides
    return given


def command_line(args: argparse.Namespace, given: dict) -> list[str]:
    """This command as `lamina train ...` with the flags that were given (for the record)."""
    cmd = ["lamina", "train"]
    flat = {**{k: v for k, v in given.items() if k != "model_overrides"},
            **given.get("model_overrides", {})}  # fmt: skip
    for name in ("out", "resume"):
        if getattr(args, name):
            flat[name] = getattr(args, name)
    for name, value in flat.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            cmd.append(flag if value else "--no-" + flag[2:])
        else:
            cmd += [flag, str(value)]
    return cmd + [f for f in ("--force", "--quiet") if getattr(args, f[2:])]


def check_flags(args: argparse.Namespace, given: dict[str, Any]) -> None:
    """Refuse combinations the run would otherwise ignore silently (LaminaError, one line)."""
    from lamina.errors import LaminaError
    from lamina.training.distributed import under_torchrun

    if args.nproc is not None and args.nproc < 1:
        raise LaminaError(f"--nproc must be >= 1, got {args.nproc}")
    if args.fsdp and (args.nproc or 1) < 2 and not under_torchrun():
        raise LaminaError("--fsdp shards the model over several processes: add --nproc N (N >= 2)")
    for name in ("out", "resume"):
        if getattr(args, name) is not None and not getattr(args, name).strip():
            raise LaminaError(f"--{name} must name a folder, got an empty string")


def process_age() -> float:
    """Seconds since this process started, from /proc (0.0 where it cannot be read)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def run(args: argparse.Namespace) -> int:
    # --max-time counts from the start of the process (interpreter, imports) when this command
    # is the process's own; a caller's main([...]) counts from the call
    started = time.perf_counter() - (process_age() if getattr(args, "own_process", False) else 0)
    given = given_flags(args)
    check_flags(args, given)
    if "max_time" in given:
        given["max_time"] = parse_duration(given["max_time"])
    command = command_line(args, given)
    from lamina.cli.launch import check_launch, launch
    from lamina.training.distributed import under_torchrun

    if args.fsdp and args.compile:
        check_launch(args, given, args.nproc or 1)  # refuses the combination
    if (args.nproc or 1) > 1 and not under_torchrun():
        check_launch(args, given, args.nproc)
        return launch(args, command, args.nproc)
    from lamina.training.distributed import start

    world = start(args.device or "auto", fsdp=args.fsdp)
    try:
        code = _train(args, given, command, world, started)
    except BaseException:
        world.close(ok=False)
        raise
    world.close()
    return code


def _train(
    args: argparse.Namespace, given: dict, command: list[str], world: Any, started: float
) -> int:
    from lamina.errors import LaminaError
    from lamina.training.budget import plan as budget_plan
    from lamina.training.registry import make_config
    from lamina.training.session import new_session, resume_session

    layout = dict(world_size=world.size, fsdp=world.fsdp, micro_given="micro_batch_size" in given)
    if args.resume:
        if args.out and not _same_folder(args.out, args.resume):
            raise LaminaError("--out and --resume name different folders; a run resumes in place")
        with world.rank0_first():  # rank 0 locks, then finishes or drops a half-written checkpoint
            session = resume_session(args.resume, given, command, lock=world.writer, **layout)
        out = args.resume
    else:
        out = args.out or time.strftime("runs/%Y%m%d-%H%M%S")
        where = out if world.writer else None  # only rank 0 writes
        given, why = budget_plan(given)  # the tokenizer for --max-time (training/budget.py)
        if why and world.writer:
            print(why, flush=True)
        session = new_session(
            make_config(given), out=where, force=args.force, command=command, **layout
        )
    try:
        return _run(args, session, world, out, started, set(given))
    finally:
        if session.run is not None:
            session.run.release()


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _run(
    args: argparse.Namespace, session: Any, world: Any, out: str, started: float, given: set[str]
) -> int:
    from lamina.frozen_linear import kept_dequantization
    from lamina.training.distributed import place

    if world.writer and session.run.stale_pid:
        print(
            f"lamina train: note: the previous process on {out} (pid {session.run.stale_pid}) "
            "ended without releasing it (crashed or killed); continuing from what it saved",
            file=sys.stderr,
        )
    placement = place(session, world)
    with contextlib.nullcontext() if session.cfg.compile else kept_dequantization():
        return _sized_run(args, session, world, out, placement, given, started)


def _sized_run(
    args: argparse.Namespace, session: Any, world: Any, out: str, placement: Any,
    given: set[str], started: float,
) -> int:  # fmt: skip
    from lamina.training.heap import lean_heap
    from lamina.training.loop import run_training
    from lamina.training.progress import safe_print
    from lamina.training.registry import finished
    from lamina.training.sizing import size_to_budget

    clock, started_at = world.timing(started, session.cfg.max_time is not None)
    sized = {"batch_size", "micro_batch_size"} & given
    if session.cfg.max_time and world.size == 1 and not args.resume and not sized:
        session = size_to_budget(session, placement, clock, clock() - started_at, given,
                                 safe_print)  # fmt: skip
    c = session.cfg
    budget = f"{c.max_time:g} s" if c.max_time else f"{c.max_steps} steps"
    if c.max_time:  # setup (plan, tokenizer, tokenizing, probe) is charged to the budget
        budget += f" (setup took {clock() - started_at:.1f} s of it)"
    n_params = sum(p.numel() for p in session.model.parameters())
    procs = f" x {world.size} processes ({'FSDP' if world.fsdp else 'DDP'}, {world.backend})"
    if world.writer and hasattr(session.objective, "describe"):
        safe_print(session.objective.describe())
    if world.writer:
        safe_print(
            f"lamina train: {n_params / 1e6:.2f}M parameters, batch {c.batch_size} "
            f"(micro {c.micro_batch_size}), lr {c.lr:g}, {budget}, "
            f"{'bf16' if session.bf16 else 'fp32'}{base_note(session.model)} on {session.device}"
            f"{procs if world.size > 1 else ''}; run dir {out}"
        )
    silent = None if world.writer else open(os.devnull, "w")  # noqa: SIM115 - other ranks
    trim = getattr(args, "heap_trim", True) and session.device.type == "cpu" and not c.compile
    with lean_heap(session.model) if trim else contextlib.nullcontext():
        result = run_training(
            session,
            placement,
            quiet=args.quiet,
            progress_stream=silent,
            started_at=started_at,
            clock=clock,
        )
    if not world.writer:
        return 0
    if result.stopped == "interrupted":
        print(
            f"lamina train: interrupted at step {result.step}; checkpoint saved in {out}. "
            f"Resume with: lamina train --resume {out}",
            file=sys.stderr,
        )
        return 130
    if result.step == 0:
        print(
            f"lamina train: warning: the run ended before its first step (setup took the whole "
            f"--max-time of {c.max_time or 0:g} s); the model in {out} is untrained. Give a longer "
            "--max-time",
            file=sys.stderr,
        )
        return 1
    from lamina.training.split_loss import val_line

    val = val_line(result.eval)
    val = f"loss {val}" if "nats/char" in val else val  # "loss 2.9500" without per-char
    safe_print(
        f"lamina train: done at step {result.step} ({result.tokens:,} tokens, "
        f"{session.state.seconds_used:.1f} s); validation {val}; saved to {out}"
    )
    safe_print(finished(c, out, result.eval, session.objective))
    return 0
