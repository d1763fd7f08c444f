"""A GPT's decode step in one native call: `NativeStep(model, caches)`, or None where it can't.

    engine = native_step(model, caches)        # None: not built here, or this model isn't covered
    logits = engine.step(tokens, positions, starts)   # (B, vocab) float32
    logits = engine.step_batch(tokens, positions, slots, rows=None, starts=None)  # (B, vocab)
    logits = engine.step_entries(tokens, slots, rows)   # (N, vocab): a row at several slots
    y = linear(module, x)                      # one quantized linear, for a short prefill
    pack_lanes(int4_linear) -> bool            its weights in 16-row lanes, in place (one copy)
    unpack_lanes(int4_linear) -> (qweight, scale, minimum)   its rows' layout, new tensors
    pack_kq_lanes(block_linear, shared=None) -> int   its Q4_K parts in 16-row lanes, in place

One call runs every layer for one new token per row. `step` writes each layer's key and value
at the caches' `pos`, lets row r attend cache slots starts[r]..pos, returns the logits and
advances every cache's `pos` by one, as a PyTorch step through the caches does.

`step_batch` is for sequences decoded together at different lengths (a server's continuous
batching): batch row r is the sequence held in cache row rows[r] (default r); its new key and
value go to slot slots[r] of that row, and it attends that row's slots starts[r] (default 0)
..slots[r]. Nothing else about the caches is read or changed (their `pos` stays): the caller
keeps each sequence's length (its next slot) and fills a new sequence's row as it likes, e.g.
a PyTorch prefill through caches of batch 1 whose k and v are copied into row j of these
caches. `step_entries` is the same call with a row allowed at several slots (a prompt's tokens
riding other rows' decode step, each token one entry at its own slot and position): the kernel
stores every entry's key and value of a layer before any entry of that layer attends, so a
row's entries at consecutive slots are a causal prefill of those tokens. The rows of a call share every weight block they read (the tiled multi-row path), so
B sequences cost far less than B separate steps; each row's logits are those it would get
decoded alone (tests/test_native.py holds them equal). The model's own tensors are read in
place (pointers into them, kept alive here), so building an engine costs no copy; build one
per generation (or per server), since it sees the tensors the model holds at that moment. An
engine of 3 cache rows or more (a server's) first lays each int4 linear out in lanes where the
CPU has AVX-512 VNNI (`pack_lanes`: in place, the module keeps that layout and every native
call on it, one row or many, reads it; PyTorch's paths read it back through `unpack_lanes`).
Those calls round their inputs to int8 per 32 (llama.cpp's Q8_1 activations; decode.c's lanes8,
`lm_lanes_act8(0)` or LAMINA_LANES_ACT8=0 keeps int16), and so does the head of a step of such
an engine: ~2e-2 of the logits from the float model's instead of ~1e-4. Such an engine's int8
head (a GGUF's tied token table, SmolLM2's) gets a copy in lanes beside its rows (decode.c's
lm_pack_i8, where the CPU has AVX-512 VNNI: +28 MB for SmolLM2), which its steps of 3 rows or
more read (the same bits as the rows' kernel, at about half its time); the token table and the
one- and two-row heads keep reading the rows. An engine of one or
two rows (chat, sample) lays each Q4_K part out in decode.c's 16-row lanes instead
(`pack_kq_lanes`), which a one-row call reads fastest; a batch's engine leaves Q4_K in GGML's
rows, which its several-row calls would otherwise unpack every call.

Which models it covers is coverage.py's (`unsupported(model)` says why not); `native_step`
returns None for the rest, leaving PyTorch to run the step. The quantized linears quantize
their input to int16 in blocks of 32, so their outputs differ from the same weights dequantized
to float by ~1e-4 relative (closer than PyTorch's bf16-input int4 kernel); float linears differ
only by summation order. tests/test_native.py holds every case to the PyTorch step.

The caches may be float32 or float16 (a server's 16-bit rows, `lazy_caches(..., torch.float16)`):
with float16 each new key and value is stored rounded as torch rounds a float32 -> float16
copy, and attention reads the halves (decode.c's kv16).

Deliberately unaware of sampling, windows and stopping: tokens and positions in, logits out.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

import lamina.cpu as cpu
from lamina.attention import KVCache, rotary_frequencies
from lamina.errors import LaminaError
from lamina.libc import trim_freed_memory
from lamina.models.gpt import GPT
from lamina.native.build import library
from lamina.native.coverage import unsupported
from lamina.native.pointers import Pointers, kind_of
from lamina.native.structs import (
    ACTIVATIONS,
    GGML_KINDS,
    LIN_F32,
    LIN_INT8,
    Layer,
    Lin,
    Model,
    aligned_bytes,
)


def _aligned(nbytes: int, dtype: torch.dtype) -> Tensor:
    """A 64-byte aligned 1-d tensor of nbytes (structs.aligned_bytes, shared with torch)."""
    return torch.from_numpy(aligned_bytes(nbytes)).view(dtype)


def pack_lanes(m: nn.Module) -> bool:
    """Lay an int4 linear's weights, scales and minimums out in lanes (decode.c's lm_pack16,
    where the CPU has AVX-512 VNNI) IN PLACE: m.lanes_w / lanes_s / lanes_mn take the place of
    qweight / native_scale / native_min, which go (one copy of the weights, not two). Every
    native call reads the lanes (one row as 8); `Int4Linear.dequantized` and
    `restore_saved_scales` read them back (`unpack_lanes`). False (nothing changed) where it does not apply: not an
    int4 linear prepared for the native kernel, no library, or not this CPU's form."""
    lib = library()
    if kind_of(m) != "int4" or lib is None or getattr(m, "lanes_w", None) is not None:
        return False
    if m.native_scale is None:
        return False  # prepared for another kernel: its rows stay as they are
    ptrs = Pointers()  # alive until packed
    L = ptrs.lin(m)
    if not lib.lm_pack16(ctypes.addressof(L), None, None, None):
        return False
    floats = (L.n + 15) // 16 * (L.k // 32) * 16  # per group of 16 rows and block
    w = _aligned(16 * floats, torch.uint8)
    sc, mn = _aligned(4 * floats, torch.float32), _aligned(4 * floats, torch.float32)
    if not lib.lm_pack16(ctypes.addressof(L), w.data_ptr(), sc.data_ptr(), mn.data_ptr()):
        raise LaminaError("decode.c's lm_pack16 refused a linear it had accepted")
    m.lanes_w, m.lanes_s, m.lanes_mn = w, sc, mn
    m.qweight = m.native_scale = m.native_min = None
    return True


