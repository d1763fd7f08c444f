"""Continuous batching: many sequences decode together, each in its own row of one KV cache.

    Batcher(model, tokenizer, slots, context, prefill_chunk=256, ride=64, kv16=True)
        .submit(seq)                 queue a `Sequence` (any thread); its sink gets the events
        .call(fn, *args) -> Future   run fn on the batch thread between two steps
        .close()
    Sequence(ids, sampling, sink, constraint=None, cancel=None, deadline=None)   sequence.py
    Sampling(max_tokens, temperature, top_k, top_p, seed, stop, logprobs)       sequence.py

One thread owns the model. Each turn of its loop it (1) runs the calls it was given, (2) admits
waiting sequences into free rows, (3) prefills up to `prefill_chunk` prompt tokens of prompts
whose uncached rest is longer than `ride` (least recently served first: several, or a chunk of
a long one) through the PyTorch forward and (4) runs ONE step for every sequence that is
decoding, each row at its own position. Where the native step runs, the rests of `ride` tokens
or fewer (short prompts; the tail of a prompt whose prefix was cached) ride that step: each of
their tokens is one more entry of it, at its own slot of its row (`NativeStep.step_entries`), as many as
the step has room for (`slots` entries), the oldest prompt first (an entry costs the step far
less than a PyTorch forward's Python calls per module; a long rest is faster through PyTorch's
batched matmuls). So a new request joins at the next step and a finished one leaves at once; a
long prompt is prefilled a chunk at a time between the others' steps.

Memory is bounded at start: `slots` rows of `context` tokens (`lazy_caches(model, slots,
context)`, resident as the rows fill). Where the native step runs and `kv16` is set (the default),
the caches hold float16 (half the memory, and half the bytes each row's attention reads a step:
at 8 rows of ~100 tokens, ~35 MB of float32 a step otherwise); every row's keys and values are
rounded alike whatever the batch, and PyTorch's prefill attends them as rounded too. Rows 0..D-1 hold the decoding sequences (contiguous, so
a step reads a view of the cache, never a gathered copy); a row that finishes is swapped to the end of that range. A
row keeps its tokens after its sequence ends: a new prompt goes to the free row sharing its
longest prefix, and when another row shares more, that row's keys and values for the shared
prefix are copied over (n choices of one prompt, many clients with one system prompt) instead
of being prefilled again. A sequence that waits past its `deadline` for a row gets a "busy"
event (HTTP 503).

A step computes each row as it would alone: the native multi-row step (`NativeStep.step_batch`,
where the model is covered) reads each weight block once for all rows and writes each row's key
at that row's length; the PyTorch step otherwise writes each row's key at its own position and
masks the columns past it. Sampling is per row (its own seeded generator), so a
request's tokens do not depend on what else is in the batch (a test holds greedy tokens equal).

Events, on the batch thread at the end of each turn (`_flush`), to `sink(kind, payload)`:
"token" `Token` (one per sampled token, with its new text), then "done" `Done`; or "error" (a
message: the step failed or its logits were not finite) or "busy". Deliberately unaware of
HTTP and of OpenAI's shapes.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lamina.generation.conversation import common_prefix
from lamina.generation.prompts import TextStream
from lamina.generation.sampling import sample
from lamina.native import native_step, usable
from lamina.serve.kv_rows import (
    copy_prefix,
    lazy_caches,
    prefill_row,
    swap_rows,
    torch_step,
)
from lamina.serve.sequence import Done, Sequence, Token

log = logging.getLogger("lamina.serve")


def _scan(logits: Tensor) -> tuple[Any, Any]:
    """The max and argmax of each row of logits (B, V) -> two lists, or of one row (V,) -> two
    numbers; for all rows at once in NumPy (torch's reductions of one row cost far more). A
    row's max is NaN if any logit is, -inf if all are."""
    values = logits.float().cpu().numpy()
    best = values.argmax(-1)  # NumPy's argmax stops at a NaN: the value there is the max's
    peak = values[best] if values.ndim == 1 else values[range(len(values)), best]
    return peak.tolist(), best.tolist()


@dataclass
class _Row:
    ids: list[int] = field(default_factory=list)  # tokens whose keys and values it holds
    seq: Sequence | None = None
    used: float = 0.0


class Batcher:
    """See the module docstring."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        slots: int,
        context: int,
        prefill_chunk: int = 256,
        ride: int = 64,
        kv16: bool = True,
    ) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.slots, self.context, self.chunk, self.ride = slots, context, prefill_chunk, ride
        floats = model.reference_tensor().dtype == torch.float32
        self.caches = lazy_caches(model, slots, context, torch.float16 if kv16 and floats else None)
        self.rows = [_Row() for _ in range(slots)]
        self.decoding = 0  # rows[:decoding] are decoding
        self.eot = frozenset(getattr(tokenizer, "eot_ids", ()) or ())
        self._native = native_step(model, self.caches)
        if self._native is None and self.caches[0].k.dtype != model.reference_tensor().dtype:
            self.caches = lazy_caches(model, slots, context)  # PyTorch's steps: the model's dtype
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._calls: collections.deque[tuple[Future, Callable, tuple]] = collections.deque()
        self._wake = threading.Condition()
        self._stop = False
        self.steps = 0  # steps run that decoded (for tests and the bench)
        self.widest = 0  # the most rows one step has decoded
        self._events: list[tuple[Callable[[str, Any], None], str, Any]] = []
        self.rode = 0  # prompt tokens computed as entries of a step (for tests and the bench)
        self.thread = threading.Thread(target=self._loop, name="lamina-batch", daemon=True)
        self.thread.start()

    # -- any thread ----------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        with self._wake:
            self._waiting.append(seq)
            self._wake.notify()

    def call(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._wake:
            self._calls.append((future, fn, args))
            self._wake.notify()
        return future

    def close(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self.thread.join(timeout=2)  # a daemon: a step stuck in the model does not hold exit

    @property
    def busy_rows(self) -> int:
        return sum(r.seq is not None for r in self.rows)

    # -- the batch thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not (
                    self._calls or self._waiting or any(r.seq for r in self.rows)
                ):
                    self._wake.wait(timeout=1.0)
                if self._stop:
                    break
                calls = list(self._calls)
                self._calls.clear()
            for future, fn, args in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args))
                    except BaseException as exc:  # handed to the caller
                        future.set_exception(exc)
            try:
                with torch.no_grad():
                    self._turn()
                self._flush()
            except Exception as exc:  # the step failed: its sequences end with an error
                log.error("batch step failed: %s: %s", type(exc).__name__, exc)
                self._flush()  # what the turn had sent before it failed
                for row in self.rows:
                    if row.seq is not None:
                        row.seq.sink("error", f"generation failed: {type(exc).__name__}: {exc}")
                    row.seq = None
                    row.ids.clear()  # the caches may hold half a step
                self.decoding = 0
        for seq in [*self._waiting, *(r.seq for r in self.rows if r.seq)]:
            seq.sink("error", "the server is shutting down")

    def _turn(self) -> None:
        self._admit()
        native = self._native is not None and usable(self.model)
        budget = self.chunk  # prompt tokens this turn, over one or several prompts
        while budget > 0:
            prefilling = [r for r in self._prefilling() if not (native and self._rides(r))]
            if not prefilling:
                break
            budget -= self._prefill(min(prefilling, key=lambda r: r.used), budget)
        for i in reversed(range(self.slots)):
            if (seq := self.rows[i].seq) is not None and seq.cancel.is_set():
                if i < self.decoding or (native and self._rides(self.rows[i])):
                    self._finish(i, "cancelled")
        riders = [r for r in self._prefilling() if self._rides(r)] if native else []
        if self.decoding or riders:
            self._decode(sorted(riders, key=lambda r: r.used))

    def _prefilling(self) -> list[_Row]:
        return [r for r in self.rows[self.decoding :] if r.seq is not None]

    def _rides(self, row: _Row) -> bool:
        return len(row.seq.ids) - len(row.ids) <= self.ride

    def _admit(self) -> None:
        now = time.monotonic()
        with self._wake:
            waiting = list(self._waiting)
            self._waiting.clear()
        keep = []
        for seq in waiting:
            if seq.cancel.is_set():
                self._emit(seq, "done", Done("cancelled", len(seq.ids), 0, 0, ""))
                continue
            free = [i for i, r in enumerate(self.rows) if r.seq is None]
            if not free:
                if seq.deadline is not None and now > seq.deadline:
                    self._emit(
                        seq, "busy", f"no free slot within the wait limit ({self.slots} slots)"
                    )
                else:
                    keep.append(seq)
                continue
            self._place(seq, free)
        with self._wake:
            self._waiting.extendleft(reversed(keep))

    def _place(self, seq: Sequence, free: list[int]) -> None:
        """Give `seq` the free row sharing its longest prefix (least recently used on a tie);
        copy a longer shared prefix from another row."""
        limit = len(seq.ids) - 1  # the last prompt token is always computed (its logits)
        shared = [min(common_prefix(r.ids, seq.ids), limit) for r in self.rows]
        i = max(free, key=lambda j: (shared[j], -self.rows[j].used))
        row = self.rows[i]
        best = max(range(len(self.rows)), key=lambda j: shared[j])
        if shared[best] > shared[i]:
            n = shared[best]
            copy_prefix(self.caches, best, i, n)
            row.ids = list(self.rows[best].ids[:n])
        else:
            del row.ids[shared[i] :]
        seq.cached = len(row.ids)
        row.seq, row.used = seq, time.monotonic()
        s = seq.sampling
        seq.text = TextStream(self.tokenizer, s.stop, include_stop=False)
        if s.seed is not None:
            seq.generator = torch.Generator().manual_seed(s.seed)

    def _prefill(self, row: _Row, budget: int) -> int:
        """Prefill up to `budget` more of the row's prompt; the tokens it computed."""
        seq = row.seq
        i = self.rows.index(row)
        if seq.cancel.is_set():
            self._finish(i, "cancelled")
            return 0
        start = len(row.ids)
        chunk = seq.ids[start : start + budget]
        logits = prefill_row(self.model, self.caches, i, start, chunk)
        row.ids.extend(chunk)
        row.used = time.monotonic()
        if len(row.ids) == len(seq.ids):
            self._swap(i, self.decoding)
            self.decoding += 1
            self._next(self.decoding - 1, logits[0, -1], *_scan(logits[0, -1]))
        return len(chunk)

    def _decode(self, riders: list[_Row]) -> None:
        """One step: each decoding row's pending token, then as many of the riders' prompt
        tokens as the step has room for (the first riders' first); a rider whose prompt is then
        all in the cache samples its first token and joins the decoding rows."""
        rows = self.rows[: self.decoding]
        tokens = [r.seq.pending for r in rows]
        lens = [len(r.ids) for r in rows]
        at, taken = list(range(len(rows))), []
        for r in riders:
            n = min(len(r.seq.ids) - len(r.ids), self.slots - len(tokens))
            if n <= 0:
                break
            start, i = len(r.ids), self.rows.index(r)
            taken.append((r, r.seq.ids[start : start + n], len(tokens) + n - 1))
            tokens += r.seq.ids[start : start + n]
            lens += range(start, start + n)
            at += [i] * n
        logits = self._step(tokens, lens, at if taken else None)
        self.rode += len(tokens) - len(rows)
        self.steps += bool(rows)  # a step of prompt tokens only is a prefill
        self.widest = max(self.widest, len(rows))
        for r, t in zip(rows, tokens, strict=False):
            r.ids.append(t)
        peaks, best = _scan(logits[: len(rows)])
        for i in reversed(range(len(rows))):
            self._next(i, logits[i], peaks[i], best[i])
        for r, chunk, last in taken:  # in the order they came (their `used` is their admission)
            r.ids.extend(chunk)
            if len(r.ids) == len(r.seq.ids):
                self._swap(self.rows.index(r), self.decoding)
                self.decoding += 1
                self._next(self.decoding - 1, logits[last], *_scan(logits[last]))

    def _step(self, tokens: list[int], lens: list[int], at: list[int] | None) -> Tensor:
        """Logits (B, V): entry e's token at position lens[e] of cache row at[e] (default e),
        attending that row's columns 0..lens[e]."""
        if at is not None:
            return self._native.step_entries(tokens, lens, at)
        if self._native is not None and usable(self.model):
            return self._native.step_batch(tokens, lens, lens)  # rows 0..B-1, each at its length
        return torch_step(self.model, self.caches, tokens, lens)

    def _next(self, i: int, logits: Tensor, peak: float, best: int) -> None:
        """Sample row i's next token from its logits (V,), whose max and argmax `_scan` gave;
        emit it; finish the row if done."""
        row = self.rows[i]
        seq, s = row.seq, row.seq.sampling
        logits = logits.float()
        if not math.isfinite(peak):  # the max is NaN if any logit is, -inf if all are
            self._fail(row, "the model produced non-finite logits (NaN or infinity)")
            self._release(i, None)
            return
        raw = logits
        if seq.constraint is not None:
            allowed = seq.constraint.allowed(logits.shape[-1])
            if not bool(allowed.any()):
                self._fail(row, "the output grammar allows no next token")
                self._release(i, None)
                return
            logits = logits.masked_fill(~allowed, float("-inf"))
        if seq.constraint is None and s.temperature == 0:
            token = best  # greedy: what `sample` gives (NumPy's argmax, the first maximum)
        else:
            token = int(sample(logits[None], s.temperature, s.top_k, s.top_p, seq.generator)[0])
        lp, top = None, ()
        if s.logprobs is not None:
            logp = torch.log_softmax(raw, -1)
            lp = float(logp[token])
            if s.logprobs:
                v, ix = logp.topk(s.logprobs)
                top = tuple(zip(ix.tolist(), v.tolist(), strict=True))
        if token in self.eot:
            self._finish(i, "stop")
            return
        if seq.constraint is not None:
            seq.constraint.consume(token)
        seq.out.append(token)
        text = seq.text.push(token)
        self._emit(seq, "token", Token(token, text, lp, top))
        if seq.text.stopped or (seq.constraint is not None and seq.constraint.done):
            self._finish(i, "stop")
        elif len(seq.out) >= s.max_tokens or len(row.ids) >= self.context:
            self._finish(i, "length")
        else:
            seq.pending = token

    def _emit(self, seq: Sequence, kind: str, payload: Any) -> None:
        self._events.append((seq.sink, kind, payload))

    def _flush(self) -> None:
        """Hand the turn's events to their sinks, all at once after the turn's work: a sink
        that wakes another thread (an event loop) then competes for the interpreter while the
        next step runs in native code, not while this thread samples the other rows."""
        events, self._events = self._events, []
        for sink, kind, payload in events:
            sink(kind, payload)

    def _finish(self, i: int, reason: str) -> None:
        seq = self.rows[i].seq
        if rest := seq.text.flush():  # held back: an incomplete character, a stop's start
            self._emit(seq, "token", Token(-1, rest))
        self._emit(seq, "done", Done(reason, len(seq.ids), seq.cached, len(seq.out), seq.text.text))
        self._release(i, reason)

    def _fail(self, row: _Row, message: str) -> None:
        log.error("%s", message)
        self._emit(row.seq, "error", message)

    def _release(self, i: int, reason: str | None) -> None:
        row = self.rows[i]
        row.seq = None
        row.used = time.monotonic()
        if reason is None:
            row.ids.clear()
        if i < self.decoding:
            self._swap(i, self.decoding - 1)
            self.decoding -= 1

    def _swap(self, i: int, j: int) -> None:
        if i != j:
            swap_rows(self.caches, i, j, max(len(self.rows[i].ids), len(self.rows[j].ids)))
            self.rows[i], self.rows[j] = self.rows[j], self.rows[i]
