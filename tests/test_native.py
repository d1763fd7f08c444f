"""The native decode step (lamina.native) against PyTorch: every option it covers, float and
quantized linears, batches with their own windows, threads, fork, refusals, the real model."""

from __future__ import annotations

import copy
import multiprocessing
import os

import pytest
import torch
from test_kquant import ACT8_TOL, act8  # noqa: F401  (act8: a fixture)
from torch import nn

import lamina
from lamina import GPT, GPTConfig, LaminaError, cpu, native
from lamina.generation.decoder import Decoder
from lamina.lora import apply_lora
from lamina.quant import Int4Linear, Int8Embedding, Int8Linear, quantize, quantize_int8


@pytest.fixture(scope="module", autouse=True)
def built():
    why = native.reason()
    if why is not None and any(s in why for s in ("lacks", "x86-64", "no C compiler", "=0")):
        pytest.skip(f"native step not available here: {why}")
    assert native.available(), why


OPTIONS = [
    {},
    {"bias": False, "norm_gain": False},
    {"positions": "sinusoidal", "activation": "relu"},
    {
        "positions": "rope",
        "norm": "rms",
        "activation": "swiglu",
        "n_kv_heads": 2,
        "bias": False,
        "qkv_bias": True,
        "tie_weights": False,
    },
    {
        "positions": "rope",
        "norm": "rms",
        "activation": "swiglu",
        "n_kv_heads": 1,
        "qk_norm": True,
        "logit_softcap": 5.0,
        "d_head": 24,
        "rope_theta": 500.0,
    },
    {"activation": "relu2", "norm": "rms", "qkv_bias": False},
]


def _model(seed: int = 0, **options) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=97, block_size=48, d_model=64, n_heads=4, n_layers=2, d_ff=128, **options
    )
    model = GPT(cfg).eval()
    with torch.no_grad():  # larger weights than the init's, so errors show
        for p in model.parameters():
            p.mul_(4)
    return model


def _float_copy(model: GPT) -> GPT:
    """The same model with every quantized linear and table dequantized into float ones."""
    f = copy.deepcopy(model)
    for parent in list(f.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (Int4Linear, Int8Linear)):
                lin = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                lin.weight.data = child.dequantized()
                if child.bias is not None:
                    lin.bias.data = child.bias.data.clone()
                setattr(parent, name, lin)
            elif isinstance(child, Int8Embedding):
                table = nn.Embedding(child.num_embeddings, child.embedding_dim)
                table.weight.data = child(torch.arange(child.num_embeddings))
                setattr(parent, name, table)
    return f


