"""The kernel policy: which code runs a quantized layer, a decode step or an optimizer here.

    flags() -> {"avx2", "fma", ...}        the CPU's flags (/proc/cpuinfo; empty elsewhere)
    native_bf16() -> bool                  bf16 dot products in hardware, used by torch
    native_missing() -> str | None         why lamina.native cannot run here (None: it runs)
    choice() -> "auto" | a kernel name     what the user asked for (using(), LAMINA_KERNEL)
    layer_kernel() -> "native" | "packed" | "dequantize"   what quantized layers prepare for
    call_kernel(x, has=None) -> the same, for one call on x (its rows, dtype, device, gradients;
                              `has`: the kernels a layer has, where not all)
    dequantized_dtype(x) -> the dtype a call on x that runs dequantized multiplies in
    prefill_int8(x) -> bool                whether such a call multiplies int8 by int8 instead
    int8_prefill(on=None) -> bool          the switch for that (set, or read; LAMINA_PREFILL_INT8)
    native_step() -> bool                  whether a decode step may run whole in lamina.native
    keeps_quantized(device_type) -> bool   whether lamina.open keeps a file's blocks quantized
    fused_adamw(device_type) -> bool       whether AdamW tries torch's fused kernel
    with using("torch"): ...               a kernel for everything inside (tests, benches)

The kernels (`KERNELS`, one entry each; measured in bench/decode_kernels.py and
bench/real_decode.py, figures in BENCHMARKS.md only):
  * "native": lamina.native's AVX2 kernels (x86-64 Linux with AVX2 + FMA and a C compiler):
    the whole decode step in one call, and quantized linears of up to 32 float32 rows.
  * "packed": torch's int8/int4 kernels with bf16 activations (``torch._weight_int8pack_mm``,
    ``torch._weight_int4pack_mm_for_cpu``); where bf16 is emulated, for up to 32 rows.
  * "dequantize": the weights dequantized for each call; runs anywhere (GPUs included).
  * "torch": not a kernel but a choice: PyTorch only, the best of "packed" and "dequantize".
A call the chosen kernel does not take (too many rows, a gradient to record, not on the CPU)
runs dequantized: a call of more than MAX_ROWS rows recording no gradient in bf16 where bf16 is
native (a prefill's long calls: weights dequantized to bf16, the input cast, the output cast
back; the packed kernels' precision there), else in the input's dtype; a choice of
"dequantize" keeps the input's dtype (float32: the exact reference). "auto" takes "packed"
where bf16 is native (it measured fastest at batch 1 there) for the layers, else the first
entry that runs here; the decode step runs natively wherever lamina.native does, unless the
choice names a PyTorch kernel. A loader whose model the native step covers prepares its
int8/int4 layers for "native" alone (lamina.quant.saved.prepare_kernels): no packed copy is
made that no step would read, and a prefill's long calls run dequantized (faster there than
"packed": bench/kquant_decode.py).

One environment variable sets the choice for a process; `using` overrides it in a block:

    LAMINA_KERNEL=auto|native|packed|dequantize|torch     (default auto)

A forced kernel that cannot run here is refused naming why.

A prefill's long calls may instead multiply int8 by int8 (lamina.quant.int8mm: the input
smoothed per column, both operands rounded to int8 per row, heavy columns and, by the linear's
role, each row's heaviest entries in float, torch._int_mm; faster than bf16 where the CPU has
AVX-512 VNNI, as near the float result as llama.cpp's own prefill but further than bf16:
BENCHMARKS.md has both), off unless asked for. It runs where `prefill_int8(x)` says:
the calls that would run in bf16 by the rule above (VNNI in place of native bf16), outside
`lamina train`'s kept dequantizations, while the switch is on:

    LAMINA_PREFILL_INT8=0|1     (default 0), or int8_prefill(True) for a process

Deliberately unaware of models:
the quantized layers, the decoder and the optimizers ask it; lamina.native.build compiles.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor

import lamina.native.build as build
from lamina.errors import LaminaError

ENV = "LAMINA_KERNEL"
RETIRED_ENV = ("LAMINA_NATIVE", "LAMINA_QUANT_KERNEL")  # refused, naming ENV
MAX_ROWS = 32  # rows a per-call kernel takes where it wins (bench/decode_kernels.py)


def flags() -> frozenset[str]:
    """The flags of /proc/cpuinfo (empty where there is none; lamina.native.build reads them)."""
    return build.cpu_flags()


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686")


@cache
def native_bf16() -> bool:
    """True where the CPU does bf16 dot products in hardware (AVX512-BF16 or AMX) and torch's
    oneDNN uses them: the one test for "bf16 is fast here" (the packed kernels, training's
    --dtype auto, Muon's Newton-Schulz precision)."""
    if not {"avx512_bf16", "amx_bf16"} & flags():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


def native_missing() -> str | None:
    """Why lamina.native cannot run here (the platform, the CPU, the compiler or the build);
    None where its library is built and loaded (building it the first time, ~1 s)."""
    why = build.platform_missing()
    if why is None and build.library() is None:
        why = build.reason()
    return why


def _packed_missing() -> str | None:
    if native_bf16() or (_x86() and "avx2" in flags()):
        return None
    return "torch's packed kernels are measured only on x86 with AVX2 or native bf16"


@dataclass(frozen=True)
class Kernel:
    """One entry of the policy."""

    name: str
    missing: Callable[[], str | None]  # why it cannot run here (None: it can)
    takes: Callable[[int, torch.dtype], bool]  # whether a call of so many rows goes through it
    steps: bool = False  # runs the whole decode step too
    first_if: Callable[[], bool] = lambda: False  # auto takes it before the others where true


KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in (
        Kernel(
            "native",
            native_missing,
            lambda rows, dtype: dtype == torch.float32 and rows <= MAX_ROWS,
            steps=True,
        ),
        Kernel(
            "packed",
            _packed_missing,
            lambda rows, dtype: native_bf16() or rows <= MAX_ROWS,
            first_if=native_bf16,
        ),
        Kernel("dequantize", lambda: None, lambda rows, dtype: False),
    )
}


