"""lamina.cpu, the kernel policy: the choice (environment, `using`), refusals, per-call rules."""

from __future__ import annotations

import pytest
import torch

from lamina import cpu
from lamina.errors import LaminaError


def test_the_default_is_auto_and_using_nests(monkeypatch):
    monkeypatch.delenv(cpu.ENV, raising=False)
    assert cpu.choice() == "auto"
    with cpu.using("torch"):
        assert cpu.choice() == "torch"
        with cpu.using("dequantize"):
            assert cpu.choice() == "dequantize"
        assert cpu.choice() == "torch"
    assert cpu.choice() == "auto"


def test_the_environment_chooses_and_using_wins(monkeypatch):
    monkeypatch.setenv(cpu.ENV, "dequantize")
    assert cpu.layer_kernel() == "dequantize" and not cpu.native_step()
    with cpu.using("auto"):
        assert cpu.choice() == "auto"


@pytest.mark.parametrize("name", ["fast", "Native", ""])
def test_an_unknown_kernel_is_refused_by_name(name, monkeypatch):
    if name:
        monkeypatch.setenv(cpu.ENV, name)
        with pytest.raises(LaminaError, match=f"{cpu.ENV} must be one of"):
            cpu.choice()
    with pytest.raises(LaminaError, match="the kernel must be one of"):
        with cpu.using(name):
            pass


@pytest.mark.parametrize("old", cpu.RETIRED_ENV)
def test_a_retired_variable_is_refused_naming_the_new_one(old, monkeypatch):
    monkeypatch.setenv(old, "0")
    with pytest.raises(LaminaError, match=f"{old} is retired: set {cpu.ENV}"):
        cpu.choice()


def test_pytorch_kernels_stop_the_native_step():
    for name in ("torch", "packed", "dequantize"):
        with cpu.using(name):
            assert not cpu.native_step(), name
    with cpu.using("torch"):
        assert cpu.layer_kernel() in ("packed", "dequantize")


def test_forcing_native_where_it_cannot_run_is_refused_naming_why(monkeypatch):
    monkeypatch.setitem(cpu.KERNELS, "native", cpu.KERNELS["native"].__class__(
        "native", lambda: "no C compiler (set CC, or install gcc)", lambda r, d: True, True
    ))  # fmt: skip
    with cpu.using("native"), pytest.raises(LaminaError, match="no C compiler"):
        cpu.layer_kernel()


def test_a_call_runs_dequantized_where_the_kernel_does_not_take_it():
    x = torch.randn(2, 64)
    with cpu.using("dequantize"):
        assert cpu.call_kernel(x) == "dequantize"
    if cpu.native_missing() is None:
        with cpu.using("native"):
            assert cpu.call_kernel(x) == "native"
            assert cpu.call_kernel(torch.randn(cpu.MAX_ROWS + 1, 64)) == "dequantize"
            assert cpu.call_kernel(x.bfloat16()) == "dequantize"
            assert cpu.call_kernel(x.requires_grad_()) == "dequantize"  # gradients recorded
            with torch.no_grad():
                assert cpu.call_kernel(x) == "native"


def test_a_new_kernel_is_one_entry(monkeypatch):
    new = cpu.Kernel("mine", lambda: None, lambda rows, dtype: rows == 1, first_if=lambda: True)
    monkeypatch.setattr(cpu, "KERNELS", {"mine": new, **cpu.KERNELS})  # first in the table
    cpu._auto.cache_clear()
    try:
        assert cpu.layer_kernel() == "mine"  # auto takes it first where first_if holds
        with torch.no_grad():
            assert cpu.call_kernel(torch.randn(1, 8)) == "mine"
            assert cpu.call_kernel(torch.randn(2, 8)) == "dequantize"
        with cpu.using("mine"):
            assert cpu.layer_kernel() == "mine" and not cpu.native_step()
    finally:
        cpu._auto.cache_clear()


def test_flags_and_bf16_agree():
    assert isinstance(cpu.flags(), frozenset)
    if cpu.native_bf16():
        assert {"avx512_bf16", "amx_bf16"} & cpu.flags()


