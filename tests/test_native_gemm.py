"""decode.c's bf16 form of a prompt's chunk (lin_rows_bf, step_run_attention): the linears of a
step whose rows are one cache row's consecutive slots (B >= lm_gemm_min()) and that wants fewer
logits than rows (lm_step_last, keep < B: the runtime's prompt chunks) multiplied in bf16 on a
CPU with AVX-512 BF16, and their attention blocked as a prefill. Held to the product of the
bf16-rounded weights and inputs, to the integer kernels, and to greedy decoding."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ggml_rows import random_rows

from lamina.native import build
from lamina.native.runtime import Runtime
from lamina.native.structs import (
    GGML_KINDS,
    LIN_INT4,
    LIN_INT8,
    LIN_PARTS,
    Keep,
    Lin,
    aligned_bytes,
)
from lamina.quant.kquant import BLOCKS

FIXTURES = Path(__file__).parent / "fixtures"


def _lib():
    lib = build.library() if build.platform_missing() is None else None
    if lib is None:
        pytest.skip("the native library does not build here")
    if lib.lm_gemm_bf16(-1) != 1:
        pytest.skip("no AVX-512 BF16 here: the bf16 form does not run")
    return lib


@contextlib.contextmanager
def _forms(lib, gemm: int, runs: int, att_bf16: int = 0) -> Iterator[None]:
    """The step's bf16 linears (lm_gemm_bf16), blocked attention (lm_step_runs) and that
    attention's bf16 form (lm_patt_bf16) set, then put back."""
    before = lib.lm_gemm_bf16(-1), lib.lm_step_runs(-1), lib.lm_patt_bf16(-1)
    lib.lm_gemm_bf16(gemm), lib.lm_step_runs(runs), lib.lm_patt_bf16(att_bf16)
    try:
        yield
    finally:
        lib.lm_gemm_bf16(before[0]), lib.lm_step_runs(before[1]), lib.lm_patt_bf16(before[2])


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bf16 (ties to even), as float64"""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).astype(np.float64)


def _ggml(lib, keep: Keep, qtype: str, n: int, k: int, seed: int, lanes: bool = False):
    raw = random_rows(qtype, n, k, seed)
    L = Lin()
    L.kind, L.n, L.k, L.gs, L.w = GGML_KINDS[qtype], n, k, 32, keep.address(raw)
    dense = np.empty((n, k), np.float32)
    assert lib.lm_dequant(L.kind, L.w, n, k, dense.ctypes.data)
    if lanes:  # Q4_K in 16-row lanes (what the runtime holds where the CPU takes them)
        packed = aligned_bytes(raw.nbytes)
        packed[:] = raw.reshape(-1)
        assert lib.lm_kq_pack16(ctypes.addressof(L), packed.ctypes.data, 1)
        L.w = L.lw = keep.address(packed)
    return L, dense


def _int4(keep: Keep, n: int, k: int, gs: int, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    s = rng.uniform(0.01, 0.02, (n, k // gs)).astype(np.float32)
    mn = rng.uniform(-0.1, 0.0, (n, k // gs)).astype(np.float32)
    qq = np.empty((n, k), np.float32)
    qq[:, 0::2], qq[:, 1::2] = q & 15, q >> 4
    L = Lin()
    L.kind, L.n, L.k, L.gs = LIN_INT4, n, k, gs
    L.w, L.s, L.mn = keep.address(q), keep.address(s), keep.address(mn)
    return L, qq * np.repeat(s, gs, 1) + np.repeat(mn, gs, 1)


def _int8(keep: Keep, n: int, k: int, gs: int, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.integers(-127, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.001, 0.002, (n, k // gs)).astype(np.float32)
    L = Lin()
    L.kind, L.n, L.k, L.gs, L.w, L.s = LIN_INT8, n, k, gs, keep.address(q), keep.address(s)
    return L, q * np.repeat(s, gs, 1)


def _call(fn, L: Lin, x: np.ndarray, threads: int) -> np.ndarray:
    y = np.full((x.shape[0], L.n), np.nan, np.float32)
    assert fn(ctypes.addressof(L), x.shape[0], x.ctypes.data, y.ctypes.data, threads)
    return y


def _linear(lib, keep: Keep, case: str) -> tuple[Lin, np.ndarray]:
    """A linear of CASES' kind `case` (53 rows, 48 in lanes) and its dense float weights."""
    n = 48 if case.endswith("-lanes") else 53
    if case.startswith("int4"):
        return _int4(keep, n, 576, 64 if case.endswith("g64") else 32, 1)
    if case.startswith("int8"):
        return _int8(keep, n, 288, 288 if case.endswith("row") else 32, 2)
    if (
        case == "parts"
    ):  # a fused linear of mixed kinds (with and without minimums), each its own tiles
        parts = [_ggml(lib, keep, "Q5_0", 21, 256, 3), _ggml(lib, keep, "Q4_K", 16, 256, 4, True),
                 _ggml(lib, keep, "Q8_0", 16, 256, 5)]  # fmt: skip
        structs = keep.parts(3)
        for P, (p, _) in zip(structs, parts, strict=True):
            ctypes.memmove(ctypes.addressof(P), ctypes.addressof(p), ctypes.sizeof(Lin))
        L = Lin()
        L.kind, L.n, L.k, L.gs, L.w = LIN_PARTS, 53, 256, 3, ctypes.addressof(structs[0])
        return L, np.concatenate([d for _, d in parts])
    qtype, lanes = case.removesuffix("-lanes"), case.endswith("-lanes")
    return _ggml(lib, keep, qtype, n, 512 if BLOCKS[qtype][0] == 256 else 288, 6, lanes)