def choices() -> tuple[str, ...]:
    """The names a choice may take: "auto", each kernel, "torch"."""
    return ("auto", *KERNELS, "torch")


_using: ContextVar[str | None] = ContextVar("lamina_kernel", default=None)


def _check(name: str, where: str) -> str:
    if name not in choices():
        raise LaminaError(f"{where} must be one of {', '.join(choices())}, got {name!r}")
    return name


def choice() -> str:
    """What was asked for: the innermost `using`, else $LAMINA_KERNEL, else "auto"."""
    inner = _using.get()
    if inner is not None:
        return inner
    for old in RETIRED_ENV:
        if os.environ.get(old, "").strip():
            raise LaminaError(f"{old} is retired: set {ENV} (one of {', '.join(choices())})")
    return _check(os.environ.get(ENV, "").strip() or "auto", ENV)


@contextmanager
def using(name: str) -> Iterator[None]:
    """Run everything inside with kernel `name` (one of `choices()`; "auto" restores the policy's
    own choice). Layers prepared before keep their kernel-side tensors; a call whose layer was
    prepared for another kernel runs dequantized."""
    token = _using.set(_check(name, "the kernel"))
    try:
        yield
    finally:
        _using.reset(token)


@cache
def _auto(pytorch_only: bool, has: tuple[str, ...] | None = None) -> str:
    order = [
        k
        for k in KERNELS.values()
        if not (pytorch_only and k.steps) and (has is None or k.name in has)
    ]
    order.sort(key=lambda k: not k.first_if())  # stable: the table's order otherwise
    return next((k.name for k in order if k.missing() is None), "dequantize")


def layer_kernel(has: tuple[str, ...] | None = None) -> str:
    """The kernel quantized layers prepare for and use (see the module docstring); `has`: the
    kernels a layer has, where not all (GGML's K-quant blocks: ("native",)). A forced kernel
    such a layer lacks runs it dequantized."""
    name = choice()
    if name in ("auto", "torch"):
        return _auto(name == "torch", has)
    if has is not None and name not in has:
        return "dequantize"
    why = KERNELS[name].missing()
    if why is not None:
        raise LaminaError(f"{ENV}={name}, but {why}")
    return name


def call_kernel(x: Tensor, has: tuple[str, ...] | None = None) -> str:
    """The kernel one call on x runs: the layers' kernel where it takes x, else "dequantize"
    (the int8/int4 kernels record no gradients, so a LoRA over a quantized base runs
    dequantized while training); `has` as for layer_kernel."""
    if (x.requires_grad and torch.is_grad_enabled()) or x.device.type != "cpu":
        return "dequantize"
    name = layer_kernel(has)
    rows = x.numel() // max(1, x.shape[-1])
    return name if KERNELS[name].takes(rows, x.dtype) else "dequantize"


