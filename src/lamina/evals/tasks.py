"""Evaluation task files: JSONL, one item a line, read and validated.

    read_task(path) -> Task        kind "choice" (ChoiceItems) or "perplexity" (texts)
    Task(name, kind, items, texts, source)   .chance: the baseline of guessing uniformly

A multiple-choice line is an object with
    "context"  the text the choices continue (may be ""; "query" is accepted instead, the shape
               lm-eval's and many data sets' records have)
    "choices"  a list of at least two non-empty strings; each is scored as the continuation
               " " + choice (the delimiter is the scorer's, `--delimiter`)
    "gold"     the index of the right choice (an integer, 0-based)
Other fields are kept out of scoring (ids, sources: anything). A perplexity line is
    {"text": "..."}     each text is scored on its own (lamina.evals.perplexity)
One file holds one kind. Blank lines are skipped. Any other shape is refused in one line naming
the file, the line and the field (`LaminaError`), before anything is scored.

Deliberately unaware of models and tokenizers.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lamina.errors import LaminaError
from lamina.evals.choice import ChoiceItem, chance
from lamina.files import json_lines, kind_of

Kind = Literal["choice", "perplexity"]


@dataclass(frozen=True)
class Task:
    name: str
    kind: Kind
    items: tuple[ChoiceItem, ...] = ()
    texts: tuple[str, ...] = ()
    source: str = ""
    about: str = ""  # one line saying what the task is
    delimiter: str = " "  # between context and choice (lm-eval's target_delimiter)
    meta: tuple[dict[str, Any], ...] = field(default=(), compare=False)  # per item, for output

    @property
    def chance(self) -> float:
        return chance(self.items) if self.kind == "choice" else math.nan

    def limited(self, limit: int | None) -> Task:
        """The first `limit` items (or texts); all of them for None."""
        if limit is None:
            return self
        if limit < 1:
            raise LaminaError(f"--limit must be >= 1, got {limit}")
        return Task(
            self.name, self.kind, self.items[:limit], self.texts[:limit], self.source,
            self.about, self.delimiter, self.meta[:limit],
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.items) if self.kind == "choice" else len(self.texts)


def choice_item(obj: Any, where: str) -> ChoiceItem:
    """A ChoiceItem from one parsed JSON line (`where` names the line in errors)."""
    if not isinstance(obj, dict):
        raise LaminaError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    key = "context" if "context" in obj else "query" if "query" in obj else None
    if key is None:
        raise LaminaError(f'{where}: no "context" (or "query") field')
    context = obj[key]
    if not isinstance(context, str):
        raise LaminaError(f'{where}: "{key}" must be a string, got {type(context).__name__}')
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) < 2:
        raise LaminaError(f'{where}: "choices" must be a list of at least 2 strings')
    for i, c in enumerate(choices):
        if not isinstance(c, str) or not c:
            raise LaminaError(f'{where}: "choices"[{i}] must be a non-empty string, got {c!r}')
    gold = obj.get("gold")
    if isinstance(gold, bool) or not isinstance(gold, int):
        raise LaminaError(f'{where}: "gold" must be an integer index, got {gold!r}')
    if not 0 <= gold < len(choices):
        raise LaminaError(f'{where}: "gold" {gold} is not an index of its {len(choices)} choices')
    return ChoiceItem(context, tuple(choices), gold)


def _line_kind(obj: Any) -> Kind:
    if isinstance(obj, dict) and "text" in obj and "choices" not in obj:
        return "perplexity"
    return "choice"


def read_task(path: str | os.PathLike[str], delimiter: str = " ") -> Task:
    """The task in a JSONL file (see the module docstring); choices follow `delimiter`."""
    p = Path(path)
    if not p.is_file():
        kind = kind_of(p)
        if kind != "missing":
            raise LaminaError(f"--task {p} is a {kind}, not a regular file")
        raise LaminaError(f"--task {p}: no such file (nor a built-in task name)")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise LaminaError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    kind: Kind | None = None
    items: list[ChoiceItem] = []
    texts: list[str] = []
    meta: list[dict[str, Any]] = []
    for where, obj in json_lines(text, str(p)):
        this = _line_kind(obj)
        if kind is not None and this != kind:
            raise LaminaError(f"{where}: a {this} item in a file of {kind} items")
        kind = this
        if this == "perplexity":
            if not isinstance(obj["text"], str):
                raise LaminaError(f'{where}: "text" must be a string')
            texts.append(obj["text"])
        else:
            items.append(choice_item(obj, where))
        keep = ("context", "query", "choices", "gold", "text")
        meta.append({k: v for k, v in obj.items() if k not in keep})
    if kind is None:
        raise LaminaError(f"{p} holds no items")
    return Task(
        p.stem, kind, tuple(items), tuple(texts), str(p), delimiter=delimiter, meta=tuple(meta)
    )


def write_task(task: Task, path: str | os.PathLike[str]) -> None:
    """The task as a JSONL file `read_task` reads back (for the lm-eval bench and `--save`)."""
    from lamina.files import atomic_write

    if task.kind == "choice":
        rows = [
            {"context": i.context, "choices": list(i.choices), "gold": i.gold} for i in task.items
        ]
    else:
        rows = [{"text": t} for t in task.texts]
    blob = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    atomic_write(path, lambda f: f.write(blob))
