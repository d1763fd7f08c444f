"""`lamina merge RUN --out DIR`: fold a LoRA run's adapters into its base, as a plain model.

RUN is a LoRA run or folder (adapters + a reference to the base, whose sha256 is checked): its
base is opened, the adapters applied and merged (W + alpha / r * B A, lamina.lora.merge_lora),
and the result written as an ordinary lamina model folder (config.json, model.safetensors, the
base's tokenizer), which `lamina sample`, `lamina eval` and `lamina convert` read like any other.
`--peft DIR` also (or instead) writes the adapters as a Hugging Face PEFT folder
(adapter_config.json + adapter_model.safetensors) for `peft.PeftModel.from_pretrained` on the
transformers version of the base. Nothing is written unless the whole folder is (each is built
beside its name and renamed into place).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from lamina.errors import LaminaError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge",
        help="merge a LoRA run's adapters into its base (a plain model folder) or export them",
        description="Open a LoRA run (its base model, checked unchanged, plus the adapters), "
        "merge the adapters into the weights and write a plain lamina model folder; or "
        "export the adapters as a Hugging Face PEFT adapter folder.",
    )
    p.add_argument("run", metavar="RUN", help="a LoRA run or adapter folder (lamina train --lora)")
    p.add_argument("--out", metavar="DIR", help="the merged model folder to write (must be new)")
    p.add_argument(
        "--peft",
        metavar="DIR",
        help="also write the adapters as a Hugging Face PEFT folder (adapter_config.json + "
        "adapter_model.safetensors); Llama-shaped models only",
    )
    p.add_argument(
        "--base-name",
        metavar="NAME",
        default=None,
        help="with --peft: the base_model_name_or_path to record (default: the base's path)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace --out / --peft if they exist (default: refuse)",
    )
    p.set_defaults(func=run)


def _check_target(flag: str, target: Path, source: Path, force: bool) -> None:
    t, s = target.resolve(), source.resolve()
    if t == s or s in t.parents or t in s.parents:
        raise LaminaError(f"{flag} {target} overlaps RUN {source}; write somewhere else")
    if target.exists() and not target.is_dir():
        raise LaminaError(f"{flag} {target} is a file, not a folder")
    if target.exists() and not force:
        raise LaminaError(f"{flag} {target} already exists; pick a new folder or pass --force")


def _write_folder(target: Path, write: Callable[[Path], object]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def run(args: argparse.Namespace) -> int:
    from lamina.checkpoint import save_model
    from lamina.interop.adapters import export_peft, is_lora_folder, read_lora_folder
    from lamina.interop.bundle import open_model
    from lamina.lora import lora_config, merge_lora

    source = Path(args.run)
    if args.out is None and args.peft is None:
        raise LaminaError("give --out DIR (the merged model) or --peft DIR (a PEFT adapter)")
    if not is_lora_folder(source):
        raise LaminaError(f"{source} is not a LoRA run or folder (config.json kind 'lora')")
    for flag, target in (("--out", args.out), ("--peft", args.peft)):
        if target is not None:
            _check_target(flag, Path(target), source, args.force)
    if args.out is not None and args.peft is not None and Path(args.out) == Path(args.peft):
        raise LaminaError("--out and --peft must be different folders")
    bundle = open_model(source, quantized=False).require("decoder", tokenizer=False, verb="merge")
    model = bundle.model
    config = lora_config(model)
    if args.peft is not None:
        base = args.base_name or read_lora_folder(source)[1]["path"]
        _write_folder(Path(args.peft), lambda d: export_peft(model, d, base))
        print(f"wrote {args.peft} (PEFT LoRA adapter: r {config.r}, alpha {config.alpha:g})")
    if args.out is not None:
        merge_lora(model)
        _write_folder(Path(args.out), lambda d: save_model(d, model, bundle.tokenizer))
        size = (Path(args.out) / "model.safetensors").stat().st_size
        print(
            f"wrote {args.out} (merged: r {config.r}, alpha {config.alpha:g}, targets "
            f"{','.join(config.targets)}; weights {size / 2**20:.1f} MiB)"
        )
    return 0
