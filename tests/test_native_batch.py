"""The native step's batched decode (NativeStep.step_batch): sequences of different lengths,
each in its own cache row, decoded together equal each decoded alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lamina import GPT, GPTConfig, LaminaError, native, quantize


@pytest.fixture(scope="module", autouse=True)
def built():
    why = native.reason()
    if why is not None and any(s in why for s in ("lacks", "x86-64", "no C compiler", "=0")):
        pytest.skip(f"native step not available here: {why}")
    assert native.available(), why


def _model(
    scheme: str, seed: int = 3, d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2
) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=97, block_size=64, d_model=d_model, n_heads=n_heads, n_layers=2,
        d_ff=2 * d_model, positions="rope", norm="rms", activation="swiglu",
        n_kv_heads=n_kv_heads, bias=False,
    )  # fmt: skip
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4)
    if scheme == "fp32":
        return model
    return quantize(model, scheme, group_size=32)


def _alone(model: GPT, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and logits of one sequence decoded by itself through `step`."""
    with torch.no_grad():
        caches = model.make_caches(1, 40)
        if len(prompt) > 1:
            model(torch.tensor([prompt[:-1]]), caches=caches)
        engine = native.native_step(model, caches)
        tok, out, got = prompt[-1], [], []
        for _ in range(steps):
            row = engine.step([tok], [caches[0].pos], [0])[0]
            got.append(row)
            tok = int(row.argmax())
            out.append(tok)
    return out, got


@pytest.mark.parametrize("scheme", ["fp32", "int4"])
def test_batched_rows_equal_each_row_decoded_alone(scheme):
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]  # three lengths
    _batched_equal_alone(scheme, prompts, [2, 0, 1])  # own cache rows, not in batch order


def _filled_caches(model: GPT, prompts: list[list[int]], rows: list[int], batch) -> list:
    """Caches of `batch` rows (a number, or the caches to fill in place), row rows[i] holding
    prompts[i] but its last token, each row filled by itself (a prefill of one sequence)."""
    caches = model.make_caches(batch, 40) if isinstance(batch, int) else batch
    for prompt, row in zip(prompts, rows, strict=True):
        own = model.make_caches(1, 40)
        if len(prompt) > 1:
            model(torch.tensor([prompt[:-1]]), caches=own)
        for c, o in zip(caches, own, strict=True):
            c.k[row, :, : o.pos], c.v[row, :, : o.pos] = o.k[0, :, : o.pos], o.v[0, :, : o.pos]
    return caches


def _batched_equal_alone(
    scheme: str, prompts: list[list[int]], rows: list[int], tol: float = 1e-4, model=None
) -> None:
    model = _model(scheme) if model is None else model
    steps = 12
    with torch.no_grad():
        # the engine first, as the server makes it: one of 3 rows or more lays the int4 linears
        # out in lanes (int8 inputs where the CPU has VNNI), so the prompts here and in _alone
        # take one form (prefilled before it, these rows would have taken the rows' int16 form)
        caches = model.make_caches(len(prompts), 40)
        engine = native.native_step(model, caches)
        _filled_caches(model, prompts, rows, caches)
        slots = [len(p) - 1 for p in prompts]
        toks = [p[-1] for p in prompts]
        outs, logits = [[] for _ in prompts], [[] for _ in prompts]
        for _ in range(steps):
            got = engine.step_batch(toks, slots, slots, rows=rows)
            for i in range(len(prompts)):
                logits[i].append(got[i])
                toks[i] = int(got[i].argmax())
                outs[i].append(toks[i])
            slots = [s + 1 for s in slots]
    assert all(c.pos == 0 for c in caches)  # step_batch leaves the caches' pos alone
    for i, prompt in enumerate(prompts):
        want_toks, want = _alone(model, prompt, steps)
        assert outs[i] == want_toks, i
        diff = (torch.stack(logits[i]) - torch.stack(want)).abs().max().item()
        scale = torch.stack(want).abs().max().item()
        # the tiled path sums a row's blocks in another order than the one-row path (int4: a
        # scale part and a minimum part that nearly cancel, so the order shows more)
        assert diff <= (1e-5 if scheme == "fp32" else tol) * scale, (i, diff, scale)


