"""Text in and text out of generation, written once: the prompt encoder and the streamed decoder.

    encode_prompt(tokenizer, text, block_size=None, *, empty="start", what="the prompt")
        -> ids: list[int]
    TextStream(tokenizer, stops=(), stop_ids=(), include_stop=True)
        .push(id) -> str      the new complete text this token adds ("" while it waits)
        .flush() -> str       whatever was held back, at the end
        .text, .ids, .stopped

`encode_prompt` is what `lamina sample`, `lamina attention`, the playground and chat use:
characters a character tokenizer does not know are named (with the first position), a
tokenizer with an add-bos rule gets its start token (`tokenizer.encode_prompt`, e.g. Llama's
<s>; SmolLM2 adds none), an empty prompt becomes the start token (empty="start") or is refused
(empty="error"), and a prompt longer than `block_size` tokens is refused when one is given.

`TextStream` turns generated ids into text as they come. Its text is the decoding of all ids so
far (a token's text can depend on its neighbours: byte-level pieces of one character, a
sentencepiece word's leading space), found without decoding them all each time: the ids after
the last complete character are decoded with the token before them as left context, and what
they add to that token's text is appended (the whole is decoded again should a tokenizer's text
not grow that way). It shows only what is complete: a trailing U+FFFD (a character still
missing bytes) waits for the next token. A `stop_ids` token (end of turn, eos)
ends the stream and is not shown. A stop string ends it too: with include_stop=True (`lamina
sample`) the text runs to the end of the string; with include_stop=False (an API that drops the
stop) the string is cut off, and text that might be the start of a stop string is held back
until it is known not to be.

Deliberately unaware of models and sampling: ids and text only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from lamina.errors import LaminaError

MAX_TOKENS = 2**28  # prompts + new tokens of all rows: the id buffer stays under 2 GiB

START_TOKENS = ("bos", "<|endoftext|>", "<s>", "<bos>")  # special tokens that may start a text


def start_id(tokenizer: Any) -> int | None:
    """The id a text may start from: the tokenizer's bos, or a start-like special token."""
    bos = getattr(tokenizer, "bos_id", None)
    if isinstance(bos, int):
        return bos
    special = getattr(tokenizer, "special_tokens", None) or {}
    return next((special[k] for k in START_TOKENS if k in special), None)


def unknown_characters(tokenizer: Any, text: str) -> list[tuple[int, str]]:
    """(position, character) of each character a closed character vocabulary lacks."""
    chars = getattr(tokenizer, "chars", None)
    if chars is None or getattr(tokenizer, "unk", None) is not None:
        return []
    known = set(chars)
    return [(i, c) for i, c in enumerate(text) if c not in known]


def encode_prompt(
    tokenizer: Any,
    text: str,
    block_size: int | None = None,
    *,
    empty: Literal["start", "error"] = "start",
    what: str = "the prompt",
) -> list[int]:
    """The ids of a prompt (see the module docstring); every refusal is a LaminaError."""
    if not isinstance(text, str):
        raise LaminaError(f"{what} must be a string, got {type(text).__name__}")
    bad = unknown_characters(tokenizer, text)
    if bad:
        shown = ", ".join(repr(c) for c in sorted({c for _, c in bad})[:20])
        raise LaminaError(
            f"{what} has {len({c for _, c in bad})} character(s) the tokenizer does not know: "
            f"{shown} (first: {bad[0][1]!r} at position {bad[0][0]})"
        )
    encode = getattr(tokenizer, "encode_prompt", None)
    ids = [int(i) for i in (encode(text) if callable(encode) else tokenizer.encode(text))]
    if not ids and text == "" and empty == "start":
        start = start_id(tokenizer)
        if start is None:
            raise LaminaError(f"{what} is empty and this tokenizer defines no start token")
        ids = [start]
    if not ids:
        raise LaminaError(f"{what} is empty" if not text else f"{what} encodes to no tokens")
    if block_size is not None and len(ids) > block_size:
        raise LaminaError(
            f"{what} is {len(ids)} tokens, longer than the model's block_size {block_size}"
        )
    return ids


class TextStream:
    """Generated ids in, new complete text out (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Any,
        stops: Sequence[str] = (),
        stop_ids: Iterable[int] = (),
        *,
        include_stop: bool = True,
    ) -> None:
        if any(not isinstance(s, str) or not s for s in stops):
            raise LaminaError("a stop string must be a non-empty string")
        self.tokenizer, self.stops = tokenizer, list(stops)
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self.include_stop = include_stop
        self.ids: list[int] = []
        self.text = ""  # everything shown so far
        self.stopped = False
        self._done = ""  # the text of ids[:_read], ending with a complete character
        self._left = self._read = 0  # ids[_left:_read]: the context decoded with the new ids
        self._left_text = ""  # decode(ids[_left:_read])

    def push(self, token: int) -> str:
        """The text that token `token` completes; "" while it waits, or once stopped."""
        if self.stopped:
            return ""
        token = int(token)
        if token in self.stop_ids:
            self.stopped = True
            return ""
        self.ids.append(token)
        text = self._decoded()
        cut = self._cut(text)
        if cut is not None:
            self.stopped = True
            return self._show(cut)
        return self._show(self._complete(text))

    def flush(self) -> str:
        """At the end: what was held back (an incomplete character, a possible stop's start)."""
        if self.stopped or not self.ids:
            return ""
        return self._show(self.tokenizer.decode(self.ids))

    def _decoded(self) -> str:
        """decode(self.ids), from the ids after the last complete character (see the module
        docstring)."""
        decode = self.tokenizer.decode
        window = decode(self.ids[self._left :])
        if not window.startswith(self._left_text):  # not additive here: decode the whole
            self._done, self._left, self._read, self._left_text = "", 0, 0, ""
            window = decode(self.ids)
        tail = window[len(self._left_text) :]
        text = self._done + tail
        if tail and not tail.endswith("\ufffd"):  # complete: the next window starts after it
            self._done, self._left, self._read = text, self._read, len(self.ids)
            self._left_text = decode(self.ids[self._left : self._read])
        return text

    def _cut(self, text: str) -> str | None:
        """`text` up to its earliest-ending stop string (after it, or before it with
        include_stop=False); None without one."""
        hits = [(text.find(s) + len(s), s) for s in self.stops if s in text]
        if not hits:
            return None
        end, stop = min(hits)
        return text[:end] if self.include_stop else text[: end - len(stop)]

    def _complete(self, text: str) -> str:
        """What may be shown before the stream ends: no trailing incomplete character, and with
        include_stop=False no tail that a stop string might start with."""
        text = text.rstrip("\ufffd")
        if not self.include_stop:
            for n in range(min(len(text), max(map(len, self.stops), default=0)), 0, -1):
                if any(s.startswith(text[-n:]) for s in self.stops):
                    return text[:-n]
        return text

    def _show(self, text: str) -> str:
        if len(text) > len(self.text) and text.startswith(self.text):
            new, self.text = text[len(self.text) :], text
            return new
        return ""
