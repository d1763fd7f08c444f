"""A GPT's decode step in one native call: `NativeStep(model, caches)`, or None where it can't.

    engine = native_step(model, caches)        # None: not built here, or this model isn't covered
    logits = engine.step(tokens, positions, starts)   # (B, vocab) float32
    logits = engine.step_batch(tokens, positions, slots, rows=None, starts=None)  # (B, vocab)

One call runs every layer for one new token per row. `step` writes each layer's key and value
at the caches' `pos`, lets row r attend cache slots starts[r]..pos, returns the logits and
advances every cache's `pos` by one, as a PyTorch step through the caches does.

`step_batch` is for sequences decoded together at different lengths (a server's continuous
batching): batch row r is the sequence held in cache row rows[r] (default r); its new key and
value go to slot slots[r] of that row, and it attends that row's slots starts[r] (default 0)
..slots[r]. Nothing else about the caches is read or changed (their `pos` stays): the caller
keeps each sequence's length (its next slot) and fills a new sequence's row as it likes, e.g.
a PyTorch prefill through caches of batch 1 whose k and v are copied into row j of these
caches. The rows of a call share every weight block they read (the tiled multi-row path), so
B sequences cost far less than B separate steps; each row's logits are those it would get
decoded alone (tests/test_native.py holds them equal). The model's own tensors are read in
place (pointers into them, kept alive here), so building an engine costs no copy and about a
millisecond; build one per generation (or per server), since it sees the tensors the model
holds at that moment.

What it covers, and otherwise returns None from `native_step` (with `unsupported(model)`
saying why), leaving PyTorch to run the step:
  * a pre-LN lamina GPT, float32 on the CPU (LayerNorm or RMSNorm, with or
    without gains and shifts; GELU, ReLU, ReLU² or SwiGLU; learned, sinusoidal, rotary or no
    positions; grouped-query attention, QK-norm, biases, embedding scale, logit soft cap);
  * linears that are plain `nn.Linear` (float32), `Int4Linear` or `Int8Linear` (grouped or per
    row) with input widths a multiple of 32 for the quantized ones, or `BlockLinear`s of GGML
    blocks as a GGUF file holds them (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q5_1, parts of different
    kinds stacked by rows); a LoRA-wrapped layer is not covered (merge it first);
  * a token table that is float32, an `Int8Embedding` or a `BlockEmbedding` (a tied head
    reading the same blocks);
  * float32 `KVCache`s of one length.
It computes what the model computes in eval mode without gradients: dropout is not applied,
so callers use it only then (`usable(model)`). The quantized linears quantize their input to int16 in blocks of 32, so their outputs differ
from the same weights dequantized to float by ~1e-4 relative (SmolLM2 Q4_1: 4e-5 on the
logits, closer than PyTorch's bf16-input int4 kernel at 7e-3); float linears differ only by
summation order. tests/test_native.py holds every case to the PyTorch step.

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
from lamina.block import LayerNorm, RMSNorm
from lamina.errors import LaminaError
from lamina.models.gpt import GPT
from lamina.native.build import expect_layout, library

LIN_F32, LIN_INT4, LIN_INT8, LIN_PARTS = 0, 1, 2, 9
# GGML's blocks as a GGUF file holds them (lamina.quant.kquant), read by decode.c as stored
GGML_KINDS = {"Q4_K": 3, "Q5_K": 4, "Q6_K": 5, "Q8_0": 6, "Q5_0": 7, "Q5_1": 8}
ACTIVATIONS = {"gelu": 0, "relu": 1, "relu2": 2, "swiglu": 3}
_p = ctypes.c_void_p


class _Lin(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("kind", "n", "k", "gs")] + [
        ("w", _p),
        ("s", _p),
        ("mn", _p),
        ("bias", _p),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [(n, _p) for n in ("n1w", "n1b", "n2w", "n2b", "qg", "kg")] + [
        ("qkv", _Lin),
        ("proj", _Lin),
        ("fc", _Lin),
        ("out", _Lin),
        ("kc", _p),
        ("vc", _p),
    ]


class _Model(ctypes.Structure):
    _fields_ = (
        [
            (n, ctypes.c_int32)
            for n in ("n_layers", "d", "H", "Hkv", "hd", "ff", "vocab", "cache_len")
        ]
        + [(n, ctypes.c_int32) for n in ("norm", "act", "qk_norm", "rope")]
        + [(n, ctypes.c_float) for n in ("eps", "emb_scale", "softcap")]
        + [("emb_kind", ctypes.c_int32), ("emb_gs", ctypes.c_int32)]
        + [(n, _p) for n in ("emb_w", "emb_s", "pos_table", "inv_freq", "nfw", "nfb")]
        + [("head", _Lin), ("layers", ctypes.POINTER(_Layer))]
    )


expect_layout(Lin=_Lin, Layer=_Layer, Model=_Model)  # build.py compares decode.c's with these


def _float32(t: Tensor | None) -> bool:
    return t is None or (t.dtype == torch.float32 and t.device.type == "cpu")


def kind_of(m: nn.Module) -> str | None:
    """ "float" for a plain nn.Linear or nn.Embedding, else the quantized layout a module
    declares it stores (`native_kind` on lamina.quant's classes: "int4", "int8", "int8-table",
    "ggml" and "ggml-table" for GGML's blocks);
    None for anything else (a LoRA wrapper, say)."""
    if type(m) in (nn.Linear, nn.Embedding):
        return "float"
    return getattr(type(m), "native_kind", None)


def _linear_problem(name: str, m: nn.Module) -> str | None:
    kind = kind_of(m)
    if kind == "float" and type(m) is nn.Linear:
        return None if _float32(m.weight) and _float32(m.bias) else f"{name} is not float32"
    if kind == "int4":
        return None if _blocks_of_32(m.group_size) else f"{name}: int4 groups of {m.group_size}"
    if kind == "int8":
        g = m.group_size
        if m.in_features % 32 or (g is not None and not _blocks_of_32(g)):
            return f"{name}: int8 rows of {m.in_features} (groups {m.group_size})"
        return None
    if kind == "ggml":
        bad = [q for q in m.qtypes if q not in GGML_KINDS]
        return f"{name}: GGML blocks {', '.join(bad)}" if bad else None
    return f"{name} is a {type(m).__name__}"


def _blocks_of_32(g: int) -> bool:
    """What decode.c assumes of a group: g / 32 blocks of 32, a power of two."""
    return g > 0 and g % 32 == 0 and (g // 32) & (g // 32 - 1) == 0


def unsupported(model: object) -> str | None:
    """Why the native step does not cover this model (None when it does)."""
    if not isinstance(model, GPT):
        return f"not a lamina GPT ({type(model).__name__})"
    c = model.config
    if not c.norm_first:
        return "post-LN blocks"
    layer_options = {  # Gemma, Phi-3 and Mistral layers: the PyTorch step runs them
        "sliding_window": c.sliding_window is not None,
        "rope_local_theta": c.rope_local_theta is not None,
        "attn_softcap": c.attn_softcap is not None,
        "attn_scale": c.attn_scale is not None,
        "embed_scale": c.embed_scale is not None,
        "norm_offset": c.norm_offset != 0,
        "sandwich_norm": c.sandwich_norm,
        "rotary_dim": c.rotary_dim is not None,
        "longrope": c.rope_scaling is not None and c.rope_scaling.kind == "longrope",
    }
    used = [name for name, on in layer_options.items() if on]
    if used:
        return f"{', '.join(used)}: not in the native step"
    if c.activation not in ACTIVATIONS:
        return f"activation {c.activation!r}"
    if c.head_dim % 2:
        return f"odd head width {c.head_dim}"
    norm_type = LayerNorm if c.norm == "layer" else RMSNorm
    wte = model.embed.wte
    if kind_of(wte) == "float":
        if not _float32(wte.weight):
            return "the token table is not float32"
    elif kind_of(wte) == "ggml-table":
        if wte.qtype not in GGML_KINDS:
            return f"token table of GGML blocks {wte.qtype}"
    elif kind_of(wte) != "int8-table":
        return f"token table {type(wte).__name__}"
    if model.embed.wpe is not None and not _float32(model.embed.wpe.weight):
        return "the position table is not float32"
    linears = [("head", model.head)]
    norms = [model.norm_f]
    for i, b in enumerate(model.blocks):
        linears += [
            (f"block {i} qkv", b.attn.qkv),
            (f"block {i} attention output", b.attn.proj),
            (f"block {i} feed-forward in", b.ff.fc),
            (f"block {i} feed-forward out", b.ff.proj),
        ]
        norms += [b.norm1, b.norm2]
    for name, lin in linears:
        problem = _linear_problem(name, lin)
        if problem:
            return problem
    for n in norms:
        if type(n) is not norm_type or n.eps != c.layer_norm_eps:
            return f"norm {type(n).__name__}"
        if not (_float32(n.weight) and _float32(getattr(n, "bias", None))):
            return "a norm is not float32"
    return None


def int4_rows(scales_and_zeros: Tensor) -> tuple[Tensor, Tensor]:
    """lamina's int4 (K/gs, N, 2) scales and zeros -> the native kernel's (N, K/gs) scales and
    minimums (w = q scale + minimum, minimum = zero - 8 scale), each row's groups side by side."""
    s, z = scales_and_zeros.detach().float().transpose(0, 1).unbind(-1)
    return s.contiguous(), (z - 8 * s).contiguous()


def linear(m: nn.Module, x: Tensor) -> Tensor:
    """x (M, K) float32 -> (M, N): a quantized linear (its bias included) through the native
    kernel, for a few rows at a time (a short prefill); the caller checks `library()`."""
    ptrs = _Pointers()  # alive until the call returns
    L = ptrs.lin(m)
    x = x.detach().float().contiguous()
    y = torch.empty(x.shape[0], m.out_features)
    threads = torch.get_num_threads()
    if not library().lm_linear(
        ctypes.addressof(L), x.shape[0], x.data_ptr(), y.data_ptr(), threads
    ):
        raise LaminaError("the native linear failed (out of memory or threads)")
    return y


class _Pointers:
    """Pointers into tensors for the C structs, each tensor kept alive here."""

    def __init__(self) -> None:
        self.keep: list[Tensor] = []
        self.structs: list[ctypes.Array[_Lin]] = []  # the parts of LIN_PARTS linears

    def t(self, t: Tensor | None) -> int | None:
        """A pointer to t's data (made contiguous float32 or int first if needed)."""
        if t is None:
            return None
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        self.keep.append(t)
        return t.data_ptr()

    def lin(self, m: nn.Module) -> _Lin:
        L = _Lin()
        kind = kind_of(m)
        if kind == "float":
            L.kind, L.gs, L.w = LIN_F32, 0, self.t(m.weight)
        elif kind == "ggml":
            parts = m.parts
            L.n, L.k = m.out_features, m.in_features
            if len(parts) == 1:
                self._ggml(L, *parts[0], m.bias)
                return L
            array, at = (_Lin * len(parts))(), 0
            for P, (qtype, rows) in zip(array, parts, strict=True):
                P.n, P.k = rows.shape[0], m.in_features
                bias = None if m.bias is None else m.bias[at : at + P.n]
                self._ggml(P, qtype, rows, bias)
                at += P.n
            self.structs.append(array)
            L.kind, L.gs, L.w, L.bias = LIN_PARTS, len(parts), ctypes.addressof(array), None
            return L
        elif kind == "int4":
            L.kind, L.gs = LIN_INT4, m.group_size
            scale, low = m.native_scale, m.native_min
            if scale is None:  # prepared for another kernel: the native layout, made here
                scale, low = int4_rows(m.scales_and_zeros)
            L.w, L.s, L.mn = self.t(m.qweight), self.t(scale), self.t(low)
        else:
            L.kind, L.gs = LIN_INT8, m.group_size or m.in_features
            L.w, L.s = self.t(m.qweight), self.t(m.scale)
        L.n, L.k = m.out_features, m.in_features
        L.bias = self.t(m.bias)
        return L

    def _ggml(self, L: _Lin, qtype: str, rows: Tensor, bias: Tensor | None) -> None:
        L.kind, L.gs, L.w, L.bias = GGML_KINDS[qtype], 32, self.t(rows), self.t(bias)


class NativeStep:
    """The decode step of one model over one set of caches; see the module docstring."""

    def __init__(self, model: GPT, caches: Sequence[KVCache], lib: ctypes.CDLL) -> None:
        c = model.config
        self.lib, self.config = lib, c
        self._ptrs = _Pointers()  # every tensor a pointer was taken from, kept alive
        self._t, self._lin = self._ptrs.t, self._ptrs.lin
        lens = {cache.max_len for cache in caches}
        if len(caches) != c.n_layers or len(lens) != 1:
            raise LaminaError(f"expected {c.n_layers} KV caches of one length")
        for cache in caches:
            for t in (cache.k, cache.v):
                if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
                    raise LaminaError("the native step needs contiguous float32 CPU caches")
        self.cache_len, self.cache_batch = lens.pop(), caches[0].k.shape[0]
        self._caches = list(caches)
        layers = (_Layer * c.n_layers)()
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
            ly.qkv, ly.proj = self._lin(a.qkv), self._lin(a.proj)
            ly.fc, ly.out = self._lin(block.ff.fc), self._lin(block.ff.proj)
            ly.kc, ly.vc = self._t(cache.k), self._t(cache.v)
        self._layers = layers
        m = self._model = _Model()
        m.n_layers, m.d, m.H, m.Hkv = c.n_layers, c.d_model, c.n_heads, c.kv_heads
        m.hd, m.ff, m.vocab, m.cache_len = c.head_dim, c.ff_width, c.vocab_size, self.cache_len
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
        m.head = self._lin(model.head)
        m.layers = layers
        self._fn = lib.lm_step

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
        if not 0 < B <= self.cache_batch or not len(positions) == len(starts) == len(slots) == B:
            raise LaminaError(f"a step takes 1..{self.cache_batch} rows, each with a position")
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


def usable(model: nn.Module) -> bool:
    """Whether a step may run natively now: eval mode, no gradients being recorded."""
    return not model.training and not torch.is_grad_enabled()


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