def test_lamina_changes_no_process_environment():
    """No module of src/lamina writes os.environ (a child's env dict is its own business)."""
    import ast
    from pathlib import Path

    src = Path(cpu.__file__).parent
    writes = ("setdefault", "update", "pop", "popitem", "clear", "putenv", "unsetenv")
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
                hit = any(
                    isinstance(t, ast.Subscript) and "environ" in ast.unparse(t.value)
                    for t in targets
                )
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                hit = node.func.attr in writes and "os" in ast.unparse(node.func.value)
                hit = hit and ("environ" in ast.unparse(node.func) or "env" in node.func.attr)
            else:
                hit = False
            if hit:
                found.append(f"{path.relative_to(src)}:{node.lineno}")
    assert not found, f"process environment written at {found}"


def test_a_layer_with_only_some_kernels_gets_one_of_them():
    x = torch.randn(2, 64)
    with torch.no_grad():
        with cpu.using("packed"):  # forced, but the layer lacks it: dequantized
            assert cpu.call_kernel(x, has=("native",)) == "dequantize"
        with cpu.using("torch"):
            assert cpu.call_kernel(x, has=("native",)) == "dequantize"
        want = "native" if cpu.native_missing() is None else "dequantize"
        assert cpu.call_kernel(x, has=("native",)) == want  # auto: the kernel it has


def test_long_dequantized_calls_multiply_in_bf16_only_where_it_is_native(monkeypatch):
    """A prefill's long calls (> MAX_ROWS rows, no gradient, float32, CPU) in bf16 where bf16
    is native; short calls, gradients, other dtypes and a "dequantize" choice keep the input's."""
    long, short = torch.randn(cpu.MAX_ROWS + 1, 8), torch.randn(cpu.MAX_ROWS, 8)
    for native in (True, False):
        monkeypatch.setattr(cpu, "native_bf16", lambda native=native: native)
        with torch.no_grad():
            assert cpu.dequantized_dtype(long) == (torch.bfloat16 if native else torch.float32)
            assert cpu.dequantized_dtype(short) == torch.float32
            assert cpu.dequantized_dtype(long.double()) == torch.float64
            with cpu.using("dequantize"):
                assert cpu.dequantized_dtype(long) == torch.float32
        assert cpu.dequantized_dtype(long.requires_grad_()) == torch.float32
        long = long.detach()


@pytest.mark.parametrize(
    ("flags", "onednn", "native"),
    [
        ({"avx2", "fma", "amx_tile", "amx_bf16", "amx_int8"}, True, True),  # Xeon with AMX
        ({"avx2", "fma", "avx512f", "avx512_bf16"}, True, True),  # AVX512-BF16, no AMX
        ({"avx2", "fma", "avx512f"}, True, False),  # bf16 emulated
        ({"amx_bf16"}, False, False),  # listed, but oneDNN does not use it
    ],
)
def test_auto_dtype_is_chosen_at_run_time_from_the_flags(monkeypatch, flags, onednn, native):
    """--dtype auto trains in bf16 where the CPU lists amx_bf16 or avx512_bf16 and oneDNN uses
    it (bf16 on AMX: 22.0 against fp32's 31.1 ms a step at bench/step.py's shape A), from
    BF16_MIN_WIDTH wide; the flags are read when asked, not when lamina is imported."""
    from lamina.training.device import BF16_MIN_WIDTH, use_bf16

    monkeypatch.setattr(cpu, "flags", lambda: frozenset(flags))
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn)
    here = torch.device("cpu")
    cpu.native_bf16.cache_clear()
    try:
        assert cpu.native_bf16() is native
        assert use_bf16("auto", here, BF16_MIN_WIDTH) is native
        assert use_bf16("auto", here, BF16_MIN_WIDTH // 2) is False
        assert use_bf16("fp32", here, 384) is False and use_bf16("bf16", here, 64) is True
    finally:
        cpu.native_bf16.cache_clear()
