"""Training byte-level BPE on a corpus of any size: bounded chunks, progress lines, Ctrl-C.

    text_chunks(text, size=CHUNK_CHARS) -> iterator of str, each at most `size` characters
    train_bpe_json(text, vocab_size, progress=None) -> the trained `tokenizers` JSON (a str)

The `tokenizers` trainer is fed `text_chunks(text)`, never the whole text as one string: given
one string it keeps about 190 bytes of bookkeeping per byte (a 50 MB one-line file took 9.4 GB),
and text without spaces is one pre-token ("word") whose merges cost the square of its length
(1 MB without spaces ran for minutes). A chunk is cut just before the last newline in its
window of `size` characters, else before the last space, else hard at `size` characters. Cutting
before whitespace gives the same pre-tokens (so the same merges) as the whole text, since
GPT-2's pre-tokenizer attaches a space to the word after it; only a run of more than `size`
non-space characters is cut into pieces, which bounds every word at `size` characters.

Memory (measured, tokenizers 0.23): about 25 MB of chunk bookkeeping, plus the distinct words
and their pair counts, about 55 bytes per character of distinct words. Prose repeats its words
(a 50 MB one-line file: 0.33 GB peak for the whole process, 22 s on 2 shared cores; given as
one string it took 9.4 GB and 82 s); text without spaces, where every chunk-sized piece is a new
word, needs about 55 bytes per character (10 MB: 0.55 GB; 1 MB trains in about 1 s).

Progress: `progress(line)` is called with a few lines (start, every 10% of the text read, the
merge phase, done). Ctrl-C: training runs in a worker thread (the `tokenizers` library releases
the GIL) while the calling thread waits, so Ctrl-C raises KeyboardInterrupt at once; the worker
stops at its next chunk (waited for, at most STOP_WAIT seconds), or, in the merge phase, finishes
in the background and is discarded.

Deliberately unaware of models, files and tokenizer JSON layout beyond what `tokenizers` writes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

CHUNK_CHARS = 4096
BYTES_PER_DISTINCT_CHAR = 55  # measured peak memory per character of distinct words
STOP_WAIT = 0.5  # seconds an interrupted call waits for the worker to stop


def text_chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """Consecutive pieces of `text` (joined, they are `text`), each at most `size` characters."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    start, n = 0, len(text)
    while start < n:
        end = start + size
        if end >= n:
            yield text[start:]
            return
        cut = text.rfind("\n", start + 1, end + 1)
        if cut < 0:
            cut = text.rfind(" ", start + 1, end + 1)
        if cut < 0:
            cut = end
        yield text[start:cut]
        start = cut


class _Stopped(Exception):
    """Raised inside the chunk iterator when the caller was interrupted."""


def bpe_setup(vocab_size: int, special_tokens: list[str]) -> tuple[Any, Any]:
    """A fresh byte-level BPE `tokenizers.Tokenizer` and its trainer, with lamina's settings
    (no prefix space, pairs seen at least twice, every byte in the alphabet)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def train_bpe_json(
    text: str,
    vocab_size: int,
    special_tokens: list[str],
    progress: Callable[[str], None] | None = None,
) -> str:
    """Train byte-level BPE on `text` (the special tokens first: ids 0, 1, ...); its JSON."""
    say = progress or (lambda line: None)
    tok, trainer = bpe_setup(vocab_size, special_tokens)
    n = len(text)
    worst = 25 + n * BYTES_PER_DISTINCT_CHAR / 1e6
    say(
        f"bpe: learning up to {vocab_size:,} ids from {n / 1e6:.1f} M characters (memory: up "
        f"to ~{worst:,.0f} MB if no word repeats; prose needs far less)"
    )
    stop = threading.Event()
    started = time.monotonic()

    reading_done = threading.Event()

    def chunks() -> Iterator[str]:
        try:
            done, next_report = 0, n / 10
            for chunk in text_chunks(text):
                if stop.is_set():
                    raise _Stopped
                yield chunk
                done += len(chunk)
                if done >= next_report and done < n:
                    say(f"bpe: read {100 * done / n:.0f}% of the text")
                    next_report += n / 10
        finally:
            reading_done.set()
        say("bpe: computing merges")

    failure: list[BaseException] = []

    def work() -> None:
        try:
            tok.train_from_iterator(chunks(), trainer=trainer, length=-(-n // CHUNK_CHARS))
        except BaseException as e:  # handed to the waiting thread
            failure.append(e)

    worker = threading.Thread(target=work, name="lamina-bpe", daemon=True)
    try:
        worker.start()  # inside the try: Ctrl-C may arrive before start() returns
        while worker.is_alive():
            worker.join(0.1)
    except BaseException:
        stop.set()
        # Reading: the trainer's reader stops at its next chunk; wait for it (a thread still in
        # Python code when the interpreter exits would crash it). Merging: it cannot stop and
        # runs no Python code; it is left to finish in the background.
        reading_done.wait(STOP_WAIT)
        raise
    if failure:
        raise failure[0]
    say(f"bpe: {tok.get_vocab_size():,} ids in {time.monotonic() - started:.1f} s")
    return tok.to_str()
