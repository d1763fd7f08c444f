"""GGUF in and out: the real SmolLM2 file against transformers, dequantization against gguf-py,
write/read round trips, and refusals of truncated, corrupt and unsupported files.

The real-model test loads SmolLM2-135M-Instruct (Q4_1) once in lamina and once in transformers
(module-scoped; transformers takes 10-35 s). Run with `-s` to see the measured difference.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from lamina import GPT, GPTConfig, LaminaError
from lamina.interop import tensor_map
from lamina.interop.gguf import gguf_config, gguf_table, load_gguf, read_gguf, save_gguf

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

# the first 256 ids (transformers' AutoTokenizer on the same GGUF) of this text: Austen's
# opening, then digits, a tab, double spaces, an accent, CJK and an emoji (tokenizing it here
# would cost transformers' 20 s vocabulary conversion, and the tokenizer has its own tests)
TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. ..."
)
IDS = [
    int(x)
    for x in """
1589 314 253 4569 21902 14494 28 338 253 2244 555 281 13932 282 253 1123 18598 28 1251 325 281
1277 282 253 6221 30 1423 1838 1343 260 4401 355 5542 282 715 253 555 654 325 335 650 808 9245
253 27315 28 451 4569 314 588 876 6450 281 260 7335 282 260 3990 3168 28 338 384 314 2500 260
40253 3501 282 634 582 355 550 282 480 16924 30 198 18 5965 14119 4994 30 22575 305 1627 1137
650 16305 288 1272 582 1194 28 476 13671 346 3984 338 11779 4385 4173 314 1303 418 1596 4817
198 14086 30 22575 305 12028 338 384 761 441 30 476 2596 357 314 1627 5598 1041 43 476 1710
10721 30 6880 553 915 719 1535 28 284 1041 3783 549 511 563 357 1270 4994 30 22575 305 1135
787 2988 30 476 6248 346 441 1277 288 699 617 553 2473 357 4817 31592 650 6221 46215 318 30
476 2683 1277 288 2505 549 28 284 339 457 787 27073 288 5364 357 1270 669 436 23362 2001 30
476 4898 28 957 14119 28 346 1251 699 28 10721 30 6880 1921 338 11779 4385 314 2473 411 253
1805 555 282 1507 18598 429 260 4081 282 3996 43 338 384 2422 1187 335 12397 281 253 10162
769 284 1876 288 963 260 1379 28 284 436 588 1083 30160 351 357 28 338 384 6454 351 4994 30
18803 4654 43""".split()
]


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    """(lamina model, metadata) from the real GGUF, loaded once."""
    return load_gguf(smollm2_gguf)


@pytest.fixture(scope="module")
def hf_smollm2(request, smollm2_gguf):
    """transformers' model from the same GGUF: through the session's `smollm2_hf` folder where
    conftest has it (transformers' own reading of the file, saved once), else read here."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        folder = request.getfixturevalue("smollm2_hf")
    except pytest.FixtureLookupError:
        folder = None
    if folder is not None:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
        )
    return model.eval()


