"""PretrainedTokenizer: ids equal transformers' on the real SmolLM2 GGUF tokenizer and on small
sentencepiece-BPE, Unigram and byte-level tokenizers built here; specials, add-bos, chat ids and
the SFT mask; the JSON round trip and the Hugging Face folder round trip.

The GGUF metadata is read by a small reader of the file's key/value section below (the test's
own: lamina.data never reads files of models)."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from lamina.data import load_tokenizer, save_tokenizer, tokenizer_from_dict
from lamina.errors import LaminaError
from lamina.tokenizers.pretrained import PretrainedTokenizer

transformers = pytest.importorskip("transformers")
tt = pytest.importorskip("tiny_tokenizers")

TEXTS = [
    "Hello world 12345 and 3.14159, 2024-01-01",
    " 1 12 123 1234 x1y22z333",
    "  spaces   runs\t\ttabs\t \r\nCRLF\r\n\n\n  ",
    "café naïve Ångström déjà-vu",
    "中文字符 日本語のテキスト 한국어",
    "emoji 😀👍🏽 🇫🇷 👩‍👩‍👧",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>x<repo_name>",
    "It's, they're; we'll: I'd've \u00a0nbsp",
    "",
]
CHAT = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4. 😀"},
    {"role": "user", "content": "And 3+3?\tTabs  \r\n"},
    {"role": "assistant", "content": "6, said the café."},
]
SYSTEM = [{"role": "system", "content": "Be brief."}]

# -- a tiny reader of a GGUF file's metadata (the test's own) -------------------------------------
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS.update({11: "<q", 12: "<d"})


def _gguf_metadata(path: Path) -> dict:
    data = path.read_bytes()[: 64 << 20]  # the metadata lies in the first few MB
    pos = 0

    def take(fmt: str):
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n : pos].decode("utf-8")

    def value(kind: int):
        if kind == 8:
            return string()
        if kind == 9:
            inner, n = take("<I"), take("<Q")
            return [value(inner) for _ in range(n)]
        return take(_SCALARS[kind])

    assert data[:4] == b"GGUF", path
    pos = 8  # magic, version
    _, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("<I"))
    return meta


@pytest.fixture(scope="module")
def smol_meta(smollm2_gguf) -> dict:
    return _gguf_metadata(smollm2_gguf)


@pytest.fixture(scope="module")
def smol(smol_meta) -> PretrainedTokenizer:
    return PretrainedTokenizer.from_gguf_metadata(smol_meta)


@pytest.fixture(scope="module")
def smol_hf(smollm2_hf):
    """transformers' tokenizer of the same GGUF file: the one transformers made from it and
    saved with the session's reference folder (tests/conftest.py), loaded in about a second
    instead of reading the GGUF's metadata with gguf-py's slow reader again (~9 s)."""
    return transformers.AutoTokenizer.from_pretrained(str(smollm2_hf))


def _hf_chat(hf, messages, add_generation_prompt: bool) -> list[int]:
    out = hf.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


# -- the real model's GGUF tokenizer --------------------------------------------------------------
def test_gguf_ids_and_text_equal_transformers_on_hard_texts(smol, smol_hf):
    for text in TEXTS:
        ids = smol.encode(text)
        assert ids == smol_hf.encode(text, add_special_tokens=False), text
        assert smol.encode_prompt(text) == smol_hf.encode(text), text
        assert smol.decode(ids) == smol_hf.decode(ids) == text
        assert smol.decode(ids, skip_special=True) == smol_hf.decode(ids, skip_special_tokens=True)


def test_gguf_specials_end_of_turn_and_add_bos(smol, smol_meta):
    assert (smol.bos_id, smol.eos_id, smol.pad_id, smol.unk_id) == (1, 2, 2, 0)
    assert smol.eot_ids[0] == 2 and smol.encode("<|im_end|>") == [2]
    assert set(smol.eot_ids) == {2, 0}  # <|im_end|> and <|endoftext|>
    assert smol.add_bos is False and smol.encode_prompt("hi") == smol.encode("hi")
    assert smol.vocab_size == 49152 and smol.special_tokens["<|im_start|>"] == 1
    assert smol.special_tokens["bos"] == 1 and "<jupyter_code>" in smol.special_tokens
    assert smol.chat_template == smol_meta["tokenizer.chat_template"]


def test_digits_are_split_alone_first_as_the_smollm_pre_tokenizer_says(smol, smol_hf):
    """llama.cpp's "smollm" (and SmolLM2's own tokenizer.json): each digit alone, then GPT-2's
    regex on the pieces between. transformers 5's GGUF loader ignores tokenizer.ggml.pre here
    and differs only where a whitespace run meets a digit ("a  1": "ĠĠ" "1" vs "Ġ" "Ġ1"->"Ġ" "1"),
    so the reference is its tokenizer with SmolLM2's own pre-tokenizer put back."""
    from tokenizers import Tokenizer, pre_tokenizers

    ref = Tokenizer.from_str(smol_hf.backend_tokenizer.to_str())
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False)]
    )
    for text in TEXTS + ["And  3+3", "x\t\t12  345\n\n 6", "2024 and 12345"]:
        assert smol.encode(text) == ref.encode(text, add_special_tokens=False).ids, text
    ids = smol.encode("2024 and  12")
    assert [smol.decode([i]) for i in ids] == ["2", "0", "2", "4", " and", "  ", "1", "2"]


