"""One set of KV caches holding many sequences, a row each: the PyTorch side of the batch.

    lazy_caches(model, slots, context, dtype=None) -> caches            memory as rows fill
    prefill_row(model, caches, row, start, ids) -> logits (1, 1, V)   ids after `start` tokens
    torch_step(model, caches, tokens, lens) -> logits (B, V)           one token per row 0..B-1
    copy_prefix(caches, src, dst, n)                                    row dst gets src's first n
    swap_rows(caches, i, j, n)                                          (their first n columns)

`caches` are a model's `make_caches(slots, context)` (`lazy_caches`: the same, in memory the
OS commits page by page as the rows fill, so resident memory follows the tokens held instead of
slots x context from the start; zero until written, like make_caches'): row r of every layer's k and v is one
sequence, column t its token t. They may hold float16 where the model computes in float32 (the
batch's 16-bit caches, half the bytes a step's attention reads): a write rounds to the
cache's dtype, and the model's attention gets the keys and values back in its own dtype (so a
prompt chunk attends its own keys as rounded, as the native step's entries do). The model's forward sees a cache through a view whose
`append` writes where that row's tokens go: `prefill_row` writes a chunk of one row from
column `start` (keys of its earlier columns attended, causally); `torch_step` writes row r's
new key at column lens[r], returns the keys up to the longest row (a view, no copy) and masks,
per row, the columns past its own length, with each row's position lens[r]. So a row computes
what it would alone, whatever the other rows hold (the native multi-row step, where it covers
the model, does the same in one call: `NativeStep.step_batch`; `NativeStep.step_entries` takes
a row at several consecutive slots, a prompt's tokens riding a decode step).

Deliberately unaware of sequences, sampling and scheduling (`batch.py`).
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import torch
from torch import Tensor

from lamina.bounds import check_fits


class _RowsView:
    """A layer's cache during a step: row r writes at lens[r]; keys up to `width` returned."""

    def __init__(self, cache: Any, lens: Tensor, width: int) -> None:
        self.c, self.lens, self.width, self.pos = cache, lens, width, 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        B = k.shape[0]
        rows = torch.arange(B)
        self.c.k[rows, :, self.lens] = k[:, :, 0]
        self.c.v[rows, :, self.lens] = v[:, :, 0]
        w = self.width
        return self.c.k[:B, :, :w].to(k.dtype), self.c.v[:B, :, :w].to(v.dtype)


class _RowView:
    """One row's cache from column `start` on (a prefill chunk)."""

    def __init__(self, cache: Any, row: int, start: int) -> None:
        self.c, self.row, self.pos = cache, row, start

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        end = self.pos + k.shape[2]
        r = self.row
        self.c.k[r, :, self.pos : end] = k[0]
        self.c.v[r, :, self.pos : end] = v[0]
        self.pos = end
        return self.c.k[r : r + 1, :, :end].to(k.dtype), self.c.v[r : r + 1, :, :end].to(v.dtype)


def lazy_caches(
    model: Any, slots: int, context: int, dtype: torch.dtype | None = None
) -> list[Any]:
    """`model.make_caches(slots, context, dtype=dtype)` on the CPU, each layer's keys and
    values in an anonymous memory map (zero pages until written; see the module docstring)."""
    caches = model.make_caches(1, context, dtype=dtype)  # the model's checks; one row's memory
    if caches[0].k.device.type != "cpu":
        return model.make_caches(slots, context, dtype=dtype)
    n = slots * sum(c.k.nbytes + c.v.nbytes for c in caches)
    check_fits(n, f"KV caches for {slots} x {context:,} positions ({len(caches)} layers)")
    for c in caches:
        c.k, c.v = (_mapped_zeros((slots, *t.shape[1:]), t.dtype) for t in (c.k, c.v))
    return caches


def _mapped_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    buf = mmap.mmap(-1, math.prod(shape) * dtype.itemsize)  # the tensor keeps it alive
    return torch.frombuffer(buf, dtype=dtype).view(shape)


def prefill_row(model: Any, caches: list[Any], row: int, start: int, ids: list[int]) -> Tensor:
    """Logits (1, 1, V) after `ids`, written to `row` from column `start` on."""
    views = [_RowView(c, row, start) for c in caches]
    device = model.reference_tensor().device
    return model(torch.tensor([ids], device=device), caches=views, last_only=True)


def torch_step(model: Any, caches: list[Any], tokens: list[int], lens: list[int]) -> Tensor:
    """Logits (B, V): row r's token at position lens[r], attending its columns 0..lens[r]."""
    width = max(lens) + 1
    device = model.reference_tensor().device
    lens_t = torch.tensor(lens, device=device)
    views = [_RowsView(c, lens_t, width) for c in caches]
    masked = torch.arange(width, device=device)[None, :] > lens_t[:, None]
    ids = torch.tensor(tokens, device=device)[:, None]
    out = model(ids, masked if masked.any() else None, positions=lens_t[:, None], caches=views)
    return out[:, -1]


def copy_prefix(caches: list[Any], src: int, dst: int, n: int) -> None:
    for c in caches:
        c.k[dst, :, :n] = c.k[src, :, :n]
        c.v[dst, :, :n] = c.v[src, :, :n]


def swap_rows(caches: list[Any], i: int, j: int, n: int) -> None:
    if n:
        for c in caches:
            for t in (c.k, c.v):
                tmp = t[i, :, :n].clone()
                t[i, :, :n] = t[j, :, :n]
                t[j, :, :n] = tmp
