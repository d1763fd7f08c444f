"""`lamina convert`: Hugging Face GPT-2 and Llama folders <-> lamina model/run folders.

    lamina convert --from hf HF_DIR --out RUN    config.json + weights -> a lamina model folder
                                                 (GPT-2, or Llama when model_type is "llama";
                                                 with tokenizer.json when HF_DIR has GPT-2's
                                                 merges.txt or a byte-level BPE tokenizer.json)
    lamina convert --to hf RUN --out HF_DIR      a lamina GPT -> GPT2LMHeadModel.from_pretrained,
                                                 or a rotary one -> LlamaForCausalLM's
                                                 (with vocab.json/merges.txt or tokenizer.json
                                                 for gpt2 and bpe tokenizers)

Bad input (a folder with no weights, another model type, wrong shapes, unsafe pickles, a setting
the converter cannot express) is one line on stderr and exit status 2; nothing is written then.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lamina.cli import check_writable, need_decoder
from lamina.files import build_folder, check_output_folder


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert Hugging Face GPT-2 / Llama checkpoints to lamina and back",
        description="Read a Hugging Face GPT-2 or Llama folder (config.json + model.safetensors, "
        "sharded or not, or pytorch_model.bin, loaded without running code) into a lamina model "
        "folder, or write a lamina GPT as a folder that transformers loads with from_pretrained "
        "(GPT2LMHeadModel; LlamaForCausalLM for a model with rotary positions). "
        "Weights are copied exactly; logits match Hugging Face's within float rounding.",
    )
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument(
        "--from", dest="src_format", choices=["hf"], help="read SOURCE in this format (hf)"
    )
    way.add_argument(
        "--to", dest="dst_format", choices=["hf"], help="write --out in this format (hf)"
    )
    p.add_argument(
        "source",
        metavar="SOURCE",
        help="with --from hf: a Hugging Face GPT-2 or Llama folder; with --to hf: a lamina model "
        "or run folder",
    )
    p.add_argument(
        "--out", required=True, metavar="DIR", help="folder to write (must be new or empty)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace --out if lamina wrote it, once the new folder is complete (default: refuse)",
    )
    p.set_defaults(func=run)


def _check_out(out: Path, force: bool, source: Path) -> None:
    check_output_folder(out, force=force, inputs=[("SOURCE", source)])
    check_writable(out, "--out")  # a file in the way, a read-only place: refused up front


def _from_hf(source: Path, out: Path, force: bool) -> str:
    from lamina.checkpoint import save_model
    from lamina.interop import from_hf
    from lamina.interop.hf_tokenizer import tokenizer_from_hf

    model = from_hf(source)
    tokenizer = tokenizer_from_hf(source, model.config.vocab_size)
    build = lambda d: save_model(d, model, tokenizer)  # noqa: E731
    build_folder(out, build, kind="model", force=force, inputs=[("SOURCE", source)])
    kind = tokenizer.to_dict()["kind"] if tokenizer is not None else "none found"
    if tokenizer is None and (source / "tokenizer.json").is_file():
        kind = "tokenizer.json not carried (lamina reads byte-level BPE ones only)"
    return f"{model.num_params():,} parameters; tokenizer: {kind}"


def _to_hf(source: Path, out: Path) -> str:
    from lamina.checkpoint import load_model
    from lamina.interop import save_hf

    model, tokenizer = load_model(source)
    need_decoder(model, source, "convert --to hf")
    save_hf(model, out, tokenizer)
    kind = tokenizer.to_dict()["kind"] if tokenizer is not None else None
    if kind in ("gpt2", "bpe"):
        return f"{model.num_params():,} parameters; tokenizer files for {kind}"
    return f"{model.num_params():,} parameters; no Hugging Face tokenizer files (tokenizer: {kind})"


def run(args: argparse.Namespace) -> int:
    import lamina.data.subword  # noqa: F401 - registers the byte, bpe and gpt2 tokenizer kinds

    source, out = Path(args.source), Path(args.out)
    _check_out(out, args.force, source)
    if args.src_format == "hf":
        note = _from_hf(source, out, args.force)
    else:
        note = _to_hf(source, out)
    print(f"wrote {out} ({note})")
    return 0
