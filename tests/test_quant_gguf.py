"""GGUF's quantized blocks kept as lamina's int8/int4: exact values, row transforms, a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lamina import GPT, GPTConfig, LaminaError, quant
from lamina.quant import Int4Linear, Int8Embedding, Int8Linear
from lamina.quant.from_blocks import from_blocks
from lamina.quant.ggml import blocks_to_int4, blocks_to_int8, dequantize_rows, row_bytes

gguf = pytest.importorskip("gguf")


def _blocks(w: np.ndarray, qtype: str) -> np.ndarray:
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])


def _ggml(raw: np.ndarray, qtype: str) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_blocks_dequantize_to_ggmls_very_values(qtype):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((24, 96)) * rng.uniform(0.001, 2, (24, 1))).astype(np.float32)
    w[3] += 5  # a row far from zero: Q4_1's minimum matters
    raw = _blocks(w, qtype)
    if qtype == "Q8_0":
        q, scale = blocks_to_int8(raw, qtype, (24, 96))
        m = Int8Linear(96, 24, False, group_size=32)
        m.qweight, m.scale = q, scale
    else:
        nibbles, sz = blocks_to_int4(raw, qtype, (24, 96))
        m = Int4Linear(96, 24, False, 32)
        m.qweight, m.scales_and_zeros = nibbles, sz
    assert torch.equal(m.dequantized(), _ggml(raw, qtype))  # bit for bit
    assert torch.equal(
        dequantize_rows(row_bytes(raw, qtype, (24, 96)), qtype, 96), _ggml(raw, qtype)
    )


def test_row_transforms_on_bytes_are_exact():
    w = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    raw = _blocks(w, "Q4_1")
    perm = torch.randperm(16)
    rows = row_bytes(raw, "Q4_1", (16, 64))[perm]
    assert torch.equal(dequantize_rows(rows, "Q4_1", 64), _ggml(raw, "Q4_1")[perm])


def test_wrong_sizes_and_types_are_refused():
    raw = _blocks(np.ones((4, 64), np.float32), "Q8_0")
    with pytest.raises(LaminaError, match="needs 136 bytes"):
        blocks_to_int8(raw, "Q8_0", (2, 64))
    with pytest.raises(LaminaError, match="only Q4_0 and Q4_1"):
        blocks_to_int4(raw, "Q5_K", (4, 64))
    with pytest.raises(LaminaError, match="whole blocks of 32"):
        blocks_to_int8(raw, "Q8_0", (8, 34))


def _grouped_int8(n: int, k: int) -> Int8Linear:
    raw = _blocks(np.random.default_rng(2).standard_normal((n, k)).astype(np.float32), "Q8_0")
    m = Int8Linear(k, n, False, group_size=32)
    m.qweight, m.scale = blocks_to_int8(raw, "Q8_0", (n, k))
    return m.prepare()


def test_grouped_int8_kernel_agrees_with_its_exact_form():
    m = _grouped_int8(40, 96)
    x = torch.randn(3, 96)
    ref = x @ m.dequantized().T
    assert torch.allclose(m(x), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def _state_as_blocks(model: GPT, table: str, linear: str) -> tuple[dict, dict]:
    """The model's 2-D weights as GGUF rows (table and linears), the rest as floats."""
    state, qtypes = {}, {}
    for name, t in model.state_dict().items():
        qtype = table if name == "embed.wte.weight" else linear
        if t.dim() == 2 and name != "head.weight":
            state[name] = row_bytes(_blocks(t.numpy(), qtype), qtype, tuple(t.shape))
            qtypes[name] = qtype
        elif name != "head.weight":
            state[name] = t.clone()
    return state, qtypes


@pytest.mark.parametrize("table", ["Q8_0", "Q4_1"])
def test_a_model_from_blocks_matches_its_dequantized_twin(table):
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=96,
        block_size=16,
        d_model=64,
        n_heads=4,
        n_layers=2,
        norm="rms",
        positions="rope",
        activation="swiglu",
        n_kv_heads=2,
        bias=False,
        tie_weights=True,
    )
    model = GPT(cfg).eval()
    state, qtypes = _state_as_blocks(model, table, "Q4_1")
    twin = GPT(cfg).eval()  # the same values in fp32, as the dequantizing loader gives
    widths = {k: t.shape[-1] for k, t in model.state_dict().items()}
    twin.load_state_dict(
        {
            k: dequantize_rows(v, qtypes[k], widths[k]) if k in qtypes else v
            for k, v in state.items()
        }
        | {"head.weight": dequantize_rows(state["embed.wte.weight"], table, 64)}
    )
    with torch.device("meta"):
        empty = GPT(cfg)
    q = from_blocks(empty, state, qtypes)
    assert quant.scheme_of(q) == {"scheme": "gguf", "types": sorted({table, "Q4_1"})}
    assert isinstance(q.blocks[0].attn.qkv, Int4Linear)
    if table == "Q8_0":  # the tied head is the int8 table itself
        assert isinstance(q.embed.wte, Int8Embedding) and isinstance(q.head, Int8Linear)
        assert q.head.qweight.data_ptr() == q.embed.wte.qweight.data_ptr()
    else:
        assert isinstance(q.head, Int4Linear)
    with pytest.raises(LaminaError, match="cannot be saved as a lamina folder yet"):
        quant.quantized_tensors(q)
    ids = torch.randint(0, 96, (2, 8))
    assert torch.equal(q.embed.wte(ids), twin.embed.wte(ids))  # lookups are exact
    ref, out = twin(ids), q(ids)
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel < 0.02, f"kernel vs dequantized twin: relative logit error {rel:.4f}"