def test_bad_batches_are_refused():
    model = _model("fp32")
    with torch.no_grad():
        caches = model.make_caches(2, 8)
    engine = native.native_step(model, caches)
    for args, kw in (
        (([1, 2], [0, 0], [0, 0]), {"rows": [1, 1]}),  # two sequences in one cache row
        (([1, 2], [0, 0], [0, 8]), {}),  # slot past the caches
        (([1, 2], [0, 0], [0, 0]), {"rows": [0, 2]}),  # a row the caches lack
        (([1, 2], [0, 0], [0, 1]), {"starts": [0, 2]}),  # first slot after the slot
        (([1, 2, 3], [0, 0, 0], [0, 0, 0]), {"rows": [0, 1, 0]}),
    ):
        with pytest.raises(LaminaError):
            engine.step_batch(*args, **kw)


def test_both_forms_of_the_batch_kernel_equal_each_row_alone():
    """A batch's int4 linears run in AVX-512 VNNI form where the CPU has it, in AVX2 form
    elsewhere: each form, forced in turn, gives each row what it gets alone."""
    from lamina.native.build import library

    lib = library()
    before = lib.lm_lanes_wide(-1)
    try:
        for wide in (0, 1):
            if lib.lm_lanes_wide(wide) != wide:
                continue  # this CPU lacks AVX-512 VNNI: its own form is the AVX2 one
            prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15], [16, 17], [18], [19, 20, 21]]
            # 6 rows: the lanes in both forms; the AVX2 form sums a row's blocks in one chain
            # (the one-row path in four), which here moves a logit by 1.2e-4 of the largest
            _batched_equal_alone("int4", prompts, [3, 0, 5, 1, 4, 2], tol=2e-4)
    finally:
        lib.lm_lanes_wide(before)


@pytest.mark.parametrize(
    ("scheme", "switch"), [("int4", "lm_lanes_min"), ("int8", "lm_lanes_min8")]
)
def test_the_avx2_lanes_threshold_rows_equal_each_row_alone(scheme, switch):
    """decode.c's lanes_min: from its AVX2 threshold on (lm_lanes_min for int4, lm_lanes_min8
    for int8) a batch's linears take the AVX2 lanes, below it the per-row tiles. At the
    threshold (int8's default, 9, is past the lanes' 8 rows: 5 here), with the lanes and with
    the tiles forced (the threshold one higher), and one row below it: each row as alone."""
    from lamina.native.build import library

    lib = library()
    fn = getattr(lib, switch)
    wide, before = lib.lm_lanes_wide(-1), fn(-1)
    least = min(before, 5)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15], [16, 17], [18], [19, 20, 21]]
    try:
        lib.lm_lanes_wide(0)  # the AVX2 form, where the CPU has both
        for threshold, n in ((least, least), (least + 1, least), (least, least - 1)):
            assert fn(threshold) == threshold
            rows = [n - 1 - i for i in range(n)]  # own cache rows, not in batch order
            _batched_equal_alone(scheme, prompts[:n], rows, tol=2e-4)
        assert fn(1) == least and fn(99) == 9  # below 2 left as it is; past 9 the most
    finally:
        fn(before)
        lib.lm_lanes_wide(wide)


def test_an_int8_head_beside_int4_lanes_gives_each_row_what_it_gets_alone():
    """A GGUF's tied int8 head beside int4 linears in lanes (SmolLM2 Q4_1's shape): with the
    lanes' int8 inputs (lanes8) the step's head takes int8 inputs at every row count (decode.c's
    head8: lane_rows8_512 for a batch, one_row8 for one or two rows), so 10 rows (8 in the
    lanes, 2 past them) and 5 give each row what it gets alone; d_model 96 (an odd number of
    blocks: the last block pair has one). The int16 form (lm_lanes_act8(0)) differs by the int8
    inputs' rounding, within ACT8_TOL."""
    from test_kquant import ACT8_TOL
    from test_native import _int8_linear

    from lamina.native.build import library

    model = _model("fp32", seed=4, d_model=96)
    head = model.head.weight.detach().clone()
    model = quantize(model, "int4", group_size=32)
    model.head = _int8_linear(head, torch.zeros(97), 32)
    lib = library()
    prompts = [[5 + i, 6, 7 + 2 * i][: 1 + i % 3] for i in range(10)]
    rows = [(3 * i) % 10 for i in range(10)]
    _batched_equal_alone("int4", prompts, rows, tol=2e-4, model=model)
    if model.blocks[0].ff.fc.lanes_w is None or lib.lm_lanes_act8(-1) != 1:
        pytest.skip("no AVX-512 VNNI here: the int4 weights stay in their rows, inputs int16")
    _batched_equal_alone("int4", prompts[:5], [0, 2, 4, 1, 3], tol=2e-4, model=model)
    with torch.no_grad():
        caches = model.make_caches(5, 40)
        engine = native.native_step(model, caches)
        _filled_caches(model, prompts[:5], list(range(5)), caches)
        slots = [len(p) - 1 for p in prompts[:5]]
        got = engine.step_batch([p[-1] for p in prompts[:5]], slots, slots)
        try:
            lib.lm_lanes_act8(0)
            want = engine.step_batch([p[-1] for p in prompts[:5]], slots, slots)
        finally:
            lib.lm_lanes_act8(1)
    err = ((got - want).norm() / want.norm()).item()
    assert 1e-4 < err < ACT8_TOL, err


