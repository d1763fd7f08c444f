"""The built-in classification task: is this speech from a comedy, a history or a tragedy?

    genre_task(min_chars=MIN_CHARS) -> LabelledTexts    speeches of the 36 First Folio plays in
                                                        the built-in corpus, labelled by genre
    GENRES: genre -> the plays' file stems (`<stem>_gut.txt`)

Each play is read from its first "ACT I" / "ACT FIRST" line on (the cast list and title pages
are skipped). A speech is a paragraph (blank-line separated) whose first line is a speaker tag:
at most 40 characters, starting with a capital, ending with "." or written in capitals ("HAM.",
"SIR TOBY.", "EGEUS"). The text is the rest of the paragraph with stage directions in [brackets]
removed and whitespace (line breaks included) collapsed to single spaces; the speaker tag is not
part of the text. Speeches shorter than `min_chars` characters ("He.", "Ay, my lord.") carry
almost no signal and are dropped.

The genres are the First Folio's (1623) three sections; Troilus and Cressida, which the Folio
leaves unlisted, counts as a tragedy, as does Cymbeline (the Folio's last tragedy). Pericles
(not in the Folio) and the poems are left out. With the default `min_chars` the task has about
22,500 speeches: comedy 39%, tragedy 33%, history 28% (so always answering "comedy" scores
39%, the majority baseline). Read once per process (about 3 s) and cached.

Deliberately unaware of tokenizers, tensors and training.
"""

from __future__ import annotations

import functools
import re

from lamina.data.builtin import builtin_root
from lamina.data.labelled import LabelledTexts
from lamina.errors import LaminaError

GENRE_TASK_NAME = "shakespeare-genre (built-in)"
MIN_CHARS = 32

GENRES: dict[str, tuple[str, ...]] = {
    "comedy": (
        "tempest", "two_gentlemen_of_verona", "merry_wives_of_windsor", "measure_for_measure",
        "comedy_of_errors", "much_ado_about_nothing", "loves_labours_lost",
        "midsummer_nights_dream", "merchant_of_venice", "as_you_like_it", "taming_of_the_shrew",
        "alls_well_that_ends_well", "twelfth_night", "winters_tale",
    ),
    "history": (
        "john", "richard_ii", "henry_iv_part_1", "henry_iv_part_2", "henry_v", "henry_vi_part_1",
        "henry_vi_part_2", "henry_vi_part_3", "richard_iii", "henry_viii",
    ),
    "tragedy": (
        "troilus_and_cressida", "coriolanus", "tragedy_of_titus_andronicus", "romeo_and_juliet",
        "timon_of_athens", "julius_caesar", "macbeth", "hamlet", "lear", "othello",
        "antony_and_cleopatra", "cymbeline",
    ),
}  # fmt: skip

_ACT_ONE = re.compile(r"^[ \t]*ACT[ \t]+(I|1|FIRST|ONE)\b", re.IGNORECASE | re.MULTILINE)
_PARAGRAPH = re.compile(r"\n[ \t]*\n")
_DIRECTION = re.compile(r"\[[^\]]*\]")


def _is_speaker(line: str) -> bool:
    if not line or len(line) > 40 or not line[0].isupper() or "[" in line:
        return False
    return line.endswith(".") or line == line.upper()


def speeches(play_text: str) -> list[str]:
    """The speeches of one play's text (see the module docstring), in order."""
    m = _ACT_ONE.search(play_text)
    body = play_text[m.start() :] if m else play_text
    out = []
    for para in _PARAGRAPH.split(body):
        lines = para.strip().split("\n")
        if len(lines) < 2 or not _is_speaker(lines[0].strip()):
            continue
        text = " ".join(_DIRECTION.sub(" ", " ".join(lines[1:])).split())
        if text:
            out.append(text)
    return out


def genre_task(min_chars: int = MIN_CHARS) -> LabelledTexts:
    """Every speech of at least `min_chars` characters, labelled comedy / history / tragedy."""
    texts, labels = _genre_speeches(min_chars)
    return LabelledTexts(list(texts), list(labels), GENRE_TASK_NAME)


@functools.lru_cache(maxsize=2)
def _genre_speeches(min_chars: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    root = builtin_root()
    texts: list[str] = []
    labels: list[str] = []
    for genre, plays in GENRES.items():
        for play in plays:
            f = root / f"{play}_gut.txt"
            if not f.is_file():
                raise LaminaError(f"the built-in corpus has no {f.name}; reinstall shakespeare")
            for s in speeches(f.read_text(encoding="utf-8").lstrip("\ufeff")):
                if len(s) >= min_chars:
                    texts.append(s)
                    labels.append(genre)
    return tuple(texts), tuple(labels)
