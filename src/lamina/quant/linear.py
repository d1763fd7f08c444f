"""lamina's quantized modules: Int8Linear, Int4Linear and Int8Embedding, and the math they use.

    quantize_int8(w) -> q int8 (N, K), scale (N,)                  w ~ q * scale[:, None]
    quantize_int4(w, group_size) -> nibbles uint8 (N, K // 2), scales_and_zeros (K // gs, N, 2)

int8: w ~ q * s, q in [-127, 127], one scale per output row (absmax / 127), or one per group of
``group_size`` inputs (GGUF's Q8_0, kept exact: see quant/ggml.py); torch's packed kernel takes a
scale per row, so there a grouped layer gets a per-row requantized copy (the saved form stays
exact; the native kernel reads the groups as they are).
int4: w ~ (q - 8) * s + z per group of ``group_size`` inputs, q in [0, 15] (min/max per group:
s = (max - min) / 15, z = min + 8 s), PyTorch's convention; stored unpacked (two values per
byte, low nibble first), packed for the CPU kernel when loaded (the kernel's layout).

Which kernel a call runs is lamina.cpu's choice (`layer_kernel` when a layer is prepared,
`call_kernel` for each call); the output is cast back to the input's dtype.

Deliberately unaware of models, files and training (a quantized layer has no gradients).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import lamina.cpu as cpu
from lamina.errors import LaminaError
from lamina.native.pointers import int4_rows
from lamina.native.step import linear as native_linear
from lamina.native.step import unpack_lanes
from lamina.quant.bf16 import dequantized_matmul

INT4_GROUP_SIZES = (32, 64, 128, 256)


def _prepared_for(t: Tensor, kernel: str | None) -> str | None:
    """The kernel a layer on t's device prepares for: `kernel` where given (checked), else
    lamina.cpu's layer kernel (None off the CPU)."""
    if kernel is not None and kernel not in cpu.KERNELS:
        raise LaminaError(f"kernel must be one of {', '.join(cpu.KERNELS)}, got {kernel!r}")
    if t.device.type != "cpu":
        return None
    return kernel or cpu.layer_kernel()


def _has(kernel: str | None) -> tuple[str, ...] | None:
    """The kernels a layer prepared for `kernel` has (None: whichever the policy picks)."""
    return None if kernel is None else (kernel,)


def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """(N, K) float -> q int8 (N, K), scale float32 (N,): w ~ q * scale[:, None]."""
    w = w.detach().float()
    scale = (torch.maximum(w.amax(1), -w.amin(1)) / 127).clamp(min=1e-12)  # no |w| copy
    q = (w / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)  # one float temporary
    return q, scale