def pack_kq_lanes(m: nn.Module, shared: Tensor | None = None) -> int:
    """Lay a `BlockLinear`'s Q4_K and Q5_0 parts out in decode.c's 16-row lanes (lm_kq_pack16,
    where the CPU has AVX-512 VNNI and LAMINA_KQ_LANES / LAMINA_Q50_LANES is not 0) IN PLACE:
    the same bytes, so one copy; a one-row call then runs the lanes form, any other call
    unpacks 16 rows at a time, and `BlockLinear.parts` and its state dict read the rows back in
    GGML's layout. A part whose storage is `shared`'s (a head tied to its token table) stays as
    it is. Returns the parts laid out."""
    lib = library()
    if kind_of(m) != "ggml" or lib is None:
        return 0
    done = 0
    for i, (qtype, rows, lanes) in enumerate(m.native_parts):
        if lanes or qtype not in ("Q4_K", "Q5_0") or not rows.is_contiguous():
            continue
        if (
            shared is not None
            and rows.untyped_storage().data_ptr() == shared.untyped_storage().data_ptr()
        ):
            continue
        L = Lin()
        L.kind, L.n, L.k = GGML_KINDS[qtype], rows.shape[0], m.in_features
        if not lib.lm_kq_pack16(ctypes.addressof(L), rows.data_ptr(), 1):
            continue
        m.lanes[i] = True
        done += 1
    return done