def _grouped_int8(model: GPT) -> GPT:
    """int8 with a scale per 32 inputs (GGUF's Q8_0 form) in every block linear."""
    for block in model.blocks:
        for parent, name in ((block.attn, "qkv"), (block.attn, "proj"), (block.ff, "fc")):
            lin = getattr(parent, name)
            n, k = lin.weight.shape
            m = Int8Linear(k, n, lin.bias is not None, group_size=32)
            q, s = quantize_int8(lin.weight.detach().reshape(n * k // 32, 32))
            m.qweight, m.scale = q.reshape(n, k), s.reshape(n, k // 32)
            if lin.bias is not None:
                m.bias = nn.Parameter(lin.bias.detach().clone(), requires_grad=False)
            setattr(parent, name, m.prepare())
    return model


SCHEMES = ["fp32", "int8", "int4-32", "int4-64", "int8-grouped"]


def _scheme(model: GPT, scheme: str) -> GPT:
    if scheme == "int8":
        return quantize(model, "int8")
    if scheme.startswith("int4"):
        return quantize(model, "int4", group_size=int(scheme.split("-")[1]))
    if scheme == "int8-grouped":
        return _grouped_int8(model)
    return model


def _steps(
    model: GPT,
    ids: torch.Tensor,
    n_prefill: int,
    threads: int | None = None,
    prefill: GPT | None = None,
) -> torch.Tensor:
    """Native logits of the tokens after the first n_prefill, one step at a time; the cache is
    filled by `prefill` (default: the model itself, through PyTorch)."""
    B, T = ids.shape
    with torch.no_grad():
        caches = model.make_caches(B, T)
        (prefill or model)(ids[:, :n_prefill], caches=caches)
        engine = native.native_step(model, caches)
        assert engine is not None, native.unsupported(model)
        out = []
        for t in range(n_prefill, T):
            out.append(engine.step(ids[:, t].tolist(), [t] * B, [0] * B, threads))
    return torch.stack(out, 1)


CASES = [  # 4 heads of 24 (options 4) make 96 inputs: no int4 groups of 64 there
    (i, scheme) for i in range(len(OPTIONS)) for scheme in SCHEMES if (i, scheme) != (4, "int4-64")
]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{s}" for i, s in CASES])
def test_step_equals_the_float_model(case):
    options, scheme = OPTIONS[case[0]], case[1]
    model = _scheme(_model(**options), scheme)
    ref_model = _float_copy(model)
    ids = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1))
    got = _steps(model, ids, 12, prefill=ref_model)  # the same cache for both
    with torch.no_grad():
        want = ref_model(ids)[:, 12:]
    err = ((got - want).norm() / want.norm()).item()
    # float: summation order only; quantized: inputs rounded to 16 bits per block of 32
    assert err < (1e-5 if scheme == "fp32" else 1e-3), err  # PyTorch's bf16-input kernels: ~1e-2
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("scheme", ["int4-32", "int4-64"])
def test_a_batch_engines_lanes_within_their_rounding_of_the_float_model(scheme):
    """An engine of 3 rows or more lays the int4 linears out in lanes (AVX-512 VNNI), whose
    inputs are int8 per 32 by default (decode.c's lanes8): its logits within ACT8_TOL of the
    float model; with lm_lanes_act8(0), int16 inputs, within the 1e-3 of the test above."""
    lib = native.build.library()
    model = _scheme(_model(**OPTIONS[0]), scheme)
    ref_model = _float_copy(model)
    ids = torch.randint(0, 97, (3, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ref_model(ids)[:, 12:]
    got = _steps(model, ids, 12, prefill=ref_model)
    if model.blocks[0].ff.fc.lanes_w is None:
        pytest.skip("no AVX-512 VNNI here: the int4 weights stay in their rows")
    form = lib.lm_lanes_act8(-1)
    lib.lm_lanes_act8(0)
    try:
        got16 = _steps(model, ids, 12, prefill=ref_model)
    finally:
        lib.lm_lanes_act8(form)
    err, err16 = (((g - want).norm() / want.norm()).item() for g in (got, got16))
    print(f"LANES8 {scheme} int8 {err:.3e} int16 {err16:.3e}")
    assert form == 1 and 1e-3 < err < ACT8_TOL, err  # int8 inputs: the default there
    assert err16 < 1e-3, err16


@pytest.mark.usefixtures("act8")
@pytest.mark.parametrize("scheme", ["int8", "int4-32", "int4-64", "int8-grouped"])
def test_int8_inputs_within_their_rounding_of_the_int16_form(scheme):
    # lamina's own int8 / int4 layouts (the K-quant kinds: tests/test_kquant.py)
    model = _scheme(_model(**OPTIONS[0]), scheme)
    ids = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(2))
    got = _steps(model, ids, 12)  # one row: the int8-input form
    native.build.library().lm_act8(0)
    exact = _steps(model, ids, 12)
    err = ((got - exact).norm() / exact.norm()).item()
    assert 0 < err < ACT8_TOL, err


def _int8_linear(weight: torch.Tensor, bias: torch.Tensor, group: int) -> Int8Linear:
    """`weight` (n, k) quantized to int8, a scale per `group` (0: per row), with `bias`."""
    n, k = weight.shape
    m = Int8Linear(k, n, True, group_size=group or None)
    q, s = quantize_int8(weight.reshape(n * k // (group or k), group or k))
    m.qweight, m.scale = q.reshape(n, k), s.reshape(n, k // group) if group else s
    m.bias = nn.Parameter(bias.clone(), requires_grad=False)
    return m


def _int4_linear(weight: torch.Tensor, bias: torch.Tensor, group: int) -> Int4Linear:
    """`weight` (n, k) quantized to int4 in groups of `group`, with `bias`, laid out for native."""
    n, k = weight.shape
    dense = nn.Linear(k, n)
    with torch.no_grad():
        dense.weight.copy_(weight)
        dense.bias.copy_(bias)
    return Int4Linear.from_linear(dense, group).prepare("native")


@pytest.mark.parametrize("group", [32, 0])
def test_int8_one_row_forms_hold_the_dequantized_product(group):
    # decode.c's lm_i8_wide: the AVX-512 one-row int8 form (1) and the AVX2 row loop (0); k = 288
    # (9 blocks) and 13 rows (not a multiple of the 4 rows a pass takes); group 0: a scale per row
    from lamina.native.step import linear

    lib = native.build.library()
    n, k = 13, 288
    g = torch.Generator().manual_seed(11)
    m = _int8_linear(torch.randn(n, k, generator=g), torch.randn(n, generator=g), group)
    x = torch.randn(1, k, generator=g)
    want = x @ m.dequantized().T + m.bias
    before = lib.lm_i8_wide(-1)
    try:
        outs = [(lib.lm_i8_wide(form), linear(m, x)) for form in (0, 1)]
    finally:
        lib.lm_i8_wide(before)
    assert outs[0][0] == 0
    for _, y in outs:
        assert ((y - want).norm() / want.norm()).item() < 1e-4
    assert torch.allclose(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kind,k,group",
    [
        ("int4", 288, 32),
        ("int4", 1536, 32),
        ("int4", 1536, 64),
        ("int4", 1024, 256),
        ("int8", 288, 32),
        ("int8", 1536, 64),
        ("int8", 576, 0),
    ],
)
def test_avx512_one_row_block_forms_hold_the_old_ones(kind, k, group):
    # decode.c's lm_q4_pair (int4: two blocks a step, 1) against one_row_q4_512 (0), and lm_i8_wide
    # (int8: one_row_i8_512, the blocks' scale products made 16 at a time, 1) against the AVX2 row
    # loop (0: the same integer sums, float sums in another order). k 288: 9 blocks (an odd one left alone); 1536: 48
    # blocks (three windows of 16); groups of 1, 2 and 8 blocks, int8's scale per row (0); 13 rows
    # (not a multiple of the 4 a pass takes); a few large inputs, as real activations have.
    from lamina.native.step import linear

    lib = native.build.library()
    switch = lib.lm_q4_pair if kind == "int4" else lib.lm_i8_wide
    before = switch(-1)
    if not lib.lm_lanes_wide(-1) or switch(1) != 1:
        switch(before)
        pytest.skip("no AVX-512 VNNI here: the one-row AVX-512 forms do not run")
    n = 13
    g = torch.Generator().manual_seed(16)
    weight, bias = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    if kind == "int4":
        m = _int4_linear(weight, bias, group)
    else:
        m = _int8_linear(weight, bias, group)
    x = torch.randn(1, k, generator=g)
    x[0, ::97] *= 30
    want = x @ m.dequantized().T + m.bias
    try:
        outs = []
        for form in (1, 0):
            assert switch(form) == form
            outs.append(linear(m, x))
    finally:
        switch(before)
    assert before == 1  # the default where it runs
    for y in outs:
        assert ((y - want).norm() / want.norm()).item() < 1e-4
    assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-4)
    assert not torch.equal(outs[0], outs[1])  # the AVX-512 form ran (its sums in another order)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_prefetch_spread_through_a_pass_changes_no_float(kind):
    # decode.c's lm_pf_spread (see test_kquant's): the int4 and int8 one-row forms, 40 rows
    from lamina.native.step import linear

    lib = native.build.library()
    n, k = 40, 576
    g = torch.Generator().manual_seed(20)
    weight, bias = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    if kind == "int4":
        m = _int4_linear(weight, bias, 32)
    else:
        m = _int8_linear(weight, bias, 32)
    x = torch.randn(1, k, generator=g)
    before = lib.lm_pf_spread(-1)
    try:
        outs = [linear(m, x) for form in (1, 0) if lib.lm_pf_spread(form) == form]
    finally:
        lib.lm_pf_spread(before)
    assert before == 1 and len(outs) == 2
    assert torch.equal(outs[0], outs[1])
    want = x @ m.dequantized().T + m.bias
    assert ((outs[0] - want).norm() / want.norm()).item() < 1e-4


@pytest.mark.parametrize(
    "kind,k,group", [("int4", 256, 32), ("int4", 1536, 64), ("int8", 256, 32), ("int8", 1536, 0)]
)
def test_avx2_one_row_passes_hold_the_row_loops(kind, k, group):
    # decode.c's lm_nr2 (the AVX2 one-row form, 4 weight rows a pass): 0 the row loops, 1 int4 at
    # k <= 1024, 2 every int4 / int8 row; 21 rows (13 and 8 a thread at 2 threads: passes and a
    # remainder), 1 and 2 threads. Where the AVX-512 forms run, lm_nr2 is 0 whatever it is set to.
    import ctypes

    from lamina.native.pointers import Pointers

    lib = native.build.library()
    n = 21
    g = torch.Generator().manual_seed(12)
    dense = nn.Linear(k, n)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(n, k, generator=g))
        dense.bias.copy_(torch.randn(n, generator=g))
    if kind == "int4":
        m = Int4Linear.from_linear(dense, group).prepare("native")
    else:
        m = _int8_linear(dense.weight.detach(), dense.bias.detach(), group)
    x = torch.randn(1, k, generator=g)
    want = x @ m.dequantized().T + m.bias
    ptrs = Pointers()
    L = ptrs.lin(m)
    before, outs = lib.lm_nr2(-1), {}
    try:
        for nt in (1, 2):
            for choice in (0, 1, 2):
                y = torch.empty(1, n)
                form = lib.lm_nr2(choice)
                assert lib.lm_linear(ctypes.addressof(L), 1, x.data_ptr(), y.data_ptr(), nt)
                outs[nt, choice] = (form, y)
    finally:
        lib.lm_nr2(before)
    assert before == (0 if lib.lm_lanes_wide(-1) else 1)  # the default: 1 where AVX-512 is not
    loops = outs[1, 0][1]
    for (nt, choice), (form, y) in outs.items():
        assert form in (0, choice)
        assert ((y - want).norm() / want.norm()).item() < 1e-4
        assert torch.allclose(y, loops, rtol=1e-5, atol=1e-4), (nt, choice)


def test_float_generation_equals_pytorchs_token_for_token():
    model = _model(**OPTIONS[3])
    prompts = [[5, 6, 7, 8, 9], [10, 11]]  # left-padded: the rows' windows start apart
    fast = lamina.generate(model, prompts, 20)
    with cpu.using("torch"):
        slow = lamina.generate(model, prompts, 20)
    assert torch.equal(fast, slow)


def test_windows_jump_past_block_size_as_the_uncached_path():
    model = _model(**OPTIONS[3])  # block_size 48: the windows jump twice in 90 tokens
    fast = lamina.generate(model, [[1, 2, 3], [4]], 90)
    slow = lamina.generate(model, [[1, 2, 3], [4]], 90, use_cache=False)
    assert torch.equal(fast, slow)


def test_decoder_uses_it_and_a_pytorch_kernel_does_not():
    model = _model(**OPTIONS[3])
    ids = torch.tensor([[1, 2, 3]])
    assert Decoder(model, ids, [0], 8)._native is not None
    for name in ("torch", "packed", "dequantize"):
        with cpu.using(name):
            assert Decoder(model, ids, [0], 8)._native is None, name
    assert Decoder(model, ids, [0], 8, fixed_shape=True)._native is None


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_do_not_change_a_bit(threads):
    model = quantize(_model(**OPTIONS[3]), "int4", group_size=32)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _steps(model, ids, 10)
        torch.set_num_threads(threads)
        many = _steps(model, ids, 10)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


@pytest.mark.parametrize("i, scheme", [c for c in CASES if c[1] != "int8-grouped"])
def test_one_row_shares_its_norms_and_inputs_among_threads(i, scheme):
    # decode.c's lm_col_split: a step of one row gives each thread its columns of the norms,
    # the activation and their quantized blocks (1) where thread 0 made the row (0): not a bit
    # changes, at 2 and 3 threads
    lib = native.build.library()
    model = _scheme(_model(**OPTIONS[i]), scheme)
    ids = torch.randint(0, 97, (1, 14), generator=torch.Generator().manual_seed(4))
    one = _steps(model, ids, 6, threads=1)
    before, outs = _under_col_split(lib, lambda: [_steps(model, ids, 6, threads=t) for t in (2, 3)])
    assert before == 1  # the default
    for got in (g for pair in outs for g in pair):
        assert torch.equal(got, one)


def _under_col_split(lib, run):
    before = lib.lm_col_split(-1)
    try:
        return before, [run() for form in (1, 0) if lib.lm_col_split(form) == form]
    finally:
        lib.lm_col_split(before)


@pytest.mark.parametrize("spin", [0, None])
def test_more_threads_than_cores_sleep_at_the_barriers_and_change_no_bit(spin):
    # decode.c's barrier spins a bounded, adaptive time, then sleeps (a futex on Linux): with
    # more threads than cores a partner is often off its core. spin 0: every wait that does
    # not end at once sleeps (the sleeping path, counted by lm_bar_sleeps); None: the default
    # (adaptive) spin. Either way the logits equal one thread's bit for bit.
    lib = native.build.library()
    model = quantize(_model(**OPTIONS[3]), "int4", group_size=32)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(4))
    many = (os.cpu_count() or 1) + 2
    most = lib.lm_bar_spin(-1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _steps(model, ids, 6)
        if spin is not None:
            lib.lm_bar_spin(spin)
        slept = lib.lm_bar_sleeps()
        got = _steps(model, ids, 6, threads=many)
        slept = lib.lm_bar_sleeps() - slept
    finally:
        torch.set_num_threads(before)
        lib.lm_bar_spin(most)
    assert most > 0  # the default spins first
    assert torch.equal(one, got)
    if spin == 0:
        assert slept > 0  # the waits slept (with more threads than cores, some always wait)


_FORKED: dict = {}  # what the forked child inherits: a model and caches filled by the parent


def _child(queue) -> None:  # a forked process: OpenMP's threads are gone, the step must not wait
    model, caches, tok = _FORKED["model"], _FORKED["caches"], _FORKED["tok"]
    engine = native.native_step(model, caches)  # only the native step runs here: torch's own
    # parallel ops may hang in a forked child (its OpenMP pool is gone)
    queue.put(engine.step([tok], [caches[0].pos], [0], threads=2).tolist())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_steps_too():
    model = _model(**OPTIONS[3])
    with torch.no_grad():
        caches = model.make_caches(1, 16)
        model(torch.tensor([[1, 2, 3, 4, 5]]), caches=caches)
    engine = native.native_step(model, caches)
    want = engine.step([6], [5], [0], threads=2)  # the parent's threads exist at the fork
    for c in caches:  # the child steps from the same place
        c.pos -= 1
    _FORKED.update(model=model, caches=caches, tok=6)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_child, args=(queue,))
    p.start()
    got = queue.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert torch.equal(torch.tensor(got), want)


def test_bad_steps_are_refused():
    model = _model()
    with torch.no_grad():
        caches = model.make_caches(1, 8)
        model(torch.tensor([[1, 2]]), caches=caches)
    engine = native.native_step(model, caches)
    for args in (
        ([97], [2], [0]),  # token outside the vocabulary
        ([-1], [2], [0]),
        ([1], [48], [0]),  # position past block_size
        ([1], [2], [3]),  # first slot after the slot (the caches' pos, 2)
        ([1, 2], [2, 2], [0, 0]),  # more rows than the cache holds
    ):
        with pytest.raises(LaminaError):
            engine.step(*args)
    assert caches[0].pos == 2  # a refused step writes nothing
    for c in caches:  # the caches full: the slot would lie past them
        c.pos = 8
    with pytest.raises(LaminaError):
        engine.step([1], [2], [0])


def test_what_it_does_not_cover_falls_back_to_pytorch():
    lora = apply_lora(_model(**OPTIONS[3]), r=2)
    assert "LoRALinear" in native.unsupported(lora)
    post = _model(norm_first=False)
    assert native.unsupported(post) == "post-LN blocks"
    half = _model().to(torch.bfloat16)
    assert native.unsupported(half) is not None
    for m in (lora.eval(), post):
        assert native.native_step(m, m.make_caches(1, 8)) is None
        assert lamina.generate(m, [[1, 2]], 4).shape == (1, 6)
    model = _model()
    assert native.native_step(model, model.make_caches(1, 8, dtype=torch.bfloat16)) is None


def test_training_mode_or_gradients_take_the_pytorch_step():
    model = _model()
    assert not native.usable(model.train())
    model.eval()
    with torch.no_grad():
        assert native.usable(model)
    assert not native.usable(model)  # gradients recorded


# ---------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    from lamina.interop.gguf import load_gguf

    q4, _ = load_gguf(smollm2_gguf, quantized=True)
    f32, meta = load_gguf(smollm2_gguf)
    return q4.eval(), f32.eval(), meta


@pytest.mark.parametrize("nr2", [1, 0, 2])
def test_real_q4_1_steps_equal_the_dequantized_model(smollm2, nr2):
    # nr2: decode.c's lm_nr2 where the AVX-512 forms do not run (1, the default; 0 the row
    # loops; 2 the int8 head and the int4 rows at k 1536 in passes of 4 rows too)
    q4, f32, _ = smollm2
    ids = torch.randint(0, 49152, (1, 40), generator=torch.Generator().manual_seed(4))
    lib = native.build.library()
    before = lib.lm_nr2(-1)
    try:
        lib.lm_nr2(nr2)
        got = _steps(q4, ids, 24, prefill=f32)
    finally:
        lib.lm_nr2(before)
    with torch.no_grad():
        want = f32(ids)[:, 24:]
    err = ((got - want).norm() / want.norm()).item()
    assert err < 2e-4, err  # PyTorch's own int4 kernel (bf16 inputs): ~7e-3
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_real_chat_reply_equals_the_float_models(smollm2):
    from lamina.tokenizers.pretrained import PretrainedTokenizer

    q4, f32, meta = smollm2
    tok = PretrainedTokenizer.from_gguf_metadata(meta)
    ids = tok.render_chat([{"role": "user", "content": "Name three colours."}])
    # the prompt through the dequantized weights (where bf16 is native, the per-call kernel is
    # torch's bf16 one), so what is compared is the native decode steps
    with cpu.using("native"):  # lamina's kernels only
        fast = lamina.generate(q4, torch.tensor(ids), 24)
    slow = lamina.generate(f32, torch.tensor(ids), 24)
    assert torch.equal(fast, slow)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_attention_forms_for_heads_of_64(kv_heads):
    # decode.c's lm_att_wide: heads of 64 take the AVX-512 attention (1; a GQA group's heads
    # together) or the AVX2 one (0): both the float model's step, differing by summation order;
    # lm_att_pf (the AVX-512 form's prefetches of keys and values ahead) changes no float
    lib = native.build.library()
    before = lib.lm_att_wide(-1)
    model = _model(positions="rope", norm="rms", n_kv_heads=kv_heads, d_head=64, bias=False)
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids)[:, 12:]
    pf = lib.lm_att_pf(-1)
    try:
        outs = [_steps(model, ids, 12) for form in (1, 0) if lib.lm_att_wide(form) == form]
        lib.lm_att_wide(1)
        lib.lm_att_pf(0)  # the AVX-512 form without its prefetches: the same floats
        unfetched = _steps(model, ids, 12)
    finally:
        lib.lm_att_wide(before)
        lib.lm_att_pf(pf)
    assert pf > 0  # the default prefetches
    assert torch.equal(unfetched, outs[0])
    for got in outs:
        assert ((got - want).norm() / want.norm()).item() < 1e-5
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    if len(outs) == 2:
        assert not torch.equal(outs[0], outs[1])  # the AVX-512 form ran
