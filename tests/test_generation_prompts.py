"""The one prompt encoder and the one streamed decoder (lamina.generation.prompts)."""

from __future__ import annotations

import pytest

from lamina.data import CharTokenizer
from lamina.errors import LaminaError
from lamina.generation import TextStream, encode_prompt, start_id
from lamina.tokenizers.subword import ByteTokenizer

TEXT = "ROMEO: But soft, what light through yonder window breaks?\n"


class WithBos:
    """A tokenizer with an add-bos rule, as PretrainedTokenizer has (bos id 0)."""

    special_tokens = {"<s>": 0}
    bos_id = 0

    def encode(self, text):
        return [ord(c) for c in text]

    def encode_prompt(self, text):
        return [0, *self.encode(text)]


class ByteWithEnd(ByteTokenizer):
    """Bytes, with byte 0 standing for "<|endoftext|>" (a start and end-of-text token)."""

    special_tokens = {"<|endoftext|>": 0}


def test_unknown_characters_are_named_with_the_first_position():
    tok = CharTokenizer.from_text(TEXT)
    with pytest.raises(LaminaError, match=r"2 character\(s\).*'#', '~' \(first: '~' at position 5"):
        encode_prompt(tok, "ROMEO~#")


def test_an_add_bos_tokenizer_gets_its_start_token():
    """The tokenizer's own prompt rule (Llama's <s>) is used, not plain encode."""
    assert encode_prompt(WithBos(), "hi") == [0, ord("h"), ord("i")]


def test_empty_prompt_becomes_the_start_token_or_is_refused():
    tok = ByteWithEnd()
    assert start_id(tok) == 0
    assert encode_prompt(tok, "") == [start_id(tok)]
    with pytest.raises(LaminaError, match="text is empty"):
        encode_prompt(tok, "", empty="error", what="text")
    with pytest.raises(LaminaError, match="defines no start token"):
        encode_prompt(CharTokenizer.from_text(TEXT), "")


def test_block_size_is_checked_only_when_given():
    tok = ByteTokenizer()
    assert len(encode_prompt(tok, "x" * 70)) == 70
    with pytest.raises(LaminaError, match="70 tokens, longer than the model's block_size 64"):
        encode_prompt(tok, "x" * 70, block_size=64)


def stream_all(stream: TextStream, ids: list[int]) -> list[str]:
    pieces = []
    for i in ids:
        pieces.append(stream.push(i))
        if stream.stopped:
            break
    pieces.append(stream.flush())
    return pieces


def test_a_character_is_shown_only_once_all_its_bytes_came():
    """UTF-8 bytes of 'é' and '😀' arrive one token each: nothing partial is ever shown."""
    tok = ByteTokenizer()
    text = "café 😀!"
    pieces = stream_all(TextStream(tok), tok.encode(text))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[3] == "" and pieces[4] == "é"  # 'é' is bytes 3 and 4


def test_the_stream_equals_decoding_everything():
    tok = CharTokenizer.from_text(TEXT)
    stream = TextStream(tok)
    assert "".join(stream_all(stream, tok.encode(TEXT))) == TEXT == stream.text


def test_a_stop_string_ends_the_text_right_after_it():
    tok = ByteTokenizer()
    stream = TextStream(tok, stops=["\n\n"])
    pieces = stream_all(stream, tok.encode("one\n\ntwo"))
    assert "".join(pieces) == "one\n\n" and stream.stopped


def test_without_the_stop_its_start_is_held_back_until_it_is_known():
    """include_stop=False (an API dropping the stop): 'EN' waits, since it may begin 'END'."""
    tok = ByteTokenizer()
    stream = TextStream(tok, stops=["END"], include_stop=False)
    shown = [stream.push(i) for i in tok.encode("okEN")]
    assert "".join(shown) == "ok"
    assert stream.push(tok.encode("D")[0]) == "" and stream.stopped and stream.text == "ok"
    other = TextStream(tok, stops=["END"], include_stop=False)
    assert "".join(stream_all(other, tok.encode("okENs"))) == "okENs"


def test_an_end_of_turn_id_stops_the_stream_and_is_not_shown():
    tok = ByteWithEnd()
    eot = tok.special_tokens["<|endoftext|>"]
    stream = TextStream(tok, stop_ids=[eot])
    pieces = stream_all(stream, [*tok.encode("hi"), eot, *tok.encode("more")])
    assert "".join(pieces) == "hi" and stream.stopped and stream.ids == tok.encode("hi")


class WholeText(TextStream):
    """The reference: every id decoded again at each token (what TextStream's windows equal)."""

    def _decoded(self) -> str:
        return self.tokenizer.decode(self.ids)


class HFDecode:
    """A `tokenizers.Tokenizer` decoding as PretrainedTokenizer does (special tokens kept)."""

    def __init__(self, tok) -> None:
        self.tok = tok

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)


def monotone(tok, ids: list[int]) -> bool:
    """Whether decoding more ids never takes back text (but a trailing U+FFFD) decoded before."""
    texts = [tok.decode(ids[:k]) for k in range(len(ids) + 1)]
    return all(b.startswith(a.rstrip("\ufffd")) for a, b in zip(texts, texts[1:], strict=False))


@pytest.mark.parametrize("kind", ["bytes", "sentencepiece_bpe", "unigram", "byte_level_bpe"])
def test_the_windowed_decoding_equals_decoding_everything_at_every_token(kind):
    """Text with characters out of the vocabulary (byte pieces) and random ids (broken UTF-8,
    special tokens, leading spaces), with and without stop strings: every piece, the text and
    the stop equal the reference's, which decodes all ids at each token. Where that decoding
    takes text back (a sentencepiece byte-fallback run that ends up invalid UTF-8 turns all
    its bytes, a space shown before included, into U+FFFD) the reference shows nothing more,
    and the windows go on after what it showed; byte-level vocabularies never take back."""
    import random

    import tiny_tokenizers

    if kind == "bytes":
        tok, n = ByteTokenizer(), 256
        encode = tok.encode
    else:
        hf = getattr(tiny_tokenizers, kind)()
        tok, n = HFDecode(hf), hf.get_vocab_size()
        encode = lambda text: hf.encode(text).ids  # noqa: E731
    rng = random.Random(0)
    odd = ["😀", "ß", "東京", "\u2028", " é", "\n\n", "  "]
    runs = []
    for _ in range(60):
        at = rng.randrange(len(tiny_tokenizers.TEXT) - 80)
        words = tiny_tokenizers.TEXT[at : at + rng.randrange(1, 80)].split(" ")
        runs.append(encode(" ".join(w + rng.choice(["", "", *odd]) for w in words)))
    runs += [[rng.randrange(n) for _ in range(rng.randrange(1, 60))] for _ in range(150)]
    same = 0
    for r, ids in enumerate(runs):
        whole = tok.decode(ids)
        stops = [] if r % 3 == 0 else [whole[len(whole) // 2 :][:3] or "x", "\ufffd a"]
        exact = monotone(tok, ids)
        same += exact
        for include in (True, False):
            new = TextStream(tok, stops, include_stop=include)
            ref = WholeText(tok, stops, include_stop=include)
            pieces, expected = stream_all(new, ids), stream_all(ref, ids)
            if exact:
                assert pieces == expected, (kind, r, ids)
                assert (new.text, new.stopped) == (ref.text, ref.stopped)
            else:
                assert new.text.startswith(ref.text), (kind, r, ids)
    assert same == len(runs) if kind in ("bytes", "byte_level_bpe") else same >= 60