@pytest.mark.parametrize("system", [False, True], ids=["default-system", "own-system"])
def test_chat_ids_equal_transformers_apply_chat_template(smol, smol_hf, system):
    """SmolLM2's template adds a default system message when there is none."""
    messages = (SYSTEM if system else []) + CHAT
    for end in (2, 3, 4):
        for prompt in (True, False):
            text = smol.render_chat_text(messages[:end], prompt)
            ref = smol_hf.apply_chat_template(
                messages[:end], tokenize=False, add_generation_prompt=prompt
            )
            assert text == ref
            assert smol.render_chat(messages[:end], prompt) == _hf_chat(
                smol_hf, messages[:end], prompt
            )
    assert ("You are a helpful AI assistant" in text) is not system
    assert smol.render_chat(messages).count(1) == len(messages) + (not system) + 1  # <|im_start|>


def test_chat_with_mask_marks_assistant_content_and_its_end_of_turn(smol):
    ids, mask = smol.chat_with_mask(SYSTEM + CHAT)
    assert ids == smol.render_chat(SYSTEM + CHAT, add_generation_prompt=False)
    assert len(mask) == len(ids)
    runs, run = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            run.append(i)
        elif run:
            runs.append(run)
            run = []
    assert [smol.decode(r) for r in runs] == ["4. 😀<|im_end|>", "6, said the café.<|im_end|>"]
    assert ids[mask.index(True) - 1] == smol.encode("\n")[0]  # the header is not trained on


def test_an_end_of_turn_text_inside_a_reply_does_not_cut_the_mask_short(smol):
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a<|im_end|>b"}]
    ids, mask = smol.chat_with_mask(chat)
    assert smol.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "a<|im_end|>b<|im_end|>"


def test_round_trip_through_to_dict_and_a_tokenizer_file(smol, tmp_path):
    again = tokenizer_from_dict(json.loads(json.dumps(smol.to_dict())))
    assert again == smol and again.eot_ids == smol.eot_ids
    save_tokenizer(smol, tmp_path / "tokenizer.json")
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(loaded, PretrainedTokenizer) and loaded.to_dict() == smol.to_dict()
    assert loaded.render_chat(CHAT) == smol.render_chat(CHAT)


