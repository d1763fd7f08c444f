"""`lamina merge RUN --out DIR`: fold a LoRA run's adapters into its base, as a plain model.

RUN is a LoRA run or folder (adapters + a reference to the base, whose sha256 is checked): its
base is opened, the adapters applied and merged (W + alpha / r * B A, lamina.lora.merge_lora),
and the result written as an ordinary lamina model folder (config.json, model.safetensors, the
base's tokenizer), which `lamina sample`, `lamina eval` and `lamina convert` read like any other.
`--peft DIR` also (or instead) writes the adapters as a Hugging Face PEFT folder
(adapter_config.json + adapter_model.safetensors) for `peft.PeftModel.from_pretrained` on the
transformers version of the base. Each folder is written through `lamina.files.build_folder`:
built beside its name, marked as lamina's and swapped in whole; `--force` replaces only a folder
lamina wrote (or an empty one). Every target is checked before any work: it may not be, hold or
sit inside RUN or any file the open reads (the base's included), nor lie where nothing can be
written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lamina.cli import open_for
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
        help="replace --out / --peft if lamina wrote them (default: refuse)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lamina.checkpoint import save_model
    from lamina.files import build_folder, check_output_folder
    from lamina.interop.adapters import export_peft, is_lora_folder, read_lora_folder
    from lamina.interop.origin import model_inputs
    from lamina.lora import lora_config, merge_lora

    source = Path(args.run)
    if args.out is None and args.peft is None:
        raise LaminaError("give --out DIR (the merged model) or --peft DIR (a PEFT adapter)")
    if not is_lora_folder(source):
        raise LaminaError(f"{source} is not a LoRA run or folder (config.json kind 'lora')")
    if args.out is not None and args.peft is not None and Path(args.out) == Path(args.peft):
        raise LaminaError("--out and --peft must be different folders")
    targets = [(f, Path(t)) for f, t in (("--out", args.out), ("--peft", args.peft)) if t]
    inputs = model_inputs(source, "RUN")  # its base and every file opening it reads
    for flag, target in targets:  # before any work: the target, its place, RUN and its base
        check_output_folder(target, force=args.force, inputs=inputs, flag=flag)  # + writable
    bundle = open_for(source, "merge", tokenizer=False)
    inputs = bundle.inputs("RUN")  # every file the open read, the base's included
    model = bundle.model
    config = lora_config(model)
    if args.peft is not None:
        base = args.base_name or read_lora_folder(source)[1]["path"]
        build = lambda d: export_peft(model, d, base)  # noqa: E731
        build_folder(args.peft, build, kind="peft", force=args.force, inputs=inputs, flag="--peft")
        print(f"wrote {args.peft} (PEFT LoRA adapter: r {config.r}, alpha {config.alpha:g})")
    if args.out is not None:
        merge_lora(model)
        build = lambda d: save_model(d, model, bundle.tokenizer)  # noqa: E731
        build_folder(args.out, build, kind="model", force=args.force, inputs=inputs)
        size = (Path(args.out) / "model.safetensors").stat().st_size
        print(
            f"wrote {args.out} (merged: r {config.r}, alpha {config.alpha:g}, targets "
            f"{','.join(config.targets)}; weights {size / 2**20:.1f} MiB)"
        )
    return 0
