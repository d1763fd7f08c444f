"""K-quants kept as GGUF stores them (lamina.quant.kquant, native/decode.c's GGML kernels), on
blocks made by gguf-py's layouts and on the files llama.cpp's quantizer wrote (tests/fixtures)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from ggml_rows import SCALES, random_rows

import lamina
from lamina import LaminaError, native
from lamina.interop.gguf import load_gguf
from lamina.native.gguf_read import read_gguf
from lamina.quant.kquant import BLOCKS, BlockEmbedding, BlockLinear, dequantize_blocks

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FILES = sorted(FIXTURES.glob("kquant-*.gguf"))
Q = gguf.GGMLQuantizationType


def _native() -> bool:
    return native.reason() is None and native.available()


def _under(switch, forms, run):
    """run() under each of a decode.c switch's forms that this CPU takes, the switch put back:
    (the form in force before, the outputs); `switch(-1)` reads a switch, `switch(f)` sets it."""
    before = switch(-1)
    try:
        return before, [run() for form in forms if switch(form) == form]
    finally:
        switch(before)


def _rows(qtype: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(random_rows(qtype, n, k, seed))


@pytest.mark.parametrize("qtype", list(BLOCKS))
def test_dequantize_is_gguf_py_bit_for_bit(qtype):
    rows = _rows(qtype, 6, 512)
    want = gguf.quants.dequantize(rows.numpy(), Q[qtype])
    got = dequantize_blocks(qtype, rows, 512)  # the native dequantizer where it is built
    assert np.array_equal(got.numpy(), want) and np.abs(want).max() > 0


def test_llama_cpp_blocks_read_bit_for_bit_and_near_the_source(tmp_path):
    # the fixtures' blocks, quantized by llama.cpp: lamina's reading (native where kept, gguf-py
    # otherwise) equals gguf-py's, and each is near the float weights llama.cpp quantized
    spec = importlib.util.spec_from_file_location("make_kquants", FIXTURES / "make_kquants.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    maker.write_source(tmp_path / "f32.gguf")  # the same seed: the very source weights
    source = read_gguf(tmp_path / "f32.gguf").tensors
    bound = {"Q8_0": 0.01, "Q6_K": 0.03, "Q5_K": 0.06, "Q4_K": 0.12, "IQ4_NL": 0.12,
             "IQ4_XS": 0.12, "Q3_K": 0.25, "Q2_K": 0.5}  # fmt: skip
    seen = set()
    assert len(FILES) == 8
    for path in FILES:
        for name, t in read_gguf(path).tensors.items():
            if t.qtype == "F32":
                continue
            got = t.dequantize()
            want = gguf.quants.dequantize(t.raw, Q[t.qtype])
            assert np.array_equal(got.numpy(), want), (path.name, name)
            if t.qtype in BLOCKS:
                rows = torch.from_numpy(np.array(t.raw))
                assert torch.equal(dequantize_blocks(t.qtype, rows, t.shape[1]), got)
            ref = source[name].dequantize()
            err = ((got - ref).norm() / ref.norm()).item()
            assert err < bound[t.qtype], (path.name, name, t.qtype, err)
            seen.add(t.qtype)
    assert seen == set(bound)


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
def test_block_linear_native_calls_match_the_dequantized_matmul():
    parts = [("Q4_K", _rows("Q4_K", 40, 512, 1)), ("Q6_K", _rows("Q6_K", 24, 512, 2)),
             ("Q5_0", _rows("Q5_0", 16, 512, 3)), ("Q8_0", _rows("Q8_0", 8, 512, 4))]  # fmt: skip
    for chosen in (parts[:1], parts[1:2], parts):
        n = sum(r.shape[0] for _, r in chosen)
        m = BlockLinear(512, n, chosen, torch.randn(n))
        w = m.dequantized()
        for rows in (1, 9):  # one row, the tiled path
            x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
            want = x @ w.T + m.bias
            err = ((m(x) - want).norm() / want.norm()).item()
            assert err < 1e-4, (m, rows, err)
        x = torch.randn(40, 512)  # past 32 rows: dequantized, in fp32 where chosen
        with lamina.cpu.using("dequantize"):
            torch.testing.assert_close(m(x), x @ w.T + m.bias, atol=1e-5, rtol=1e-6)
        dtype = lamina.cpu.dequantized_dtype(x)  # by default in the dtype lamina.cpu picks
        want = (x.to(dtype) @ w.to(dtype).T).float() + m.bias
        torch.testing.assert_close(m(x), want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
def test_block_linear_bf16_dequantization_is_the_floats_cast():
    # a prefill's weights: the native dequantizer writes bf16 itself, on torch's threads; each
    # value must be the float dequantization's cast (round to nearest even, NaN kept a NaN)
    parts = [(q, _rows(q, 7 + i, 512, i)) for i, q in enumerate(BLOCKS)]
    damaged = parts[0][1].clone()
    damaged[0, SCALES[parts[0][0]][0] : SCALES[parts[0][0]][0] + 2] = torch.tensor([0, 0x7C])
    damaged[1, SCALES[parts[0][0]][0] : SCALES[parts[0][0]][0] + 2] = torch.tensor([1, 0x7C])
    parts.append((parts[0][0], damaged))  # an inf scale and a NaN one
    m = BlockLinear(512, sum(r.shape[0] for _, r in parts), parts)
    want = m.dequantized().to(torch.bfloat16)
    assert want.isnan().any() and want.isinf().any()
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got = m.dequantized(torch.bfloat16)
            assert got.dtype == torch.bfloat16
            same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
            assert same.all(), threads
    finally:
        torch.set_num_threads(before)


def test_block_modules_refuse_rows_that_do_not_fit():
    with pytest.raises(LaminaError, match="Q4_K rows hold whole blocks of 256"):
        BlockLinear(96, 4, [("Q4_K", torch.zeros(4, 54, dtype=torch.uint8))])
    with pytest.raises(LaminaError, match="must be uint8"):
        BlockEmbedding("Q6_K", torch.zeros(4, 100, dtype=torch.uint8), 256)
    with pytest.raises(LaminaError, match="no kept form"):
        BlockLinear(256, 4, [("Q2_K", torch.zeros(4, 84, dtype=torch.uint8))])


KEPT_FILES = ["Q4_K_M", "Q5_K_M", "Q6_K"]


@pytest.fixture(scope="module")
def models():
    out = {}
    for name in KEPT_FILES:
        path = FIXTURES / f"kquant-{name}.gguf"
        out[name] = (load_gguf(path, quantized=True)[0], load_gguf(path)[0], path)
    return out


@pytest.mark.parametrize("name", KEPT_FILES)
def test_kept_as_the_file_types_them_at_its_size(models, name):
    kept, _, path = models[name]
    types = {n: t.qtype for n, t in read_gguf(path).tensors.items()}
    table = kept.embed.wte
    assert isinstance(table, BlockEmbedding) and table.qtype == types["token_embd.weight"]
    assert kept.head.parts[0][1] is table.blocks  # tied: the head reads the table's own rows
    for i, block in enumerate(kept.blocks):
        qkv = block.attn.qkv
        assert isinstance(qkv, BlockLinear)
        assert qkv.qtypes in ((types[f"blk.{i}.attn_q.weight"],), tuple(
            types[f"blk.{i}.attn_{p}.weight"] for p in "qkv"))  # fmt: skip
        assert block.ff.proj.qtypes == (types[f"blk.{i}.ffn_down.weight"],)
    held = sum(b.nbytes for n, b in kept.named_buffers() if "blocks" in n)  # the tie once
    in_file = sum(t.nbytes for t in read_gguf(path).tensors.values() if t.qtype != "F32")
    assert held == in_file


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("name", KEPT_FILES)
def test_native_steps_within_kernel_tolerance_and_greedy_tokens_equal(models, name):
    kept, ref, _ = models[name]
    ids = torch.randint(3, 320, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        caches = kept.make_caches(2, 20)
        ref(ids[:, :10], caches=caches)  # the same cache for both
        engine = native.native_step(kept, caches)
        assert engine is not None, native.unsupported(kept)
        got = torch.stack(
            [engine.step(ids[:, t].tolist(), [t] * 2, [0] * 2) for t in range(10, 20)], 1
        )
        want = ref(ids)[:, 10:]
    err = ((got - want).norm() / want.norm()).item()
    assert err < 1e-3, err  # inputs rounded to int16 per 32: ~1e-4
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    prompt = [[1, 40, 41, 300, 7]]
    assert torch.equal(lamina.generate(kept, prompt, 32), lamina.generate(ref, prompt, 32))


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
def test_one_row_on_two_threads_changes_no_bit(models):
    # decode.c's lm_col_split: each thread its columns of a one-row step's norms, activation and
    # input blocks (1, the default; the super-block kinds' integer form shares a scale per 256:
    # whole spans each) or thread 0 all of them (0): the logits of 1 thread, bit for bit
    from lamina.native.build import library

    ids = torch.randint(3, 320, (12,), generator=torch.Generator().manual_seed(6)).tolist()

    def steps(kept, threads):
        with torch.no_grad():
            engine = native.native_step(kept, kept.make_caches(1, 12))
            return torch.stack([engine.step([t], [i], [0], threads) for i, t in enumerate(ids)])

    for name in KEPT_FILES:
        kept = models[name][0]
        one = steps(kept, 1)
        before, outs = _under(
            library().lm_col_split, (1, 0), lambda k=kept: [steps(k, 2), steps(k, 3)]
        )
        assert before == 1
        for got in (g for pair in outs for g in pair):
            assert torch.equal(got, one), name


def test_pytorch_path_runs_the_kept_blocks_too(models):
    # no native step or kernel (LAMINA_KERNEL=torch, or no compiler): the blocks dequantized
    import lamina.cpu as cpu

    kept, ref, _ = models["Q4_K_M"]
    prompt = [[1, 9, 300, 44]]
    with cpu.using("torch"):
        assert native.native_step(kept, kept.make_caches(1, 8)) is None
        x = torch.randn(3, 256)
        lin = kept.blocks[1].attn.qkv
        assert torch.allclose(lin(x), x @ lin.dequantized().T, rtol=0, atol=1e-5)
        got = lamina.generate(kept, prompt, 8)
    assert torch.equal(got, lamina.generate(ref, prompt, 8))


@pytest.fixture
def act8():
    """The int8-input form of the one-row kernels (decode.c's act8) for one test, or skip where
    the CPU lacks AVX-512 VNNI; the int16 form (the default) restored after."""
    from lamina.native.build import library

    lib = library()
    before = lib.lm_act8(-1)
    if lib.lm_act8(1) != 1:
        lib.lm_act8(before)
        pytest.skip("no AVX-512 VNNI here: the int8-input form does not run")
    yield lib
    lib.lm_act8(before)


# The int8-input form's logits differ from the int16 form's by what rounding the inputs to 8 bits
# per 32 costs: measured (BENCHMARKS.md, the decode section) 3-4e-2 of the logits' norm on SmolLM2
# Q4_1 / Q4_K_M / Q8_0 and ERR8 below on these fixtures; the bound is twice the largest measured.
ACT8_TOL = 8e-2


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("name", KEPT_FILES)
def test_int8_inputs_within_their_rounding_of_the_int16_form(models, name, act8):
    kept, ref, _ = models[name]
    ids = torch.randint(3, 320, (1, 20), generator=torch.Generator().manual_seed(6))

    def steps() -> torch.Tensor:
        caches = kept.make_caches(1, 20)
        ref(ids[:, :10], caches=caches)
        engine = native.native_step(kept, caches)
        assert engine is not None, native.unsupported(kept)
        return torch.stack([engine.step([int(ids[0, t])], [t], [0]) for t in range(10, 20)], 1)

    with torch.no_grad():
        got = steps()
        act8.lm_act8(0)
        exact = steps()
    err = ((got - exact).norm() / exact.norm()).item()
    print(f"ERR8 {name} {err:.3e}")
    assert 0 < err < ACT8_TOL, err  # 0: the int16 form ran both times


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("qtype", list(BLOCKS))
def test_int8_inputs_per_kind_within_their_rounding(qtype, act8):
    # k = 288 for the kinds of 32-blocks: 9 blocks, the odd one alone (the kernel takes two at once)
    k = 512 if BLOCKS[qtype][0] == 256 else 288
    m = BlockLinear(k, 12, [(qtype, _rows(qtype, 12, k, 7))], torch.randn(12))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(8))
    want = x @ m.dequantized().T + m.bias
    err = ((m(x) - want).norm() / want.norm()).item()
    act8.lm_act8(0)
    exact = ((m(x) - want).norm() / want.norm()).item()
    assert exact < 1e-4 < err < ACT8_TOL, (exact, err)


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("qtype", list(BLOCKS))
def test_one_row_forms_agree_per_kind(qtype):
    # decode.c's lm_kq_wide: the AVX-512 one-row form (1) and the AVX2 row loop (0) both hold the
    # dequantized product, and differ from each other by float summation order only
    from lamina.native.build import library

    lib = library()
    k = 512 if BLOCKS[qtype][0] == 256 else 288
    m = BlockLinear(k, 12, [(qtype, _rows(qtype, 12, k, 9))], torch.randn(12))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(10))
    want = x @ m.dequantized().T + m.bias
    _, outs = _under(lib.lm_kq_wide, (0, 1), lambda: m(x))
    assert len(outs) == 2
    for y in outs:
        assert ((y - want).norm() / want.norm()).item() < 1e-4
    assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("qtype,n", [("Q4_K", 13), ("Q6_K", 13), ("Q4_K", 40)])
def test_integer_form_of_the_super_block_kinds(qtype, n):
    # decode.c's lm_kq_int: one input row quantized with a scale per 256, each super-block's
    # products summed in int32 (1), against the per-32 float form (0); a fused linear whose parts
    # mix kinds (Q5_0 rows keep their kernel, reading the same inputs) too; 13 rows leave a part
    # pass, 40 reach the prefetches spread through a pass (Q4_K's rows go in step there)
    from lamina.native.build import library

    lib = library()
    before = lib.lm_kq_int(-1)
    if lib.lm_kq_int(1) != 1:
        lib.lm_kq_int(before)
        pytest.skip("no AVX-512 VNNI here: the integer form does not run")
    k = 768
    parts = [(qtype, _rows(qtype, n, k, 11)), ("Q5_0", _rows("Q5_0", 6, k, 12))]
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(13))
    x[0, ::97] *= 30  # a few large inputs, as real activations have
    try:
        for chosen in (parts[:1], parts):
            n = sum(r.shape[0] for _, r in chosen)
            m = BlockLinear(k, n, chosen, torch.randn(n))
            want = x @ m.dequantized().T + m.bias
            outs = []
            for form in (1, 0):
                assert lib.lm_kq_int(form) == form
                outs.append(m(x))
            for y in outs:
                assert ((y - want).norm() / want.norm()).item() < 3e-4  # measured up to 1.6e-4
            assert not torch.equal(outs[0], outs[1])  # the integer form ran
    finally:
        lib.lm_kq_int(before)


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("qtype,n,extreme", [("Q4_K", 13, False), ("Q6_K", 40, False),
                                             ("Q4_K", 40, True), ("Q6_K", 13, True)])  # fmt: skip
def test_byte_planes_hold_the_integer_forms(qtype, n, extreme):
    # decode.c's lm_kq_planes: Q4_K / Q6_K one-row integer sums by vpdpbusd on the input's two
    # byte planes (1) against the int16 vpdpwssd forms (0): the same exact integers per group,
    # converted in other groupings; extreme: every weight, scale and input at its largest size
    # (Q6_K's scales -128, q 0: a lane at the int32 bound), where both sums are exact
    from lamina.native.build import library

    lib = library()
    before = lib.lm_kq_planes(-1)
    if lib.lm_kq_planes(1) != 1 or lib.lm_kq_int(-1) != 1:
        lib.lm_kq_planes(before)
        pytest.skip("no AVX-512 VNNI here: the byte-plane form does not run")
    k = 768
    rows = _rows(qtype, n, k, 21)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(22))
    x[0, ::97] *= 30
    if extreme:
        blocks = rows.view(n, k // 256, -1)
        if qtype == "Q6_K":
            blocks[..., :192] = 0  # q = 0: weights -32 x scale
            blocks[..., 192:208] = 0x80  # scales -128
        else:
            blocks[..., 4:] = 0xFF  # scales, minimums 63, q 15
        x = torch.where(torch.arange(k) % 256 == 0, 1.0, -1.0)[None]  # inputs +-32767
    m = BlockLinear(k, n, [(qtype, rows)], torch.randn(n))
    want = x @ m.dequantized().T + m.bias
    try:
        outs = []
        for form in (1, 0):
            assert lib.lm_kq_planes(form) == form
            outs.append(m(x))
    finally:
        lib.lm_kq_planes(before)
    assert before == 1  # the default where it runs
    for y in outs:
        assert ((y - want).norm() / want.norm()).item() < 3e-4
    assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-4)
    if not extreme:
        assert not torch.equal(outs[0], outs[1])  # the byte-plane form ran


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1"])
def test_five_bit_blocks_by_lane_mask_are_kq_q8s_integers(qtype):
    # decode.c's lm_q5_mask: the high bits as a lane mask (1) or by kq_q8's byte shuffles (0):
    # the same integers summed in the same order, so the same floats, and the dequantized product
    from lamina.native.build import library

    lib = library()
    before, pair = lib.lm_q5_mask(-1), lib.lm_q5_pair(-1)
    m = BlockLinear(288, 13, [(qtype, _rows(qtype, 13, 288, 14))], torch.randn(13))
    x = torch.randn(1, 288, generator=torch.Generator().manual_seed(15))
    want = x @ m.dequantized().T + m.bias
    try:
        lib.lm_q5_pair(0)  # one_row_kq_512, where the mask is read
        outs = [m(x) for form in (1, 0) if lib.lm_q5_mask(form) == form]
    finally:
        lib.lm_q5_mask(before)
        lib.lm_q5_pair(pair)
    assert torch.equal(outs[0], outs[1])
    assert ((outs[0] - want).norm() / want.norm()).item() < 1e-4


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("qtype,k", [("Q5_0", 288), ("Q5_1", 288), ("Q5_0", 1536), ("Q5_1", 576)])
def test_five_bit_blocks_in_pairs_hold_the_one_block_form(qtype, k):
    # decode.c's lm_q5_pair: Q5_0 / Q5_1 rows two blocks a step (1) against one_row_kq_512 (0):
    # the same integers, float sums in another order; k 288 leaves an odd block alone; 13 rows
    from lamina.native.build import library

    lib = library()
    m = BlockLinear(k, 13, [(qtype, _rows(qtype, 13, k, 16))], torch.randn(13))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(17))
    x[0, ::97] *= 30
    want = x @ m.dequantized().T + m.bias
    before, outs = _under(lib.lm_q5_pair, (1, 0), lambda: m(x))
    if len(outs) < 2:
        pytest.skip("no AVX-512 VNNI here: the pair form does not run")
    assert before == 1  # the default where it runs
    for y in outs:
        assert ((y - want).norm() / want.norm()).item() < 1e-4
    assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-4)
    assert not torch.equal(outs[0], outs[1])  # the pair form ran


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("qtype", list(BLOCKS))
def test_prefetch_spread_through_a_pass_changes_no_float(qtype):
    # decode.c's lm_pf_spread: the weights of passes ahead prefetched a few lines a step (1) or a
    # pass's rows at once (0); 40 rows, so that passes ahead exist; the same floats either way
    from lamina.native.build import library

    lib = library()
    k = 512 if BLOCKS[qtype][0] == 256 else 288
    m = BlockLinear(k, 40, [(qtype, _rows(qtype, 40, k, 18))], torch.randn(40))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(19))
    want = x @ m.dequantized().T + m.bias
    before, outs = _under(lib.lm_pf_spread, (1, 0), lambda: m(x))
    assert before == 1 and len(outs) == 2
    assert torch.equal(outs[0], outs[1])
    assert ((outs[0] - want).norm() / want.norm()).item() < 1e-4


# The kinds decode.c's lm_kq_pack16 lays out in 16-row lanes: each with its switch, a width (Q5_0:
# 288, an odd number of blocks), the kind of a part between two laid-out ones, the inputs scaled
# up every `spike`, and its extreme rows (the int32 sums' largest: every q, scale and minimum at
# its top) with inputs +-32767 at one per block (Q5_0) or super-block (Q4_K).
LANES = {
    "Q5_0": dict(switch="lm_q50_lanes", k=288, middle="Q8_0", spike=41, block=32, top=2),
    "Q4_K": dict(switch="lm_kq_lanes", k=768, middle="Q6_K", spike=97, block=256, top=4),
}


@pytest.mark.skipif(not _native(), reason="lamina.native not built here")
@pytest.mark.parametrize("n,extreme", [(48, False), (32, True)])
@pytest.mark.parametrize("kind", list(LANES))
def test_lanes_hold_the_integer_forms(kind, n, extreme):
    # decode.c's lm_kq_pack16 (native/step.py's pack_kq_lanes): the kind's rows laid out again in
    # place, 16 rows in the lanes of a vector (Q5_0's high bits transposed): one row by the lanes
    # form, the same integers per block as the one-row form in GGML's layout (1e-5 of it, floats
    # grouped otherwise), bit-equal at 1-3 threads (a thread's rows may start inside a group);
    # any other call, and the kind's switch at 0, unpacks 16 rows at a time: the other forms'
    # bits exactly; `parts`, the state dict, the bf16 rows and a prompt's bf16 GEMM (bf_row)
    # read GGML's rows back
    from lamina.native.build import library
    from lamina.native.pointers import Pointers
    from lamina.native.step import pack_kq_lanes

    spec = LANES[kind]
    lib = library()
    switch = getattr(lib, spec["switch"])
    if switch(-1) != 1 or lib.lm_kq_planes(-1) != 1 or lib.lm_kq_int(-1) != 1:
        pytest.skip("no AVX-512 VNNI here: the lanes form does not run")
    k, seed = spec["k"], 33 if kind == "Q5_0" else 23
    rows = _rows(kind, n, k, seed)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(seed + 1))
    x[0, :: spec["spike"]] *= 30
    if extreme:
        rows.view(n, k // spec["block"], -1)[..., spec["top"] :] = 0xFF
        x = torch.where(torch.arange(k) % spec["block"] == 0, 1.0, -1.0)[None]
    parts = [
        (kind, rows.clone()),
        (spec["middle"], _rows(spec["middle"], 13, k, seed + 2)),
        (kind, rows[:16].clone()),
    ]
    m = BlockLinear(k, n + 29, parts, torch.randn(n + 29))
    xs = torch.randn(5, k, generator=torch.Generator().manual_seed(seed + 3))
    want = x @ m.dequantized().T + m.bias
    bf16 = m.dequantized(torch.bfloat16)
    xg = torch.randn(20, k, generator=torch.Generator().manual_seed(seed + 4))

    def prompt_rows(threads: int) -> torch.Tensor | None:  # a prompt's bf16 GEMM (bf_row)
        y, ptrs = torch.empty(20, n + 29), Pointers()  # ptrs holds the parts' structs
        L = ptrs.lin(m)
        done = lib.lm_linear_bf16(ctypes.addressof(L), 20, xg.data_ptr(), y.data_ptr(), threads)
        return y if done else None

    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            plain = [m(x), m(xs)]
            gemm_plain = [prompt_rows(t) for t in (1, 2)]
            assert pack_kq_lanes(m) == 2 and m.lanes == [True, False, True]
            for threads in (1, 3):  # a prefill's bf16 weights read from the lanes, group by group
                torch.set_num_threads(threads)
                assert torch.equal(m.dequantized(torch.bfloat16), bf16)
            gemm_lanes = [prompt_rows(t) for t in (1, 2)]  # 2: rows split inside a group
            assert not torch.equal(m.blocks_0, rows)  # laid out again, in place
            assert torch.equal(m.parts[0][1], rows) and torch.equal(
                m.state_dict()["blocks_0"], rows
            )
            assert pack_kq_lanes(m) == 0  # once
            got = []
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                got.append(m(x))
            pair = m(torch.cat([xs[:1], x]))  # 2 rows: the lanes form for each row
            assert switch(0) == 0
            unpacked = [m(x), m(xs)]
    finally:
        switch(1)
        torch.set_num_threads(before)
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
    assert torch.equal(pair[1:], got[0])
    assert ((got[0] - want).norm() / want.norm()).item() < 3e-4
    torch.testing.assert_close(got[0], plain[0], rtol=1e-5, atol=1e-4)
    if not extreme:
        assert not torch.equal(got[0], plain[0])  # the lanes form ran
    assert torch.equal(unpacked[0], plain[0]) and torch.equal(unpacked[1], plain[1])
    assert torch.equal(m(xs), plain[1])
    if lib.lm_gemm_bf16(
        -1
    ):  # where the bf16 GEMM runs (AVX-512 BF16): the same bits from the lanes
        assert gemm_plain[0] is not None and all(
            torch.equal(a, b) for a, b in zip(gemm_plain, gemm_lanes, strict=True)
        )
    fresh = BlockLinear(k, n + 29, parts, torch.randn(n + 29))
    fresh.load_state_dict(m.state_dict())
    assert fresh.lanes == [False] * 3 and torch.equal(fresh.blocks_0, rows)
    odd = BlockLinear(k, 13, [(kind, rows[:13].clone())])
    assert pack_kq_lanes(odd) == 0 and odd.lanes == [False]  # rows not a multiple of 16
