"""`lamina train`: train a GPT on your text (or the encoder classifier on a toy task).

Every flag defaults to None here so the command knows which flags were typed: those become
the `given` set that `--resume` checks against the run. The rest stay None in TrainConfig and
are resolved from `lamina.training.config.DEFAULTS`, the same table each option's help reads its
default from, and recorded in train_config.json. Types and choices come from TrainConfig's and
GPTConfig's annotations (`lamina.cli.flags`).

Refused up front, in one line: --nproc below 1, --fsdp without --nproc >= 2, an empty --out or
--resume, --data or --tokenizer with --task first-last (it has no corpus), a negative --seed
(TrainConfig: seeds are >= 0). The run directory is locked while training (a second `lamina
train` on it is refused naming the first one's pid). Progress survives a broken stdout (e.g.
`| head`): output stops, training and checkpoints go on. A run that ends before its first step
(a --max-time shorter than the setup) exits 1 and says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import typing
from typing import Any

from lamina.cli.flags import add_config_overrides, config_overrides, field_flag
from lamina.models.config import GPT_PRESETS
from lamina.training.config import TrainConfig, default_text, parse_duration, resolve_defaults

# TrainConfig field -> (what the flag does, argparse keywords beyond what its annotation gives).
# Each help ends with the default from lamina.training.config.DEFAULTS, the table the run reads.
TRAIN_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "task": ("lm: next-token prediction on --data; first-last: the encoder classifier's "
             "synthetic task; classify: the encoder classifier on labelled texts (--data, "
             "default: the built-in comedy/history/tragedy task; other defaults as first-last)",
             {}),
    "data": ("a UTF-8 text file, a folder of .txt files, or a folder written by `lamina "
             "prepare`; classify: a .csv/.tsv with a header, a .jsonl, or a folder with one "
             "subfolder of .txt files per label", {"metavar": "PATH"}),
    "init_from": ("fine-tune: start from the model in this lamina run or model folder, or "
                  "Hugging Face folder; its shape and tokenizer come with it, the optimizer "
                  "starts fresh", {"metavar": "SOURCE"}),
    "tokenizer": ("tokenizer spec (see the README's Tokenizers section)", {"metavar": "SPEC"}),
    "preset": ("model shape (first-last: the seed encoder's)", {"choices": list(GPT_PRESETS)}),
    "max_steps": ("optimizer steps", {"metavar": "N"}),
    "max_time": ("wall-clock budget, e.g. 90s, 5m, 1h; the learning-rate schedule is laid "
                 "over it", {"metavar": "DURATION", "type": str}),
    "batch_size": ("sequences per optimizer step, all processes together", {"metavar": "N"}),
    "micro_batch_size": ("sequences per process per micro-step; accumulation = batch / "
                         "micro-batch / processes", {"metavar": "N"}),
    "lr": ("peak learning rate", {}),
    "min_lr_ratio": ("decay floor as a fraction of --lr", {"metavar": "R"}),
    "warmup": ("linear warmup steps", {"metavar": "N"}),
    "decay": ("decay after warmup; wsd: warmup, stable at --lr, then linear to the floor over "
              "the last --decay-fraction of the steps", {}),
    "decay_fraction": ("with --decay wsd, the share of the steps spent decaying, in (0, 1]",
                       {"metavar": "F"}),
    "weight_decay": ("weight decay on matrices", {}),
    "optimizer": ("adamw, or muon: Muon for the blocks' 2-D weight matrices and AdamW for "
                  "embeddings, head, norms and biases", {}),
    "muon_ns_dtype": ("with --optimizer muon, the precision of its Newton-Schulz iteration", {}),
    "embed_lr_scale": ("the embedding tables' learning rate as a multiple of --lr",
                       {"metavar": "X"}),
    "head_lr_scale": ("an untied head's learning rate as a multiple of --lr", {"metavar": "X"}),
    "grad_clip": ("max gradient norm, 0 = off", {}),
    "eval_every": ("steps between evaluations", {"metavar": "N"}),
    "eval_batches": ("held-out batches per evaluation", {"metavar": "N"}),
    "checkpoint_every": ("steps between checkpoints", {"metavar": "N"}),
    "log_every": ("steps between plain progress lines", {"metavar": "N"}),
    "seed": ("random seed", {}),
    "device": ("auto: cuda, then mps, then cpu", {}),
    "dtype": ("auto: bf16 autocast only where measured faster (GPUs; CPUs with "
              "AMX/AVX512-BF16 at width >= 256)", {}),
    "compile": ("torch.compile the model, falling back to eager if it fails", {}),
    "val_fraction": ("classify: the stratified, seeded share of --data held out; lm: the "
                     "corpus's tail held out", {"metavar": "F"}),
    "val_data": ("classify: validation texts in a file of their own", {"metavar": "PATH"}),
    "text_column": ("classify: CSV/TSV column or JSONL field of the text", {"metavar": "NAME"}),
    "label_column": ("classify: column or field of the label", {"metavar": "NAME"}),
    "max_len": ("classify: tokens per text (with the classification token); longer texts "
                "are cut and counted", {"metavar": "N"}),
    "pooling": ("classify: mean of real tokens, the first ([CLS]) or the last real one", {}),
    "class_weights": ("classify: balanced weighs texts by n / (K * n_label)", {}),
    "bucket": ("classify: batches of texts of similar length (less padding)", {}),
}  # fmt: skip


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
    hints = typing.get_type_hints(TrainConfig)
    for name, (text, extra) in TRAIN_FLAGS.items():
        p.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            help=f"{text} (default: {default_text(name)})",
            **{**field_flag(hints[name]), **extra},
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
    add_config_overrides(p)
    p.set_defaults(func=run)


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields (and model overrides) typed on this command line."""
    given = {name: getattr(args, name) for name in TRAIN_FLAGS if getattr(args, name) is not None}
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
    if given.get("optimizer") == "muon" and args.fsdp:
        raise LaminaError(
            "--optimizer muon orthogonalizes whole matrices; with --fsdp they are sharded: "
            "use DDP (drop --fsdp) or --optimizer adamw"
        )
    task = given.get("task")
    if task == "first-last":
        for name in ("data", "tokenizer"):
            if name in given:
                raise LaminaError(
                    f"--{name} does not apply to --task first-last (its sequences are "
                    "synthetic); drop it"
                )


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    given = given_flags(args)
    check_flags(args, given)
    if args.fsdp and args.resume is None and "optimizer" not in given:
        given["optimizer"] = "adamw"  # Muon (the CPU default) needs whole matrices: FSDP shards
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
    from lamina.training.build import resolve_device
    from lamina.training.distributed import plan_batch
    from lamina.training.session import new_session, resume_session

    micro_given = "micro_batch_size" in given
    if args.resume:
        if args.out and not _same_folder(args.out, args.resume):
            raise LaminaError("--out and --resume name different folders; a run resumes in place")
        with world.rank0_first():  # rank 0 locks, then finishes or drops a half-written checkpoint
            session = resume_session(args.resume, given, command, lock=world.writer)
        session.cfg = plan_batch(session.cfg, world.size, micro_given)
        out = args.resume
    else:
        out = args.out or time.strftime("runs/%Y%m%d-%H%M%S")
        cfg = TrainConfig(**given)
        if world.size > 1:
            cfg = resolve_defaults(cfg, resolve_device(cfg.device).type)
            cfg = plan_batch(cfg, world.size, micro_given)
        where = out if world.writer else None  # only rank 0 writes
        session = new_session(cfg, out=where, force=args.force, command=command)
    try:
        return _run(args, session, world, out, started)
    finally:
        if session.run is not None:
            session.run.release()


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _run(args: argparse.Namespace, session: Any, world: Any, out: str, started: float) -> int:
    from lamina.training.distributed import prepare
    from lamina.training.loop import run_training
    from lamina.training.progress import safe_print

    if world.writer and session.run.stale_pid:
        print(
            f"lamina train: note: the previous process on {out} (pid {session.run.stale_pid}) "
            "ended without releasing it (crashed or killed); continuing from what it saved",
            file=sys.stderr,
        )
    prepare(session, world)
    c = session.cfg
    budget = f"{c.max_time:g} s" if c.max_time else f"{c.max_steps} steps"
    n_params = sum(p.numel() for p in session.model.parameters())
    procs = f" x {world.size} processes ({'FSDP' if world.fsdp else 'DDP'}, {world.backend})"
    if world.writer and hasattr(session.task, "describe"):
        safe_print(session.task.describe(c.max_len))
    if world.writer:
        safe_print(
            f"lamina train: {n_params / 1e6:.2f}M parameters, batch {c.batch_size} "
            f"(micro {c.micro_batch_size}), lr {c.lr:g}, {budget}, "
            f"{'bf16' if session.bf16 else 'fp32'} on {session.device}"
            f"{procs if world.size > 1 else ''}; run dir {out}"
        )
    clock, started_at = world.timing(started, c.max_time is not None)
    silent = None if world.writer else open(os.devnull, "w")  # noqa: SIM115 - other ranks
    result = run_training(
        session,
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
    from lamina.training.tasks import val_line

    val = val_line(result.eval)
    val = f"loss {val}" if "nats/char" in val else val  # "loss 2.9500" without per-char
    safe_print(
        f"lamina train: done at step {result.step} ({result.tokens:,} tokens, "
        f"{session.seconds_used:.1f} s); validation {val}; saved to {out}"
    )
    if c.task == "lm":
        safe_print(f"  sample: lamina sample {out}    evaluate: lamina eval {out}")
    if c.task == "classify":
        safe_print(
            f"  accuracy {result.eval['accuracy']:.1%} (majority baseline "
            f"{session.task.baseline:.1%}), macro-F1 {result.eval['macro_f1']:.3f}; "
            f"confusion matrix: {out}/confusion.png\n"
            f'  predict: lamina predict {out} "some text"    evaluate: lamina eval {out} '
            "--data FILE"
        )
    return 0