def test_hf_folder_written_back_loads_the_same_in_transformers_and_lamina(smol, tmp_path):
    from lamina.tokenizers.hf_files import save_hf_tokenizer, tokenizer_from_hf

    names = save_hf_tokenizer(smol, tmp_path)
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} == set(names)
    back = tokenizer_from_hf(tmp_path)
    assert isinstance(back, PretrainedTokenizer) and back.to_dict() == smol.to_dict()
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS[:3]:
        assert ref.encode(text) == smol.encode_prompt(text)
    assert _hf_chat(ref, CHAT[:3], True) == smol.render_chat(CHAT[:3])


# -- small tokenizers of the other kinds, built here ----------------------------------------------
BUILDS = {
    "sentencepiece-bpe": (tt.sentencepiece_bpe, "LlamaTokenizerFast", "<s>", "</s>", "<unk>"),
    "unigram": (tt.unigram, "PreTrainedTokenizerFast", None, "</s>", "<unk>"),
    "byte-level-bpe": (
        tt.byte_level_bpe,
        "PreTrainedTokenizerFast",
        "<|im_start|>",
        "<|im_end|>",
        None,
    ),
}


@pytest.fixture(scope="module", params=sorted(BUILDS))
def folder(request, tmp_path_factory):
    build, cls, bos, eos, unk = BUILDS[request.param]
    specials = {k: v for k, v in (("bos_token", bos), ("eos_token", eos), ("unk_token", unk)) if v}
    hf = getattr(transformers, cls)(tokenizer_object=build(), chat_template=tt.CHATML, **specials)
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d)
    return request.param, d, transformers.AutoTokenizer.from_pretrained(d)


def test_folder_ids_equal_transformers(folder):
    kind, d, ref = folder
    tok = PretrainedTokenizer.from_hf_folder(d)
    assert tok.add_bos is (kind == "sentencepiece-bpe")  # Llama 2's post-processor adds <s>
    for text in TEXTS + [" leading space", "<s>x</s>", "lazy dog <unk>"]:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), (kind, text)
        assert tok.encode_prompt(text) == ref.encode(text), (kind, text)
        assert tok.decode(ids) == ref.decode(ids), (kind, text)
        assert tok.decode(ids, skip_special=True) == ref.decode(ids, skip_special_tokens=True)
    for end in (1, 2, 3):
        assert tok.render_chat(CHAT[:end]) == _hf_chat(ref, CHAT[:end], True), kind
    ids, mask = tok.chat_with_mask(CHAT)
    assert ids == tok.render_chat(CHAT, add_generation_prompt=False)
    marked = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    if kind != "unigram":  # its tiny vocabulary has no "|" or "6": <unk> there
        assert marked.replace(" ", "") == "4.😀<|im_end|>6,saidthecafé.<|im_end|>", kind
    assert mask[-1] is False and tok.decode(ids[-1:]).strip() == ""  # the final newline


