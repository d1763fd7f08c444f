"""Defaults that depend on the budget: the tokenizer and model shape a `lamina train --max-time T`
run gets.

    TABLE: rows (least budget s, least corpus bytes per budget second, tokenizer, model shape,
           the measurement behind it)
    pick(max_time, corpus) -> Pick(tokenizer, shape, why)   the first row that the run meets
    corpus_bytes(data) -> int | None   a text file's size, a folder's .txt files', the built-in
                                       corpus's (None: a prepared folder, unreadable)
    plan(given) -> (given, line | None)   `given` with the picked tokenizer and shape added,
        and the line the command prints about it; unchanged (and None) unless the run is a
        language model from text with --max-time and no --tokenizer, model field, --init-from,
        --preset or --resume

The rows come from bench/speedrun.py (BENCHMARKS.md, "Budget-dependent defaults"). A BPE
vocabulary sees about two characters per token, so a model of the same shape reads twice the
text per step; that wins while the run reads its corpus only once or twice (the loaded machine
of an earlier round: 0.7 passes at 120 s, bpe:1024 1.789 nats/char against char's 2.004). It
loses once the budget makes many passes: the 3 x 128 model then overfits BPE tokens first (a
quiet AMX Xeon reads ~80 kB of text a second as bpe:1024: 8.5 passes of tinyshakespeare in
120 s, bpe:1024 1.586 against char's 1.519; its held-out loss rose after 60 s). So BPE needs a
corpus of at least `per_second` bytes per budget second (2 passes at that rate), a rate
measured on one machine: a slower one makes fewer passes and would have gained from BPE
sooner. The batch, warmup and evaluations are then sized to the budget by sizing.py.

Deliberately unaware of the command line's parsing and of what a tokenizer computes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from lamina.data.shards import is_prepared


class Row(NamedTuple):
    seconds: float  # the budget is at least this
    per_second: int  # the corpus has at least this many bytes per second of the budget
    tokenizer: str
    shape: dict[str, Any]  # model fields over the CPU default shape ({}: that shape)
    why: str


TABLE: tuple[Row, ...] = (
    Row(
        120.0,
        40_000,
        "bpe:1024",
        {},
        "bpe:1024: the budget reads this corpus at most about twice; measured better than char "
        "over few passes, worse over many",
    ),
    Row(
        0.0,
        0,
        "char",
        {},
        "a character model: under 2 minutes, or with less than 40 kB of text per budget "
        "second (read many times, where BPE overfits first), char measured best",
    ),
)


@dataclass(frozen=True)
class Pick:
    tokenizer: str
    shape: dict[str, Any]
    why: str


def pick(max_time: float, corpus: int | None) -> Pick:
    """The first TABLE row whose budget and corpus size the run meets."""
    for row in TABLE:
        if max_time >= row.seconds and (corpus or 0) >= row.per_second * max_time:
            return Pick(row.tokenizer, dict(row.shape), row.why)
    return Pick("char", {}, TABLE[-1].why)


def _words(shape: dict[str, Any]) -> str:
    return ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in shape.items())


def corpus_bytes(data: str | None) -> int | None:
    """The corpus's size in bytes, without reading it (None where that is not a text corpus)."""
    if data is None:
        from lamina.data.builtin import builtin_root

        try:
            root = builtin_root()
        except Exception:  # noqa: BLE001 - not installed: the run refuses later, naming it
            return None
        return sum(len(f.read_bytes()) for f in root.iterdir() if f.name.endswith("_gut.txt"))
    path = Path(data).expanduser()
    if is_prepared(path):
        return None
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*.txt") if f.is_file())
        return os.path.getsize(path)
    except OSError:
        return None


def plan(given: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`given` plus the budget's tokenizer, and the line saying what was picked and why."""
    from lamina.training.registry import task_entry

    if not given.get("max_time") or not task_entry(given.get("task", "lm")).budget_tokenizer:
        return given, None
    if {"tokenizer", "init_from", "preset", "resume"} & set(given) or given.get("model_overrides"):
        return given, None  # the tokenizer and shape were measured together: both or neither
    corpus = corpus_bytes(given.get("data"))
    if corpus is None:
        return given, None
    chosen = pick(float(given["max_time"]), corpus)
    picked = f"--tokenizer {chosen.tokenizer}"
    out = {**given, "tokenizer": chosen.tokenizer}
    if chosen.shape:
        out["model_overrides"] = dict(chosen.shape)
        picked += ", " + _words(chosen.shape)
    line = (
        f"lamina train: plan for {given['max_time']:g} s on {corpus / 1e6:.2f} MB of text: "
        f"{picked} ({chosen.why}; pass --tokenizer or a model flag to choose)"
    )
    return out, line
