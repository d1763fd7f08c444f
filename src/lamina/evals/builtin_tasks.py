"""Built-in multiple-choice tasks made from the Shakespeare corpus lamina ships (no downloads).

    builtin_task(name, n=None, seed=0) -> Task       BUILTIN_TASKS: name -> one line about it

"next-line": a passage of 2 to 6 verse lines from a speech (its speaker tag first, as the text
    prints it); the choices are the line that follows and three lines drawn from other speeches
    of the same play. Delimiter "\\n" (each choice is scored as a new line). Chance 25%.
"next-line-2": next-line's items in the shape of task files written for lm-eval: the passage's
    last two lines as the context, each choice starting with its newline, delimiter "" (lm-eval's
    `target_delimiter: ""`). The same requests as a "\\n" delimiter, another acc_norm (the
    newline counts in a choice's length).
"which-play": a speech (160 to 600 characters, cut at a word), then "Question: Which
    Shakespeare play is this speech from?\\nAnswer:"; the choices are the play's title and three
    other plays' titles. Delimiter " ". Chance 25%.

All read the 36 First Folio plays of `lamina.data.genre.GENRES` (each from its first "ACT I"
line, as the genre task reads them; speeches and speaker tags found the same way). An item is
drawn by a `random.Random(seed)`: play, then speech, then the cut and the distractors; the
choices are shuffled by the same generator, so a (name, n, seed) is always the same task, item
for item. A model trained on the built-in corpus has read these passages (the tasks measure what
it learnt of the plays, not generalisation to unseen text).

Deliberately unaware of models and tokenizers.
"""

from __future__ import annotations

import functools
import random
import re

from lamina.data.builtin import builtin_root
from lamina.data.genre import _ACT_ONE, _PARAGRAPH, GENRES, _is_speaker
from lamina.errors import LaminaError
from lamina.evals.choice import ChoiceItem
from lamina.evals.tasks import Task

DEFAULT_ITEMS = 500

BUILTIN_TASKS: dict[str, str] = {
    "next-line": "which of four lines follows a Shakespeare passage (same play's lines as "
    "distractors)",
    "next-line-2": "next-line with two lines of context and choices that start with a newline "
    '(delimiter "")',
    "which-play": "which of four plays a Shakespeare speech is from",
}

TITLES: dict[str, str] = {
    "tempest": "The Tempest", "two_gentlemen_of_verona": "The Two Gentlemen of Verona",
    "merry_wives_of_windsor": "The Merry Wives of Windsor",
    "measure_for_measure": "Measure for Measure", "comedy_of_errors": "The Comedy of Errors",
    "much_ado_about_nothing": "Much Ado About Nothing",
    "loves_labours_lost": "Love's Labour's Lost",
    "midsummer_nights_dream": "A Midsummer Night's Dream",
    "merchant_of_venice": "The Merchant of Venice", "as_you_like_it": "As You Like It",
    "taming_of_the_shrew": "The Taming of the Shrew",
    "alls_well_that_ends_well": "All's Well That Ends Well", "twelfth_night": "Twelfth Night",
    "winters_tale": "The Winter's Tale", "john": "King John", "richard_ii": "Richard II",
    "henry_iv_part_1": "Henry IV, Part 1", "henry_iv_part_2": "Henry IV, Part 2",
    "henry_v": "Henry V", "henry_vi_part_1": "Henry VI, Part 1",
    "henry_vi_part_2": "Henry VI, Part 2", "henry_vi_part_3": "Henry VI, Part 3",
    "richard_iii": "Richard III", "henry_viii": "Henry VIII",
    "troilus_and_cressida": "Troilus and Cressida", "coriolanus": "Coriolanus",
    "tragedy_of_titus_andronicus": "Titus Andronicus", "romeo_and_juliet": "Romeo and Juliet",
    "timon_of_athens": "Timon of Athens", "julius_caesar": "Julius Caesar",
    "macbeth": "Macbeth", "hamlet": "Hamlet", "lear": "King Lear", "othello": "Othello",
    "antony_and_cleopatra": "Antony and Cleopatra", "cymbeline": "Cymbeline",
}  # fmt: skip

QUESTION = "\nQuestion: Which Shakespeare play is this speech from?\nAnswer:"
_DIRECTION = re.compile(r"\[[^\]]*\]")
_MIN_LINE = 12  # characters: shorter lines ("Ay.") make poor choices


