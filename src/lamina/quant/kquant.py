"""GGUF's quantized rows kept as the file stores them: a linear and a token table of GGML blocks.

    BlockLinear(in_features, out_features, parts, bias)   parts: [(qtype, rows uint8), ...]
    BlockEmbedding(qtype, rows, embedding_dim)             a token table of one qtype
    dequantize_blocks(qtype, rows, width) -> float32 (N, width), GGML's values exactly
    KEPT: the qtypes held this way ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q5_0", "Q5_1")

`rows` is (N, bytes per row) uint8: each weight row its width / 256 super-blocks (Q4_K 144
bytes, Q5_K 176, Q6_K 210; 6-bit scales and minimums per 32, or int8 scales per 16 for Q6_K)
or width / 32 blocks (Q8_0 34, Q5_0 22, Q5_1 24), in GGML's own layout, untouched. A linear may
stack parts of different qtypes by rows (a fused q/k/v whose v the file typed apart, as
llama.cpp's Q4_K_M does), so a model keeps every such tensor at its file size.

The native kernels (lamina/native/decode.c, "GGML's blocks") read these rows as they are: the
decode step, and a call of up to ``lamina.cpu.MAX_ROWS`` float32 rows, quantize the input to int16
per 32 and take integer dot products per 32 weights (within ~1e-4 of the dequantized matmul).
Other calls (a long prefill, gradients, no native library) dequantize the rows and multiply in
fp32, or in bf16 where lamina.cpu.dequantized_dtype says so (a prefill where bf16 is native):
through the native dequantizer where it is built, else gguf-py's `gguf.quants.dequantize`; the
two give the same floats (tests/test_kquant.py holds them equal bit for bit). In bf16 the native
dequantizer writes bf16 itself, on torch's threads: the floats' cast, exactly.

Deliberately unaware of files and tensor names: the loader hands in the rows.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

import lamina.cpu as cpu
from lamina.errors import LaminaError
from lamina.native.build import library
from lamina.native.step import linear as native_linear
from lamina.native.structs import GGML_KINDS, Lin
from lamina.quant.bf16 import dequantized_matmul

# qtype -> (weights per block, bytes per block)
BLOCKS = {
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "Q8_0": (32, 34),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
}
KEPT = tuple(BLOCKS)


def row_width(qtype: str, width: int) -> int:
    """Bytes of one row of `width` weights in `qtype` (refused where blocks cannot tile it)."""
    if qtype not in BLOCKS:
        raise LaminaError(f"no kept form for GGML type {qtype!r}; one of {', '.join(KEPT)}")
    per, size = BLOCKS[qtype]
    if width <= 0 or width % per:
        raise LaminaError(f"{qtype} rows hold whole blocks of {per} weights, got width {width}")
    return width // per * size


def _checked(qtype: str, rows: Tensor, width: int) -> Tensor:
    want = row_width(qtype, width)
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != want:
        raise LaminaError(
            f"{qtype} rows of width {width} must be uint8 (N, {want}), got "
            f"{rows.dtype} {tuple(rows.shape)}"
        )
    return rows


def dequantize_blocks(qtype: str, rows: Tensor, width: int) -> Tensor:
    """(N, bytes per row) of `qtype` -> float32 (N, width): GGML's dequantization exactly."""
    rows = _checked(qtype, rows, width).contiguous()
    lib = library()
    if lib is not None:
        out = torch.empty(rows.shape[0], width)
        if lib.lm_dequant(GGML_KINDS[qtype], rows.data_ptr(), rows.shape[0], width, out.data_ptr()):
            return out
    import gguf  # the reference dequantizer, where lamina.native is not built

    with np.errstate(all="ignore"):  # a damaged scale: check_finite names the tensor
        values = gguf.quants.dequantize(rows.numpy(), gguf.GGMLQuantizationType[qtype])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(-1, width)


def _unlaned(qtype: str, rows: Tensor, width: int) -> Tensor:
    """Q4_K or Q5_0 rows in decode.c's 16-row lanes (lm_kq_pack16) -> new rows in GGML's layout."""
    lib = library()
    if lib is None:
        raise LaminaError(f"{qtype} rows in lanes need the native library to read back")
    out = rows.clone()
    L = Lin()
    L.kind, L.n, L.k = GGML_KINDS[qtype], rows.shape[0], width
    if not lib.lm_kq_pack16(ctypes.addressof(L), out.data_ptr(), 0):
        raise LaminaError(f"decode.c's lm_kq_pack16 refused {qtype} rows in lanes")
    return out