def _ten_filled_rows(model, prompts):
    """Ten cache rows holding `prompts` but for each one's last token, the native engine over
    them, and the steps to check: (b, the first b rows' last tokens, their slots) for b = 1, 2,
    5 and 10."""
    caches = model.make_caches(10, 40)
    engine = native.native_step(model, caches)
    _filled_caches(model, prompts, list(range(10)), caches)
    rows = (1, 2, 5, 10)
    return (
        caches,
        engine,
        [(b, [p[-1] for p in prompts[:b]], [len(p) - 1 for p in prompts[:b]]) for b in rows],
    )


def test_a_step_gives_the_same_bits_whoever_computes_each_unit():
    """decode.c shares a step's phases out in units that a thread done with its own takes from
    the others (lm_step_share), and pins each thread to a CPU for the step (lm_step_pin): the
    logits are the same bits with either off, at 1, 2 and 3 threads (3 on a 2-core machine:
    threads off their cores, their units taken), for 1, 2, 5 and 10 rows (one-row column
    split, the one-row head per row, the lanes and the int8 head in lanes); and the int8 head's
    copy in lanes (lm_pack_i8) gives the same bits as its rows' kernel."""
    from test_native import _int8_linear

    from lamina.native.build import library

    model = _model("fp32", seed=5, d_model=96)
    head = model.head.weight.detach().clone()
    model = quantize(model, "int4", group_size=32)
    model.head = _int8_linear(head, torch.zeros(97), 32)
    lib = library()
    prompts = [[5 + i, 6, 7 + 2 * i, 9][: 1 + i % 4] for i in range(10)]
    share, pin = lib.lm_step_share(-1), lib.lm_step_pin(-1)
    with torch.no_grad():
        _, engine, cases = _ten_filled_rows(model, prompts)
        try:
            for b, toks, slots in cases:
                want = engine.step_batch(toks, slots, slots, threads=1)
                for threads in (1, 2, 3):
                    for s_, p_ in ((0, 0), (1, 0), (0, 1), (1, 1)):
                        lib.lm_step_share(s_), lib.lm_step_pin(p_)
                        for _ in range(3):
                            got = engine.step_batch(toks, slots, slots, threads=threads)
                            assert torch.equal(got, want), (b, threads, s_, p_)
            if engine._head_lanes is None:
                pytest.skip("no AVX-512 VNNI here: the int8 head stays in its rows")
            lanes = engine._model.head.lw  # the head's copy in lanes (lm_pack_i8) against its rows
            slots = [len(p) - 1 for p in prompts]
            toks = [p[-1] for p in prompts]
            got = engine.step_batch(toks, slots, slots)
            engine._model.head.lw = None
            want = engine.step_batch(toks, slots, slots)
            engine._model.head.lw = lanes
            assert torch.equal(got, want)
        finally:
            lib.lm_step_share(share), lib.lm_step_pin(pin)