def test_real_gguf_logits_match_transformers(smollm2, hf_smollm2):
    """The same logits as transformers' own GGUF loader (fp32), 256 tokens."""
    assert len(IDS) == 256
    model, _ = smollm2
    ids = torch.tensor([IDS])
    with torch.no_grad():
        want, got = hf_smollm2(ids).logits, model(ids)
    diff = (want - got).abs().max().item()
    print(f"\nSmolLM2 GGUF: max |logit diff| vs transformers = {diff:.3g}")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_real_gguf_config_and_metadata(smollm2, smollm2_gguf):
    model, meta = smollm2
    c = model.config
    assert (c.n_layers, c.d_model, c.n_heads, c.kv_heads, c.ff_width) == (30, 576, 9, 3, 1536)
    assert (c.vocab_size, c.block_size, c.rope_theta, c.tie_weights) == (49152, 8192, 1e5, True)
    assert model.head.weight is model.embed.wte.weight  # tied: one tensor
    assert not any(p.is_meta for p in model.parameters())
    # metadata the tokenizer helper needs, as plain Python, equal to gguf-py's own reading
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "smollm"
    assert len(meta["tokenizer.ggml.tokens"]) == 49152 and meta["tokenizer.ggml.bos_token_id"] == 1
    assert "<|im_start|>" in meta["tokenizer.chat_template"]
    contents = read_gguf(smollm2_gguf)
    kinds = {t.qtype for t in contents.tensors.values()}
    assert kinds == {"Q4_1", "Q8_0", "F32"}
    q = contents.tensors["blk.0.attn_q.weight"]  # raw blocks: 576 rows of 18 x 20 bytes
    assert q.shape == (576, 576) and q.raw.shape == (576, 360) and q.raw.dtype == np.uint8
    # the table's row transforms apply to raw blocks as to values (a quantized loader's path)
    config, table = gguf_table(contents)
    assert config == model.config
    row = next(r for r in table if r.lamina == "blocks.0.attn.qkv.weight")
    part = row.parts[0]
    assert part.foreign == "blk.0.attn_q.weight" and part.rows == 576
    blocks = part.transform.to_lamina(torch.from_numpy(q.raw.copy())).numpy()
    from_blocks = gguf.quants.dequantize(blocks, Q.Q4_1)
    assert np.array_equal(from_blocks, part.transform.to_lamina(q.dequantize()).numpy())
    assert torch.equal(torch.from_numpy(from_blocks), model.blocks[0].attn.qkv.weight[:576])


def _write(path, tensors: dict[str, tuple[np.ndarray, object]], arch="llama", **kv) -> None:
    w = gguf.GGUFWriter(path, arch)
    for k, v in kv.items():
        w.add_uint32(k, v)
    for name, (data, raw) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


