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
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from lamina.cli import check_writable
from lamina.errors import LaminaError


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
        help="write into --out even if it already holds files (default: refuse)",
    )
    p.set_defaults(func=run)


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise LaminaError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise LaminaError(f"--out {out} already holds files; pick a new folder or pass --force")
    check_writable(out, "--out")  # a file in the way, a read-only place: refused up front


def _check_out_file(out: Path, force: bool) -> None:
    if out.is_dir():
        raise LaminaError(f"--out {out} is a folder; with --to gguf it names the file to write")
    if out.exists() and not force:
        raise LaminaError(f"--out {out} already exists; pick a new name or pass --force")
    check_writable(out.parent, "--out")


def _write_model(out: Path, model: object, tokenizer: object) -> None:
    from lamina.checkpoint import save_model

    if out.exists():
        save_model(out, model, tokenizer)
    else:  # build beside, then rename: a failed write leaves no half folder
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            save_model(tmp, model, tokenizer)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _from_hf(source: Path, out: Path) -> str:
    from lamina.interop import from_hf
    from lamina.interop.hf_tokenizer import tokenizer_from_hf

    model = from_hf(source)
    tokenizer = tokenizer_from_hf(source, model.config.vocab_size)
    _write_model(out, model, tokenizer)
    kind = tokenizer.to_dict()["kind"] if tokenizer is not None else "none found"
    if tokenizer is None and (source / "tokenizer.json").is_file():
        kind = "tokenizer.json not carried (lamina reads byte-level BPE ones only)"
    return f"{model.num_params():,} parameters; tokenizer: {kind}"


def _to_hf(source: Path, out: Path) -> str:
    from lamina.checkpoint import load_model
    from lamina.interop import save_hf
    from lamina.models.gpt import GPT

    model, tokenizer = load_model(source)
    if not isinstance(model, GPT):
        raise LaminaError(
            f"{source} holds a {type(model).__name__}; only a GPT converts to GPT-2 or Llama"
        )
    save_hf(model, out, tokenizer)
    kind = tokenizer.to_dict()["kind"] if tokenizer is not None else None
    if kind in ("gpt2", "bpe"):
        return f"{model.num_params():,} parameters; tokenizer files for {kind}"
    return f"{model.num_params():,} parameters; no Hugging Face tokenizer files (tokenizer: {kind})"


def _gguf_tokenizer(metadata: dict) -> tuple[object, str]:
    """The file's tokenizer as lamina's "pretrained" kind, where that kind exists."""
    try:
        from lamina.data.pretrained import PretrainedTokenizer
    except ImportError:
        return None, "not carried (this lamina has no pretrained tokenizer kind)"
    if metadata.get("tokenizer.ggml.model", "none") == "none":  # llama.cpp's "no vocabulary"
        return None, "none in the file"
    tokenizer = PretrainedTokenizer.from_gguf_metadata(metadata)
    return tokenizer, tokenizer.to_dict()["kind"]


def _from_gguf(source: Path, out: Path) -> str:
    from lamina.interop.gguf import load_gguf

    model, metadata = load_gguf(source)
    tokenizer, kind = _gguf_tokenizer(metadata)
    _write_model(out, model, tokenizer)
    arch = metadata["general.architecture"]
    return f"{arch}, {model.num_params():,} parameters in fp32; tokenizer: {kind}"


def _to_gguf(source: Path, out: Path, qtype: str) -> str:
    from lamina.checkpoint import load_model
    from lamina.interop.gguf import read_gguf, save_gguf
    from lamina.interop.gguf_write import gguf_arch
    from lamina.models.gpt import GPT

    model, tokenizer = load_model(source)
    if not isinstance(model, GPT):
        raise LaminaError(f"{source} holds a {type(model).__name__}; only a GPT converts to GGUF")
    save_gguf(model, out, tokenizer, qtype)
    kind = tokenizer.to_dict()["kind"] if tokenizer is not None else None
    carried = read_gguf(out).metadata.get("tokenizer.ggml.model") != "none"
    tok = f"tokenizer {kind}" if carried else f"no GGUF tokenizer (tokenizer: {kind})"
    arch = gguf_arch(model.config)
    return f"{arch}, {qtype}, {model.num_params():,} parameters; {tok}"


def run(args: argparse.Namespace) -> int:
    import lamina.data.subword  # noqa: F401 - registers the byte, bpe and gpt2 tokenizer kinds

    source, out = Path(args.source), Path(args.out)
    if args.gguf_type is not None and args.dst_format != "gguf":
        raise LaminaError("--type applies to --to gguf only")
    if args.dst_format == "gguf":
        _check_out_file(out, args.force)
    else:
        _check_out(out, args.force)
    if args.src_format == "gguf" and not source.is_file():
        what = "a folder" if source.is_dir() else "not found"
        raise LaminaError(f"--from gguf {source}: {what}; expected a .gguf file")
    if args.src_format == "hf":
        note = _from_hf(source, out)
    elif args.src_format == "gguf":
        note = _from_gguf(source, out)
    elif args.dst_format == "gguf":
        note = _to_gguf(source, out, args.gguf_type or "f32")
    else:
        note = _to_hf(source, out)
    print(f"wrote {out} ({note})")
    return 0