@pytest.mark.parametrize("scheme", ["int4", "int8", "fp32"])
def test_fused_phases_give_the_same_bits_as_the_phases_apart(scheme):
    """decode.c's step_fuse (lm_step_fuse) runs a batch's attention merge with the
    out-projection's inputs, and the feed-forward's fc, activation and out-projection's inputs,
    as one phase each (fewer barriers): the logits and the caches it writes are the same bits
    as with the phases apart, at 1, 2 and 3 threads, for 1, 2, 5 and 10 rows (int4 in lanes
    with int8 inputs where the CPU has AVX-512 VNNI, int8 and float linears)."""
    from lamina.native.build import library

    model = _model(scheme, seed=7, d_model=96)
    lib = library()
    prompts = [[3 + i, 8, 5 + 3 * i, 2, 11][: 1 + i % 5] for i in range(10)]
    fuse = lib.lm_step_fuse(-1)
    assert fuse == 1
    with torch.no_grad():
        caches, engine, cases = _ten_filled_rows(model, prompts)
        try:
            for b, toks, slots in cases:
                for threads in (1, 2, 3):
                    outs = []
                    for f in (0, 1):
                        lib.lm_step_fuse(f)
                        logits = engine.step_batch(toks, slots, slots, threads=threads)
                        keys = [c.k[:b].clone() for c in caches]
                        outs.append((logits, keys))
                    (want, wkeys), (got, gkeys) = outs
                    assert torch.equal(got, want), (b, threads)
                    assert all(torch.equal(g, w) for g, w in zip(gkeys, wkeys, strict=True)), (
                        b,
                        threads,
                    )
        finally:
            lib.lm_step_fuse(fuse)


def test_two_rows_with_int8_inputs_equal_each_row_alone():
    """Two rows (fewer than the lanes take) run the one-row form per row, int8 inputs too."""
    from lamina.native.build import library

    lib = library()
    before = lib.lm_act8(-1)
    try:
        if lib.lm_act8(1) != 1:
            pytest.skip("no AVX-512 VNNI here: the int8-input form does not run")
        _batched_equal_alone("int4", [[5, 6, 7, 8], [9, 10]], [1, 0], tol=1e-6)
    finally:
        lib.lm_act8(before)


def test_entries_of_one_row_are_a_causal_prefill_beside_a_decoding_row():
    """step_entries: a prompt's tokens as entries of one row at consecutive slots, in one call
    with another row's decode entry, give the logits a PyTorch forward gives each position."""
    model = _model("fp32")
    prompt, other = [5, 6, 7, 8, 9], [12, 13, 14]
    with torch.no_grad():
        caches = model.make_caches(2, 16)
        own = model.make_caches(1, 16)
        model(torch.tensor([other[:-1]]), caches=own)
        for c, o in zip(caches, own, strict=True):
            c.k[1, :, : o.pos], c.v[1, :, : o.pos] = o.k[0, :, : o.pos], o.v[0, :, : o.pos]
        engine = native.native_step(model, caches)
        n = len(prompt)
        got = engine.step_entries([*prompt, other[-1]], [*range(n), 2], [0] * n + [1])
        want = model(torch.tensor([prompt]))[0]
        want_other = model(torch.tensor([other]))[0, -1]
    scale = want.abs().max().item()
    assert (got[:n] - want).abs().max().item() <= 1e-5 * scale
    assert (got[n] - want_other).abs().max().item() <= 1e-5 * scale
    for args in (
        ([1, 2], [0, 0], [0, 0]),  # two entries at one slot of one row
        ([1, 2], [0, 16], [0, 0]),  # a slot past the caches
        ([1, 2], [0, 1], [0, 2]),  # a row the caches lack
        ([1, 2], [0], [0, 0]),  # a token without a slot
    ):
        with pytest.raises(LaminaError):
            engine.step_entries(*args)


