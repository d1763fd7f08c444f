"""`lamina train --nproc N`: re-run the command under torchrun on this machine (a helper, not a verb).

    check_launch(args, given, nproc)          bad input refused here, in one line, before any
                                              process starts
    launch(args, command, nproc) -> status    `python -m torch.distributed.run --standalone
                                              --nproc_per_node=N -m lamina train ...`

The children find RANK / WORLD_SIZE in their environment and join the process group
(lamina.training.distributed.start); this module only builds the command line, chooses the
threads per process and hands the exit status back. Several machines: run torchrun yourself
(`--nnodes`, `--node-rank`, `--rdzv-endpoint`); see the README.

Deliberately unaware of training: it starts processes and waits for them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

from lamina.errors import LaminaError


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _wants_cuda(device: str | None) -> bool:
    import torch

    return device == "cuda" or (device in (None, "auto") and torch.cuda.is_available())


def check_launch(args: argparse.Namespace, given: dict[str, Any], nproc: int) -> None:
    """Refuse what cannot work with `nproc` processes (LaminaError, exit 2); warn on CPU."""
    import torch

    from lamina.training.registry import load_config, make_config, resolve

    if nproc < 1:
        raise LaminaError(f"--nproc must be >= 1, got {nproc}")
    if args.fsdp and args.compile:
        raise LaminaError(
            "--fsdp with --compile is not supported: lamina does not compile FSDP2-sharded "
            "models yet; drop one of the two"
        )
    if args.device == "mps":
        raise LaminaError("--nproc: multi-process training runs on CPUs or CUDA GPUs, not mps")
    if _wants_cuda(args.device):
        have = torch.cuda.device_count()
        if nproc > have:
            raise LaminaError(
                f"--nproc {nproc}: this machine has {have} GPU(s); use at most {have}"
            )
    elif nproc > cpu_count():
        print(
            f"lamina train: warning: --nproc {nproc} exceeds the {cpu_count()} CPU cores "
            "available; processes will share cores and run slower",
            file=sys.stderr,
        )
    layout = dict(world_size=nproc, fsdp=args.fsdp, micro_given="micro_batch_size" in given)
    if args.resume:
        from lamina.files import read_json

        try:
            cfg = load_config(read_json(f"{args.resume}/train_config.json")["train"])
        except (LaminaError, KeyError, TypeError):
            return  # the children say what is wrong with the run
        resolve(cfg, fill=False, **layout)  # the same checks the children make
    else:
        resolve(make_config(given), **layout)


def launch(args: argparse.Namespace, command: list[str], nproc: int) -> int:
    """Run `command` (lamina train + flags) in `nproc` processes under torchrun; its status."""
    flags = list(command[2:])
    if not args.resume and not args.out:  # every rank must agree on the run directory
        flags += ["--out", time.strftime("runs/%Y%m%d-%H%M%S")]
    if args.fsdp:
        flags.append("--fsdp")
    env = dict(os.environ)
    if not _wants_cuda(args.device) and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, cpu_count() // nproc))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "lamina", "train", *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # torchrun got the same Ctrl-C: let it stop its workers
            continue
