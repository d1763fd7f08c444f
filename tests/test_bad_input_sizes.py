"""Issue 17, class 5: every size a user can type is bounded or refused up front. Training a BPE
tokenizer is bounded in memory and time, shows progress and stops on Ctrl-C, whatever the corpus
(one huge line, no spaces at all); batches and synthetic tasks refuse sizes beyond memory."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from lamina.data.spec import build_tokenizer
from lamina.tokenizers import bpe_trainer
from lamina.tokenizers.bpe_trainer import CHUNK_CHARS, text_chunks
from lamina.tokenizers.subword import BPETokenizer

PROSE = "".join(
    f"line {i}: the king and the queen  of {'north' if i % 3 else 'south'}\tsay hello.\n"
    for i in range(400)
)


def test_chunks_rebuild_the_text_are_bounded_and_cut_before_whitespace():
    """Joined, the chunks are the text; none is longer than the bound; a cut lands just before
    a newline when the window has one, else before a space, else hard at the bound."""
    text = PROSE + "x" * 10_000 + " tail"
    chunks = list(text_chunks(text, 500))
    assert "".join(chunks) == text
    assert max(len(c) for c in chunks) <= 500
    cuts = [sum(map(len, chunks[: i + 1])) for i in range(len(chunks) - 1)]
    prose_cuts = [c for c in cuts if c < len(PROSE)]
    assert prose_cuts and all(text[c] == "\n" for c in prose_cuts)
    spaced = list(text_chunks("ab cd " * 100, 50))
    assert all(c.startswith(" ") for c in spaced[1:])  # cut before a space, none had a newline
    solid = list(text_chunks("y" * 1234, 100))
    assert [len(c) for c in solid] == [100] * 12 + [34]


def test_chunked_training_learns_what_the_whole_text_teaches():
    """Cutting before whitespace keeps every pre-token whole, so the merges are the same as
    training on the whole text at once (what the trainer was handed before)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    whole = Tokenizer(models.BPE())
    whole.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    whole.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    whole.train_from_iterator([PROSE], trainer=trainer)
    ours = json.loads(BPETokenizer.train(PROSE, 320).hf_json)["model"]
    reference = json.loads(whole.to_str())["model"]
    assert len(list(text_chunks(PROSE))) > 1, "the corpus must span several chunks"
    assert ours["vocab"] == reference["vocab"] and ours["merges"] == reference["merges"]


def test_the_trainer_is_never_handed_more_than_a_chunk(monkeypatch):
    """Text without a single space (one giant pre-token) reaches the trainer in pieces of at
    most CHUNK_CHARS characters, so no word is longer than that."""
    seen: list[int] = []
    real = bpe_trainer.text_chunks

    def spy(text, size=CHUNK_CHARS):
        for chunk in real(text, size):
            seen.append(len(chunk))
            yield chunk

    monkeypatch.setattr(bpe_trainer, "text_chunks", spy)
    text = "abcdefghij" * 3_000  # 30,000 characters, no whitespace
    tok = BPETokenizer.train(text, 300)
    assert sum(seen) == len(text) and max(seen) <= CHUNK_CHARS and len(seen) >= 8
    assert tok.decode(tok.encode(text[:500])) == text[:500]


def test_progress_lines_state_the_memory_and_spec_reports_big_corpora(capsys):
    """train(progress=...) gets a start line with the memory it needs, reading progress and a
    done line; build_tokenizer prints them to stderr for a corpus of 1 MB or more."""
    lines: list[str] = []
    BPETokenizer.train(PROSE, 300, lines.append)
    assert lines[0].startswith("bpe: learning up to 300 ids") and "MB" in lines[0]
    assert any("computing merges" in line for line in lines)
    assert lines[-1].startswith("bpe: ") and " ids in " in lines[-1]
    build_tokenizer("bpe:300", PROSE)
    assert capsys.readouterr().err == "", "a small corpus trains silently"
    big = "word " * 210_000  # 1.05 M characters
    build_tokenizer("bpe:260", big)
    err = capsys.readouterr().err
    assert "bpe: learning up to 260 ids" in err and "% of the text" in err


