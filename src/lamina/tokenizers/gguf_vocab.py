"""A GGUF file's tokenizer metadata (``tokenizer.ggml.*``) -> a Hugging Face ``tokenizers`` JSON.

    gguf_tokenizer_json(meta) -> (json string, specials)
        meta: the GGUF metadata as plain python (str/int/float/bool/list values);
        specials: {"bos"|"eos"|"unk"|"pad"|"eot": id} for the ids the file names.

Two vocabulary kinds, as llama.cpp names them in ``tokenizer.ggml.model``:
- ``gpt2``: byte-level BPE from ``tokens`` + ``merges``, split first by the pre-tokenizer that
  ``tokenizer.ggml.pre`` names (PRE_TOKENIZERS; an unknown name is refused in one line);
- ``llama``: sentencepiece-style BPE with byte fallback, merges rebuilt from ``scores`` (a
  merge that makes a higher-scoring piece comes first), Metaspace ("\u2581") for spaces, the
  prefix space as ``tokenizer.ggml.add_space_prefix`` says; Gemma and Phi-3 files (by
  ``general.architecture``) as transformers reads them.
Tokens typed control (3) become special added tokens and user-defined ones (4) plain added
tokens, so neither is ever split.

What this module deliberately does not know: how the GGUF file is read (the caller hands over
the metadata), chat templates, and models. It imports only ``tokenizers``.
"""

from __future__ import annotations

import operator
from typing import Any

from lamina.errors import LaminaError

GEMMA = ("gemma", "gemma2", "gemma3")  # general.architecture values with Gemma's vocabulary
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types (1 normal, 2 unknown, 5 unused, 6 byte)
GPT2_SPLIT = None  # the ByteLevel pre-tokenizer's own GPT-2 regex
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (split digits one by one first?, regex before the byte mapping or None)
PRE_TOKENIZERS: dict[str, tuple[bool, str | None]] = {
    "default": (False, GPT2_SPLIT),
    "gpt2": (False, GPT2_SPLIT),
    "smollm": (True, GPT2_SPLIT),  # llama.cpp: "\p{N}" alone, then GPT-2's regex
    "starcoder": (True, GPT2_SPLIT),
    "llama-bpe": (False, LLAMA3_SPLIT),
    "llama3": (False, LLAMA3_SPLIT),
    "llama-v3": (False, LLAMA3_SPLIT),
    "qwen2": (False, QWEN2_SPLIT),
}


def _list(meta: dict[str, Any], key: str, required: bool = True) -> list[Any] | None:
    value = meta.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, (list, tuple)):
        raise LaminaError(f"GGUF metadata {key} must be a list, got {type(value).__name__}")
    return list(value)


def _special_ids(meta: dict[str, Any], n: int) -> dict[str, int]:
    keys = {
        "bos": "bos_token_id",
        "eos": "eos_token_id",
        "unk": "unknown_token_id",
        "pad": "padding_token_id",
        "eot": "eot_token_id",
    }
    out = {}
    for role, key in keys.items():
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is None:
            continue
        try:
            i = None if isinstance(value, bool) else operator.index(value)  # numpy ints too
        except TypeError:
            i = None
        if i is None or not 0 <= i < n:
            raise LaminaError(
                f"GGUF metadata tokenizer.ggml.{key} = {value!r} is not a token id in [0, {n})"
            )
        out[role] = i
    return out


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte, as byte-level vocabularies spell them."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table.update({b: chr(256 + k) for k, b in enumerate(others)})
    return table