def _plays() -> list[str]:
    return [p for plays in GENRES.values() for p in plays]


@functools.lru_cache(maxsize=1)
def _speeches() -> dict[str, tuple[tuple[str, tuple[str, ...]], ...]]:
    """play -> its speeches as (speaker tag, verse lines without stage directions)."""
    root = builtin_root()
    out = {}
    for play in _plays():
        f = root / f"{play}_gut.txt"
        if not f.is_file():
            raise LaminaError(f"the built-in corpus has no {f.name}; reinstall shakespeare")
        text = f.read_text(encoding="utf-8").lstrip("\ufeff")
        m = _ACT_ONE.search(text)
        speeches = []
        for para in _PARAGRAPH.split(text[m.start() :] if m else text):
            lines = para.strip().split("\n")
            if len(lines) < 2 or not _is_speaker(lines[0].strip()):
                continue
            verse = tuple(
                line
                for line in (" ".join(_DIRECTION.sub(" ", x).split()) for x in lines[1:])
                if line
            )
            if verse:
                speeches.append((lines[0].strip(), verse))
        out[play] = tuple(speeches)
    return out


def _shuffled(rng: random.Random, right: str, others: list[str]) -> tuple[tuple[str, ...], int]:
    choices = [right, *others]
    rng.shuffle(choices)
    return tuple(choices), choices.index(right)


def _next_line_item(rng: random.Random, play: str) -> ChoiceItem | None:
    speeches = _speeches()[play]
    tag, verse = rng.choice(speeches)
    if len(verse) < 3:
        return None
    k = rng.randint(2, min(6, len(verse) - 1))
    right = verse[k]
    if len(right) < _MIN_LINE:
        return None
    others: list[str] = []
    for _ in range(50):
        _, other = rng.choice(speeches)
        line = rng.choice(other)
        if len(line) >= _MIN_LINE and line != right and line not in others:
            others.append(line)
        if len(others) == 3:
            break
    if len(others) < 3:
        return None
    choices, gold = _shuffled(rng, right, others)
    return ChoiceItem("\n".join([tag, *verse[:k]]), choices, gold)


def _two_line_item(rng: random.Random, play: str) -> ChoiceItem | None:
    item = _next_line_item(rng, play)
    if item is None:
        return None
    context = "\n".join(item.context.split("\n")[-2:])
    return ChoiceItem(context, tuple("\n" + c for c in item.choices), item.gold)


def _which_play_item(rng: random.Random, play: str) -> ChoiceItem | None:
    _, verse = rng.choice(_speeches()[play])
    speech = " ".join(verse)
    if len(speech) < 160:
        return None
    if len(speech) > 600:
        speech = speech[:600].rsplit(" ", 1)[0]
    others = rng.sample([TITLES[p] for p in _plays() if p != play], 3)
    choices, gold = _shuffled(rng, TITLES[play], others)
    return ChoiceItem(speech + QUESTION, choices, gold)


_MAKERS = {
    "next-line": (_next_line_item, "\n"),
    "next-line-2": (_two_line_item, ""),
    "which-play": (_which_play_item, " "),
}


def builtin_task(name: str, n: int | None = None, seed: int = 0) -> Task:
    """`n` items (DEFAULT_ITEMS for None) of the built-in task `name`, drawn with `seed`."""
    if name not in _MAKERS:
        raise LaminaError(f"no built-in task {name!r}; the built-in tasks: {', '.join(_MAKERS)}")
    n = DEFAULT_ITEMS if n is None else n
    if n < 1:
        raise LaminaError(f"a built-in task needs at least 1 item, got {n}")
    make, delimiter = _MAKERS[name]
    rng, plays = random.Random(f"{name}:{seed}"), _plays()
    items: list[ChoiceItem] = []
    seen: set[str] = set()
    for _ in range(n * 50):
        item = make(rng, rng.choice(plays))
        if item is not None and item.context not in seen:
            seen.add(item.context)
            items.append(item)
            if len(items) == n:
                break
    return Task(
        name, "choice", tuple(items), source=f"built-in (seed {seed})", about=BUILTIN_TASKS[name],
        delimiter=delimiter,
    )  # fmt: skip