class _Counted(dict):
    """A state that counts how often from_blocks asks for each tensor."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.asked: dict[str, int] = {}

    def __getitem__(self, name):
        self.asked[name] = self.asked.get(name, 0) + 1
        return super().__getitem__(name)


def test_from_blocks_asks_for_each_tensor_where_it_converts_it():
    cfg = GPTConfig(vocab_size=96, block_size=16, d_model=64, n_heads=4, n_layers=2, d_ff=128)
    cfg = cfg.replace(positions="rope", norm="rms", activation="swiglu", bias=False)
    state, qtypes = _state_as_blocks(GPT(cfg).eval(), "Q8_0", "Q4_1")
    counted = _Counted(state)
    with torch.device("meta"):
        empty = GPT(cfg)
    from_blocks(empty, counted, qtypes)
    # a lazy loader's reads: each tensor once, the tied Q8_0 table too (the head shares it)
    assert set(counted.asked) == set(state) - {"head.weight"}
    assert set(counted.asked.values()) == {1}
    assert empty.head.qweight is empty.embed.wte.qweight


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_DONTNEED"), reason="needs madvise")
def test_drop_pages_hands_a_read_files_pages_back(smollm2_gguf):
    from lamina.native.gguf_read import read_gguf

    contents = read_gguf(smollm2_gguf)
    before = _rss_mb()
    total = sum(int(t.raw.sum(dtype=np.uint64) % 7) for t in contents.tensors.values())
    read = _rss_mb()
    contents.drop_pages()
    assert read - before > 60  # the 93 MB file's pages, read
    assert read - _rss_mb() > 60  # ... handed back
    again = sum(int(t.raw.sum(dtype=np.uint64) % 7) for t in contents.tensors.values())
    assert again == total  # and read back the same from the file


def _tiny_tied_config() -> GPTConfig:
    cfg = GPTConfig(vocab_size=96, block_size=16, d_model=64, n_heads=4, n_layers=2, d_ff=128)
    return cfg.replace(positions="rope", norm="rms", activation="swiglu", bias=False)


def test_a_model_the_native_step_covers_keeps_no_packed_copies():
    from lamina import cpu

    cfg = _tiny_tied_config()
    state, qtypes = _state_as_blocks(GPT(cfg).eval(), "Q8_0", "Q4_1")

    def layers(kernel: str) -> list[torch.nn.Module]:
        with torch.device("meta"):
            empty = GPT(cfg)
        with cpu.using(kernel):
            q = from_blocks(empty, state, qtypes)
        return [m for m in q.modules() if isinstance(m, (Int4Linear, Int8Linear))]

    covered = cpu.native_missing() is None  # the native step covers this model where it runs
    for m in layers("auto"):
        if covered:  # native alone: the decode step reads qweight as it is
            assert m.kernels == ("native",) and m.kernel_weight is None
        else:
            assert m.kernels is None
    for m in layers("packed"):  # a PyTorch kernel chosen: the layers prepare for it as before
        assert m.kernels is None
        if cpu.KERNELS["packed"].missing() is None:
            assert m.kernel_weight is not None


def test_int4_layers_on_the_native_kernel_keep_one_copy_of_their_scales():
    """A GGUF's Q4_1 layers prepared for the native kernel hold its scales and minimums alone
    (no saved scales_and_zeros beside them); the values, every path's output and a rebuilt
    saved form (prepare for another kernel) are unchanged, bit for bit."""
    from lamina import cpu

    w = np.random.default_rng(2).standard_normal((24, 96)).astype(np.float32)
    w[3] += 5
    raw = _blocks(w, "Q4_1")
    nibbles, sz = blocks_to_int4(raw, "Q4_1", (24, 96))

    def layer() -> Int4Linear:
        m = Int4Linear(96, 24, False, 32)
        m.qweight, m.scales_and_zeros = nibbles, sz.clone()
        return m.prepare("native")

    kept, dropped = layer(), layer().drop_saved_scales()
    assert dropped.scales_and_zeros is None and "scales_and_zeros" not in dropped.state_dict()
    assert torch.equal(dropped.dequantized(), _ggml(raw, "Q4_1"))  # GGML's values, bit for bit
    assert torch.equal(dropped.dequantized(rows=[5, 1]), kept.dequantized(rows=[5, 1]))
    x = torch.randn(cpu.MAX_ROWS + 4, 96)
    with torch.no_grad():
        assert torch.equal(dropped(x), kept(x))  # a prefill's long call
        if cpu.native_missing() is None:
            assert torch.equal(dropped(x[:3]), kept(x[:3]))  # the native kernel
    dropped.prepare(None)  # another kernel: the saved form rebuilt exactly
    assert torch.equal(dropped.scales_and_zeros, sz)

    cfg = _tiny_tied_config()  # from_blocks drops them where the native kernel runs the layer
    state, qtypes = _state_as_blocks(GPT(cfg).eval(), "Q8_0", "Q4_1")
    with torch.device("meta"):
        empty = GPT(cfg)
    for m in from_blocks(empty, state, qtypes).modules():
        if isinstance(m, Int4Linear):
            assert (m.scales_and_zeros is None) == (m.native_scale is not None)
