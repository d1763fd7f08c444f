"""Specification of lamina.tokenizers.subword and data.spec: byte, bpe:N and gpt2:DIR tokenizers."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lamina.data import encode_corpus, load_tokenizer, save_tokenizer, tokenizer_from_dict
from lamina.data.spec import TOKENIZER_SPECS, build_tokenizer
from lamina.errors import LaminaError
from lamina.tokenizers.subword import EOT, BPETokenizer, ByteTokenizer, GPT2Tokenizer, gpt2_ranks

# arbitrary Unicode, plus strings built from pieces that stress byte-level BPE and GPT-2's regex
PIECES = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "'s",
    "'ll",
    "é",
    "👍",
    "\u00a0",
    "日本",
    EOT,
    "12",
]
TEXTS = st.text() | st.lists(st.sampled_from(PIECES) | st.text(max_size=3)).map("".join)
HYP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CORPUS = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "Ça va? Très bien, merci. 日本語のテキストも少し。 Emoji 👍🏽 and tabs\tand  spaces.\n"
) * 20


@functools.lru_cache(maxsize=1)
def small_bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, 400)


@functools.lru_cache(maxsize=2)
def gpt2(directory: Path) -> GPT2Tokenizer:
    return GPT2Tokenizer.from_dir(directory)


@pytest.fixture
def gpt2_dir(shared_data: Path) -> Path:
    d = shared_data / "gpt2-tokenizer"
    if not (d / "vocab.bpe").is_file():
        pytest.skip(f"{d} has no GPT-2 tokenizer files")
    return d


# ---- byte ---------------------------------------------------------------------------------


@HYP
@given(TEXTS)
def test_byte_round_trips_any_unicode(s):
    """decode(encode(s)) == s for any Unicode string; ids are the UTF-8 bytes."""
    tok = ByteTokenizer()
    ids = tok.encode(s)
    assert ids == list(s.encode("utf-8"))
    assert tok.decode(ids) == s
    assert tok.encode_array(s).tolist() == ids


def test_byte_basics_and_json():
    """256 ids, no specials, survives save/load; a half character decodes to U+FFFD."""
    tok = ByteTokenizer()
    assert tok.vocab_size == 256 and tok.special_tokens == {}
    assert tok.encode("é") == [195, 169]
    assert tok.decode([195]) == "\ufffd"
    assert tokenizer_from_dict(tok.to_dict()) == tok


def test_lone_surrogates_and_bad_ids_are_refused():
    """Text that is not Unicode, and ids outside the vocabulary, raise LaminaError."""
    for tok in (ByteTokenizer(), small_bpe()):
        with pytest.raises(LaminaError, match="surrogate"):
            tok.encode("a\ud800b")
        with pytest.raises(LaminaError, match="outside the vocabulary"):
            tok.decode([tok.vocab_size])
        with pytest.raises(LaminaError, match="integer"):
            tok.decode([1.5])


# ---- bpe ----------------------------------------------------------------------------------


@HYP
@given(TEXTS)
def test_bpe_round_trips_any_unicode(s):
    """Byte-level BPE round-trips text it never saw, including characters absent from training."""
    tok = small_bpe()
    ids = tok.encode(s)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == s


def test_bpe_learns_merges_and_has_endoftext():
    """N ids at most, fewer tokens than bytes on its corpus, <|endoftext|> is one special id."""
    tok = small_bpe()
    assert 257 < tok.vocab_size <= 400
    assert len(tok.encode(CORPUS)) < len(CORPUS.encode("utf-8")) / 2
    assert tok.special_tokens == {EOT: 0}
    assert tok.encode(f"a{EOT}b")[1] == 0


def test_bpe_saves_and_loads_as_tokenizer_json(tmp_path):
    """save_tokenizer / load_tokenizer rebuild the same ids; the tokenizers JSON is embedded."""
    tok = small_bpe()
    save_tokenizer(tok, tmp_path / "tokenizer.json")
    data = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert data["kind"] == "bpe" and json.loads(data["tokenizer"])["model"]["type"] == "BPE"
    back = load_tokenizer(tmp_path / "tokenizer.json")
    assert back.vocab_size == tok.vocab_size
    assert back.encode(CORPUS) == tok.encode(CORPUS)


def test_bpe_refuses_bad_sizes_and_foreign_json():
    """N below 257 or not an integer, empty text, and a non-byte-level tokenizer are refused."""
    for n in (256, 0, "300", True):
        with pytest.raises(LaminaError, match="vocab size"):
            BPETokenizer.train(CORPUS, n)
    with pytest.raises(LaminaError, match="empty"):
        BPETokenizer.train("", 300)
    layout = json.loads(small_bpe().hf_json)
    layout["decoder"] = None
    with pytest.raises(LaminaError, match="byte-level"):
        BPETokenizer(json.dumps(layout))
    with pytest.raises(LaminaError, match="JSON"):
        tokenizer_from_dict({"kind": "bpe", "tokenizer": "{not json"})


# ---- specs --------------------------------------------------------------------------------


def test_specs_build_each_kind(gpt2_dir):
    """char, byte, bpe:N and gpt2:DIR each build their tokenizer; token files fit their dtype."""
    assert TOKENIZER_SPECS[:4] == ("char", "byte", "bpe:N", "gpt2:DIR")
    assert build_tokenizer("char", "abc").vocab_size == 3
    assert encode_corpus(build_tokenizer("byte"), CORPUS).dtype == np.uint8
    bpe = build_tokenizer("bpe:300", CORPUS)
    assert bpe.vocab_size <= 300 and encode_corpus(bpe, CORPUS).dtype == np.uint16
    tok = build_tokenizer(f"gpt2:{gpt2_dir}")
    ids = encode_corpus(tok, f"hello{EOT}")
    assert ids.dtype == np.uint16 and ids.tolist() == [31373, 50256]


@pytest.mark.parametrize(
    ("spec", "text", "match"),
    [
        ("bpe:x", "abc", "whole number"),
        ("bpe:300", None, "corpus"),
        ("gpt2:", None, "folder"),
        ("gpt2:/no/such/dir", None, "no encoder.json"),
        ("wordpiece", None, "unknown tokenizer"),
        ("char", None, "corpus"),
    ],
)
def test_bad_specs_are_one_clear_error(spec, text, match):
    """Each malformed spec raises LaminaError saying what is wrong."""
    with pytest.raises(LaminaError, match=match):
        build_tokenizer(spec, text)


# ---- gpt2 ---------------------------------------------------------------------------------


def test_gpt2_matches_the_published_files(gpt2_dir, monkeypatch):
    """Ranks equal tiktoken's own loader; encoder() reproduces encoder.json; EOT is 50256."""
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # no cache writes
    tok = gpt2(gpt2_dir)
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(gpt2_dir / "vocab.bpe"),
        encoder_json_file=str(gpt2_dir / "encoder.json"),
    )
    assert gpt2_ranks(tok.merges) == ranks
    assert tok.encoder() == json.loads((gpt2_dir / "encoder.json").read_text(encoding="utf-8"))
    assert tok.vocab_size == 50257 and tok.special_tokens == {EOT: 50256}
    assert tok.decode([50256]) == EOT


