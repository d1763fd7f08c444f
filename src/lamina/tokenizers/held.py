"""What a holder of a tokenizer answers about its special ids, for every kind of holder.

    class Bundle(HeldTokenizer): ...   # needs a `tokenizer` attribute (a Tokenizer, or None)
    holder.bos_id, .eos_id, .pad_id    # int | None: the tokenizer's, None where it has none
    holder.eot_ids                     # tuple[int, ...]: ids that end a turn (may be empty)
    holder.chat_template               # str | None

`lamina.open`'s Bundle (a torch model) and the torch-free runtime (lamina.native.runtime) both
hold a tokenizer beside their weights; the answers are the tokenizer's own, so they live here
once. Knows nothing of models.
"""

from __future__ import annotations

from typing import Any


class HeldTokenizer:
    """Mixin: the special ids of `self.tokenizer` (None where there is no tokenizer)."""

    tokenizer: Any

    def _tok(self, name: str, default: Any = None) -> Any:
        return getattr(self.tokenizer, name, default) if self.tokenizer is not None else default

    @property
    def bos_id(self) -> int | None:
        return self._tok("bos_id")

    @property
    def eos_id(self) -> int | None:
        return self._tok("eos_id")

    @property
    def pad_id(self) -> int | None:
        return self._tok("pad_id")

    @property
    def eot_ids(self) -> tuple[int, ...]:
        """Ids that end a turn or a generation (empty when the tokenizer names none)."""
        return tuple(self._tok("eot_ids", ()) or ())

    @property
    def chat_template(self) -> str | None:
        return self._tok("chat_template")
