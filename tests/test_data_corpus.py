"""Specification of lamina.data.corpus: loading text, dtypes, encoding, splits, token files."""

from __future__ import annotations

import numpy as np
import pytest

from lamina.data import (
    CharTokenizer,
    encode_corpus,
    load_corpus,
    load_tokens,
    save_tokens,
    split_tokens,
    token_dtype,
)
from lamina.errors import LaminaError, LaminaWarning


def test_load_corpus_reads_a_file_exactly(tmp_path):
    """A file is returned as its exact UTF-8 text, newlines untouched."""
    p = tmp_path / "a.txt"
    p.write_bytes("Hello,\r\nwörld\n".encode())
    assert load_corpus(p) == "Hello,\r\nwörld\n"


def test_load_corpus_joins_folder_txt_files_by_path(tmp_path):
    """A folder's *.txt files, subfolders included (the one folder rule of data.sources), are
    joined with one newline, in path order."""
    (tmp_path / "b.txt").write_text("second", encoding="utf-8")
    (tmp_path / "a.txt").write_text("first", encoding="utf-8")
    (tmp_path / "c.md").write_text("ignored", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "0.txt").write_text("in a subfolder", encoding="utf-8")
    with pytest.warns(LaminaWarning, match=r"skipped 1 other file \(c\.md\)"):
        assert load_corpus(tmp_path) == "first\nsecond\nin a subfolder"


def test_load_corpus_missing_path(tmp_path):
    """A missing path raises LaminaError saying so."""
    with pytest.raises(LaminaError, match="no such file or folder"):
        load_corpus(tmp_path / "missing.txt")


def test_load_corpus_folder_without_txt_files(tmp_path):
    """A folder with no .txt files is refused."""
    (tmp_path / "x.csv").write_text("1,2", encoding="utf-8")
    with pytest.raises(LaminaError, match=r"no \.txt, \.jsonl"):
        load_corpus(tmp_path)


def test_load_corpus_empty_file_and_empty_folder(tmp_path):
    """Zero characters is an empty corpus, for a file and for a folder of empty files."""
    (tmp_path / "a.txt").write_bytes(b"")
    (tmp_path / "b.txt").write_bytes(b"")
    with pytest.raises(LaminaError, match="empty"):
        load_corpus(tmp_path / "a.txt")
    with pytest.raises(LaminaError, match="empty"):
        load_corpus(tmp_path)


def test_load_corpus_invalid_utf8_names_file_and_byte_offset(tmp_path):
    """Invalid UTF-8 raises LaminaError naming the file and the offending byte offset."""
    p = tmp_path / "latin1.txt"
    p.write_bytes(b"abc\xff def")
    with pytest.raises(LaminaError) as e:
        load_corpus(p)
    assert "latin1.txt" in str(e.value)
    assert "offset 3" in str(e.value)


def test_load_corpus_refuses_binary_file(tmp_path):
    """A file with NUL bytes is reported as binary."""
    p = tmp_path / "image.txt"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(LaminaError, match="looks binary"):
        load_corpus(p)


@pytest.mark.parametrize(
    ("vocab_size", "dtype"),
    [
        (1, np.uint8),
        (256, np.uint8),
        (257, np.uint16),
        (50257, np.uint16),
        (65536, np.uint16),
        (65537, np.uint32),
        (2**32, np.uint32),
    ],
)
def test_token_dtype_is_smallest_that_fits(vocab_size, dtype):
    """uint8 up to 256 ids, uint16 up to 65,536, uint32 above."""
    assert token_dtype(vocab_size) == np.dtype(dtype)
    assert np.iinfo(token_dtype(vocab_size)).max >= vocab_size - 1


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, 2**32 + 1])
def test_token_dtype_rejects_bad_vocab_size(bad):
    """Non-integers, sizes below 1 and above 2**32 are refused."""
    with pytest.raises(LaminaError, match="vocab_size"):
        token_dtype(bad)


def test_encode_corpus_uses_token_dtype_and_matches_encode():
    """encode_corpus gives the tokenizer's ids in the compact dtype."""
    text = "the quick brown fox"
    tok = CharTokenizer.from_text(text)
    arr = encode_corpus(tok, text)
    assert arr.dtype == np.uint8
    assert arr.tolist() == tok.encode(text)


def test_encode_corpus_falls_back_to_encode():
    """A tokenizer without encode_array is encoded through encode, dtype from vocab_size."""

    class Big:
        vocab_size = 70000

        def encode(self, text):
            return [69999 if c == "z" else 1 for c in text]

    arr = encode_corpus(Big(), "azz")
    assert arr.dtype == np.uint32
    assert arr.tolist() == [1, 69999, 69999]


def test_split_is_last_ten_percent():
    """Validation is the tail: 1,115,394 tokens split 1,003,854 / 111,540."""
    tokens = np.arange(1_115_394, dtype=np.uint32)
    train, val = split_tokens(tokens, 0.1)
    assert (len(train), len(val)) == (1_003_854, 111_540)
    assert train[-1] == 1_003_853 and val[0] == 1_003_854 and val[-1] == 1_115_393


def test_split_zero_fraction_keeps_everything_for_training():
    """val_fraction=0 leaves an empty validation split."""
    train, val = split_tokens(np.arange(10, dtype=np.uint8), 0.0)
    assert len(train) == 10 and len(val) == 0


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan")])
def test_split_rejects_fraction_outside_unit_interval(bad):
    """val_fraction must be in [0, 1)."""
    with pytest.raises(LaminaError, match="val_fraction"):
        split_tokens(np.arange(10, dtype=np.uint8), bad)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_save_load_tokens_round_trip_preserves_dtype(tmp_path, dtype):
    """Tokens saved and loaded (plain or memory-mapped) keep values and dtype."""
    tokens = (np.arange(1000) % np.iinfo(dtype).max).astype(dtype)
    path = tmp_path / "train.bin"
    save_tokens(path, tokens)
    for mmap in (False, True):
        back = load_tokens(path, mmap=mmap)
        assert back.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(back, tokens)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin"]


def test_load_tokens_reports_missing_and_garbage_files(tmp_path):
    """A missing or non-.npy file raises LaminaError naming it."""
    with pytest.raises(LaminaError, match="no such token file"):
        load_tokens(tmp_path / "none.npy")
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not an npy file at all")
    with pytest.raises(LaminaError, match=r"junk\.npy"):
        load_tokens(junk)


def test_tinyshakespeare_vocab_and_split(shared_data):
    """On tinyshakespeare: 65 characters, split 1,003,854 / 111,540."""
    path = shared_data / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    text = load_corpus(path)
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == 65
    tokens = encode_corpus(tok, text)
    assert tokens.dtype == np.uint8 and len(tokens) == 1_115_394
    train, val = split_tokens(tokens)
    assert (len(train), len(val)) == (1_003_854, 111_540)
    assert tok.decode(val[:100]) == text[1_003_854:1_003_954]
