"""`lamina convert`: Hugging Face folders and GGUF files <-> lamina model/run folders.

    lamina convert --from hf HF_DIR --out RUN    config.json + weights -> a lamina model folder
                                                 (GPT-2, or Llama when model_type is "llama";
                                                 with tokenizer.json when HF_DIR has GPT-2's
                                                 merges.txt or a byte-level BPE tokenizer.json)
    lamina convert --to hf RUN --out HF_DIR      a lamina GPT -> GPT2LMHeadModel.from_pretrained,
                                                 or a rotary one -> LlamaForCausalLM's
                                                 (with vocab.json/merges.txt or tokenizer.json
                                                 for gpt2 and bpe tokenizers)
    lamina convert --from gguf FILE --out RUN    a llama / qwen2 / gpt2 GGUF (any type lamina
                                                 dequantizes) -> a lamina model folder (fp32),
                                                 with its tokenizer where lamina reads it
    lamina convert --to gguf RUN --out FILE [--type f32|f16|q8_0]
                                                 a lamina GPT -> a GGUF file llama.cpp loads
                                                 (arch llama for rotary models, else gpt2)

Bad input (a folder with no weights, another model type, wrong shapes, unsafe pickles, a setting
the converter cannot express) is one line on stderr and exit status 2; nothing is written then.
Outputs go through `lamina.files`: a folder through build_folder, the GGUF file through
atomic_write (a symlink written through, a character device written to, a FIFO refused: the
writer seeks); an output inside SOURCE, or holding a file the open read, is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lamina.cli import open_for
from lamina.errors import LaminaError
from lamina.files import (
    build_folder,
    check_output_file,
    check_output_folder,
    kind_of,
    refuse_overlap,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert Hugging Face GPT-2 / Llama folders and GGUF files to lamina and back",
        description="Read a Hugging Face GPT-2 or Llama folder (config.json + model.safetensors, "
        "sharded or not, or pytorch_model.bin, loaded without running code) into a lamina model "
        "folder, or write a lamina GPT as a folder that transformers loads with from_pretrained "
        "(GPT2LMHeadModel; LlamaForCausalLM for a model with rotary positions). "
        "Weights are copied exactly; logits match Hugging Face's within float rounding. "
        "GGUF files (llama.cpp) convert both ways too.",
    )
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument(
        "--from",
        dest="src_format",
        choices=["hf", "gguf"],
        help="read SOURCE in this format (hf, gguf)",
    )
    way.add_argument(
        "--to", dest="dst_format", choices=["hf", "gguf"], help="write --out in this format"
    )
    p.add_argument(
        "source",
        metavar="SOURCE",
        help="with --from hf: a Hugging Face GPT-2 or Llama folder; with --from gguf: a .gguf "
        "file; with --to: a lamina model or run folder",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="folder to write (must be new or empty); with --to gguf, the file to write",
    )
    p.add_argument(
        "--type",
        dest="gguf_type",
        choices=["f32", "f16", "q8_0"],
        default=None,
        help="with --to gguf: how matrices are stored (default f32; norms stay f32)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace --out if lamina wrote it, once the new folder is complete (default: refuse)",
    )
    p.set_defaults(func=run)


def _check_out(out: Path, force: bool, source: Path) -> None:
    from lamina.interop.origin import model_inputs

    # a file in the way, a read-only place: refused up front (check_output_folder probes it)
    check_output_folder(out, force=force, inputs=model_inputs(source, "SOURCE"))


def _check_out_file(out: Path, force: bool, source: Path) -> None:
    from lamina.interop.origin import model_inputs

    inputs = model_inputs(source, "SOURCE")
    check_output_file(out, inputs, "--out", seekable=True)
    refuse_overlap(out, inputs, "--out")  # not even beside SOURCE's files
    if out.exists() and not force:
        raise LaminaError(f"--out {out} already exists; pick a new name or pass --force")


def _opened(source: Path, way: str, kind: str) -> Any:
    """The bundle of SOURCE, refused in one line if it is not what `way` (--from hf, --from
    gguf, --to ...) reads: a foreign model of the --from kind, or a lamina folder for --to."""
    bundle = open_for(source, "convert", tokenizer=False)
    kinds = ("run", "model") if way == "--to" else (kind,)
    if bundle.origin.kind not in kinds:
        what = {"hf": "a Hugging Face folder", "gguf": "a .gguf file"}.get(kind, "")
        what = "a lamina model or run folder" if way == "--to" else what
        raise LaminaError(f"{way} {kind} {source}: not {what} (it is a {bundle.origin.kind})")
    return bundle


def _from_foreign(source: Path, out: Path, force: bool, kind: str) -> str:
    from lamina.checkpoint import save_model

    bundle = _opened(source, "--from", kind)
    model, tokenizer = bundle.model, bundle.tokenizer
    build = lambda d: save_model(d, model, tokenizer)  # noqa: E731
    build_folder(out, build, kind="model", force=force, inputs=bundle.inputs("SOURCE"))
    tok = tokenizer.to_dict()["kind"] if tokenizer is not None else "none found"
    what = f"{model.num_params():,} parameters"
    if kind == "gguf":
        from lamina.interop.gguf_write import gguf_arch

        what = f"{gguf_arch(model.config)}, {what} in fp32"
    return f"{what}; tokenizer: {tok}"


def _to_hf(source: Path, out: Path) -> str:
    from lamina.interop import save_hf

    bundle = _opened(source, "--to", "hf")
    model, tokenizer = bundle.model, bundle.tokenizer
    save_hf(model, out, tokenizer)
    kind = tokenizer.to_dict()["kind"] if tokenizer is not None else None
    if kind in ("gpt2", "bpe", "pretrained"):
        return f"{model.num_params():,} parameters; tokenizer files for {kind}"
    return f"{model.num_params():,} parameters; no Hugging Face tokenizer files (tokenizer: {kind})"


def _to_gguf(source: Path, out: Path, qtype: str) -> str:
    from lamina.interop.gguf import read_gguf, save_gguf
    from lamina.interop.gguf_write import gguf_arch

    bundle = _opened(source, "--to", "gguf")
    model, tokenizer = bundle.model, bundle.tokenizer
    save_gguf(model, out, tokenizer, qtype)
    kind = tokenizer.to_dict()["kind"] if tokenizer is not None else None
    regular = out.resolve().is_file()  # a character device cannot be read back
    carried = regular and read_gguf(out).metadata.get("tokenizer.ggml.model") != "none"
    tok = f"tokenizer {kind}" if carried else f"no GGUF tokenizer (tokenizer: {kind})"
    arch = gguf_arch(model.config)
    return f"{arch}, {qtype}, {model.num_params():,} parameters; {tok}"


def run(args: argparse.Namespace) -> int:
    import lamina.tokenizers.subword  # noqa: F401 - registers the byte, bpe and gpt2 tokenizer kinds

    source, out = Path(args.source), Path(args.out)
    if args.gguf_type is not None and args.dst_format != "gguf":
        raise LaminaError("--type applies to --to gguf only")
    if args.src_format == "gguf" and not source.is_file():
        kind = kind_of(source)
        what = "not found" if kind == "missing" else f"a {kind}"
        raise LaminaError(f"--from gguf {source}: {what}; expected a .gguf file")
    if args.dst_format == "gguf":
        _check_out_file(out, args.force, source)
    else:
        _check_out(out, args.force, source)
    if args.src_format in ("hf", "gguf"):
        note = _from_foreign(source, out, args.force, args.src_format)
    elif args.dst_format == "gguf":
        note = _to_gguf(source, out, args.gguf_type or "f32")
    else:
        note = _to_hf(source, out)
    print(f"wrote {out} ({note})")
    return 0