def quantize_int4(w: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """(N, K) float -> nibbles uint8 (N, K // 2), scales_and_zeros float32 (K // gs, N, 2)."""
    w = w.detach().float()
    n, k = w.shape
    g = w.reshape(n, k // group_size, group_size)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = (g - lo).div_(scale).round_().clamp_(0, 15).to(torch.uint8).reshape(n, k)
    zero = lo + 8 * scale
    sz = torch.stack([scale.reshape(n, -1), zero.reshape(n, -1)], -1).transpose(0, 1)
    return q[:, 0::2] | (q[:, 1::2] << 4), sz.contiguous()


def _unpack_nibbles(packed: Tensor) -> Tensor:
    n, half = packed.shape
    q = torch.empty(n, half * 2, dtype=torch.uint8, device=packed.device)
    q[:, 0::2], q[:, 1::2] = packed & 15, packed >> 4
    return q


def _empty_bias(n: int, bias: bool, device: Any) -> nn.Parameter | None:
    return nn.Parameter(torch.empty(n, device=device), requires_grad=False) if bias else None


def _copied_bias(linear: nn.Linear) -> nn.Parameter | None:
    if linear.bias is None:
        return None
    return nn.Parameter(linear.bias.detach().float().clone(), requires_grad=False)


def _finish(m: Int8Linear | Int4Linear, x: Tensor, y: Tensor) -> Tensor:
    """Add the bias and give the output the input's leading dimensions."""
    if m.bias is not None:
        y = y + m.bias.to(y.dtype)
    return y.reshape(*x.shape[:-1], m.out_features)


def _saved_scales(s: Tensor, low: Tensor) -> Tensor:
    """The native (N, K/gs) scales and minimums -> the saved (K/gs, N, 2) scales and zeros."""
    return torch.stack([s, low + 8 * s], -1).transpose(0, 1).contiguous()


def _dequantize_int8(
    q: Tensor, scale: Tensor, group_size: int | None, dtype: torch.dtype = torch.float32
) -> Tensor:
    if group_size is None:
        return q.to(dtype) * scale.to(dtype)[:, None]
    n, k = q.shape
    g = q.to(dtype).reshape(n, k // group_size, group_size)
    return (g * scale.to(dtype)[..., None]).reshape(n, k)


class Int8Linear(nn.Module):
    """y = x @ (q * scale).T + bias, with q int8 (out, in) and a scale per output row (scale
    (out,)) or per group of ``group_size`` inputs of a row (scale (out, in // group_size))."""

    native_kind = "int8"  # the layout lamina.native reads (qweight, scale, group_size)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        device: Any = None,
        group_size: int | None = None,
    ):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer(
            "qweight", torch.empty(out_features, in_features, dtype=torch.int8, device=device)
        )
        groups = () if group_size is None else (in_features // group_size,)
        self.register_buffer("scale", torch.empty(out_features, *groups, device=device))
        # the kernel's inputs (see prepare): a per-row int8 weight (qweight itself unless
        # grouped) and its scales in bf16
        self.register_buffer("kernel_weight", None, persistent=False)
        self.register_buffer("kernel_scale", None, persistent=False)
        self.kernels: tuple[str, ...] | None = None  # see prepare
        self.bias = _empty_bias(out_features, bias, device)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        m = cls(linear.in_features, linear.out_features, linear.bias is not None)
        m.qweight, m.scale = quantize_int8(linear.weight)
        m.bias = _copied_bias(linear)
        return m.prepare()

    def prepare(self, kernel: str | None = None) -> Int8Linear:
        """Build the kernel's inputs (stored, which torch.compile needs) where it runs: for
        `kernel` (one of lamina.cpu.KERNELS; the layer then runs only that one, else
        dequantized), or by default for lamina.cpu's layer kernel. A loader that knows the
        native step covers its model passes "native": no packed copy is made that nothing
        would read."""
        self.kernel_weight = self.kernel_scale = None
        kernel_now = _prepared_for(self.qweight, kernel)
        self.kernels = _has(kernel)
        if kernel_now != "packed":  # the native kernel reads qweight and scale
            return self
        if self.group_size is None:
            self.kernel_weight, scale = self.qweight, self.scale
        else:  # the kernel takes one scale per row: a per-row copy of the exact grouped form
            self.kernel_weight, scale = self._per_row_copy()
        self.kernel_scale = scale.to(torch.bfloat16)
        return self

    dequantizes_into = True  # dequantized(..., out=) takes a buffer (frozen_linear.dequantized)

    def dequantized(
        self, dtype: torch.dtype = torch.float32, rows: Any = None, out: Tensor | None = None
    ) -> Tensor:
        """W as `dtype`: q * s; `rows` (a slice or a tensor of ids) reads only those rows.
        `out`: an fp32 tensor of the result's shape written in place of a new one (the same
        numbers), returned as it is, or cast where `dtype` is not fp32 (not used for all of W
        in another dtype, which is computed in that dtype)."""
        if out is not None and (rows is not None or dtype == torch.float32):
            q = out.copy_(self.qweight if rows is None else self.qweight[rows])
            scale = self.scale if rows is None else self.scale[rows]
            if self.group_size is None:
                q.mul_(scale[..., None])
            else:
                q.unflatten(-1, (-1, self.group_size)).mul_(scale[..., None])
            return q.to(dtype)
        if rows is None:
            return _dequantize_int8(self.qweight, self.scale, self.group_size, dtype)
        q, scale = self.qweight[rows].float(), self.scale[rows]
        if self.group_size is None:
            return (q * scale[..., None]).to(dtype)
        return (q.unflatten(-1, (-1, self.group_size)) * scale[..., None]).flatten(-2).to(dtype)

    def _per_row_copy(self, chunk: int = 4096) -> tuple[Tensor, Tensor]:
        """Requantize the grouped weights per row, a few rows at a time (no full fp32 copy)."""
        q, scales = torch.empty_like(self.qweight), torch.empty(self.out_features)
        for i in range(0, self.out_features, chunk):
            rows = _dequantize_int8(
                self.qweight[i : i + chunk], self.scale[i : i + chunk], self.group_size
            )
            q[i : i + chunk], scales[i : i + chunk] = quantize_int8(rows)
        return q, scales

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        run = cpu.call_kernel(x, self.kernels)
        if run == "native":
            return native_linear(self, flat).to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if run == "packed" and self.kernel_scale is not None:
            y = torch._weight_int8pack_mm(
                flat.to(torch.bfloat16).contiguous(), self.kernel_weight, self.kernel_scale
            ).to(x.dtype)
        else:
            y = dequantized_matmul(self, flat)
        return _finish(self, x, y)

    def extra_repr(self) -> str:
        g = "" if self.group_size is None else f", group_size={self.group_size}"
        return (
            f"in={self.in_features}, out={self.out_features}, int8{g}, bias={self.bias is not None}"
        )


class Int4Linear(nn.Module):
    """y = x @ W.T + bias, W in int4 with a scale and zero per group of ``group_size`` inputs."""

    native_kind = "int4"  # lamina.native reads qweight and native_scale / native_min

    def __init__(
        self, in_features: int, out_features: int, bias: bool, group_size: int, device: Any = None
    ):
        super().__init__()
        if group_size not in INT4_GROUP_SIZES or in_features % group_size:
            raise LaminaError(
                f"int4 group_size must be one of {', '.join(map(str, INT4_GROUP_SIZES))} and "
                f"divide the input width {in_features}, got {group_size!r}"
            )
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer(
            "qweight", torch.empty(out_features, in_features // 2, dtype=torch.uint8, device=device)
        )
        self.register_buffer(
            "scales_and_zeros",
            torch.empty(in_features // group_size, out_features, 2, device=device),
        )
        self.bias = _empty_bias(out_features, bias, device)
        # the CPU kernel's packed layout, rows padded to a multiple of 16 (see prepare)
        self.register_buffer("kernel_weight", None, persistent=False)
        self.register_buffer("kernel_sz", None, persistent=False)
        # the native kernel's (N, K // gs) scales and minimums (w = q s + min), see prepare
        self.register_buffer("native_scale", None, persistent=False)
        self.register_buffer("native_min", None, persistent=False)
        # or all three in 16-row lanes instead (lamina.native.step.pack_lanes)
        for name in ("lanes_w", "lanes_s", "lanes_mn"):
            self.register_buffer(name, None, persistent=False)
        self.kernels: tuple[str, ...] | None = None  # see prepare

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int) -> Int4Linear:
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, group_size)
        m.qweight, m.scales_and_zeros = quantize_int4(linear.weight, group_size)
        m.bias = _copied_bias(linear)
        return m.prepare()

    dequantizes_into = True  # dequantized(..., out=) takes a buffer (frozen_linear.dequantized)
    dequantizes_in_fp32 = True  # W in any dtype is made in fp32, then cast

    def dequantized(
        self, dtype: torch.dtype = torch.float32, rows: Any = None, out: Tensor | None = None
    ) -> Tensor:
        """W as `dtype`: (q - 8) s + z, or q s + minimum where only the native layout is kept
        (see drop_saved_scales); `rows` (a slice or a tensor of ids) reads only those. `out`:
        an fp32 tensor of the result's shape written in place of a new one (the same numbers),
        returned as it is, or cast where `dtype` is not fp32."""
        index = slice(None) if rows is None else rows
        qweight, native_scale, native_min = self.qweight, self.native_scale, self.native_min
        if qweight is None:  # in lanes: the rows' layout read back, for this call
            qweight, native_scale, native_min = unpack_lanes(self)
        packed = qweight[index]  # (..., K / 2), low nibble first
        if out is None:
            q = torch.stack([packed & 15, packed >> 4], -1).flatten(-2).float()  # the temporary
        else:
            q, pairs = out, out.unflatten(-1, (-1, 2))
            pairs[..., 0].copy_(packed & 15)
            pairs[..., 1].copy_(packed >> 4)
        g = q.unflatten(-1, (-1, self.group_size))
        if self.scales_and_zeros is None:  # GGML's own form: q d + m
            s, low = native_scale[index], native_min[index]  # (..., K / g) each
            g.mul_(s[..., None]).add_(low[..., None])
            return q.to(dtype)
        s, z = self.scales_and_zeros[:, index].movedim(0, -2).unbind(-1)  # (..., K / g) each
        g.sub_(8).mul_(s[..., None]).add_(z[..., None])  # in place
        return q.to(dtype)

    def drop_saved_scales(self) -> Int4Linear:
        """Where prepared for the native kernel, keep its (N, K / gs) scales and minimums alone
        (the saved scales_and_zeros hold the same values): for a model that is run, not saved
        (a GGUF file's Q4_0/Q4_1 layers, lamina.quant.from_blocks). The dequantized path reads
        the native layout; `prepare` rebuilds the saved form first (z = minimum + 8 s: exact
        for GGML's fp16 scales and minimums)."""
        if self.native_scale is not None or self.lanes_w is not None:
            self.scales_and_zeros = None
        return self

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        # the saved form whatever the layout in memory: in lanes, the rows' layout read back
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.lanes_w is not None:
            destination[prefix + "qweight"], s, low = unpack_lanes(self)
            if self.scales_and_zeros is None:
                destination[prefix + "scales_and_zeros"] = _saved_scales(s, low)

    def restore_saved_scales(self) -> Int4Linear:
        """Rebuild scales_and_zeros where drop_saved_scales dropped it (before the native
        layout goes: `prepare`, or a caller that drops the kernel copies)."""
        if self.lanes_w is not None:  # and the rows' layout where pack_lanes laid it in lanes
            self.qweight, self.native_scale, self.native_min = unpack_lanes(self)
            self.lanes_w = self.lanes_s = self.lanes_mn = None
        if self.scales_and_zeros is None:
            s, low = self.native_scale, self.native_min
            self.scales_and_zeros = _saved_scales(s, low)
        return self

    def prepare(self, kernel: str | None = None) -> Int4Linear:
        """Lay the scales out for the native kernel, or pack the weights for torch's (where
        each runs); the saved form stays as it is. `kernel` as for Int8Linear.prepare."""
        self.restore_saved_scales()
        self.kernel_weight = self.kernel_sz = self.native_scale = self.native_min = None
        self.kernels = _has(kernel)
        kernel = _prepared_for(self.qweight, kernel)
        if kernel == "native":
            self.native_scale, self.native_min = int4_rows(self.scales_and_zeros)
            return self
        if kernel != "packed":
            return self
        q = _unpack_nibbles(self.qweight).to(torch.int32)
        sz = self.scales_and_zeros
        pad = -self.out_features % 16
        if pad:
            q = F.pad(q, (0, 0, 0, pad))
            sz = F.pad(sz, (0, 0, 0, pad))
        self.kernel_weight = torch._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
        self.kernel_sz = sz.to(torch.bfloat16).contiguous()
        return self

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        run = cpu.call_kernel(x, self.kernels)
        if run == "native":  # reads native_scale, or makes it where prepared for another
            return native_linear(self, flat).to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if run == "packed" and self.kernel_weight is not None:
            y = torch._weight_int4pack_mm_for_cpu(
                flat.to(torch.bfloat16).contiguous(),
                self.kernel_weight,
                self.group_size,
                self.kernel_sz,
            )
            y = y[:, : self.out_features].to(x.dtype)
        else:
            y = dequantized_matmul(self, flat)
        return _finish(self, x, y)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int4, group_size={self.group_size}"


class Int8Embedding(nn.Module):
    """A token table stored as int8 rows with a scale per row (scale (V,)) or per group of
    ``group_size`` columns (scale (V, D // group_size)); a lookup dequantizes its rows."""

    native_kind = "int8-table"

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        device: Any = None,
        group_size: int | None = None,
    ):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.group_size = None, group_size
        self.register_buffer(
            "qweight", torch.empty(num_embeddings, embedding_dim, dtype=torch.int8, device=device)
        )
        groups = () if group_size is None else (embedding_dim // group_size,)
        self.register_buffer("scale", torch.empty(num_embeddings, *groups, device=device))

    def forward(self, ids: Tensor) -> Tensor:
        if self.group_size is None:
            return self.qweight[ids].float() * self.scale[ids].unsqueeze(-1)
        rows = self.qweight[ids].float().unflatten(-1, (-1, self.group_size))
        return (rows * self.scale[ids].unsqueeze(-1)).flatten(-2)
