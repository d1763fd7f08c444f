"""Stop conditions: token ids, token-id sequences and strings, matched in generated text only.

    Stops(stop, tokenizer).hit(generated ids of one row) -> True once the row has produced a stop

`stop` is an int (one token id), a str (needs a tokenizer), a sequence of ints (a multi-token
stop), or a list mixing those. A stop matches only inside the generated tokens, never in the
prompt. Ids are matched at the end of the row; strings are searched in the decoded generated
text, so a stop string that a token completes (or that ends inside a token) is found at that
token. `cut_text` cuts decoded text right after its first stop string; `common_prefix` is how many
ids two id lists share from the start (a cache's reuse of a prompt).

Deliberately unaware of models and tensors beyond plain lists of ints; the tokenizer is used
only to decode generated ids when there are stop strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lamina.errors import LaminaError

StopSpec = int | str | Sequence[int] | Sequence[int | str | Sequence[int]]


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class Stops:
    """Parsed stop conditions; `hit(row)` says whether a row's generated ids end at a stop."""

    def __init__(self, stop: StopSpec | None, tokenizer: Any = None, vocab_size: int | None = None):
        self.id_seqs: list[tuple[int, ...]] = []
        self.strings: list[str] = []
        self.tokenizer = tokenizer
        if stop is None:
            return
        if _is_id(stop) or isinstance(stop, str):
            items: list[Any] = [stop]
        elif isinstance(stop, Sequence) and stop and all(_is_id(x) for x in stop):
            items = list(stop)  # a list of ints: each one is a stop token
        elif isinstance(stop, Sequence):
            items = list(stop)
        else:
            raise LaminaError(f"stop must be an id, a string or a list of them, got {stop!r}")
        for item in items:
            if _is_id(item):
                self.id_seqs.append((item,))
            elif isinstance(item, str):
                if not item:
                    raise LaminaError("a stop string must not be empty")
                self.strings.append(item)
            elif isinstance(item, Sequence) and item and all(_is_id(x) for x in item):
                self.id_seqs.append(tuple(item))
            else:
                raise LaminaError(
                    f"each stop must be a token id, a non-empty id list or a string, got {item!r}"
                )
        if self.strings and tokenizer is None:
            raise LaminaError(
                f"stop strings {self.strings!r} need a tokenizer: pass tokenizer=... or give ids"
            )
        if vocab_size is not None:
            for seq in self.id_seqs:
                bad = [i for i in seq if not 0 <= i < vocab_size]
                if bad:
                    raise LaminaError(
                        f"stop token id {bad[0]} is outside [0, vocab_size={vocab_size})"
                    )

    def __bool__(self) -> bool:
        return bool(self.id_seqs or self.strings)

    @property
    def single_ids(self) -> list[int]:
        """Stops that are one token id each (checked without decoding)."""
        return [s[0] for s in self.id_seqs if len(s) == 1]

    def hit(self, generated: list[int]) -> bool:
        """True if the generated ids (of one row) end with an id stop or contain a stop string."""
        for seq in self.id_seqs:
            n = len(seq)
            if len(generated) >= n and tuple(generated[-n:]) == seq:
                return True
        if self.strings:
            text = self.tokenizer.decode(generated)
            return any(s in text for s in self.strings)
        return False


def cut_text(text: str, strings: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` right after the earliest-ending stop string; (text, whether one was found)."""
    ends = [text.find(s) + len(s) for s in strings if s and s in text]
    if not ends:
        return text, False
    return text[: min(ends)], True


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
