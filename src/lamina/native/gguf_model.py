"""A GGUF file's Llama model laid out in decode.c's structs, torch-free: `GGUFModel(path)`.

    uncovered(contents) -> why this file is not one GGUFModel runs (None: it is)
    m = GGUFModel(contents, cache_len, lib)   m.model: the `Model` struct; m.shape; m.caches
    llama_shape(contents) -> LlamaShape      the few numbers decode.c needs, from the metadata

What it covers (the rest is the torch path's, `lamina.open`): architecture "llama" with no rope
scaling, no sliding window, no biases and no rope_freqs tensor (plain Llama 1/2, SmolLM,
TinyLlama); F32 norms; linears of GGML's kept kinds (Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, and Q8_0
as a part of a fused linear of mixed kinds), read in place from the file's map; Q4_0 / Q4_1
converted to lamina's int4 rows and Q8_0 to its int8 rows (ggml_blocks.py: the torch path's
Int4Linear / Int8Linear take the same conversions and decode.c reads those forms fastest); a
Q8_0 token table as int8 rows too (a tied head reads the very same arrays), a kept-kind one in
place, or an F32 one. The rows of q and k are put back in the order
lamina's rotary halves read (llama.cpp's converter interleaves them: a copy of those two); a
fused q|k|v or gate|up of GGML kinds is decode.c's LIN_PARTS, each part its own rows. Q4_K and
Q5_0 parts are copied and laid out in decode.c's 16-row lanes where the CPU takes them, as the
torch path's one-row engine does (step.py's pack_kq_lanes). A converted or copied tensor's file
pages are handed back as it is done (the peak stays near the end state).

KV caches are float16 (B, Hkv, cache_len, hd) numpy arrays, one pair per layer (decode.c's kv16),
views of one anonymous map: pages count only once written.

Deliberately unaware of torch, tokenizers and sampling (runtime.py).
"""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass
from typing import Any

import numpy as np

from lamina.errors import LaminaError
from lamina.native.ggml_blocks import GROUP, int4_rows, int8_rows, rope_halves
from lamina.native.gguf_read import GGUFContents, GGUFTensor
from lamina.native.structs import (
    ACTIVATIONS,
    GGML_KINDS,
    LIN_F32,
    LIN_INT4,
    LIN_INT8,
    LIN_PARTS,
    Keep,
    Layer,
    Lin,
    Model,
    aligned_bytes,
)

ARCH = "llama"
# llama.{key} -> LlamaShape field (None: checked against the others, not kept)
_KEYS = {
    "block_count": "n_layers",
    "context_length": "block_size",
    "embedding_length": "d",
    "feed_forward_length": "ff",
    "attention.head_count": "H",
    "attention.head_count_kv": "Hkv",
    "attention.layer_norm_rms_epsilon": "eps",
    "rope.freq_base": "theta",
    "vocab_size": None,
    "rope.dimension_count": None,
    "attention.key_length": None,
    "attention.value_length": None,
}
_NEUTRAL = {"rope.scaling.type": ("none",), "rope.scaling.factor": (0.0, 1.0),
            "expert_count": (0,), "expert_used_count": (0,)}  # fmt: skip
_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
          "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")  # fmt: skip
INT4 = ("Q4_0", "Q4_1")


@dataclass(frozen=True)
class LlamaShape:
    n_layers: int
    d: int
    H: int
    Hkv: int
    ff: int
    vocab: int
    block_size: int
    eps: float = 1e-5
    theta: float = 10000.0

    @property
    def hd(self) -> int:
        return self.d // self.H


def llama_shape(contents: GGUFContents) -> LlamaShape | str:
    """The model's numbers, or why the metadata is not a plain Llama's (a str)."""
    meta, a = contents.metadata, ARCH + "."
    if meta.get("general.architecture") != ARCH:
        return f"architecture {meta.get('general.architecture')!r}, not {ARCH!r}"
    fields: dict[str, Any] = {}
    for key, value in meta.items():
        if not key.startswith(a):
            continue
        k = key[len(a) :]
        if k in _NEUTRAL and value in _NEUTRAL[k]:
            continue
        if k not in _KEYS:
            return f"GGUF key {key} (not a plain Llama's)"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"GGUF key {key} is not a number"
        if _KEYS[k]:
            fields[_KEYS[k]] = value
    table = contents.tensors.get("token_embd.weight")
    if table is None or len(table.shape) != 2:
        return "no 2-d token_embd.weight"
    fields["vocab"] = table.shape[0]
    missing = {"n_layers", "d", "H", "ff", "block_size"} - set(fields)
    if missing:
        return f"GGUF metadata lacks {', '.join(sorted(missing))}"
    fields.setdefault("Hkv", fields["H"])
    shape = LlamaShape(**{k: type(getattr(LlamaShape, k, 0))(v) for k, v in fields.items()})
    hd = shape.hd
    if shape.d % shape.H or hd % 8 or shape.H % max(shape.Hkv, 1) or table.shape[1] != shape.d:
        return f"heads {shape.H}/{shape.Hkv} of width {shape.d}/{shape.H}"
    for k in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if meta.get(a + k, hd) != hd:
            return f"GGUF key {a}{k} = {meta[a + k]} (heads are {hd} wide)"
    return shape