def unpack_lanes(m: nn.Module) -> tuple[Tensor, Tensor, Tensor]:
    """An int4 linear laid out in lanes (`pack_lanes`) -> its rows' layout, new tensors:
    qweight uint8 (N, K/2), scales and minimums float (N, K/gs) (w = q s + minimum)."""
    lib = library()
    if lib is None:
        raise LaminaError("an int4 linear in lanes needs the native library to unpack")
    L = Pointers().lin(m)
    n, k, groups = m.out_features, m.in_features, m.in_features // m.group_size
    q = torch.empty(n, k // 2, dtype=torch.uint8)
    s, low = torch.empty(n, groups), torch.empty(n, groups)
    if not lib.lm_unpack16(ctypes.addressof(L), q.data_ptr(), s.data_ptr(), low.data_ptr()):
        raise LaminaError("decode.c's lm_unpack16 refused an int4 linear in lanes")
    return q, s, low


def linear(m: nn.Module, x: Tensor) -> Tensor:
    """x (M, K) float32 -> (M, N): a quantized linear (its bias included) through the native
    kernel, for a few rows at a time (a short prefill); the caller checks `library()`."""
    ptrs = Pointers()  # alive until the call returns
    L = ptrs.lin(m)
    x = x.detach().float().contiguous()
    y = torch.empty(x.shape[0], m.out_features)
    threads = torch.get_num_threads()
    if not library().lm_linear(
        ctypes.addressof(L), x.shape[0], x.data_ptr(), y.data_ptr(), threads
    ):
        raise LaminaError("the native linear failed (out of memory or threads)")
    return y


class NativeStep:
    """The decode step of one model over one set of caches; see the module docstring."""

    def __init__(self, model: GPT, caches: Sequence[KVCache], lib: ctypes.CDLL) -> None:
        c = model.config
        self.lib, self.config = lib, c
        self._ptrs = Pointers()  # every tensor a pointer was taken from, kept alive
        self._t, self._lin = self._ptrs.t, self._ptrs.lin
        lens = {cache.max_len for cache in caches}
        if len(caches) != c.n_layers or len(lens) != 1:
            raise LaminaError(f"expected {c.n_layers} KV caches of one length")
        dtypes = {t.dtype for cache in caches for t in (cache.k, cache.v)}
        for cache in caches:
            for t in (cache.k, cache.v):
                if not t.is_contiguous() or t.device.type != "cpu":
                    raise LaminaError("the native step needs contiguous CPU caches")
        if len(dtypes) != 1 or not dtypes <= {torch.float32, torch.float16}:
            raise LaminaError(f"the native step needs float32 or float16 caches, got {dtypes}")
        self.cache_len, self.cache_batch = lens.pop(), caches[0].k.shape[0]
        self._caches = list(caches)
        layers, packed = (Layer * c.n_layers)(), 0
        for i, (block, cache) in enumerate(zip(model.blocks, caches, strict=True)):
            ly = layers[i]
            a = block.attn
            ly.n1w, ly.n1b = (
                self._t(block.norm1.weight),
                self._t(getattr(block.norm1, "bias", None)),
            )
            ly.n2w, ly.n2b = (
                self._t(block.norm2.weight),
                self._t(getattr(block.norm2, "bias", None)),
            )
            ly.qg, ly.kg = self._t(a.q_gain), self._t(a.k_gain)
            mods = (a.qkv, a.proj, block.ff.fc, block.ff.proj)
            if self.cache_batch >= 3:  # a batch's engine: the int4 linears in lanes, in place
                packed += sum(pack_lanes(mod) for mod in mods)
            if self.cache_batch < 3:  # a one-row engine: Q4_K in 16-row lanes, in place
                for mod in mods:  # (a batch's several rows would unpack them every call)
                    pack_kq_lanes(mod)
            ly.qkv, ly.proj, ly.fc, ly.out = (self._lin(mod) for mod in mods)
            ly.kc, ly.vc = self._t(cache.k), self._t(cache.v)
        self._layers = layers
        m = self._model = Model()
        m.n_layers, m.d, m.H, m.Hkv = c.n_layers, c.d_model, c.n_heads, c.kv_heads
        m.hd, m.ff, m.vocab, m.cache_len = c.head_dim, c.ff_width, c.vocab_size, self.cache_len
        m.kv16 = int(dtypes == {torch.float16})
        m.norm, m.act = (0 if c.norm == "layer" else 1), ACTIVATIONS[c.activation]
        m.qk_norm, m.rope = int(c.qk_norm), int(c.positions == "rope")
        m.eps, m.softcap = c.layer_norm_eps, c.logit_softcap or 0.0
        emb = model.embed
        m.emb_scale = math.sqrt(c.d_model) if emb.scale else 0.0
        if kind_of(emb.wte) == "ggml-table":
            m.emb_kind, m.emb_gs, m.emb_w = GGML_KINDS[emb.wte.qtype], 32, self._t(emb.wte.blocks)
        elif kind_of(emb.wte) == "int8-table":
            m.emb_kind, m.emb_gs = LIN_INT8, emb.wte.group_size or c.d_model
            m.emb_w, m.emb_s = self._t(emb.wte.qweight), self._t(emb.wte.scale)
        else:
            m.emb_kind, m.emb_gs, m.emb_w = LIN_F32, 0, self._t(emb.wte.weight)
        table = emb.wpe.weight if emb.wpe is not None else getattr(emb, "pe", None)
        m.pos_table = self._t(table) if c.positions in ("learned", "sinusoidal") else None
        self.block_size = c.block_size
        if m.rope:
            m.inv_freq = self._t(rotary_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))
        m.nfw = self._t(getattr(model.norm_f, "weight", None))
        m.nfb = self._t(getattr(model.norm_f, "bias", None))
        if self.cache_batch >= 3:
            packed += pack_lanes(model.head)
        else:
            pack_kq_lanes(model.head, getattr(emb.wte, "blocks", None))
        if packed:
            trim_freed_memory()  # the rows' layouts pack_lanes freed: small chunks amid the heap
        head = self._lin(model.head)
        if self.cache_batch >= 3 and kind_of(model.head) == "int8":
            self._head_lanes = self._int8_lanes(head)
        m.head = head
        m.layers = layers
        self._fn = lib.lm_step

    def _int8_lanes(self, L: Lin) -> tuple[Tensor, Tensor] | None:
        """A batch engine's int8 head (a GGUF's tied token table) laid out again in lanes
        (decode.c's lm_pack_i8, where the CPU has AVX-512 VNNI): a copy beside the rows, which
        the token table and the one- and two-row heads keep reading; L.lw / L.ls point at it.
        Returns the copy (kept alive here), or None where it does not apply."""
        if not self.lib.lm_pack_i8(ctypes.addressof(L), None, None):
            return None
        ng, nb, groups = (L.n + 15) // 16, L.k // 32, L.k // L.gs
        w = _aligned(ng * nb * 512, torch.uint8)
        sc = _aligned(4 * ng * groups * 16, torch.float32)
        if not self.lib.lm_pack_i8(ctypes.addressof(L), w.data_ptr(), sc.data_ptr()):
            raise LaminaError("decode.c's lm_pack_i8 refused a linear it had accepted")
        L.lw, L.ls = w.data_ptr(), sc.data_ptr()
        return w, sc

    def step(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        starts: Sequence[int],
        threads: int | None = None,
    ) -> Tensor:
        """Logits (B, vocab) for one new token per row (see the module docstring), on
        `threads` threads (default: torch's intra-op count)."""
        slot, B = self._caches[0].pos, len(tokens)
        if not 0 < B <= self.cache_batch:
            raise LaminaError(f"a step takes 1..{self.cache_batch} rows")
        if not 0 <= slot < self.cache_len:
            raise LaminaError(f"the KV caches are full ({self.cache_len} tokens)")
        logits = self._run(tokens, positions, starts, [slot] * B, list(range(B)), threads)
        for cache in self._caches:
            cache.pos += 1
        return logits

    def step_batch(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        rows: Sequence[int] | None = None,
        starts: Sequence[int] | None = None,
        threads: int | None = None,
    ) -> Tensor:
        """Logits (B, vocab) for sequences decoded together, each in its own cache row (see
        the module docstring): row r writes slot slots[r] of cache row rows[r] (default r)
        and attends that row's slots starts[r] (default 0) ..slots[r]. The caches' `pos` is
        neither read nor advanced: each sequence's fill is the caller's to keep."""
        B = len(tokens)
        rows = list(range(B)) if rows is None else list(rows)
        starts = [0] * B if starts is None else list(starts)
        if len(rows) != B or len(set(rows)) != B:
            raise LaminaError(f"step_batch needs {B} distinct cache rows, got {rows}")
        for s, r in zip(slots, rows, strict=False):
            if not (0 <= s < self.cache_len and 0 <= r < self.cache_batch):
                raise LaminaError(
                    f"slot {s} (cache length {self.cache_len}) or cache row {r} "
                    f"(cache batch {self.cache_batch}) out of range"
                )
        return self._run(tokens, positions, starts, slots, rows, threads)

    def step_entries(
        self,
        tokens: Sequence[int],
        slots: Sequence[int],
        rows: Sequence[int],
        threads: int | None = None,
    ) -> Tensor:
        """Logits (N, vocab) over N entries: entry e is token tokens[e] at slot (and
        position) slots[e] of cache row rows[e], attending that row's slots 0..slots[e]. A row
        may stand in several entries, at distinct slots; the slots a row's entries attend and do
        not write must hold its earlier tokens (the caller's to keep, as in `step_batch`)."""
        N = len(tokens)
        if not len(slots) == len(rows) == N:
            raise LaminaError(f"step_entries needs a slot and a row for each of {N} tokens")
        if len(set(zip(rows, slots, strict=True))) != N:
            raise LaminaError("step_entries got two entries at one slot of one cache row")
        for s, r in zip(slots, rows, strict=True):
            if not (0 <= s < self.cache_len and 0 <= r < self.cache_batch):
                raise LaminaError(
                    f"slot {s} (cache length {self.cache_len}) or cache row {r} "
                    f"(cache batch {self.cache_batch}) out of range"
                )
        return self._run(tokens, slots, [0] * N, slots, rows, threads)

    def _run(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        starts: Sequence[int],
        slots: Sequence[int],
        rows: Sequence[int],
        threads: int | None,
    ) -> Tensor:
        B = len(tokens)
        if not 0 < B or not len(positions) == len(starts) == len(slots) == B:
            raise LaminaError("a step takes one entry or more, each with a position")
        vocab = self.config.vocab_size
        for t, p, s, slot in zip(tokens, positions, starts, slots, strict=True):
            if not (0 <= t < vocab and 0 <= p < self.block_size and 0 <= s <= slot):
                raise LaminaError(
                    f"token {t} (vocab {vocab}), position {p} (block {self.block_size}) or "
                    f"first slot {s} (slot {slot}) out of range"
                )
        arr = ctypes.c_int64 * B
        # alive through the call
        tok, pos, first, at, row = (arr(*v) for v in (tokens, positions, starts, slots, rows))
        logits = torch.empty(B, vocab)
        ok = self._fn(
            ctypes.addressof(self._model),
            B,
            *(ctypes.addressof(v) for v in (tok, pos, first, at, row)),
            logits.data_ptr(),
            threads or torch.get_num_threads(),
        )
        if not ok:
            raise LaminaError("the native step failed (out of memory or threads)")
        return logits


def native_step(model: GPT, caches: Sequence[KVCache]) -> NativeStep | None:
    """A `NativeStep` for this model and caches, or None where PyTorch must run the step
    (lamina.cpu.native_step() says whether the native one may run here and now)."""
    if not cpu.native_step():
        return None
    lib = library()
    if lib is None or unsupported(model) is not None:
        return None
    try:
        return NativeStep(model, caches, lib)
    except LaminaError:
        return None