def _act8_rounded(x: torch.Tensor) -> torch.Tensor:
    """x with each block of 32 rounded as decode.c's act8 quantizer rounds it (amax / 127 a
    step, to nearest even), back in floats."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    amax = b.abs().amax(-1, keepdim=True)
    q = torch.round(b * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax)))
    return (q * (amax / 127)).reshape(x.shape)


@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_weights_in_lanes_equal_the_dequantized_product(group_size):
    """An int4 linear laid out in lanes in place (pack_lanes: lm_pack16, AVX-512 VNNI): its rows'
    layout goes, every native call reads the lanes. Rows that are not a whole number of 16-row
    groups, 3 threads whose row ranges cut a group, 1..16 input rows (the lanes take up to 8 at a
    time, one row too), a bias; each input form in turn (lm_lanes_act8): int16 inputs within
    their rounding of the dequantized product and close to the rows' layout kernel; int8 inputs
    (the default) equal to the dequantized product of the inputs rounded to int8 per 32, so within
    ACT8_TOL of the float product; each row equal to itself computed alone (bit for bit)."""
    from test_kquant import ACT8_TOL

    from lamina.native.build import library
    from lamina.native.step import linear, pack_lanes
    from lamina.quant.linear import Int4Linear

    torch.manual_seed(5)
    m = Int4Linear.from_linear(nn.Linear(192, 360, bias=True), group_size).prepare("native")
    w = m.dequantized()
    xs = {rows: torch.randn(rows, 192) for rows in (1, 2, 3, 8, 11, 16)}
    lib = library()
    before, form = torch.get_num_threads(), lib.lm_lanes_act8(-1)
    try:
        torch.set_num_threads(3)  # rows split at multiples of 8: 120 per thread
        plain = {rows: linear(m, x) for rows, x in xs.items()}
        if not pack_lanes(m):
            pytest.skip("no AVX-512 VNNI here: the int4 weights stay in their rows")
        assert m.qweight is None and m.native_scale is None and m.native_min is None
        assert not pack_lanes(m)  # once
        assert form == 1  # int8 inputs: the default where the lanes run (VNNI)
        for act8 in (0, 1):
            assert lib.lm_lanes_act8(act8) == act8
            for rows, x in xs.items():
                got = linear(m, x)
                want = x @ w.T + m.bias
                scale = want.abs().max()
                if act8:
                    rounded = _act8_rounded(x) @ w.T + m.bias
                    assert (got - rounded).abs().max() <= 1e-5 * scale, rows
                    assert 1e-4 < (got - want).norm() / want.norm() < ACT8_TOL, rows
                else:
                    assert (got - want).abs().max() <= 1e-4 * scale, rows
                    assert (got - plain[rows]).abs().max() <= 1e-5 * scale, rows
                alone = torch.cat([linear(m, x[r : r + 1]) for r in range(rows)])
                assert torch.equal(got, alone), (act8, rows)
    finally:
        torch.set_num_threads(before)
        lib.lm_lanes_act8(form)


@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_lanes_read_back_exactly(group_size):
    """unpack_lanes gives back the rows' layout bit for bit; the dequantized weights, the saved
    form and `restore_saved_scales` are those of the module before it was laid out in lanes."""
    from lamina.native.step import pack_lanes
    from lamina.quant.linear import Int4Linear

    torch.manual_seed(6)
    m = Int4Linear.from_linear(nn.Linear(128, 40, bias=False), group_size).prepare("native")
    q, s, low, w = m.qweight.clone(), m.native_scale.clone(), m.native_min.clone(), m.dequantized()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    if not pack_lanes(m):
        pytest.skip("no AVX-512 VNNI here: the int4 weights stay in their rows")
    assert torch.equal(m.dequantized(), w)
    assert torch.equal(m.dequantized(rows=slice(3, 9)), w[3:9])
    saved = m.state_dict()
    assert saved.keys() == state.keys()
    assert all(torch.equal(saved[k], v) for k, v in state.items())
    m.restore_saved_scales()
    assert m.lanes_w is None
    assert torch.equal(m.qweight, q) and torch.equal(m.native_scale, s)
    assert torch.equal(m.native_min, low)


def test_a_batch_engine_keeps_one_copy_of_the_int4_weights():
    """A NativeStep of 3 rows or more lays the int4 linears out in lanes in place: the rows'
    layout goes, a one-row engine built afterwards reads the lanes, and the PyTorch forward
    (native linear for a few rows, dequantized for many) still gives the same logits (a few rows
    within the int8 inputs' rounding, ACT8_TOL, or those of int16 ones)."""
    from test_kquant import ACT8_TOL

    from lamina.native.build import library

    model = _model("int4")
    fc = model.blocks[0].ff.fc
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8] * 12])  # 48 tokens: the dequantized path past 32 rows
        want_long, want_short = model(ids)[0], model(ids[:, :3])[0]
        engine = native.native_step(model, model.make_caches(4, 40))
        if fc.lanes_w is None:
            pytest.skip("no AVX-512 VNNI here: the int4 weights stay in their rows")
        assert fc.qweight is None and engine is not None
        got_long, got_short = model(ids)[0], model(ids[:, :3])[0]
        lib = library()
        form = lib.lm_lanes_act8(-1)
        lib.lm_lanes_act8(0)  # the lanes' int16 inputs: the rows' form, summed otherwise
        try:
            got_short16 = model(ids[:, :3])[0]
        finally:
            lib.lm_lanes_act8(form)
    assert (got_long - want_long).abs().max() <= 1e-4 * want_long.abs().max()
    assert (got_short16 - want_short).abs().max() <= 1e-4 * want_short.abs().max()
    # the default where the lanes run: int8 inputs (3 rows: the native linear), their rounding
    err = ((got_short - want_short).norm() / want_short.norm()).item()
    assert 0 < err < ACT8_TOL, err
    _batched_equal_alone_model(model)


