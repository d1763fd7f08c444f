"""Decoding a GGUF file's model with decode.c alone: no torch in the process.

    rt = Runtime.open(path, cache_len=None, threads=None)   # LaminaError where not covered
    Runtime.uncovered(path) -> why not (None: it runs), cheap (the header only)
    logits = rt.feed(ids)            the ids after what the cache holds: (vocab,) float32, the
                                     last one's; a prefill in chunks of `chunk` tokens
    rt.forget(n)                     keep the cache's first n tokens (a chat's common prefix)
    for token in rt.generate(ids, max_new, temperature=0, top_k=None, top_p=None, seed=None,
                             stop=()): ...      ids: the whole context; reuses the cached prefix
    rt.tokenizer, rt.bos_id, rt.eos_id, rt.eot_ids, rt.chat_template, rt.render_chat(messages)

One `lm_step` call per new token (B = 1); a prompt is fed as one call of up to `chunk` entries of
one cache row at consecutive slots (step.py's `step_entries`: every entry's key and value of a
layer is stored before any entry of that layer attends, so a chunk is a causal prefill), through
`lm_step_last`: the head (vocab rows) runs for the chunk's last entry alone, whose logits are
the only ones a prompt needs; the caches are written as with every entry's. The
model's weights are gguf_model.py's (the file's blocks in place, Q4_0/Q4_1 as int4 rows), the
KV caches float16, the tokenizer and chat template lamina.tokenizers' (`from_gguf_metadata`, as
`lamina.open` builds them). The logits of a prompt and the greedy tokens equal the torch path's
native engine (lamina.native.step on `lamina.open`'s model) within the kernels' rounding:
tests/test_native_runtime.py holds them together.

Where the runtime does not cover a file (not a plain Llama, quantized kinds decode.c lacks, no
native library here: `uncovered`), callers use the torch path (`lamina.open`).

Deliberately unaware of torch, of chat loops and of the command line.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from collections.abc import Container, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lamina.errors import LaminaError
from lamina.generation.pick import pick
from lamina.libc import trim_freed_memory
from lamina.native import build
from lamina.native.gguf_model import GGUFModel, uncovered
from lamina.native.gguf_read import GGUFContents, read_gguf
from lamina.tokenizers.held import HeldTokenizer

CHUNK = 256  # a prefill's entries per call (the last one's logits alone: (vocab,) float32;
# 256: decode.c's bf16 GEMM and blocked attention for a chunk, each weight tile dequantized once
# for 256 rows; faster than 128 for a little more scratch: BENCHMARKS.md, branch kpre)
_VOCAB = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
          "tokenizer.ggml.scores")  # fmt: skip
DEFAULT_CACHE = 4096  # cache slots when the caller names none (the model's context at most)


def default_threads() -> int:
    """The threads a call runs on: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class Runtime(HeldTokenizer):
    """A covered GGUF model, its KV cache (one row) and its tokenizer; see the module."""

    def __init__(
        self,
        contents: GGUFContents,
        lib: ctypes.CDLL,
        cache_len: int | None = None,
        threads: int | None = None,
    ) -> None:
        why = uncovered(contents)
        if why is not None:
            raise LaminaError(f"{contents.path}: not covered by the native runtime: {why}")
        block = int(contents.metadata.get("llama.context_length", DEFAULT_CACHE))
        self.cache_len = min(block, DEFAULT_CACHE) if cache_len is None else cache_len
        self.vocab = contents.tensors["token_embd.weight"].shape[0]
        self.contents, self.lib = contents, lib
        # the tokenizer first, then the vocabulary's metadata dropped and the heap trimmed: its
        # transient peak (the JSON, the lists) falls before the weights are resident
        self.tokenizer = self._tokenizer(contents.metadata)
        slim = {k: v for k, v in contents.metadata.items() if not k.startswith(_VOCAB)}
        self.contents = contents = dataclasses.replace(contents, metadata=slim)
        trim_freed_memory()
        self.weights = GGUFModel(contents, self.cache_len, lib)
        trim_freed_memory()  # the conversions' temporaries
        self.threads = threads or default_threads()
        self.cached: list[int] = []  # the tokens the cache holds, slot by slot
        self._logits = np.empty((CHUNK, self.vocab), np.float32)  # pages touched: `keep` rows'

    @staticmethod
    def uncovered(path: str | os.PathLike[str]) -> str | None:
        """Why `Runtime.open(path)` would refuse (None: it runs); reads the header only."""
        why = build.platform_missing()
        if why is not None:
            return why
        try:
            why = uncovered(read_gguf(path))
        except LaminaError as e:
            return str(e)
        if why is None and build.library() is None:
            why = build.reason()
        return why

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        cache_len: int | None = None,
        threads: int | None = None,
    ) -> Runtime:
        why = build.platform_missing()
        lib = None if why else build.library()
        if lib is None:
            raise LaminaError(f"the native runtime cannot run here: {why or build.reason()}")
        return cls(read_gguf(Path(path)), lib, cache_len, threads)

    def _tokenizer(self, metadata: dict[str, Any]) -> Any:
        if metadata.get("tokenizer.ggml.model", "none") == "none":
            return None
        from lamina.tokenizers.pretrained import PretrainedTokenizer

        tok = PretrainedTokenizer.from_gguf_metadata(metadata)
        if tok.vocab_size > self.vocab:
            raise LaminaError(
                f"{self.contents.path}: its vocabulary has {tok.vocab_size:,} tokens, more "
                f"than the token table's {self.vocab:,} rows"
            )
        return tok

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """The ids of a conversation, ready for the assistant's reply (the tokenizer's own
        template, as `lamina chat` renders it)."""
        if self.tokenizer is None or self.chat_template is None:
            raise LaminaError(f"{self.contents.path} has no chat template")
        return list(self.tokenizer.render_chat(messages, add_generation_prompt=True))

    def forget(self, n: int) -> None:
        """Keep the cache's first n tokens (the slots past them are written over later)."""
        del self.cached[max(0, n) :]

    def _call(self, tokens: Sequence[int], first: int, keep: int = 1) -> np.ndarray:
        """Run `tokens` at slots first...; the logits (keep, vocab) of the last `keep`."""
        n = len(tokens)
        if not 0 < n <= CHUNK or keep > n:  # the logits' buffer holds CHUNK rows
            raise LaminaError(f"a call takes 1..{CHUNK} tokens and their last 1..n logits")
        arr = ctypes.c_int64 * n
        tok, slots = arr(*tokens), arr(*range(first, first + n))
        starts, rows = arr(*([0] * n)), arr(*([0] * n))
        out = self._logits[:keep]
        ok = self.lib.lm_step_last(
            ctypes.addressof(self.weights.model), n, ctypes.addressof(tok),
            ctypes.addressof(slots), ctypes.addressof(starts), ctypes.addressof(slots),
            ctypes.addressof(rows), out.ctypes.data, self.threads, keep,
        )  # fmt: skip
        if not ok:
            raise LaminaError("the native step failed (out of memory or threads)")
        return out

    def feed(self, ids: Sequence[int], chunk: int = CHUNK) -> np.ndarray:
        """Run `ids` after the cached tokens; the logits (vocab,) after the last (a copy)."""
        ids = [int(i) for i in ids]
        if not ids:
            raise LaminaError("feed needs at least one token")
        if len(self.cached) + len(ids) > self.cache_len:
            raise LaminaError(
                f"{len(self.cached) + len(ids)} tokens do not fit the cache ({self.cache_len})"
            )
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise LaminaError(f"token id {bad[0]} outside the vocabulary (0..{self.vocab - 1})")
        chunk = max(1, min(chunk, CHUNK))
        for at in range(0, len(ids), chunk):
            part = ids[at : at + chunk]
            out = self._call(part, len(self.cached))
            self.cached.extend(part)
        if len(ids) > 1:  # a prompt's scratch, freed, stays in the heap unless handed back: the
            trim_freed_memory()  # decode that follows would add its cache rows on top of it
        return out[0].copy()

    def generate(
        self,
        ids: Sequence[int],
        max_new: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | np.random.Generator | None = None,
        stop: Container[int] = (),
    ) -> Iterator[int]:
        """New tokens after the context `ids` (the cache's common prefix with it is kept),
        up to max_new of them, ending after a token in `stop` (which is yielded); drawn by
        lamina.generation.pick with numpy.random.default_rng(seed) (a Generator is used as it is)."""
        ids = [int(i) for i in ids]
        same = 0
        for a, b in zip(self.cached, ids[:-1], strict=False):  # the last id always runs
            if a != b:
                break
            same += 1
        self.forget(same)
        rng = np.random.default_rng(seed)
        logits = self.feed(ids[same:])
        for _ in range(max_new):
            token = pick(logits, temperature, top_k, top_p, rng)
            yield token
            if token in stop or len(self.cached) >= self.cache_len:
                return
            logits = self.feed([token])
