"""A lamina tokenizer as GGUF metadata (`tokenizer.ggml.*`), for `save_gguf`.

    gguf_tokenizer_metadata(tokenizer, vocab_size) -> {"tokenizer.ggml.model": "gpt2", ...} or {}

Written as llama.cpp's byte-level BPE (`tokenizer.ggml.model` "gpt2"): tokens in id order spelled
as the vocabulary spells them (GPT-2's byte stand-ins, "Ġthe"), merges "a b", token types
(1 normal, 3 control for special added tokens, 4 user-defined for other added tokens, 5 unused
for ids the vocabulary lacks, written "[PAD{i}]" as llama.cpp's converter does), the special
ids, add_bos and the chat template. Sources:
- kind "gpt2" (GPT-2's own BPE): pre-tokenizer "gpt-2", bos = eos = <|endoftext|>;
- any tokenizer with a `tokenizers` JSON (`hf_json`: kinds "bpe" and "pretrained") whose model
  is BPE over ByteLevel: `tokenizer.ggml.pre` is named from the JSON's pre-tokenizer (GPT-2's
  regex "gpt-2", digits then GPT-2's "smollm", Llama 3's split "llama-bpe", Qwen2's "qwen2");
  bos/eos/pad/unk ids, `add_bos` and `chat_template` are read from the tokenizer where it has
  them;
- a tokenizer with its own `gguf_metadata()` method is asked for it.
Anything else (byte and char tokenizers, sentencepiece-style vocabularies, an unknown
pre-tokenizer) gives {} and, where a tokenizer was given, a LaminaWarning saying why: the model
is then written without a vocabulary. Deliberately unaware of models and of reading GGUF.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

from lamina.errors import LaminaError, LaminaWarning
from lamina.tokenizers.gguf_vocab import LLAMA3_SPLIT, QWEN2_SPLIT
from lamina.tokenizers.kinds import Tokenizer

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # llama.cpp token types
EOT = "<|endoftext|>"
_SPLITS = {LLAMA3_SPLIT: "llama-bpe", QWEN2_SPLIT: "qwen2"}


def _type(part: Any) -> Any:
    return part.get("type") if isinstance(part, dict) else None


def pre_tokenizer_name(pre: Any) -> str | None:
    """llama.cpp's name for a `tokenizers` pre-tokenizer (JSON), or None if it has none."""
    parts = pre.get("pretokenizers") if _type(pre) == "Sequence" else [pre]
    if not isinstance(parts, list) or not parts or _type(parts[-1]) != "ByteLevel":
        return None
    *first, last = parts
    if not first and last.get("use_regex", True):
        return "gpt-2"
    if len(first) == 1 and _type(first[0]) == "Digits" and first[0].get("individual_digits"):
        return "smollm" if last.get("use_regex", True) else None
    if len(first) == 1 and _type(first[0]) == "Split" and not last.get("use_regex", True):
        pattern = first[0].get("pattern")
        regex = pattern.get("Regex") if isinstance(pattern, dict) else None
        return _SPLITS.get(regex)
    return None


def _from_json(hf_json: str) -> tuple[dict[str, int], list[str], dict[int, int], str] | str:
    """(vocab, merges, {id: token type} of added tokens, pre name), or why it cannot be."""
    layout = json.loads(hf_json)
    model = layout.get("model") if isinstance(layout, dict) else None
    if _type(model) != "BPE" or _type(layout.get("decoder")) != "ByteLevel":
        kinds = f"{_type(model)} with decoder {_type(layout.get('decoder'))}"
        return f"a {kinds} tokenizer, not byte-level BPE"
    pre = pre_tokenizer_name(layout.get("pre_tokenizer"))
    if pre is None:
        return f"its pre-tokenizer {json.dumps(layout.get('pre_tokenizer'))[:80]} has no GGUF name"
    vocab = dict(model.get("vocab") or {})
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    types = {}
    for added in layout.get("added_tokens") or []:
        vocab[added["content"]] = added["id"]
        types[added["id"]] = CONTROL if added.get("special") else USER_DEFINED
    return vocab, merges, types, pre


def _specials(tokenizer: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    eot = tokenizer.special_tokens.get(EOT)
    for role, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown")):
        value = getattr(tokenizer, f"{role}_id", None)
        if value is None and role in ("bos", "eos"):
            value = eot
        if value is not None:
            meta[f"tokenizer.ggml.{key}_token_id"] = int(value)
    meta["tokenizer.ggml.add_bos_token"] = bool(getattr(tokenizer, "add_bos", False))
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        meta["tokenizer.chat_template"] = template
    return meta


def gguf_tokenizer_metadata(tokenizer: Tokenizer | None, vocab_size: int) -> dict[str, Any]:
    """The `tokenizer.ggml.*` keys for a tokenizer ({} where none can be written)."""
    if tokenizer is None:
        return {}
    own = getattr(tokenizer, "gguf_metadata", None)
    if callable(own):
        return dict(own())
    kind = tokenizer.to_dict().get("kind")
    hf_json = getattr(tokenizer, "hf_json", None)
    if kind == "gpt2":
        lines = tokenizer.merges.splitlines()  # type: ignore[attr-defined]
        merges = [ln for ln in lines if ln and not ln.startswith("#version")]
        vocab = tokenizer.encoder()  # type: ignore[attr-defined]
        found: Any = (
            vocab,
            merges,
            {i: CONTROL for i in tokenizer.special_tokens.values()},
            "gpt-2",
        )
    elif isinstance(hf_json, str):
        found = _from_json(hf_json)
    else:
        found = f"lamina's {kind!r} tokenizer kind has no GGUF form"
    if isinstance(found, str):
        warnings.warn(f"GGUF written without a tokenizer: {found}", LaminaWarning, stacklevel=3)
        return {}
    vocab, merges, types, pre = found
    by_id = {i: t for t, i in vocab.items()}
    if max(by_id, default=-1) >= vocab_size:
        raise LaminaError(
            f"cannot save as GGUF: the tokenizer has ids up to {max(by_id)}, the model's "
            f"vocab_size is {vocab_size}"
        )
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)],
        "tokenizer.ggml.token_type": [
            types.get(i, NORMAL if i in by_id else UNUSED) for i in range(vocab_size)
        ],
        "tokenizer.ggml.merges": merges,
        **_specials(tokenizer),
    }