def _native_call(x: Tensor) -> bool:
    """Whether x (rows, in) goes through the native kernel, the one kernel that reads these
    blocks (else they are dequantized): where lamina.native runs, the user's kernel choice
    (lamina.cpu) allows it, and the call is one it takes."""
    return cpu.call_kernel(x, has=("native",)) == "native"


class BlockLinear(nn.Module):
    """y = x @ W.T + bias, W's rows GGML blocks as a GGUF file holds them (see the module)."""

    native_kind = "ggml"  # lamina.native reads `parts` as they are

    def __init__(
        self,
        in_features: int,
        out_features: int,
        parts: Sequence[tuple[str, Tensor]],
        bias: Tensor | None = None,
    ) -> None:
        super().__init__()
        if not parts or sum(int(r.shape[0]) for _, r in parts) != out_features:
            raise LaminaError(f"BlockLinear parts must stack to {out_features} rows")
        self.in_features, self.out_features = in_features, out_features
        self.qtypes = tuple(q for q, _ in parts)
        for i, (qtype, rows) in enumerate(parts):
            self.register_buffer(f"blocks_{i}", _checked(qtype, rows, in_features))
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        # per part: whether its buffer holds the rows in decode.c's 16-row lanes (native/step.py's
        # pack_kq_lanes, in place); `parts` and the state dict give GGML's layout all the same
        self.lanes = [False] * len(self.qtypes)

    @property
    def native_parts(self) -> list[tuple[str, Tensor, bool]]:
        """(qtype, the buffer as it is, whether it is in lanes) per part: for lamina.native."""
        return [(q, getattr(self, f"blocks_{i}"), self.lanes[i]) for i, q in enumerate(self.qtypes)]

    @property
    def parts(self) -> list[tuple[str, Tensor]]:
        """(qtype, rows) per part in GGML's layout (a part in lanes read back into new rows)."""
        return [
            (q, _unlaned(q, r, self.in_features) if on else r) for q, r, on in self.native_parts
        ]

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # noqa: ANN001, ANN202
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for i, (_, rows) in enumerate(self.parts):
            if self.lanes[i]:
                destination[f"{prefix}blocks_{i}"] = rows  # GGML's layout, as a file holds it

    def _load_from_state_dict(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        super()._load_from_state_dict(*args, **kwargs)
        self.lanes = [False] * len(self.qtypes)  # the rows loaded are GGML's

    def dequantized(self, dtype: torch.dtype = torch.float32, out: Tensor | None = None) -> Tensor:
        """W (out_features, in_features) in `dtype`; bf16 is written by the native dequantizer
        itself where it is built (the floats' cast, exactly), into `out` where given."""
        lib = library()
        if dtype == torch.bfloat16 and lib is not None:
            w = (
                torch.empty(self.out_features, self.in_features, dtype=dtype)
                if out is None
                else out
            )
            first, threads = 0, torch.get_num_threads()
            for q, r, lanes in self.native_parts:
                rows, n = r.contiguous(), r.shape[0]
                if lanes:  # Q4_K / Q5_0 in 16-row lanes: read back group by group, no copy
                    done = lib.lm_dequant_lanes_bf16(
                        GGML_KINDS[q], rows.data_ptr(), n, self.in_features,
                        w[first:].data_ptr(), threads,
                    )  # fmt: skip
                else:
                    done = lib.lm_dequant_bf16(
                        GGML_KINDS[q], rows.data_ptr(), n, self.in_features,
                        w[first:].data_ptr(), threads,
                    )  # fmt: skip
                if not done:
                    break
                first += rows.shape[0]
            else:
                return w
        w = [dequantize_blocks(q, r, self.in_features) for q, r in self.parts]
        return torch.cat(w).to(dtype) if out is None else out.copy_(torch.cat(w))

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        if _native_call(flat):
            y = native_linear(self, flat)  # the bias included
        else:
            y = dequantized_matmul(self, flat.float())
            if self.bias is not None:
                y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kinds = "+".join(self.qtypes)
        return f"in={self.in_features}, out={self.out_features}, {kinds} (GGML blocks)"


class BlockEmbedding(nn.Module):
    """A token table of GGML blocks (one qtype); a lookup dequantizes the rows it reads."""

    native_kind = "ggml-table"

    def __init__(self, qtype: str, rows: Tensor, embedding_dim: int) -> None:
        super().__init__()
        self.qtype, self.embedding_dim = qtype, embedding_dim
        self.num_embeddings, self.padding_idx = int(rows.shape[0]), None
        self.register_buffer("blocks", _checked(qtype, rows, embedding_dim))

    def forward(self, ids: Tensor) -> Tensor:
        flat = ids.reshape(-1)
        rows = dequantize_blocks(self.qtype, self.blocks[flat], self.embedding_dim)
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.qtype} (GGML blocks)"