QUANTIZABLE = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
# gguf-py dequantizes these but cannot quantize them: random bytes are valid blocks, once the
# fp16 scales (byte offsets in a block) are made finite; tests/fixtures holds llama.cpp's own
K_QUANTS = {
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def test_dequantize_each_type_matches_gguf_py(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.standard_normal((4, 512)).astype(np.float32)
    tensors = {}
    for name in QUANTIZABLE:
        qt = Q[name]
        if name == "F32":
            tensors[name] = (values, None)
        elif name == "F16":
            tensors[name] = (values.astype(np.float16), None)
        else:
            tensors[name] = (gguf.quants.quantize(values, qt), qt)
    for name, scales in K_QUANTS.items():
        block, size = gguf.GGML_QUANT_SIZES[Q[name]]
        raw = rng.integers(0, 256, (4, 512 // block * size), dtype=np.uint8)
        blocks = raw.reshape(4, -1, size)
        for at, value in zip(scales, (0.01, 0.02), strict=False):
            blocks[..., at : at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
        tensors[name] = (raw, Q[name])
    path = tmp_path / "types.gguf"
    _write(path, tensors)
    contents = read_gguf(path)
    for name, (data, qt) in tensors.items():
        t = contents.tensors[name]
        assert t.qtype == name and t.shape == (4, 512)
        got = t.dequantize()
        want = data.astype(np.float32) if qt is None else gguf.quants.dequantize(data, qt)
        assert got.dtype == torch.float32 and np.array_equal(got.numpy(), want), name
        assert np.isfinite(want).all() and np.abs(want).max() > 0, name
        if name in ("F32", "F16", "BF16", "Q8_0"):  # close to the values themselves
            assert np.abs(want - values).max() < 0.05, name


def test_q8_k_is_its_scale_times_its_bytes(tmp_path):
    # gguf-py has no Q8_K: a block is an fp32 d, 256 int8 q and 16 int16 sums (ggml's block_q8_K)
    rng = np.random.default_rng(1)
    d = np.array([0.5, -0.03125, 3.0e-3, 7.0], np.float32)
    q = rng.integers(-128, 128, (4, 256), dtype=np.int8)
    sums = q.reshape(4, 16, 16).sum(-1).astype(np.int16)
    raw = np.concatenate([d.view(np.uint8).reshape(4, 4), q.view(np.uint8), sums.view(np.uint8)], 1)
    path = tmp_path / "q8k.gguf"
    _write(path, {"w": (raw.reshape(2, 2 * 292), Q.Q8_K)})
    got = read_gguf(path).tensors["w"].dequantize()
    assert got.shape == (2, 512)
    assert torch.equal(got, torch.from_numpy(d[:, None] * q.astype(np.float32)).reshape(2, 512))


def test_metadata_matches_gguf_py_reader(tmp_path):
    path = tmp_path / "kv.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_array("x.strings", ["a", "", "é東🙂", "b c"])
    w.add_array("x.ints", [1, -2, 3])
    w.add_array("x.floats", [0.5, -1.25])
    w.add_array("x.bools", [True, False])
    w.add_bool("x.bool", True)
    w.add_float32("x.f32", 0.1)
    w.add_uint64("x.u64", 2**40)
    w.add_string("x.text", "<|im_start|>{{ x }}\n")
    w.add_tensor("t", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = read_gguf(path)
    reader = gguf.GGUFReader(path)
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == field.contents(), key
    assert set(ours.metadata) == {k for k in reader.fields if not k.startswith("GGUF.")}
    assert ours.metadata["x.strings"][2] == "é東🙂" and ours.metadata["x.bools"] == [True, False]
    assert ours.tensors["t"].shape == (2, 3)
    assert torch.equal(ours.tensors["t"].dequantize(), torch.arange(6.0).reshape(2, 3))


def test_unsupported_type_is_refused_by_name(tmp_path):
    path = tmp_path / "iq2.gguf"
    block, size = gguf.GGML_QUANT_SIZES[Q.IQ2_XXS]
    _write(path, {"w": (np.zeros((2, 256 // block * size), np.uint8), Q.IQ2_XXS)})
    t = read_gguf(path).tensors["w"]
    with pytest.raises(LaminaError, match="w has type IQ2_XXS, which lamina cannot read"):
        t.dequantize()


def _tiny(layout: str, tie: bool, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig.preset(layout, tie_weights=tie, d_model=64, n_heads=4, n_layers=2)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape))
    return model


@pytest.mark.parametrize("layout", ["tiny", "llama-tiny"])
@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_f32_is_exact(tmp_path, layout, tie):
    model = _tiny(layout, tie)
    path = save_gguf(model, tmp_path / "m.gguf")
    back, meta = load_gguf(path)
    assert meta["general.architecture"] == ("llama" if layout == "llama-tiny" else "gpt2")
    c = model.config  # d_ff is written out; the eps goes through float32
    assert back.config == c.replace(d_ff=c.ff_width, layer_norm_eps=float(np.float32(1e-5)))
    ids = torch.randint(0, model.config.vocab_size, (2, model.config.block_size))
    with torch.no_grad():
        assert torch.equal(back(ids), model(ids))


def test_qwen2_layout_round_trip(tmp_path):
    """q/k/v biases without the others: written as qwen2 (no row permutation), read back."""
    model = _tiny("llama-tiny", True)
    model = GPT(model.config.replace(qkv_bias=True)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    contents = read_gguf(save_gguf(model, tmp_path / "m.gguf"))
    assert contents.metadata["general.architecture"] == "qwen2"
    q = model.blocks[0].attn.qkv.weight[: model.config.d_model]
    assert torch.equal(contents.tensors["blk.0.attn_q.weight"].dequantize(), q.detach())
    assert (
        "blk.0.attn_q.bias" in contents.tensors and "blk.0.attn_output.bias" not in contents.tensors
    )
    back, _ = load_gguf(tmp_path / "m.gguf")
    assert back.config.qkv_bias and not back.config.bias
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(back(ids), model(ids))


@pytest.mark.parametrize("qtype,tol", [("f16", 2e-3), ("q8_0", 3e-2)])
def test_round_trip_f16_q8_0_are_close(tmp_path, qtype, tol):
    model = _tiny("llama-tiny", False)
    path = save_gguf(model, tmp_path / "m.gguf", qtype=qtype)
    kinds = {t.qtype for t in read_gguf(path).tensors.values()}
    assert kinds == {"F32", qtype.upper()}
    back, _ = load_gguf(path)
    ids = torch.randint(0, model.config.vocab_size, (1, 32))
    with torch.no_grad():
        want, got = model(ids), back(ids)
    assert (want - got).abs().max().item() < tol * want.abs().max().item()


def test_llama_q_k_rows_are_permuted_as_llama_cpp(tmp_path):
    """On disk, q's rows follow llama.cpp's converter permutation (reshape (H, 2, hd/2, d),
    swap axes 1 and 2) of lamina's rows."""
    model = _tiny("llama-tiny", True)
    c = model.config
    contents = read_gguf(save_gguf(model, tmp_path / "m.gguf"))
    q_ours = model.blocks[0].attn.qkv.weight[: c.d_model].detach()
    hd = c.head_dim
    want = q_ours.reshape(c.n_heads, 2, hd // 2, c.d_model).swapaxes(1, 2).reshape(q_ours.shape)
    got = contents.tensors["blk.0.attn_q.weight"].dequantize()
    assert torch.equal(got, want) and not torch.equal(got, q_ours)


def test_bad_save_requests_are_refused(tmp_path):
    model = _tiny("tiny", True)
    with pytest.raises(LaminaError, match="GGUF type must be one of f32, f16, q8_0"):
        save_gguf(model, tmp_path / "m.gguf", qtype="q4_0")
    post_ln = GPT(GPTConfig.preset("tiny", norm_first=False))
    with pytest.raises(LaminaError, match="cannot save as GGUF GPT-2: norm_first=False"):
        save_gguf(post_ln, tmp_path / "m.gguf")
    from lamina.quant import quantize

    with pytest.raises(LaminaError, match=r"needs a float model; this one is quantized \(int8\)"):
        save_gguf(quantize(_tiny("llama-tiny", False), "int8"), tmp_path / "m.gguf")
    assert not list(tmp_path.iterdir())  # nothing left behind


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    save_gguf(_tiny("llama-tiny", True), path)
    return path


def test_truncated_files_are_refused(small_file, tmp_path):
    data = small_file.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in [0, 3, 4, 10, 23, 24, 60, 200, 1000, len(data) // 2, len(data) - 1]:
        cut.write_bytes(data[:n])
        with pytest.raises(LaminaError, match="truncated or corrupt|empty|not a GGUF"):
            load_gguf(cut)


def test_corrupt_headers_are_refused(small_file, tmp_path):
    data = bytearray(small_file.read_bytes())
    bad = tmp_path / "bad.gguf"
    cases = {
        0: (b"GGUX", "not a GGUF file"),
        4: (b"\x07\x00\x00\x00", "GGUF version 7"),
        8: (b"\xff" * 8, "truncated or corrupt"),  # tensor count
        16: (b"\xff" * 8, "truncated or corrupt"),  # metadata count
        24: (b"\xff" * 8, "truncated or corrupt"),  # first key's length
    }
    for at, (patch, message) in cases.items():
        b = bytearray(data)
        b[at : at + len(patch)] = patch
        bad.write_bytes(bytes(b))
        with pytest.raises(LaminaError, match=message):
            load_gguf(bad)
    # flip every byte of the header in turn: always a model or a LaminaError, never a crash
    header = read_gguf(small_file).data_offset
    rng = np.random.default_rng(0)
    for at in rng.choice(header, size=60, replace=False):
        b = bytearray(data)
        b[at] ^= 0xFF
        bad.write_bytes(bytes(b))
        try:
            load_gguf(bad)
        except LaminaError as e:
            assert "\n" not in str(e)


def test_architecture_and_keys_lamina_cannot_use_are_refused(small_file):
    meta = dict(read_gguf(small_file).metadata)
    assert gguf_config(meta).n_layers == 2
    with pytest.raises(LaminaError, match="architecture 'falcon' is not one lamina runs"):
        gguf_config({**meta, "general.architecture": "falcon"})
    with pytest.raises(LaminaError, match="llama.rope.scaling.type = 'yarn'"):
        gguf_config({**meta, "llama.rope.scaling.type": "yarn"})
    with pytest.raises(LaminaError, match="llama.expert_count = 8"):
        gguf_config({**meta, "llama.expert_count": 8})
    wide = {**meta, "llama.attention.key_length": 32, "llama.attention.value_length": 32,
            "llama.rope.dimension_count": 32}  # fmt: skip
    assert gguf_config(wide).head_dim == 32  # a head width of its own (Qwen3, Gemma)
    with pytest.raises(LaminaError, match="llama.rope.dimension_count = 8: lamina's rotary"):
        gguf_config({**meta, "llama.rope.dimension_count": 8})
    with pytest.raises(LaminaError, match="lacks llama.block_count"):
        gguf_config({k: v for k, v in meta.items() if k != "llama.block_count"})


def test_missing_unexpected_and_misshapen_tensors_are_named(small_file, tmp_path):
    contents = read_gguf(small_file)
    tensors = {n: (t.raw, None) for n, t in contents.tensors.items()}
    kv = {
        k: v for k, v in contents.metadata.items() if isinstance(v, int) and k.startswith("llama")
    }
    kv.pop("llama.vocab_size")
    cases = {
        "missing blk.1.ffn_up.weight": {k: v for k, v in tensors.items() if k != "blk.1.ffn_up.weight"},
        "unexpected blk.0.extra.weight": {**tensors, "blk.0.extra.weight": (np.ones(8, np.float32), None)},
        r"blk.0.attn_k.weight has shape \(16, 64\), metadata implies \(32, 64\)": {
            **tensors, "blk.0.attn_k.weight": (np.zeros((16, 64), np.float32), None)},
    }  # fmt: skip
    for message, ts in cases.items():
        path = tmp_path / "t.gguf"
        w = gguf.GGUFWriter(path, "llama")
        w.add_float32("llama.rope.freq_base", 10000.0)
        for k, v in kv.items():
            w.add_uint32(k, v)
        for name, (data, raw) in ts.items():
            w.add_tensor(name, data, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(LaminaError, match=message):
            load_gguf(path)


def test_tensor_map_permutation_round_trips():
    for heads, rows, cols in [(4, 64, 8), (3, 48, 5), (2, 8, 1)]:
        t = torch.randn(rows, cols).squeeze(-1) if cols == 1 else torch.randn(rows, cols)
        perm = tensor_map.rope_permutation(heads)
        assert torch.equal(perm.to_lamina(perm.to_foreign(t)), t)
        assert not torch.equal(perm.to_foreign(t), t)


def test_a_copy_of_the_real_file_refuses_truncation(smollm2_gguf, tmp_path):
    """The real file cut inside its token list, its tensor infos and its last tensor."""
    cut = tmp_path / "cut.gguf"
    with smollm2_gguf.open("rb") as f:
        head = f.read(2_000_000)
    for n in [100_000, 1_000_000, 1_785_000, 2_000_000]:
        cut.write_bytes(head[:n])
        with pytest.raises(LaminaError, match="truncated or corrupt"):
            load_gguf(cut)
    shutil.copy(smollm2_gguf, cut)
    with cut.open("r+b") as f:
        f.truncate(smollm2_gguf.stat().st_size - 1)
    with pytest.raises(LaminaError, match="output_norm.weight needs bytes up to"):
        read_gguf(cut)


def test_transformers_reads_lamina_llama_gguf(tmp_path):
    """An independent reader of the written file: transformers' GGUF loader (which undoes
    llama.cpp's q/k permutation itself) gives lamina's logits."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = _tiny("llama-tiny", False)
    save_gguf(model, tmp_path / "m.gguf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="m.gguf", dtype=torch.float32
    ).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=0)