def _long_call(x: Tensor) -> bool:
    """A float32 CPU call of more than MAX_ROWS rows recording no gradient, the choice not
    "dequantize": a prefill's, which need not be the float reference."""
    return (
        x.dtype == torch.float32
        and x.numel() // max(1, x.shape[-1]) > MAX_ROWS
        and x.device.type == "cpu"
        and not (x.requires_grad and torch.is_grad_enabled())
        and choice() != "dequantize"
    )


def dequantized_dtype(x: Tensor) -> torch.dtype:
    """The dtype a quantized layer's call on x that runs dequantized multiplies in (see the
    module docstring): bf16 for a float32 CPU call of more than MAX_ROWS rows recording no
    gradient where bf16 is native and the choice is not "dequantize", else x's own dtype."""
    return torch.bfloat16 if _long_call(x) and native_bf16() else x.dtype


INT8_ENV = "LAMINA_PREFILL_INT8"
_int8_switch: list[bool] = []  # int8_prefill's setting, where one was made (over INT8_ENV)


def int8_prefill(on: bool | None = None) -> bool:
    """The switch for a prefill's int8 matmuls: `on` sets it for this process (over
    $LAMINA_PREFILL_INT8); returns the setting in force (default off)."""
    if on is not None:
        _int8_switch[:] = [bool(on)]
    if _int8_switch:
        return _int8_switch[0]
    value = os.environ.get(INT8_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise LaminaError(f"{INT8_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


@cache
def native_int8() -> bool:
    """True where the CPU multiplies int8 in hardware (AVX-512 VNNI or AMX) and torch has
    _int_mm on the CPU (checked once on a small product)."""
    if not {"avx512_vnni", "amx_int8"} & flags():
        return False
    try:
        a = torch.ones(2, 8, dtype=torch.int8)
        return int(torch._int_mm(a, a.t())[0, 0]) == 8
    except (AttributeError, RuntimeError):
        return False


def prefill_int8(x: Tensor) -> bool:
    """Whether a quantized layer's call on x that runs dequantized may multiply int8 by int8
    (see the module docstring): a long call (as dequantized_dtype's bf16 ones) where int8 is
    native and the switch is on. The caller (quant/bf16.py) also keeps `lamina train`'s kept
    dequantizations out, which this layer cannot see."""
    return _long_call(x) and native_int8() and int8_prefill()


def native_step() -> bool:
    """Whether a decode step may run whole in lamina.native (the model and caches permitting:
    lamina.native.unsupported says which it covers)."""
    name = choice()
    if name == "auto":
        return native_missing() is None
    return KERNELS.get(name, KERNELS["dequantize"]).steps and layer_kernel() == name


def keeps_quantized(device_type: str) -> bool:
    """Whether a model opened to be run keeps a file's quantized weights quantized: where a
    kernel runs them (lamina's native one or torch's packed ones), not where every call would
    dequantize them (other devices, or a kernel chosen that way)."""
    return device_type == "cpu" and layer_kernel() != "dequantize"


def fused_adamw(device_type: str) -> bool:
    """Whether AdamW tries torch's fused kernel on this device (CPU and CUDA have one; a
    failure to build it falls back to the plain loop)."""
    return device_type in ("cpu", "cuda")


UPCAST_HEAD_WIDTH = 64  # heads narrower than this train their attention in fp32 on a CPU


def upcast_attention(q: Tensor) -> bool:
    """Whether fused attention on `q` (B, H, T, hd) runs in float32 rather than bf16: on a CPU
    while recording gradients, for heads narrower than UPCAST_HEAD_WIDTH: torch's bf16
    flash-attention backward is slower than fp32's at narrow heads and faster at 64 wide
    (BENCHMARKS.md, "The step, option by option"); the forward alone (eval, generation) stays
    in bf16, where it is faster."""
    return (
        q.dtype == torch.bfloat16
        and q.device.type == "cpu"
        and q.shape[-1] < UPCAST_HEAD_WIDTH
        and q.requires_grad
        and torch.is_grad_enabled()
    )
