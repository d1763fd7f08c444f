"""`lamina task first-last`: train the encoder classifier on the seed's toy task."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "task",
        help="train the encoder classifier on a synthetic task and report held-out accuracy",
        description="Train lamina's Encoder + SequenceClassifier on 'first-last': does the first "
        "token of a random sequence equal the last? Prints the loss as it trains and the "
        "accuracy on held-out batches.",
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
    from lamina.training.classify import train_first_last

    result = train_first_last(
        steps=args.steps,
        length=args.length,
        vocab_size=args.vocab_size,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        log=lambda step, loss: print(f"step {step:4d}  loss {loss:.4f}", flush=True),
    )
    print(
        f"first-last: held-out accuracy {result.accuracy:.1%} after {result.steps} steps "
        f"({result.seconds:.1f} s)"
    )
    return 0
