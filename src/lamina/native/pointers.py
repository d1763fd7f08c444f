"""How a model's torch modules fill decode.c's structs (structs.py): `Pointers().lin(m)`.

    kind_of(module) -> "float" | "int4" | "int8" | "int8-table" | "ggml" | "ggml-table" | None
    int4_rows(scales_and_zeros) -> (scales, minimums)   lamina's int4 layout -> the kernel's
    Pointers()                 pointers into tensors for the structs, each tensor kept alive

A `Pointers` is structs.py's `Keep` for tensors: it keeps every tensor (and every array of
parts) it pointed at alive as long as it lives, so its owner (a NativeStep, or one native
linear call) keeps it beside the structs.

Deliberately unaware of which models the step covers (coverage.py) and of running it (step.py).
"""

from __future__ import annotations

import ctypes

from torch import Tensor, nn

from lamina.native.structs import GGML_KINDS, LIN_F32, LIN_INT4, LIN_INT8, LIN_PARTS, Keep, Lin


def kind_of(m: nn.Module) -> str | None:
    """ "float" for a plain nn.Linear or nn.Embedding, else the quantized layout a module
    declares it stores (`native_kind` on lamina.quant's classes: "int4", "int8", "int8-table",
    "ggml" and "ggml-table" for GGML's blocks);
    None for anything else (a LoRA wrapper, say)."""
    if type(m) in (nn.Linear, nn.Embedding):
        return "float"
    return getattr(type(m), "native_kind", None)


def int4_rows(scales_and_zeros: Tensor) -> tuple[Tensor, Tensor]:
    """lamina's int4 (K/gs, N, 2) scales and zeros -> the native kernel's (N, K/gs) scales and
    minimums (w = q scale + minimum, minimum = zero - 8 scale), each row's groups side by side."""
    s, z = scales_and_zeros.detach().float().transpose(0, 1).unbind(-1)
    return s.contiguous(), (z - 8 * s).contiguous()


class Pointers(Keep):
    """Pointers into tensors for the C structs, each tensor kept alive here."""

    def t(self, t: Tensor | None) -> int | None:
        """A pointer to t's data (made contiguous float32 or int first if needed)."""
        if t is None:
            return None
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        self.keep.append(t)
        return t.data_ptr()

    def lin(self, m: nn.Module) -> Lin:
        """The `Lin` struct of a linear that coverage.py accepts."""
        L = Lin()
        kind = kind_of(m)
        if kind == "float":
            L.kind, L.gs, L.w = LIN_F32, 0, self.t(m.weight)
        elif kind == "ggml":
            parts = m.native_parts
            L.n, L.k = m.out_features, m.in_features
            if len(parts) == 1:
                qtype, rows, lanes = parts[0]
                self._ggml(L, qtype, rows, m.bias, lanes)
                return L
            array, at = self.parts(len(parts)), 0
            for P, (qtype, rows, lanes) in zip(array, parts, strict=True):
                P.n, P.k = rows.shape[0], m.in_features
                bias = None if m.bias is None else m.bias[at : at + P.n]
                self._ggml(P, qtype, rows, bias, lanes)
                at += P.n
            L.kind, L.gs, L.w, L.bias = LIN_PARTS, len(parts), ctypes.addressof(array), None
            return L
        elif kind == "int4" and getattr(m, "lanes_w", None) is not None:  # native/step.py's
            L.kind, L.gs = LIN_INT4, m.group_size  # pack_lanes: the lanes alone
            L.lw, L.ls, L.lmn = self.t(m.lanes_w), self.t(m.lanes_s), self.t(m.lanes_mn)
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

    def _ggml(
        self, L: Lin, qtype: str, rows: Tensor, bias: Tensor | None, lanes: bool = False
    ) -> None:
        L.kind, L.gs, L.w, L.bias = GGML_KINDS[qtype], 32, self.t(rows), self.t(bias)
        if lanes:  # Q4_K in 16-row lanes (decode.c's lm_kq_pack16): lw the same bytes
            L.lw = L.w
