"""Specification of lamina.tokenizers.kinds: char vocabulary, encode/decode, JSON, registry."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lamina.data import (
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
    register_tokenizer,
    save_tokenizer,
    tokenizer_from_dict,
)
from lamina.errors import LaminaError


def test_char_vocab_is_sorted_set_of_text_and_stable():
    """from_text builds sorted(set(text)), the same whatever the character order."""
    a = CharTokenizer.from_text("hello world")
    b = CharTokenizer.from_text("dlrow olleh")
    assert a.chars == tuple(sorted(set("hello world")))
    assert a == b
    assert a.vocab_size == 8


def test_unk_is_added_to_vocab_keeping_sort_order():
    """An unk character not in the text is inserted at its sorted place."""
    tok = CharTokenizer.from_text("cab", unk="?")
    assert tok.chars == ("?", "a", "b", "c")
    assert tok.special_tokens == {"unk": 0}


def test_encode_decode_round_trip():
    """decode(encode(text)) == text, and ids index into chars."""
    text = "To be, or not to be: that is the question.\n"
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert isinstance(ids, list) and len(ids) == len(text)
    assert [tok.chars[i] for i in ids] == list(text)
    assert tok.decode(ids) == text


def test_encode_array_matches_encode_and_is_int64():
    """The vectorised path gives the same ids as encode, as int64."""
    text = "naïve café ☃ 😀 text"
    tok = CharTokenizer.from_text(text)
    arr = tok.encode_array(text)
    assert arr.dtype == np.int64
    assert arr.tolist() == tok.encode(text)


def test_decode_accepts_numpy_and_torch():
    """decode takes numpy arrays and 1-D torch tensors as well as lists."""
    tok = CharTokenizer("abc")
    assert tok.decode(np.array([2, 0, 1], dtype=np.uint8)) == "cab"
    assert tok.decode(torch.tensor([1, 1, 2])) == "bbc"


def test_save_load_json_round_trip(tmp_path):
    """save_tokenizer writes JSON with a kind; load_tokenizer gives an equal tokenizer."""
    tok = CharTokenizer.from_text("Shakespeare é 😀\n", unk="~")
    path = tmp_path / "tok.json"
    save_tokenizer(tok, path)
    d = json.loads(path.read_text(encoding="utf-8"))
    assert d["kind"] == "char"
    loaded = load_tokenizer(path)
    assert loaded == tok
    assert isinstance(loaded, Tokenizer)
    assert [p.name for p in tmp_path.iterdir()] == ["tok.json"]  # no temp file left behind


def test_unknown_character_error_names_character_and_position():
    """Encoding an unseen character raises LaminaError naming it (repr) and its index."""
    tok = CharTokenizer.from_text("abc def")
    with pytest.raises(LaminaError) as e:
        tok.encode("abc déf")
    msg = str(e.value)
    assert "'é'" in msg
    assert "position 5" in msg
    assert "7 characters" in msg
    assert "unk" in msg


def test_unk_fallback_maps_unknown_characters_to_unk_id():
    """With unk set, unknown characters encode to the unk id instead of raising."""
    tok = CharTokenizer.from_text("abc", unk="?")
    assert tok.encode("aXc") == [tok.encode("a")[0], tok.encode("?")[0], tok.encode("c")[0]]
    assert tok.decode(tok.encode("a😀")) == "a?"


@pytest.mark.parametrize("bad", [3, -1, 100])
def test_decode_rejects_ids_outside_vocab(bad):
    """An id outside [0, vocab_size) raises LaminaError naming the id (negatives included)."""
    tok = CharTokenizer("abc")
    with pytest.raises(LaminaError, match=rf"token id {bad} at position 1"):
        tok.decode([0, bad])


def test_decode_rejects_non_integer_ids():
    """Floats are not ids."""
    with pytest.raises(LaminaError, match="integer"):
        CharTokenizer("abc").decode([0, 1.5])


@pytest.mark.parametrize(
    ("chars", "unk", "fragment"),
    [
        ([], None, "empty"),
        (["a", "a"], None, "twice"),
        (["ab"], None, "single-character"),
        (["a", 1], None, "single-character"),
        (["a"], "b", "unk"),
    ],
)
def test_char_tokenizer_validates_its_arguments(chars, unk, fragment):
    """Empty, duplicate, multi-character chars and an unk outside the vocab are refused."""
    with pytest.raises(LaminaError, match=fragment):
        CharTokenizer(chars, unk=unk)


def test_registry_unknown_kind_names_it_and_lists_known_kinds():
    """tokenizer_from_dict on an unregistered kind names the kind and the known ones."""
    with pytest.raises(LaminaError) as e:
        tokenizer_from_dict({"kind": "wordpiece"})
    assert "'wordpiece'" in str(e.value)
    assert "char" in str(e.value)


def test_registry_dispatches_to_registered_kind():
    """A kind registered elsewhere is built through tokenizer_from_dict."""

    def build(d):
        return CharTokenizer(d["letters"])

    register_tokenizer("test-letters", build)
    try:
        tok = tokenizer_from_dict({"kind": "test-letters", "letters": "xyz"})
        assert tok == CharTokenizer("xyz")
        with pytest.raises(LaminaError, match="already registered"):
            register_tokenizer("test-letters", lambda d: build(d))
    finally:
        from lamina.tokenizers import kinds as tokenizers

        tokenizers._REGISTRY.pop("test-letters", None)


def test_load_tokenizer_reports_missing_and_malformed_files(tmp_path):
    """A missing file or broken JSON raises LaminaError naming the file."""
    with pytest.raises(LaminaError, match="no such tokenizer file"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(LaminaError, match=r"bad\.json"):
        load_tokenizer(bad)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1))
def test_char_tokenizer_round_trips_any_text(text):
    """For any non-empty text, the tokenizer built from it round-trips it exactly."""
    tok = CharTokenizer.from_text(text)
    assert tok.decode(tok.encode(text)) == text
    assert tokenizer_from_dict(json.loads(json.dumps(tok.to_dict()))) == tok
