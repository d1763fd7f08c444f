"""Small tokenizers of the kinds real models ship, trained here on a tiny text (no downloads).

sentencepiece_bpe() -> tokenizers.Tokenizer   Llama 2 / Mistral style: BPE with byte
    fallback, <unk> <s> </s> then the 256 <0xXX> byte tokens, Metaspace, bos added
unigram() -> tokenizers.Tokenizer             T5 / Gemma style Unigram with Metaspace
byte_level_bpe() -> tokenizers.Tokenizer      SmolLM / Llama 3 style, <|im_start|> <|im_end|>
CHATML: a ChatML template (as SmolLM2's, without the default system message)
"""

from __future__ import annotations

TEXT = (
    "The quick brown fox jumps over the lazy dog. Numbers like 12, 345 and 2024 appear.\n"
    "Tabs\tand  double  spaces, CRLF lines\r\nand café, naïve, 東京 and emoji 😀 too.\n"
) * 30

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _metaspace_decoder():
    from tokenizers import decoders

    return decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )


def sentencepiece_bpe(vocab_size: int = 400):
    """Byte-fallback BPE as Llama 2's tokenizer.json lays it out (ids 0-2 specials, 3-258 bytes)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors, trainers

    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    base.train_from_iterator(
        [TEXT], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False)
    )
    learned = json_model(base)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [t for t, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1])]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tok.decoder = _metaspace_decoder()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in tokens[:3]])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok


def unigram(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.decoder = decoders.Metaspace(prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer)
    return tok


def byte_level_bpe(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer)
    return tok


def json_model(tok) -> dict:
    import json

    return json.loads(tok.to_str())["model"]