def _batched_equal_alone_model(model: GPT) -> None:
    prompts = [[5, 6, 7], [12], [13, 14]]
    with torch.no_grad():
        engine = native.native_step(model, _filled_caches(model, prompts, [0, 1, 2], 3))
        slots = [len(p) - 1 for p in prompts]
        got = engine.step_batch([p[-1] for p in prompts], slots, slots)
    for i, prompt in enumerate(prompts):
        _, want = _alone(model, prompt, 1)
        assert torch.equal(got[i], want[0]), i  # the lanes compute each row as alone


@pytest.mark.parametrize(("group", "k"), [(32, 288), (64, 320), (0, 288)])
def test_int8_batch_lanes_hold_the_dequantized_product(group, k):
    """A batch's int8 linear (the head's kind) in lanes, each form in turn where the CPU has it:
    k = 288 (9 blocks: the AVX-512 form's last block pair has one block), 37 rows (not a multiple
    of the 4 weight rows a pass takes), 3..11 input rows (the lanes take 8 at a time), 2 threads;
    group 32 a scale per block, 64 per two, 0 per row. Each row within the int16 inputs' rounding
    of the dequantized product and equal to itself computed alone to float summation order."""
    from test_native import _int8_linear

    from lamina.native.build import library
    from lamina.native.step import linear

    lib = library()
    g = torch.Generator().manual_seed(13)
    n = 37
    m = _int8_linear(torch.randn(n, k, generator=g), torch.randn(n, generator=g), group)
    w = m.dequantized()
    xs = {rows: torch.randn(rows, k, generator=g) for rows in (3, 5, 8, 11)}
    before, wide = torch.get_num_threads(), lib.lm_lanes_wide(-1)
    try:
        torch.set_num_threads(2)
        for form in (0, 1):
            if lib.lm_lanes_wide(form) != form:
                continue  # this CPU lacks AVX-512 VNNI: its own form is the AVX2 one
            for rows, x in xs.items():
                got = linear(m, x)
                want = x @ w.T + m.bias
                assert ((got - want).norm() / want.norm()).item() < 1e-4, (form, rows)
                alone = torch.cat([linear(m, x[r : r + 1]) for r in range(rows)])
                assert torch.allclose(got, alone, rtol=1e-5, atol=1e-5), (form, rows)
    finally:
        torch.set_num_threads(before)
        lib.lm_lanes_wide(wide)


def _entries_then_steps(engine, prompts: list[list[int]], rows: list[int], feed=None, steps=6):
    """Each prompt into its cache row through `step_entries` (a causal prefill of entries),
    then `steps` decode steps of all rows together (`step_batch`): the logits of every step
    (prompts' last, then each step's), (steps + 1, B, V). `feed` (steps, B) gives the tokens
    (teacher-forced), else greedy."""
    got, toks, slots = [], [], []
    for prompt, row in zip(prompts, rows, strict=True):
        n = len(prompt)
        got.append(engine.step_entries(prompt, list(range(n)), [row] * n)[-1])
        toks.append(int(got[-1].argmax()))
        slots.append(n)
    out = [torch.stack(got)]
    for s in range(steps):
        toks = list(feed[s]) if feed is not None else toks
        out.append(engine.step_batch(toks, slots, slots, rows=rows))
        toks = out[-1].argmax(-1).tolist()
        slots = [x + 1 for x in slots]
    return torch.stack(out)