@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="needs POSIX signals")
def test_ctrl_c_interrupts_training_at_once():
    """SIGINT while the trainer works raises KeyboardInterrupt in the caller within a second,
    even though the trainer itself is busy (here: stalled in a progress call); once the trainer
    can look, it stops reading instead of finishing the corpus."""
    interrupted, release, lines = threading.Event(), threading.Event(), []

    def stall(line: str) -> None:
        lines.append(line)
        if "% of the text" in line and not interrupted.is_set():
            interrupted.set()
            os.kill(os.getpid(), signal.SIGINT)
            release.wait(10)  # the trainer is busy; the caller must not wait for it

    # Python's own Ctrl-C handler, whatever an earlier test in this process left installed (a
    # CI run on a loaded machine once saw no KeyboardInterrupt at all here).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            BPETokenizer.train("some words here\n" * 5_000, 300, stall)
        assert time.monotonic() - start < 2.0
    finally:
        release.set()
        signal.signal(signal.SIGINT, previous)
    time.sleep(0.3)  # the reader sees the stop flag at its next chunk
    assert not any("computing merges" in line for line in lines), lines


def test_batch_sizes_beyond_memory_are_refused_before_allocating():
    """A batch of more ids than MAX_BATCH_IDS, or a vocabulary torch cannot draw from, is a
    LaminaError up front, not torch's allocation RuntimeError or numpy's MemoryError."""
    import numpy as np

    from lamina import LaminaError
    from lamina.data.batches import MAX_BATCH_IDS, WindowSampler
    from lamina.data.toy_tasks import copy_batch, first_last_batch

    sampler = WindowSampler(np.arange(100), 8)
    with pytest.raises(LaminaError, match="ids in one batch is more than"):
        sampler.sample(MAX_BATCH_IDS // 9 + 1)
    assert sampler.sample(4)[0].shape == (4, 8)
    with pytest.raises(LaminaError, match="ids in one batch is more than"):
        first_last_batch(2, 10**12)
    with pytest.raises(LaminaError, match="ids in one batch is more than"):
        copy_batch(10**9, 8)
    with pytest.raises(LaminaError, match="vocab_size must be at most"):
        first_last_batch(2, 8, 10**30)


def test_config_describing_a_huge_model_is_refused_before_building_it(tmp_path):
    """A config.json whose model would need terabytes (a corrupt or foreign file next to small
    weights) is refused from the arithmetic, before any allocation."""
    import json

    import lamina
    from lamina import GPT, GPTConfig, LaminaError

    cfg = GPTConfig(vocab_size=16, block_size=8, d_model=8, n_layers=1, n_heads=2)
    d = lamina.save(tmp_path / "m", GPT(cfg))
    data = json.loads((d / "config.json").read_text())
    for field, value in [("vocab_size", 10**12), ("n_layers", 10**9)]:
        (d / "config.json").write_text(
            json.dumps({**data, "model": {**data["model"], field: value}})
        )
        with pytest.raises(
            LaminaError, match=r"parameters, but .*model.safetensors holds only .* bytes"
        ):
            lamina.load(d)


def test_prompt_files_are_read_up_to_a_bound(tmp_path, monkeypatch, capsys):
    """`--prompt-file /dev/zero` must not read forever: past MAX_PROMPT_BYTES it is refused."""
    import lamina
    from lamina import GPT, GPTConfig
    from lamina.cli import main, sample
    from lamina.data import CharTokenizer

    tok = CharTokenizer.from_text("ab\n")
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=8, d_model=8, n_layers=1, n_heads=2)
    d = lamina.save(tmp_path / "m", GPT(cfg), tok)
    monkeypatch.setattr(sample, "MAX_PROMPT_BYTES", 1024)
    (tmp_path / "p.txt").write_text("ab" * 513)
    assert main(["sample", str(d), "--prompt-file", str(tmp_path / "p.txt")]) == 2
    assert "is longer than" in capsys.readouterr().err
    (tmp_path / "p.txt").write_text("ab" * 512)
    assert (
        main(["sample", str(d), "--prompt-file", str(tmp_path / "p.txt"), "--max-new-tokens", "1"])
        == 0
    )


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_an_endless_binary_corpus_is_refused_at_its_first_block():
    """`--data /dev/zero` used to read until memory ran out before the NUL check ran."""
    from lamina import LaminaError
    from lamina.data.corpus import load_corpus

    with pytest.raises(LaminaError, match="looks binary .NUL byte at byte offset 0"):
        load_corpus("/dev/zero")


def test_sample_refuses_max_new_tokens_beyond_the_bound_before_writing(tmp_path, capsys):
    """`--max-new-tokens 10**21` is one line before anything is printed (it used to print the
    prompt, then fail)."""
    import lamina
    from lamina import GPT, GPTConfig
    from lamina.cli import main
    from lamina.data import CharTokenizer

    tok = CharTokenizer.from_text("ab\n")
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=8, d_model=8, n_layers=1, n_heads=2)
    d = lamina.save(tmp_path / "m", GPT(cfg), tok)
    assert main(["sample", str(d), "--prompt", "ab", "--max-new-tokens", str(10**21)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--max-new-tokens must be at most 268,435,456" in captured.err
