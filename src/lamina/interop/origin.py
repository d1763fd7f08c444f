"""Where a model came from, and every file opening it reads (what no verb may overwrite).

    Origin(kind, path, files, read)  kind "run" | "model" | "hf" | "gguf"; `files` hold the
                                     model (what `content_hash` covers), `read` every file the
                                     open read
    files_read(source) -> paths      every file opening `source` reads, found without opening
                                     it (config.json, weights and their shards, tokenizer files,
                                     a LoRA folder's adapters and its base's files)
    model_inputs(source, flag)       those labelled as `lamina.files.refuse_overlap` takes them

`content_hash` is the sha256 of the bytes, names left out (one file: what `sha256sum` prints),
so a renamed copy of a LoRA base has the same; `legacy_hash` is what runs recorded before
(names and bytes). The lists name what is present, a superset of what one open reads: for an
output check, refusing a file that might be read is the safe side.

Deliberately unaware of models and tensors: paths and bytes only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from lamina.errors import LaminaError
from lamina.files import read_json

Kind = Literal["run", "model", "hf", "gguf"]
MAX_BASE_CHAIN = 8  # LoRA folders whose bases are LoRA folders


def _sha256(path: Path, h: Any = None) -> Any:
    h = hashlib.sha256() if h is None else h
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h


@dataclass(frozen=True)
class Origin:
    """Where a model came from: its kind, absolute path, the files that hold it, and every file
    the open read (`read`: the holding files, tokenizer files, a LoRA base's files...)."""

    kind: Kind
    path: Path
    files: tuple[Path, ...] = ()
    read: tuple[Path, ...] = ()

    @cached_property
    def content_hash(self) -> str:
        """The files' content, names left out (computed once, on first use): one file's
        sha256 (what `sha256sum` prints), or the sha256 of each file's, in name order."""
        digests = [_sha256(f).hexdigest() for f in sorted(self.files, key=lambda f: f.name)]
        if len(digests) == 1:
            return digests[0]
        return hashlib.sha256("".join(d + "\n" for d in digests).encode()).hexdigest()

    @cached_property
    def legacy_hash(self) -> str:
        """The hash runs recorded before: sha256 over the files' names and bytes."""
        h = hashlib.sha256()
        for f in sorted(self.files):
            h.update(f.name.encode() + b"\0")
            _sha256(f, h)
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "sha256": self.content_hash}


def _files(d: Path, *names: str) -> tuple[Path, ...]:
    found = [d / "config.json", *(d / n for n in names)]
    found += sorted(d.glob("model-*.safetensors"))
    return tuple(f for f in dict.fromkeys(found) if f.is_file())


# the files each reader may read, beside config.json and the weights (`Origin.read`)
LAMINA_READS = ("config.json", "model.safetensors", "tokenizer.json", "labels.json")
HF_READS = (
    "config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
    "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja", "generation_config.json", "vocab.json",
    "merges.txt",
)  # fmt: skip


def _present(d: Path, *names: str) -> tuple[Path, ...]:
    """Those of `names` in `d` (symlinks resolved), with the shards an index names and any
    model-*.safetensors / pytorch_model-*.bin: what an open of `d` may have read."""
    found = [d / n for n in names]
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index in names and (d / index).is_file():
            with contextlib.suppress(LaminaError):
                weight_map = read_json(d / index).get("weight_map")
                shards = weight_map.values() if isinstance(weight_map, dict) else ()
                found += [d / s for s in shards if isinstance(s, str) and "/" not in s]
    found += sorted(d.glob("model-*.safetensors")) + sorted(d.glob("pytorch_model-*.bin"))
    return tuple(dict.fromkeys(f.resolve() for f in found if f.is_file()))


def _labelled(source: Path, read: tuple[Path, ...], flag: str) -> list[tuple[str, Path]]:
    return [(flag, source), *((f"{flag}'s file", f) for f in read if f != source)]


def model_inputs(source: str | os.PathLike[str], flag: str = "MODEL") -> list[tuple[str, Path]]:
    """`Bundle.inputs` before the model is opened (what a verb checks its output against up
    front): SOURCE and every file opening it will read."""
    return _labelled(Path(source), files_read(source), flag)


def files_read(source: str | os.PathLike[str], _chain: tuple[Path, ...] = ()) -> tuple[Path, ...]:
    """Every file opening `source` reads (resolved), found without opening it: a GGUF file; a
    folder's config.json, weights (shards and pytorch_model.bin included) and tokenizer files
    (tokenizer_config.json, special_tokens_map.json, generation_config.json,
    chat_template.jinja, vocab.json, merges.txt); a LoRA folder's adapters and its base (the
    folder or file, and what opening it reads). What it cannot read it leaves out: the open
    says what is wrong."""
    p = Path(source).expanduser()
    if p.is_file():
        return (p.resolve(),)
    d = p.resolve()
    try:
        data = read_json(d / "config.json") if (d / "config.json").is_file() else None
    except LaminaError:
        return (d / "config.json",)
    if not isinstance(data, dict):
        return _present(d, "config.json")
    if "kind" in data and data["kind"] != "lora":
        return _present(d, *LAMINA_READS)
    if "kind" not in data:
        return _present(d, *HF_READS)
    from lamina.interop.adapters import ADAPTERS_FILE, base_path

    own = _present(d, "config.json", ADAPTERS_FILE)
    try:
        base = base_path(data.get("base"), d).resolve()
    except LaminaError:
        return own
    if base in (*_chain, d) or len(_chain) >= MAX_BASE_CHAIN:
        return own  # the open refuses the loop
    return tuple(dict.fromkeys((*own, base, *files_read(base, (*_chain, d)))))
