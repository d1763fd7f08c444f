"""Tokenizers written into GGUF metadata: llama.cpp's pre-tokenizer names, token types, special
ids; with the "pretrained" kind (where present) a write/read round trip of token ids."""

from __future__ import annotations

import json

import pytest

from lamina import GPT, GPTConfig
from lamina.interop.gguf import read_gguf, save_gguf
from lamina.tokenizers.gguf_metadata import (
    LLAMA3_SPLIT,
    QWEN2_SPLIT,
    gguf_tokenizer_metadata,
    pre_tokenizer_name,
)

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("gguf")
from tokenizers import Regex, decoders, models, pre_tokenizers  # noqa: E402

TEXT = "The 2024 café costs 12.50€; 東京 🙂 <|im_end|>\n\n\tok"


def _pre(t) -> dict:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = t
    return json.loads(tok.to_str())["pre_tokenizer"]


def test_pre_tokenizer_names():
    byte = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    digits = pre_tokenizers.Digits(individual_digits=True)
    split = pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated")
    qwen = pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated")
    assert pre_tokenizer_name(_pre(byte)) == "gpt-2"
    assert pre_tokenizer_name(_pre(pre_tokenizers.Sequence([digits, byte]))) == "smollm"
    assert pre_tokenizer_name(_pre(pre_tokenizers.Sequence([split, raw]))) == "llama-bpe"
    assert pre_tokenizer_name(_pre(pre_tokenizers.Sequence([qwen, raw]))) == "qwen2"
    assert pre_tokenizer_name(_pre(raw)) is None
    assert pre_tokenizer_name(_pre(pre_tokenizers.Whitespace())) is None


class FakePretrained:
    """What the pretrained kind offers save_gguf: a tokenizers JSON and its specials."""

    def __init__(self) -> None:
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )  # fmt: skip
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator([TEXT * 3, "the quick brown fox " * 20], trainer)
        tok.add_tokens(["<think>"])
        self.tok, self.hf_json = tok, tok.to_str()
        self.special_tokens = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = 1, 2, 2, None
        self.add_bos, self.chat_template = False, "{{ messages }}"

    def to_dict(self) -> dict:
        return {"kind": "pretrained"}


def test_a_tokenizers_json_becomes_gguf_metadata():
    fake = FakePretrained()
    n = fake.tok.get_vocab_size() + 5
    meta = gguf_tokenizer_metadata(fake, n)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "smollm"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    vocab = fake.tok.get_vocab()
    assert all(tokens[i] == t for t, i in vocab.items()) and len(tokens) == n
    assert types[2] == 3 and types[vocab["<think>"]] == 4 and types[vocab["Ġ"]] == 1
    assert types[-1] == 5 and tokens[-1] == f"[PAD{n - 1}]"
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert meta["tokenizer.ggml.padding_token_id"] == 2
    assert "tokenizer.ggml.unknown_token_id" not in meta
    assert meta["tokenizer.chat_template"] == "{{ messages }}"
    assert len(meta["tokenizer.ggml.merges"]) == len(json.loads(fake.hf_json)["model"]["merges"])


def test_pretrained_kind_round_trips_through_gguf(tmp_path):
    pretrained = pytest.importorskip("lamina.tokenizers.pretrained")
    fake = FakePretrained()
    tok = pretrained.PretrainedTokenizer(
        fake.hf_json, bos_id=1, eos_id=2, pad_id=2, chat_template="{{ messages }}"
    )
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size + 3))
    path = save_gguf(model, tmp_path / "m.gguf", tok)
    back = pretrained.PretrainedTokenizer.from_gguf_metadata(read_gguf(path).metadata)
    assert back.encode(TEXT) == tok.encode(TEXT) and back.decode(tok.encode(TEXT)) == TEXT
    assert (back.bos_id, back.eos_id, back.chat_template) == (1, 2, "{{ messages }}")