def _write_gguf(path: Path, meta: dict, arch: str = "llama") -> Path:
    """A GGUF file holding `meta` (and one tiny tensor), for transformers' GGUF tokenizer."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(path, arch)
    for key, value in meta.items():
        if key == "general.architecture":
            continue
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_array(key, value)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_reference(tmp_path: Path, meta: dict, arch: str = "llama"):
    """transformers' tokenizer for a GGUF file: AutoTokenizer for llama, the class it picks
    (TokenizersBackend) for the others, whose config would need more keys than a tokenizer."""
    _write_gguf(tmp_path / "t.gguf", meta, arch)
    cls = transformers.AutoTokenizer if arch == "llama" else transformers.TokenizersBackend
    return cls.from_pretrained(tmp_path, gguf_file="t.gguf")


@pytest.mark.parametrize("arch", ["llama", "gemma", "phi3"])
def test_sentencepiece_bpe_from_gguf_metadata_equals_transformers(tmp_path, arch):
    """tokenizer.ggml.model "llama": merges rebuilt from scores (Gemma: from positions, its
    space runs stored as spaces), byte fallback, bos added."""
    vocab = tt.json_model(tt.sentencepiece_bpe())["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if arch == "gemma":  # Gemma files spell a token of 2+ spaces with spaces
        tokens += ["  ", "   "]
    meta = {
        "general.architecture": arch,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)],
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.chat_template": tt.CHATML,
    }
    ref = _gguf_reference(tmp_path, meta, arch)
    tok = PretrainedTokenizer.from_gguf_metadata(meta)
    assert tok.add_bos and tok.bos_id == 1 and tok.eot_ids == (2,)
    for text in TEXTS + [" leading space", "<s>x</s>", "a  b   c"]:
        assert tok.encode_prompt(text) == ref.encode(text), (arch, text)
        assert tok.decode(tok.encode(text)) == ref.decode(
            ref.encode(text, add_special_tokens=False)
        )
    assert tok.render_chat(CHAT) == _hf_chat(ref, CHAT, True)


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_byte_level_pre_tokenizers_from_gguf_metadata_equal_transformers(tmp_path, pre):
    model = tt.json_model(tt.byte_level_bpe())
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": pre == "llama-bpe",
    }
    ref = _gguf_reference(tmp_path, meta)
    tok = PretrainedTokenizer.from_gguf_metadata(meta)
    assert tok.add_bos is (pre == "llama-bpe") and set(tok.eot_ids) == {2, 0}
    for text in TEXTS + ["And  3+3 1234567 x\n\n\t\r\n  \n"]:
        assert tok.encode_prompt(text) == ref.encode(text), (pre, text)
        assert tok.decode(tok.encode(text)) == text


def test_generation_config_eos_list_adds_end_of_turn_ids(smol, tmp_path):
    (tmp_path / "tokenizer.json").write_text(smol.hf_json)
    config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    tok = PretrainedTokenizer.from_hf_folder(tmp_path)
    assert (tok.bos_id, tok.eos_id, tok.eot_ids, tok.add_bos) == (1, 2, (2, 5, 0), False)
    assert tok.chat_template is None
    with pytest.raises(LaminaError, match="no chat template"):
        tok.render_chat(CHAT)


# -- refusals -------------------------------------------------------------------------------------
def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_an_unknown_pre_tokenizer_or_model_is_refused_in_one_line(smol_meta):
    with pytest.raises(LaminaError) as e:
        PretrainedTokenizer.from_gguf_metadata({**smol_meta, "tokenizer.ggml.pre": "mystery"})
    assert "'mystery'" in _one_line(e) and "smollm" in str(e.value)
    with pytest.raises(LaminaError) as e:
        PretrainedTokenizer.from_gguf_metadata({**smol_meta, "tokenizer.ggml.model": "rwkv"})
    assert "'rwkv'" in _one_line(e)
    with pytest.raises(LaminaError, match="bos_token_id"):
        PretrainedTokenizer.from_gguf_metadata({**smol_meta, "tokenizer.ggml.bos_token_id": 10**6})


def test_broken_descriptions_and_folders_are_refused(tmp_path, smol):
    with pytest.raises(LaminaError, match="not readable by `tokenizers`"):
        PretrainedTokenizer('{"model": 3}')
    with pytest.raises(LaminaError, match="unexpected fields"):
        PretrainedTokenizer.from_dict({**smol.to_dict(), "extra": 1})
    with pytest.raises(LaminaError, match="outside the vocabulary"):
        smol.decode([49152])
    with pytest.raises(LaminaError, match="lone surrogate '\\\\ud800' at position 1"):
        smol.encode("x\ud800")
    with pytest.raises(LaminaError, match="no tokenizer.json"):
        PretrainedTokenizer.from_hf_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text(smol.hf_json)
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|nope|>"}')
    with pytest.raises(
        LaminaError, match=re.escape("eos_token '<|nope|>' is not in the vocabulary")
    ):
        PretrainedTokenizer.from_hf_folder(tmp_path)
