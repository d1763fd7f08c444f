"""Weight-only quantization of a GPT's linear layers: int8 (per output row) and int4 (grouped).

    quantize(model, "int8" | "int4", group_size=128) -> the same GPT, its linears replaced
    quantized_tensors(model) -> dict of tensors to save; scheme_of(model) -> {"scheme", ...}
    quantize_structure(model, scheme) -> the modules, empty, ready for ``load_state_dict``

What is quantized: every ``nn.Linear`` inside the blocks (attention, feed-forward) and the head.
Embedding tables stay exact, except a head tied to the token table: then one int8 table with a
scale per row serves both the head's matmul and the lookups (a row's lookup is exactly what the
head multiplies by), so the tie costs no second copy. With int4 the tied head gets its own int4
copy and the lookups read an int8 table (int4's packed layout cannot be gathered by row).

Kernels (measured in bench/decode_kernels.py and bench/real_decode.py; see BENCHMARKS.md),
chosen at first use by `kernel()`:
  * "native" (x86-64 Linux with AVX2 + FMA where lamina.native builds: a C compiler): lamina's
    own kernels read the int4/int8 weights as stored and multiply them by the input rounded to
    int16 per block of 32 (within ~1e-4 of the dequantized float matmul); for up to
    ``NATIVE_MAX_ROWS`` rows, more (a long prefill) dequantize and run in fp32. The decode
    step itself runs whole in lamina.native wherever it covers the model.
  * "packed" (x86 with native bf16, AVX512-BF16 or AMX; or AVX2 without a compiler):
    ``torch._weight_int8pack_mm`` and ``torch._weight_int4pack_mm_for_cpu`` with bf16
    activations; where bf16 is emulated, calls of more than ``EMULATED_BF16_MAX_ROWS`` rows
    dequantize and run in fp32 instead.
  * "dequantize" (anywhere else, GPUs included): the weights are dequantized for each call:
    correct, smaller in memory, not faster.
The output is cast back to the input's dtype, so the rest of the model runs as before (fp32
norms, softmax, KV cache). ``LAMINA_QUANT_KERNEL=native|packed|dequantize`` forces a kernel.

int8: w ~ q * s, q in [-127, 127], one scale per output row (absmax / 127), or one per group of
``group_size`` inputs (GGUF's Q8_0, kept exact: see quant/ggml.py); torch's packed kernel takes a
scale per row, so there a grouped layer gets a per-row requantized copy (the saved form stays
exact; the native kernel reads the groups as they are).
int4: w ~ (q - 8) * s + z per group of ``group_size`` inputs, q in [0, 15] (min/max per group:
s = (max - min) / 15, z = min + 8 s), PyTorch's convention; stored unpacked (two values per
byte, low nibble first) and packed for the CPU kernel when loaded, since the packed layout is
the kernel's, not a file format.

Deliberately unaware of files, tokenizers and training (a quantized model is for inference:
it has no gradients).
"""

from __future__ import annotations

import os
import platform
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.errors import LaminaError
from lamina.models.gpt import GPT
from lamina.native.build import cpu_flags
from lamina.native.build import library as native_library
from lamina.native.build import reason as native_reason
from lamina.native.step import int4_rows
from lamina.native.step import linear as native_linear

SCHEMES = ("int8", "int4")
INT4_GROUP_SIZES = (32, 64, 128, 256)


_FLAGS = cpu_flags()


