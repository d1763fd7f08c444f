"""The tokenizer of a real (pretrained) model: any Hugging Face ``tokenizers`` JSON, its special
tokens, its add-bos rule and its chat template. Kind "pretrained".

    PretrainedTokenizer.from_hf_folder(dir)        tokenizer.json + tokenizer_config.json
        (+ special_tokens_map.json, chat_template.jinja, generation_config.json's eos ids)
    PretrainedTokenizer.from_gguf_metadata(meta)   a GGUF file's tokenizer.ggml.* (gguf_vocab.py)
    PretrainedTokenizer(hf_json, bos_id=..., eos_id=..., pad_id=..., unk_id=..., eot_ids=...,
                        add_bos=..., chat_template=...)

    encode(text) -> ids            special-token text encodes as its id; no bos added
    encode_prompt(text) -> ids     encode, with bos first when add_bos
    decode(ids, skip_special=False) -> str
    render_chat_text(messages, add_generation_prompt=True) -> str
    render_chat(messages, add_generation_prompt=True) -> ids
    chat_with_mask(messages) -> (ids, mask)   mask True on the tokens of assistant turns, up to
                                              and including the end-of-turn token that closes one
    to_dict() / from_dict(d)       the JSON, the special ids, add_bos and the template

Any model the ``tokenizers`` library runs works: byte-level BPE (GPT-2, SmolLM, Llama 3, Qwen),
sentencepiece-style BPE with byte fallback (Llama 2, Mistral), Unigram. ``eot_ids`` are the ids
that end a turn or a generation: eos, GGUF's eot, generation_config's eos list, and the known
end-of-turn tokens (END_OF_TURN) the vocabulary has as special tokens.

What this module deliberately does not know: files other than a Hugging Face folder's tokenizer
files (a GGUF file is read by lamina.interop, which hands over its metadata), models, tensors.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from lamina.errors import LaminaError
from lamina.tokenizers.chat_template import assistant_spans, render_chat_template
from lamina.tokenizers.gguf_vocab import gguf_tokenizer_json
from lamina.tokenizers.kinds import check_token_ids, register_tokenizer

END_OF_TURN = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
)
ROLES = ("bos", "eos", "pad", "unk")
FIELDS = {
    "tokenizer",
    "bos_id",
    "eos_id",
    "pad_id",
    "unk_id",
    "eot_ids",
    "add_bos",
    "chat_template",
}


def _id_or_none(value: Any, name: str, n: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise LaminaError(f"{name} must be a token id in [0, {n}) or None, got {value!r}")
    return value


class PretrainedTokenizer:
    """A ``tokenizers`` JSON with its specials, add-bos rule and chat template."""

    kind = "pretrained"

    def __init__(
        self,
        hf_json: str,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        unk_id: int | None = None,
        eot_ids: Iterable[int] = (),
        add_bos: bool = False,
        chat_template: str | None = None,
    ) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        if not isinstance(hf_json, str):
            raise LaminaError(f"tokenizer JSON must be a string, got {type(hf_json).__name__}")
        try:
            self._tok = HFTokenizer.from_str(hf_json)
        except Exception as e:  # tokenizers raises a bare Exception for malformed JSON
            msg = " ".join(str(e).split())
            raise LaminaError(f"tokenizer JSON is not readable by `tokenizers`: {msg}") from None
        # the JSON is not kept: `hf_json` writes it from the tokenizer when asked (a vocabulary's
        # JSON is megabytes of text that a model only serving tokens never reads again)
        # One past the largest id (a vocabulary with holes has more ids than entries).
        n = self._size = max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        self.bos_id = _id_or_none(bos_id, "bos_id", n)
        self.eos_id = _id_or_none(eos_id, "eos_id", n)
        self.pad_id = _id_or_none(pad_id, "pad_id", n)
        self.unk_id = _id_or_none(unk_id, "unk_id", n)
        if isinstance(eot_ids, (str, bytes)) or not isinstance(eot_ids, Iterable):
            raise LaminaError(f"eot_ids must be a list of token ids, got {eot_ids!r}")
        eot = [_id_or_none(i, "eot_ids entry", n) for i in eot_ids]
        self.eot_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in eot if i is not None))
        if not isinstance(add_bos, bool):
            raise LaminaError(f"add_bos must be true or false, got {add_bos!r}")
        if add_bos and self.bos_id is None:
            raise LaminaError("add_bos is true but the tokenizer has no bos token")
        self.add_bos = add_bos
        if chat_template is not None and not isinstance(chat_template, str):
            raise LaminaError("chat_template must be a string or None")
        self.chat_template = chat_template or None
        added = self._tok.get_added_tokens_decoder()
        self._special = {t.content: i for i, t in sorted(added.items()) if t.special}
        self._special.update(
            {r: getattr(self, f"{r}_id") for r in ROLES if getattr(self, f"{r}_id") is not None}
        )

    # -- the Tokenizer protocol ----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._size

    @property
    def special_tokens(self) -> dict[str, int]:
        """Each special added token's text -> id, and the roles "bos", "eos", "pad", "unk"."""
        return dict(self._special)

    @property
    def hf_json(self) -> str:
        """The ``tokenizers`` JSON (what a Hugging Face tokenizer.json holds), as the tokenizer
        writes it (the same tokenizer as the JSON it was built from, not the same text)."""
        return self._tok.to_str()

    def token_text(self, i: int | None) -> str | None:
        """The text of token ``i`` (None for None)."""
        return None if i is None else self._tok.id_to_token(i)

    def _encoding(self, text: str) -> Any:
        if not isinstance(text, str):
            raise LaminaError(f"text must be a str, got {type(text).__name__}")
        try:
            return self._tok.encode(text, add_special_tokens=False)
        except TypeError:  # what `tokenizers` raises for a str that is not valid Unicode
            where = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
            raise LaminaError(
                f"text has a lone surrogate {text[where]!r} at position {where}: not valid "
                "Unicode, so it has no UTF-8 bytes to tokenize"
            ) from None

    def encode(self, text: str) -> list[int]:
        """Text -> ids; special-token text becomes the special id; no bos."""
        return self._encoding(text).ids

    def encode_array(self, text: str) -> np.ndarray:
        """``encode(text)`` as int64, shape ``(n_tokens,)`` (what corpus code asks for)."""
        return np.asarray(self.encode(text), dtype=np.int64)

    def encode_prompt(self, text: str) -> list[int]:
        """What a plain prompt gets: ``encode(text)``, with bos first when ``add_bos``."""
        ids = self.encode(text)
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Ids -> text (special tokens dropped with ``skip_special``)."""
        return self._tok.decode(check_token_ids(ids, self._size), skip_special_tokens=skip_special)

    # -- chat ----------------------------------------------------------------------------------
    def _variables(self) -> dict[str, str]:
        roles = {f"{r}_token": self.token_text(getattr(self, f"{r}_id")) for r in ROLES}
        return {k: v for k, v in roles.items() if v is not None}

    def render_chat_text(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: Any = None
    ) -> str:
        """The conversation as the chat template writes it (`tools`: the template's `tools`
        variable, OpenAI's function list, for templates that render them)."""
        extra = {} if tools is None else {"tools": tools}
        return render_chat_template(
            self.chat_template, messages, add_generation_prompt, **self._variables(), **extra
        )

    def render_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: Any = None
    ) -> list[int]:
        """The rendered conversation's ids (special tokens as themselves; bos only if written)."""
        return self.encode(self.render_chat_text(messages, add_generation_prompt, tools))

    def chat_with_mask(self, messages: list[dict]) -> tuple[list[int], list[bool]]:
        """Ids of the conversation, and True on each token of an assistant turn's text up to and
        including the end-of-turn text that closes it (what completion-only SFT trains on).

        A turn's span (chat.assistant_spans) is cut after the last end-of-turn text in it (the
        eot_ids' texts and END_OF_TURN), so a newline the template writes after it is not
        trained on; a token that straddles a span's edge counts as inside."""
        text, spans = assistant_spans(self.chat_template, messages, **self._variables())
        enc = self._encoding(text)
        ids, offsets, mask = enc.ids, enc.offsets, [False] * len(enc.ids)
        ends = {self.token_text(i) for i in self.eot_ids} | set(END_OF_TURN)
        k = 0
        for start, end in spans:
            piece = text[start:end]
            cuts = [piece.rfind(e) + len(e) for e in ends if e and e in piece]
            end = start + max(cuts, default=len(piece))
            while k < len(ids) and offsets[k][0] < end:
                s, e = offsets[k]
                mask[k] = max(e, s + 1) > start
                k += 1
        return ids, mask

    # -- building ------------------------------------------------------------------------------
    def _with_end_of_turn(self, extra: Iterable[int] = ()) -> PretrainedTokenizer:
        """eot_ids := eos, the given ids, then every END_OF_TURN text that is a special token."""
        known = [self._special[t] for t in END_OF_TURN if t in self._special]
        first = [self.eos_id] if self.eos_id is not None else []
        self.eot_ids = tuple(dict.fromkeys([*first, *self.eot_ids, *extra, *known]))
        return self

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> PretrainedTokenizer:
        """From a GGUF file's metadata (plain python values under llama.cpp's key names)."""
        hf_json, ids = gguf_tokenizer_json(meta)
        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        if add_bos is None:  # llama.cpp adds bos to a sentencepiece vocabulary that is silent
            add_bos = meta.get("tokenizer.ggml.model") == "llama"
        template = meta.get("tokenizer.chat_template")
        tok = cls(
            hf_json,
            bos_id=ids.get("bos"),
            eos_id=ids.get("eos"),
            pad_id=ids.get("pad"),
            unk_id=ids.get("unk"),
            add_bos=bool(add_bos) and "bos" in ids,
            chat_template=template if isinstance(template, str) else None,
        )
        return tok._with_end_of_turn([ids["eot"]] if "eot" in ids else [])

    @classmethod
    def from_hf_folder(cls, directory: str | Path) -> PretrainedTokenizer:
        """From a Hugging Face folder's tokenizer.json and its companions (hf_folder.py)."""
        from lamina.tokenizers.hf_folder import read_hf_tokenizer

        fields, extra_eot = read_hf_tokenizer(Path(directory))
        return cls(**fields)._with_end_of_turn(extra_eot)

    # -- saving --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON string, the special ids, add_bos and the chat template."""
        return {
            "kind": self.kind,
            "tokenizer": self.hf_json,
            **{f"{r}_id": getattr(self, f"{r}_id") for r in ROLES},
            "eot_ids": list(self.eot_ids),
            "add_bos": self.add_bos,
            "chat_template": self.chat_template,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PretrainedTokenizer:
        """Inverse of ``to_dict``."""
        if not isinstance(d, dict):
            raise LaminaError(f"a pretrained tokenizer description must be a dict, got {d!r}")
        if d.get("kind", cls.kind) != cls.kind:
            raise LaminaError(f"expected kind {cls.kind!r}, got {d.get('kind')!r}")
        extra = sorted(set(d) - FIELDS - {"kind"})
        if extra:
            raise LaminaError(f"pretrained tokenizer description has unexpected fields: {extra}")
        if not isinstance(d.get("tokenizer"), str):
            raise LaminaError("pretrained tokenizer description: 'tokenizer' must be a JSON string")
        args = {k: d[k] for k in FIELDS - {"tokenizer"} if k in d}
        return cls(d["tokenizer"], **args)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PretrainedTokenizer):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # compared by content, which may change

    def __repr__(self) -> str:
        return (
            f"PretrainedTokenizer(vocab_size={self._size}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, eot_ids={self.eot_ids}, add_bos={self.add_bos}, "
            f"chat_template={'yes' if self.chat_template else 'none'})"
        )


register_tokenizer(PretrainedTokenizer.kind, PretrainedTokenizer.from_dict)