# 53 rows: a tile of 32 and a tail of 21 (16 + 5); k: 9 or 18 blocks of 32, 2 super-blocks
CASES = ["int4", "int4-g64", "int8", "int8-row", *BLOCKS, "Q4_K-lanes", "parts"]


@pytest.mark.parametrize("case", CASES)
def test_bf16_linear_is_the_product_of_bf16_roundings(case: str) -> None:
    lib, keep = _lib(), Keep()
    L, dense = _linear(lib, keep, case)
    bias = np.zeros(L.n, np.float32)
    if L.kind != LIN_PARTS:  # (a fused linear's parts hold their own biases)
        bias = np.random.default_rng(7).standard_normal(L.n).astype(np.float32)
        L.bias = keep.address(bias)
    rng = np.random.default_rng(8)
    for B in (1, 13, 37):  # a pass of fewer than 12 rows, and 3 passes and 1 row
        x = rng.standard_normal((B, L.k)).astype(np.float32)
        x[:, ::37] *= 20  # some large inputs
        want = _bf16(x) @ _bf16(dense).T + bias
        outs = [_call(lib.lm_linear_bf16, L, x, t) for t in (1, 2)]  # 2: rows split mid-tile
        for y in outs[1:]:
            assert np.array_equal(y, outs[0])  # each output summed whole by one thread
        got = outs[0]
        # (the weights' floats rounded once (fma) where numpy rounds twice: a rare bf16 apart)
        assert np.linalg.norm(got - want) < 1e-4 * np.linalg.norm(want), case
        ints = _call(lib.lm_linear, L, x, 2)  # the integer kernels: ~2e-3 apart (bf16's rounding)
        assert np.linalg.norm(got - ints) < 6e-3 * np.linalg.norm(ints), case


def test_bf16_form_is_refused_where_it_does_not_apply() -> None:
    lib, keep = _lib(), Keep()
    L = Lin()
    L.kind, L.n, L.k, L.w = 0, 4, 64, keep.address(np.zeros((4, 64), np.float32))  # float rows
    x = np.zeros((20, 64), np.float32)
    y = np.zeros((20, 4), np.float32)
    assert lib.lm_linear_bf16(ctypes.addressof(L), 20, x.ctypes.data, y.ctypes.data, 1) == 0
    with _forms(lib, 0, 1):
        L, _ = _int8(keep, 4, 64, 32, 0)
        assert lib.lm_linear_bf16(ctypes.addressof(L), 20, x.ctypes.data, y.ctypes.data, 1) == 0