@pytest.mark.parametrize("scheme", ["fp32", "int4"])
@pytest.mark.parametrize("d_model", [64, 256])  # heads of 16 (the AVX2 form), of 64 (AVX-512's)
def test_float16_caches_round_like_torch_and_each_row_decodes_as_alone(scheme, d_model):
    """Caches of float16 (the server's 16-bit KV rows): the step stores each key and value as
    torch's float32 -> float16 rounding of the float32 engine's (layer 0's keys do not depend
    on the caches); each row's logits and greedy tokens in a batch are those it gets alone over
    float16 caches; and the logits stay near the float32 caches' (teacher-forced)."""
    model = _model(scheme, d_model=d_model)
    prompts, rows = [[5, 6, 7, 8, 9, 10, 11], [12, 3], [13, 14, 15]], [2, 0, 3]
    with torch.no_grad():
        c16 = model.make_caches(4, 40, dtype=torch.float16)
        e16 = native.native_step(model, c16)
        c32 = model.make_caches(4, 40)
        e32 = native.native_step(model, c32)
        ref = _entries_then_steps(e32, prompts, rows)
        feed = ref[:-1].argmax(-1).tolist()
        got = _entries_then_steps(e16, prompts, rows, feed)
        for r, p in zip(rows, prompts, strict=True):
            n = len(p) + 6  # the prompt's and the steps' slots
            for c, f in ((c16[0].k, c32[0].k), (c16[0].v, c32[0].v)):
                assert torch.equal(c[r, :, :n], f[r, :, :n].half())
        rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
        # float16 keys and values (11 bits): median ~5e-4 of the logits through float linears
        # (up to 1.1e-2 on this model's spiky weights); the lanes' int8 inputs (int4, where the
        # CPU has VNNI) round the difference up: median ~2e-2, up to 6e-2 (measured here)
        assert rel.max() < (3e-2 if scheme == "fp32" else 1e-1), (rel.max(), rel.median())
        assert rel.max() > 0  # the caches did round
        together = _entries_then_steps(e16, prompts, rows)
        for i, (prompt, row) in enumerate(zip(prompts, rows, strict=True)):
            alone = _entries_then_steps(e16, [prompt], [row])[:, 0]
            assert torch.equal(together[:, i].argmax(-1), alone.argmax(-1)), i
            diff = (together[:, i] - alone).abs().max().item()
            assert diff <= (1e-5 if scheme == "fp32" else 1e-4) * alone.abs().max().item(), i


def test_caches_of_other_dtypes_are_refused():
    model = _model("fp32")
    with torch.no_grad():
        caches = model.make_caches(2, 8, dtype=torch.bfloat16)
    assert native.native_step(model, caches) is None  # PyTorch runs the step
    with pytest.raises(LaminaError, match="float32 or float16"):
        native.step.NativeStep(model, caches, native.build.library())


@pytest.mark.parametrize("kv", [torch.float32, torch.float16])
def test_grouped_scores_and_slot_prefetch_give_the_same_bits(kv):
    """decode.c's AVX-512 attention scores a key/value head's group of query heads at once
    (lm_att_group: each key row widened once for the group), and a step asks for the slots its
    new keys go to before qkv (lm_slot_pf): the logits and the caches written are the same bits
    with either off, at 1 and 2 threads, for 1 and 5 rows of 3 to 29 keys (fewer than 8, a
    multiple of 8, and 8s with a tail), heads of 64 in a group of 3, float32 and float16 caches.
    (Where the CPU lacks AVX-512 both switches' forms are the AVX2 one.)"""
    from lamina.native.build import library

    model = _model("int4", seed=11, d_model=192, n_heads=3, n_kv_heads=1)
    lib = library()
    prompts = [[(7 * i + 3 * j) % 97 for j in range(n)] for i, n in enumerate((29, 8, 3, 16, 11))]
    group, slot = lib.lm_att_group(-1), lib.lm_slot_pf(-1)
    assert group == 1 and slot == 1
    with torch.no_grad():
        caches = _filled_caches(model, prompts, list(range(5)), model.make_caches(5, 40, dtype=kv))
        engine = native.native_step(model, caches)
        try:
            for b in (1, 5):
                toks, slots = [p[-1] for p in prompts[:b]], [len(p) - 1 for p in prompts[:b]]
                for threads in (1, 2):
                    outs = []
                    for g, s in ((0, 0), (1, 1), (1, 0), (0, 1)):
                        lib.lm_att_group(g), lib.lm_slot_pf(s)
                        logits = engine.step_batch(toks, slots, slots, threads=threads)
                        outs.append((logits, [c.k[:b].clone() for c in caches]))
                    want, wkeys = outs[0]
                    for got, gkeys in outs[1:]:
                        assert torch.isfinite(got).all()
                        assert torch.equal(got, want), (b, threads)
                        assert all(torch.equal(x, y) for x, y in zip(gkeys, wkeys, strict=True))
        finally:
            lib.lm_att_group(group), lib.lm_slot_pf(slot)