def _pre_tokenizer(pre: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    if pre not in PRE_TOKENIZERS:
        raise LaminaError(
            f"GGUF tokenizer.ggml.pre {pre!r} is a pre-tokenizer lamina does not know; known: "
            + ", ".join(sorted(PRE_TOKENIZERS))
        )
    digits, split = PRE_TOKENIZERS[pre]
    parts = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if split is None:
        parts.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        parts.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
        parts.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return parts[0] if len(parts) == 1 else pre_tokenizers.Sequence(parts)


def _byte_level(meta: dict[str, Any], tokens: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models

    merges = _list(meta, "tokenizer.ggml.merges")
    pairs = []
    for n, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else []
        if len(parts) != 2:
            raise LaminaError(f"GGUF tokenizer.ggml.merges[{n}] is not two tokens: {merge!r}")
        pairs.append((parts[0], parts[1]))
    alphabet = _byte_chars()
    letters = set(alphabet.values())
    vocab = {}  # a repeated token: the last id, as llama.cpp
    for i, t in enumerate(tokens):
        spelled = t if set(t) <= letters else "".join(alphabet[b] for b in t.encode("utf-8"))
        vocab[spelled] = i
    try:
        bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False)
    except Exception as e:  # tokenizers raises a bare Exception for a merge of unknown tokens
        raise LaminaError(f"GGUF byte-level vocabulary is inconsistent: {e}") from None
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    tok.decoder = decoders.ByteLevel()
    return tok


def _score_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Sentencepiece BPE as ranked merges: every split of a piece into two known pieces, the
    merges of higher-scoring pieces first (ties: longer left, then longer right piece)."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []
    for piece, score in zip(tokens, scores, strict=True):
        local = [
            (piece[:k], piece[k:])
            for k in range(1, len(piece))
            if piece[:k] in ids and piece[k:] in ids
        ]
        local.sort(key=lambda p: (ids[p[0]], ids[p[1]]))
        found.extend((-float(score), -len(left), -len(right), left, right) for left, right in local)
    found.sort(key=lambda m: m[:3])
    return [(m[3], m[4]) for m in found]


def _sentencepiece(meta: dict[str, Any], tokens: list[str], specials: dict[str, int]) -> Any:
    """Sentencepiece BPE; Gemma files store runs of spaces as spaces and rank merges by
    position, and Phi-3 prefixes its space by a normalizer (as transformers reads them)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    scores = _list(meta, "tokenizer.ggml.scores")
    if len(scores) != len(tokens):
        raise LaminaError(
            f"GGUF tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens"
        )
    arch = meta.get("general.architecture")
    if arch in GEMMA:
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = [-float(i) for i in range(len(tokens))]
    vocab = {t: i for i, t in enumerate(tokens)}  # a repeated token: the last id, as llama.cpp
    merges = _list(meta, "tokenizer.ggml.merges", required=False)
    if merges is not None:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        pairs = _score_merges(tokens, scores)
    unk = tokens[specials["unk"]] if "unk" in specials else None
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True)) and arch not in GEMMA
    if arch in GEMMA:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    elif arch == "phi3":
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
        )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    return tok


def gguf_tokenizer_json(meta: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """The ``tokenizers`` JSON and the special ids that a GGUF file's metadata describes."""
    from tokenizers import AddedToken

    if not isinstance(meta, dict):
        raise LaminaError(f"GGUF metadata must be a dict, got {type(meta).__name__}")
    model = meta.get("tokenizer.ggml.model")
    tokens = _list(meta, "tokenizer.ggml.tokens") if model in ("gpt2", "llama") else None
    if tokens is None:
        raise LaminaError(
            f"GGUF tokenizer.ggml.model {model!r} is a tokenizer lamina does not build; it "
            "builds 'gpt2' (byte-level BPE) and 'llama' (sentencepiece BPE)"
        )
    if not tokens or not all(isinstance(t, str) for t in tokens):
        raise LaminaError("GGUF tokenizer.ggml.tokens must be a non-empty list of strings")
    specials = _special_ids(meta, len(tokens))
    types = _list(meta, "tokenizer.ggml.token_type", required=False) or [1] * len(tokens)
    if len(types) != len(tokens):
        raise LaminaError(
            f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens"
        )
    kinds = list(zip(tokens, types, strict=True))
    if model == "gpt2":
        tok = _byte_level(meta, tokens)
        letters = set(_byte_chars().values())
        control = [t for t, k in kinds if k == CONTROL and set(t) <= letters]
    else:
        tok = _sentencepiece(meta, tokens, specials)
        control = [t for t, k in kinds if k == CONTROL]
        control += [tokens[i] for role, i in specials.items() if role != "eot"]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    user = [AddedToken(t, special=False, normalized=False) for t, k in kinds if k == USER_DEFINED]
    tok.add_tokens(user)
    return tok.to_str(), specials