def _expected(shape: LlamaShape) -> dict[str, tuple[int, int] | tuple[int]]:
    d, hd, ff = shape.d, shape.hd, shape.ff
    want: dict[str, Any] = {"output_norm.weight": (d,), "token_embd.weight": (shape.vocab, d)}
    rows = {"attn_q": shape.H * hd, "attn_k": shape.Hkv * hd, "attn_v": shape.Hkv * hd,
            "attn_output": d, "ffn_gate": ff, "ffn_up": ff, "ffn_down": d}  # fmt: skip
    cols = {"attn_output": shape.H * hd, "ffn_down": ff}
    for i in range(shape.n_layers):
        for part in _BLOCK:
            name = f"blk.{i}.{part}.weight"
            want[name] = (d,) if part.endswith("norm") else (rows[part], cols.get(part, d))
    return want


def uncovered(contents: GGUFContents) -> str | None:
    """Why this file is not one GGUFModel runs (None: it is); see the module docstring."""
    shape = llama_shape(contents)
    if isinstance(shape, str):
        return shape
    want = _expected(shape)
    extra = set(contents.tensors) - set(want) - {"output.weight"}
    if extra:
        return f"tensor {sorted(extra)[0]} (not a plain Llama's)"
    want["output.weight"] = (shape.vocab, shape.d)
    for name, t in contents.tensors.items():
        if t.shape != want[name]:
            return f"tensor {name} has shape {t.shape}, not {want[name]}"
        if len(t.shape) == 1 and t.qtype != "F32":
            return f"tensor {name} is {t.qtype}, not F32"
        ok = ("F32", *GGML_KINDS) if name == "token_embd.weight" else (*GGML_KINDS, *INT4)
        if len(t.shape) == 2 and t.qtype not in ok:
            return f"tensor {name} is {t.qtype}"
    for i in range(shape.n_layers):
        for group in (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up")):
            kinds = {contents.tensors[f"blk.{i}.{p}.weight"].qtype in INT4 for p in group}
            if len(kinds) > 1:
                return f"layer {i} mixes Q4_0/Q4_1 with other kinds in one fused linear"
    return None


class GGUFModel:
    """decode.c's `Model` of a covered GGUF file (`uncovered` is None) and its KV caches."""

    def __init__(
        self, contents: GGUFContents, cache_len: int, lib: ctypes.CDLL, batch: int = 1
    ) -> None:
        why = uncovered(contents)
        if why is not None:
            raise LaminaError(f"{contents.path}: not covered by the native runtime: {why}")
        shape = llama_shape(contents)
        if isinstance(shape, str):  # uncovered() said it is not (kept for the type)
            raise LaminaError(f"{contents.path}: {shape}")
        if not 0 < cache_len <= shape.block_size:
            raise LaminaError(f"cache length {cache_len} outside 1..{shape.block_size}")
        self.contents, self.shape, self.lib, self.keep = contents, shape, lib, Keep()
        self.cache_len, self.batch = cache_len, batch
        t, H, Hkv, hd = contents.tensors, shape.H, shape.Hkv, shape.hd
        # one anonymous map for every cache: zero pages that count only once written (a
        # calloc may come from a heap that was used, and be written to zero up front)
        kv = (shape.n_layers, 2, batch, Hkv, cache_len, hd)
        self._kv_map = mmap.mmap(-1, int(np.prod(kv)) * 2)
        whole = np.frombuffer(self._kv_map, np.float16).reshape(kv)
        self.caches = [(whole[i, 0], whole[i, 1]) for i in range(shape.n_layers)]
        m = self.model = Model()
        m.n_layers, m.d, m.H, m.Hkv, m.hd = shape.n_layers, shape.d, H, Hkv, hd
        m.ff, m.vocab, m.cache_len, m.kv16 = shape.ff, shape.vocab, cache_len, 1
        m.norm, m.act, m.qk_norm, m.rope = 1, ACTIVATIONS["swiglu"], 0, 1
        m.eps, m.emb_scale, m.softcap = shape.eps, 0.0, 0.0
        # the table first: its file pages are handed back before the layers' are read
        table = t["token_embd.weight"]
        if table.qtype == "Q8_0":  # int8 rows, as the torch path's Int8Embedding (a tied head
            m.head = self._lin([(table, 0)])  # reads the same arrays: one copy)
            m.emb_kind, m.emb_gs, m.emb_w, m.emb_s = LIN_INT8, GROUP, m.head.w, m.head.s
        else:
            kind = LIN_F32 if table.qtype == "F32" else GGML_KINDS[table.qtype]
            m.emb_kind, m.emb_gs = kind, 0 if kind == LIN_F32 else GROUP
            m.emb_w = self.keep.address(table.raw)
        exps = np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)
        inv_freq = (np.float32(1.0) / (np.float32(shape.theta) ** exps)).astype(np.float32)
        m.inv_freq = self.keep.address(inv_freq)
        m.nfw = self.keep.address(t["output_norm.weight"].raw)
        if "output.weight" in t or table.qtype != "Q8_0":
            m.head = self._lin([(t.get("output.weight", table), 0)], lanes=False)
        layers = (Layer * shape.n_layers)()
        for i, ly in enumerate(layers):
            b = f"blk.{i}."
            ly.n1w = self.keep.address(t[b + "attn_norm.weight"].raw)
            ly.n2w = self.keep.address(t[b + "ffn_norm.weight"].raw)
            ly.qkv = self._lin([(t[b + "attn_q.weight"], H), (t[b + "attn_k.weight"], Hkv),
                                (t[b + "attn_v.weight"], 0)])  # fmt: skip
            ly.proj = self._lin([(t[b + "attn_output.weight"], 0)])
            ly.fc = self._lin([(t[b + "ffn_gate.weight"], 0), (t[b + "ffn_up.weight"], 0)])
            ly.out = self._lin([(t[b + "ffn_down.weight"], 0)])
            k, v = self.caches[i]
            ly.kc, ly.vc = self.keep.address(k), self.keep.address(v)
        m.layers = layers
        self._layers = layers

    def _lin(self, parts: list[tuple[GGUFTensor, int]], lanes: bool = True) -> Lin:
        """The `Lin` of a linear whose rows are the parts' stacked (heads > 0: un-permuted)."""
        L = Lin()
        L.n, L.k = sum(p.shape[0] for p, _ in parts), parts[0][0].shape[1]
        if parts[0][0].qtype in INT4:  # lamina's int4 rows, one struct for all the parts
            arrays: list[list[np.ndarray]] = [[], [], []]
            for p, heads in parts:
                q, s, zero = int4_rows(p.raw, p.qtype, p.shape)
                for got, a in zip(arrays, (q, s, zero - 8 * s), strict=True):
                    got.append(rope_halves(a, heads) if heads else a)
                self.contents.drop_pages(p.raw)
            q, s, mn = (np.ascontiguousarray(np.concatenate(a)) for a in arrays)
            L.kind, L.gs = LIN_INT4, GROUP
            L.w, L.s, L.mn = self.keep.address(q), self.keep.address(s), self.keep.address(mn)
            return L
        if all(p.qtype == "Q8_0" for p, _ in parts):  # int8 rows (the torch path's Int8Linear)
            arrays = [[], []]
            for p, heads in parts:
                for got, a in zip(arrays, int8_rows(p.raw, p.shape), strict=True):
                    got.append(rope_halves(a, heads) if heads else a)
                self.contents.drop_pages(p.raw)
            q, s = (np.ascontiguousarray(np.concatenate(a)) for a in arrays)
            L.kind, L.gs, L.w, L.s = LIN_INT8, GROUP, self.keep.address(q), self.keep.address(s)
            return L
        structs = self.keep.parts(len(parts)) if len(parts) > 1 else [L]
        for P, (p, heads) in zip(structs, parts, strict=True):
            P.kind, P.gs, P.n, P.k = GGML_KINDS[p.qtype], GROUP, p.shape[0], p.shape[1]
            rows = p.raw
            if heads:
                rows = rope_halves(rows, heads)
                self.contents.drop_pages(p.raw)
            if lanes and p.qtype in ("Q4_K", "Q5_0"):
                rows = self._kq_lanes(P, rows, p)
            P.w = self.keep.address(rows)
            if P.lw:
                P.lw = P.w
        if len(parts) > 1:
            L.kind, L.gs, L.w = LIN_PARTS, len(parts), ctypes.addressof(structs[0])
        return L

    def _kq_lanes(self, P: Lin, rows: np.ndarray, p: GGUFTensor) -> np.ndarray:
        """Q4_K / Q5_0 rows in decode.c's 16-row lanes (a copy; lm_kq_pack16), where it takes
        them."""
        if not self.lib.lm_kq_pack16(ctypes.addressof(P), None, 1):
            return rows  # not this CPU's form: read in place
        copy = aligned_bytes(rows.nbytes).reshape(rows.shape)
        copy[...] = rows
        if not self.lib.lm_kq_pack16(ctypes.addressof(P), copy.ctypes.data, 1):
            return rows
        if rows is p.raw:
            self.contents.drop_pages(p.raw)
        P.lw = 1  # marked: _lin points lw at the packed rows
        return copy