def _mkldnn_bf16() -> bool:
    """Whether torch's oneDNN runs bf16 natively here (where torch can say)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


_NATIVE_BF16 = bool({"avx512_bf16", "amx_bf16"} & _FLAGS) and _mkldnn_bf16()
KERNELS = ("native", "packed", "dequantize")


def choose_kernel(flags: set[str], machine: str, native_built: bool) -> str:
    """The kernel measured fastest at batch 1 here (bench/decode_kernels.py, BENCHMARKS.md):
    "packed" (torch's int8/int4 kernels, bf16 activations) where bf16 is native; else
    "native" (lamina.native's AVX2 kernels) where that library is built; else "packed" on x86
    with AVX2; else "dequantize"."""
    x86 = machine.lower() in ("x86_64", "amd64", "i686")
    if x86 and {"avx512_bf16", "amx_bf16"} & flags:
        return "packed"
    if native_built:
        return "native"
    return "packed" if x86 and "avx2" in flags else "dequantize"


_KERNEL: str | None = None  # chosen at first use (building the native library may take a second)


def kernel() -> str:
    """The CPU kernel quantized layers use here: "native", "packed" or "dequantize" (see the
    docstring); ``LAMINA_QUANT_KERNEL`` overrides the choice."""
    global _KERNEL
    if _KERNEL is None:
        name = os.environ.get("LAMINA_QUANT_KERNEL", "").strip()
        if name and name not in KERNELS:
            raise LaminaError(
                f"LAMINA_QUANT_KERNEL must be one of {', '.join(KERNELS)}, got {name!r}"
            )
        if name == "native" and native_library() is None:
            raise LaminaError(f"LAMINA_QUANT_KERNEL=native, but {native_reason()}")
        if not name:
            name = choose_kernel(_FLAGS, platform.machine(), native_library() is not None)
        _KERNEL = name
    return _KERNEL


def native_bf16() -> bool:
    """True where the CPU does bf16 dot products in hardware (AVX512-BF16 or AMX) and torch's
    oneDNN uses it: the one test for "bf16 is fast here" (quantized kernels, training's
    --dtype auto, Muon's Newton-Schulz precision)."""
    return _NATIVE_BF16


def _on_cpu(t: Tensor, name: str) -> bool:
    return t.device.type == "cpu" and kernel() == name


# Where bf16 is emulated (AVX2), the packed kernels win at batch 1 but lose to an fp32 matmul
# on freshly dequantized weights for many rows at once (a prefill): measured crossover 16-64.
EMULATED_BF16_MAX_ROWS = 32
# The native kernels likewise, above this many rows (bench/decode_kernels.py)
NATIVE_MAX_ROWS = 32


def _use_kernel(x: Tensor) -> bool:
    """Whether x goes through the kernel (else: the dequantized weights, in fp32)."""
    # the int8/int4 kernels have no backward: where gradients must flow back through a frozen
    # quantized layer (LoRA over a quantized base), the dequantized matmul computes them
    if (x.requires_grad and torch.is_grad_enabled()) or x.device.type != "cpu":
        return False
    rows = x.numel() // max(1, x.shape[-1])
    if kernel() == "native":
        return x.dtype == torch.float32 and rows <= NATIVE_MAX_ROWS
    return kernel() == "packed" and (_NATIVE_BF16 or rows <= EMULATED_BF16_MAX_ROWS)


def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """(N, K) float -> q int8 (N, K), scale float32 (N,): w ~ q * scale[:, None]."""
    w = w.detach().float()
    scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
    q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """(N, K) float -> nibbles uint8 (N, K // 2), scales_and_zeros float32 (K // gs, N, 2)."""
    w = w.detach().float()
    n, k = w.shape
    g = w.reshape(n, k // group_size, group_size)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = ((g - lo) / scale).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
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
        self.bias = _empty_bias(out_features, bias, device)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        m = cls(linear.in_features, linear.out_features, linear.bias is not None)
        m.qweight, m.scale = quantize_int8(linear.weight)
        m.bias = _copied_bias(linear)
        return m.prepare()

    def prepare(self) -> Int8Linear:
        """Build the kernel's inputs (stored, which torch.compile needs) where it runs."""
        self.kernel_weight = self.kernel_scale = None
        if not _on_cpu(self.qweight, "packed"):  # the native kernel reads qweight and scale
            return self
        if self.group_size is None:
            self.kernel_weight, scale = self.qweight, self.scale
        else:  # the kernel takes one scale per row: a per-row copy of the exact grouped form
            self.kernel_weight, scale = self._per_row_copy()
        self.kernel_scale = scale.to(torch.bfloat16)
        return self

    def dequantized(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return _dequantize_int8(self.qweight, self.scale, self.group_size, dtype)

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
        if _use_kernel(x) and kernel() == "native":
            return native_linear(self, flat).to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if _use_kernel(x) and self.kernel_scale is not None:
            y = torch._weight_int8pack_mm(
                flat.to(torch.bfloat16).contiguous(), self.kernel_weight, self.kernel_scale
            ).to(x.dtype)
        else:
            y = flat @ self.dequantized(x.dtype).T
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

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int) -> Int4Linear:
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, group_size)
        m.qweight, m.scales_and_zeros = quantize_int4(linear.weight, group_size)
        m.bias = _copied_bias(linear)
        return m.prepare()

    def dequantized(self, dtype: torch.dtype = torch.float32) -> Tensor:
        q = _unpack_nibbles(self.qweight).float()
        n, k = q.shape
        s, z = self.scales_and_zeros.transpose(0, 1).unbind(-1)  # (N, K // gs) each
        g = (q.reshape(n, k // self.group_size, self.group_size) - 8) * s[..., None] + z[..., None]
        return g.reshape(n, k).to(dtype)

    def prepare(self) -> Int4Linear:
        """Lay the scales out for the native kernel, or pack the weights for torch's (where
        each runs); the saved form stays as it is."""
        self.kernel_weight = self.kernel_sz = self.native_scale = self.native_min = None
        if _on_cpu(self.qweight, "native"):
            self.native_scale, self.native_min = int4_rows(self.scales_and_zeros)
            return self
        if not _on_cpu(self.qweight, "packed"):
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
        if _use_kernel(x) and self.native_scale is not None:
            return native_linear(self, flat).to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if _use_kernel(x) and self.kernel_weight is not None:
            y = torch._weight_int4pack_mm_for_cpu(
                flat.to(torch.bfloat16).contiguous(),
                self.kernel_weight,
                self.group_size,
                self.kernel_sz,
            )
            y = y[:, : self.out_features].to(x.dtype)
        else:
            y = flat @ self.dequantized(x.dtype).T
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


def _check_scheme(scheme: str, group_size: int) -> None:
    if scheme not in SCHEMES:
        raise LaminaError(
            f"unknown quantization scheme {scheme!r}; choose one of {', '.join(SCHEMES)}"
        )
    if scheme == "int4" and group_size not in INT4_GROUP_SIZES:
        raise LaminaError(
            f"group_size must be one of {', '.join(map(str, INT4_GROUP_SIZES))} for int4, got {group_size!r}"
        )


def _block_linears(model: GPT) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [
        (parent, name, child)
        for parent in model.blocks.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]


def scheme_of(model: nn.Module) -> dict[str, Any] | None:
    """{"scheme": "int8"} or {"scheme": "int4", "group_size": g}; None for a float model."""
    return getattr(model, "quantization", None)


def quantize_structure(model: GPT, scheme: str, group_size: int = 128) -> GPT:
    """Replace the linears (and a tied token table) by empty quantized modules, in place.

    For loading a saved quantized model: build the GPT on the meta device, call this, then
    ``load_state_dict(tensors, assign=True)``. ``quantize`` fills the same modules from weights.
    """
    return _replace(model, scheme, group_size, fill=False)


def quantize(model: GPT, scheme: str = "int8", *, group_size: int | None = None) -> GPT:
    """Quantize a GPT's linear layers in place (and return it) for inference.

    scheme: "int8" (a scale per output row) or "int4" (a scale and zero per ``group_size``
    inputs; group_size one of 32, 64, 128, 256 and dividing every layer's input width; None:
    the largest of them that divides every width, so a caller without a group-size flag, such
    as `lamina sample --quantize int4`, never has to ask for one).
    """
    if not isinstance(model, GPT):
        raise LaminaError(f"quantize needs a lamina GPT, got {type(model).__name__}")
    if scheme_of(model) is not None:
        raise LaminaError(f"this model is already quantized ({scheme_of(model)['scheme']})")
    if group_size is None:
        group_size = _largest_group(model) if scheme == "int4" else 128
    _check_scheme(scheme, group_size)
    return _replace(model, scheme, group_size, fill=True)


def _largest_group(model: GPT) -> int:
    widths = sorted(
        {lin.in_features for _, _, lin in _block_linears(model)} | {model.head.in_features}
    )
    for g in sorted(INT4_GROUP_SIZES, reverse=True):
        if all(w % g == 0 for w in widths):
            return g
    raise LaminaError(
        f"no int4 group size ({', '.join(map(str, INT4_GROUP_SIZES))}) divides every input "
        f"width of this model ({', '.join(map(str, widths))}); use int8"
    )


def _replace(model: GPT, scheme: str, group_size: int, *, fill: bool) -> GPT:
    _check_scheme(scheme, group_size)
    targets = _block_linears(model) + [(model, "head", model.head)]
    if scheme == "int4":
        for _, name, lin in targets:
            if lin.in_features % group_size:
                raise LaminaError(
                    f"group_size {group_size} does not divide the input width {lin.in_features} "
                    f"of {name}; choose a group size that divides every layer's width"
                )
    tied = model.config.tie_weights
    device = model.head.weight.device
    for parent, name, lin in targets:
        bias = lin.bias is not None
        if scheme == "int8":
            new = (
                Int8Linear.from_linear(lin)
                if fill
                else Int8Linear(lin.in_features, lin.out_features, bias, device)
            )
        else:
            new = (
                Int4Linear.from_linear(lin, group_size)
                if fill
                else Int4Linear(lin.in_features, lin.out_features, bias, group_size, device)
            )
        setattr(parent, name, new)
    if tied:
        wte = model.embed.wte
        table = Int8Embedding(wte.num_embeddings, wte.embedding_dim, device)
        if fill:
            table.qweight, table.scale = quantize_int8(wte.weight)
        if scheme == "int8":  # one tensor for both: the head multiplies by the rows looked up
            model.head.qweight, model.head.scale = table.qweight, table.scale
            if fill:
                model.head.prepare()
        model.embed.wte = table
    for p in model.parameters():
        p.requires_grad_(False)
    model.quantization = {"scheme": scheme} | (
        {"group_size": group_size} if scheme == "int4" else {}
    )
    return model.eval()


def quantized_tensors(model: GPT) -> dict[str, Tensor]:
    """The tensors to save: each stored once (a tied int8 head is the token table's)."""
    if (scheme_of(model) or {}).get("scheme") not in SCHEMES:
        raise LaminaError(
            f"a model quantized as {scheme_of(model)} (GGUF blocks kept) cannot be saved as a "
            "lamina folder yet: open the GGUF file itself, or load it in fp32 and quantize"
        )
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_weights and scheme_of(model) == {"scheme": "int8"}:
        state.pop("head.qweight"), state.pop("head.scale")
    return state


def finish_loading(model: GPT) -> None:
    """After ``load_state_dict(assign=True)``: re-tie a tied int8 head to the token table and
    build each layer's kernel-side tensors from the loaded ones."""
    if model.config.tie_weights and scheme_of(model) == {"scheme": "int8"}:
        model.head.qweight, model.head.scale = model.embed.wte.qweight, model.embed.wte.scale
    for m in model.modules():
        if isinstance(m, (Int8Linear, Int4Linear)):
            m.prepare()