def test_gpt2_checks_sha256(gpt2_dir, tmp_path):
    """A modified vocab.bpe, or a missing encoder.json, is refused naming the file."""
    shutil.copy(gpt2_dir / "encoder.json", tmp_path / "encoder.json")
    text = (gpt2_dir / "vocab.bpe").read_text(encoding="utf-8")
    (tmp_path / "vocab.bpe").write_text(text.replace("Ġ t", "Ġ x", 1), encoding="utf-8")
    with pytest.raises(LaminaError, match=r"vocab\.bpe has sha256 .* expected"):
        GPT2Tokenizer.from_dir(tmp_path)
    (tmp_path / "encoder.json").unlink()
    with pytest.raises(LaminaError, match="no encoder.json"):
        GPT2Tokenizer.from_dir(tmp_path)
    with pytest.raises(LaminaError, match="sha256"):
        tokenizer_from_dict({"kind": "gpt2", "merges": text + "x y\n"})


def test_gpt2_saves_and_loads(gpt2_dir, tmp_path):
    """tokenizer.json embeds vocab.bpe; loading it checks the hash and gives the same ids."""
    tok = gpt2(gpt2_dir)
    save_tokenizer(tok, tmp_path / "tokenizer.json")
    back = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(back, GPT2Tokenizer)
    assert back.encode(CORPUS) == tok.encode(CORPUS)


def test_gpt2_round_trips_any_unicode(gpt2_dir):
    """decode(encode(s)) == s for arbitrary Unicode strings."""
    tok = gpt2(gpt2_dir)

    @HYP
    @given(TEXTS)
    def check(s):
        assert tok.decode(tok.encode(s)) == s
        assert tok.encode_array(s).tolist() == tok.encode(s)

    check()


def _hf_gpt2(gpt2_dir: Path):
    transformers = pytest.importorskip("transformers")
    # NB transformers 5: GPT2TokenizerFast(vocab_file=..., merges_file=...) is silently empty
    return transformers.GPT2Tokenizer(
        vocab=str(gpt2_dir / "encoder.json"), merges=str(gpt2_dir / "vocab.bpe")
    )


def test_gpt2_ids_equal_hugging_face_on_arbitrary_text(gpt2_dir):
    """Same ids as transformers' GPT2Tokenizer on random strings (whitespace, specials, emoji)."""
    tok, hf = gpt2(gpt2_dir), _hf_gpt2(gpt2_dir)

    @HYP
    @given(TEXTS)
    def check(s):
        assert tok.encode(s) == hf(s)["input_ids"]

    check()


def test_gpt2_ids_equal_hugging_face_on_tinyshakespeare(gpt2_dir, shared_data):
    """On tinyshakespeare.txt: exactly Hugging Face's 338,025 ids (takes ~10 s)."""
    text = (shared_data / "tinyshakespeare.txt").read_text(encoding="utf-8")
    ids = gpt2(gpt2_dir).encode_array(text)
    assert len(ids) == 338_025
    assert ids.tolist() == _hf_gpt2(gpt2_dir)(text)["input_ids"]