def _prompt_and_tokens(rt: Runtime, ids: list[int], new: int) -> tuple[np.ndarray, list[int]]:
    rt.forget(0)
    logits = rt.feed(ids)
    rt.forget(0)
    return logits, list(rt.generate(ids, new))


@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q8_0", "Q6_K"])
def test_a_prompts_chunks_in_bf16_decode_as_the_integer_kernels(qtype: str) -> None:
    lib = _lib()
    rt = Runtime.open(FIXTURES / f"kquant-{qtype}.gguf", cache_len=256, threads=2)
    ids = [(7 * i * i + 3 * i + 5) % 250 + 1 for i in range(150)]  # one chunk (the runtime's: 256)
    with _forms(lib, 0, 0):
        want, want_tokens = _prompt_and_tokens(rt, ids, 32)
        rt.forget(0)
        short = rt.feed(ids[:15])  # below lm_gemm_min: the integer kernels whatever the switch
    with _forms(lib, 0, 1):  # the blocked attention alone: floats summed otherwise
        runs, _ = _prompt_and_tokens(rt, ids, 0)
    got, tokens = _prompt_and_tokens(rt, ids, 32)
    rt.forget(0)
    assert np.array_equal(rt.feed(ids[:15]), short)
    rt.forget(0)
    chunked = rt.feed(ids, 100)  # chunks of 100 and 50: the second attends over the first's keys
    scale = np.abs(want).max()
    assert np.abs(runs - want).max() < 1e-3 * scale
    # bf16 weights and inputs: ~3e-3 of the largest logit here (~1e-2 on SmolLM2, BENCHMARKS.md)
    assert np.abs(got - want).max() < 2e-2 * scale
    assert 0 < np.abs(got - want).max()  # the bf16 form ran
    assert np.abs(chunked - want).max() < 2e-2 * scale
    assert tokens == want_tokens


def test_the_real_model_in_bf16_keeps_its_greedy_tokens(smollm2_gguf: Path) -> None:
    lib = _lib()
    rt = Runtime.open(smollm2_gguf, cache_len=256, threads=2)
    ids = rt.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert len(ids) >= lib.lm_gemm_min(-1)
    with _forms(lib, 0, 0):
        want, want_tokens = _prompt_and_tokens(rt, ids, 32)
    got, tokens = _prompt_and_tokens(rt, ids, 32)
    assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()  # measured 9e-3
    assert tokens == want_tokens


def test_a_step_that_wants_every_rows_logits_rounds_each_row_as_alone() -> None:
    """lm_step (every row's logits: the server's step, which a rider's prompt may fill alone)
    never takes the prefill forms, so a request's tokens do not depend on the rest of its batch;
    the same rows asking for their last logits alone (a prompt's chunk) do take them."""
    lib = _lib()
    rt = Runtime.open(FIXTURES / "kquant-Q8_0.gguf", cache_len=256, threads=2)
    n = 20
    assert n >= lib.lm_gemm_min(-1)
    arr = ctypes.c_int64 * n
    tok = arr(*[(5 * i + 1) % 250 + 1 for i in range(n)])
    slots, zeros = arr(*range(n)), arr(*([0] * n))

    def step(keep: int) -> np.ndarray:
        out = np.zeros((keep, rt.vocab), np.float32)
        at = [ctypes.addressof(a) for a in (tok, slots, zeros, slots, zeros)]
        ok = lib.lm_step_last(ctypes.addressof(rt.weights.model), n, *at, out.ctypes.data, 2, keep)
        assert ok
        return out

    with _forms(lib, 0, 0):
        want_all, want_last = step(n), step(1)
    got_all, got_last = step(n), step(1)
    assert np.array_equal(got_all, want_all)
    assert not np.array_equal(got_last, want_last)
