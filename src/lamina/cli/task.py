"""`lamina task first-last`: train the encoder classifier on the seed's toy task.

The same run as `lamina train --task first-last` (the shared loop, `lamina.training.loop`), with
nothing written to disk: it prints the loss as it trains and the accuracy on held-out batches.
A shape whose memory estimate is over `lamina.training.first_last.MAX_TASK_BYTES` (e.g. --length
100000) is refused before anything is allocated.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "task",
        help="train the encoder classifier on a synthetic task and report held-out accuracy",
        description="Train lamina's Encoder + SequenceClassifier on 'first-last': does the first "
        "token of a random sequence equal the last? Prints the loss as it trains and the "
        "accuracy on held-out batches. Nothing is written; `lamina train --task first-last` "
        "runs the same training into a run directory.",
    )
    p.add_argument("name", choices=["first-last"], help="the task")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default: 300)")
    p.add_argument("--length", type=int, default=12, help="sequence length (default: 12)")
    p.add_argument("--vocab-size", type=int, default=64, help="vocabulary size (default: 64)")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per step (default: 64)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: 2e-3)")
    p.add_argument("--seed", type=int, default=7, help="random seed (default: 7)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lamina.errors import LaminaError
    from lamina.training.config import TrainConfig
    from lamina.training.loop import run_training
    from lamina.training.session import new_session

    for flag in ("steps", "length", "vocab_size", "batch_size"):
        value = getattr(args, flag)
        if value < 1:
            raise LaminaError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    cfg = TrainConfig(
        task="first-last",
        max_steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        eval_every=args.steps,  # held-out accuracy before and after
        log_every=50,
        device="cpu",
        model_overrides={"max_len": args.length, "vocab_size": args.vocab_size},
    )
    result = run_training(new_session(cfg, out=None), quiet=True)
    print(
        f"first-last: held-out accuracy {result.eval['accuracy']:.1%} after {result.step} steps "
        f"({result.seconds:.1f} s)"
    )
    return 0
