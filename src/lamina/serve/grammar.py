"""Constrained decoding: replies that must be JSON (of a schema), through llguidance.

    Grammars(tokenizer)                  one per server; the token table is built at first use
        .for_schema(schema | None) -> grammar     JSON of that schema (None: any JSON object);
                                                  RequestError (HTTP 400) if it cannot compile
        .constraint(grammar) -> Constraint        a fresh matcher for one sequence
    Constraint.allowed(n) -> bool tensor (n,)   .consume(token)   .done

Why llguidance: bench/grammar.py measured the three libraries built for this on SmolLM2's
49,152-token vocabulary (figures in BENCHMARKS.md, "The OpenAI API under load"). Per token
(mask + consume) llguidance and xgrammar cost under 1% of a decode step, outlines-core more at
its tail (and to compile a schema). llguidance reads the tokenizer's own `tokenizers` JSON (any
family, no byte table to rebuild), imports quickly and has no dependencies; xgrammar brings
triton, transformers and a slow import. So llguidance: within the cost goal, at the least
weight.

JSON is compiled compact (no free whitespace between tokens: a model cannot spend its budget
on blank runs). A matcher never raises for a bad grammar or token: it enters an error state,
which `Constraint` turns into "no token allowed" (the batcher then ends the sequence with an
error, never with invalid text). A schema llguidance cannot compile is refused before any
work, naming its error.

Deliberately unaware of HTTP, sampling and the batch: masks in, tokens consumed.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lamina.errors import LaminaError

OPTIONS = {"whitespace_flexible": False}  # compact JSON: no blank runs


class GrammarError(LaminaError):
    """A schema or grammar that cannot be compiled (HTTP 400)."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise GrammarError(
            "structured output needs llguidance (the serve extra): pip install 'lamina[serve]'"
        ) from exc
    return llguidance


class _Tokens:
    """The generic tokenizer shape llguidance's TokenizerWrapper reads (for tokenizers that
    are not a `tokenizers` JSON: each id's bytes from decode([id]))."""

    def __init__(self, tokenizer: Any, eos: int) -> None:
        n = tokenizer.vocab_size
        self.tokens = [tokenizer.decode([i]).encode() for i in range(n)]
        self.eos_token_id, self.bos_token_id = eos, None
        specials = getattr(tokenizer, "special_tokens", None)
        ids = set(specials.values()) if isinstance(specials, dict) else set()
        ids |= set(getattr(tokenizer, "eot_ids", ()) or ())
        ids |= {i for i, t in enumerate(self.tokens) if t.startswith(b"<|") and t.endswith(b"|>")}
        self.special_token_ids = sorted(ids)
        self._tok = tokenizer

    def __call__(self, s: Any) -> list[int]:
        try:
            return list(
                self._tok.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s)
            )
        except Exception:  # text the tokenizer cannot encode: no tokens for it
            return []


class Grammars:
    """See the module docstring."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eot = list(getattr(tokenizer, "eot_ids", ()) or ())
        self._lt = None
        self._lock = threading.Lock()

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._lt is None:
                llg = _llguidance()
                if not self.eot:
                    raise GrammarError("structured output needs a model with an end-of-turn token")
                hf = getattr(self.tokenizer, "hf_json", None)
                n = self.tokenizer.vocab_size
                if isinstance(hf, str):
                    self._lt = llg.LLTokenizer(hf, n_vocab=n, eos_token=self.eot)
                else:
                    wrapped = llg.TokenizerWrapper(_Tokens(self.tokenizer, self.eot[0]))
                    self._lt = llg.LLTokenizer(wrapped, n_vocab=n, eos_token=self.eot)
            return self._lt

    def for_schema(self, schema: dict[str, Any] | None) -> str:
        """The grammar of JSON matching `schema` (None: any JSON object), checked to compile."""
        llg = _llguidance()
        schema = {"type": "object"} if schema is None else schema
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=OPTIONS)
        except (ValueError, TypeError, RecursionError) as exc:
            raise GrammarError(f"the JSON schema cannot be used: {exc}") from None
        error = llg.LLMatcher.validate_grammar(grammar, self._tokenizer())
        if error and not error.startswith("WARNING"):
            raise GrammarError(f"the JSON schema cannot be compiled: {_one_line(error)}")
        return grammar

    def constraint(self, grammar: str) -> Constraint:
        llg = _llguidance()
        matcher = llg.LLMatcher(self._tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the grammar cannot be compiled: {_one_line(matcher.get_error())}")
        return Constraint(matcher, self.tokenizer.vocab_size)


class Constraint:
    """One sequence's matcher: which tokens may come next, and what was chosen."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        self.matcher, self.vocab = matcher, vocab
        self._bits = np.zeros((vocab + 31) // 32, dtype=np.int32)

    def allowed(self, n: int) -> Tensor:
        """(n,) bool: True where token i may come next (none once the matcher is in error)."""
        out = torch.zeros(n, dtype=torch.bool)
        if self.matcher.is_error():
            return out
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self.matcher.is_error():
            return out
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: min(n, self.vocab)]
        out[: len(bits)] = torch.from_numpy(bits.astype(bool))
        return out

    def consume(self, token: int) -> None:
        self.matcher.consume_token(token)

    @property
    def done(self) -> bool:
        return bool(self.matcher.is_stopped())


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:300]
