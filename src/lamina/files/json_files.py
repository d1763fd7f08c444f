"""Strict, bounded JSON: written atomically, read naming the file, nested at most 64 deep.

    write_json(path, data) / read_json(path)   UTF-8 JSON files; reading errors name the file
    loads_json(text, where) / json_lines(text, source)   parsing that refuses data nested deeper
                                               than MAX_JSON_DEPTH (one line, never a
                                               RecursionError)
    check_depth(value, limit, where)           measure any JSON-like value without recursing
    to_json(data, **dumps_args)                strict JSON text (NaN and infinities become
                                               null): what every --json line and JSONL prints

Deliberately unaware of what the JSON means (lamina.schema checks shapes).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lamina.errors import LaminaError
from lamina.files.output_rule import atomic_write

MAX_JSON_DEPTH = 64  # arrays/objects inside each other; lamina's own formats use 4 at most


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def to_json(data: Any, **dumps_args: Any) -> str:
    """`json.dumps(data)` as strict JSON: a NaN or an infinity anywhere becomes null."""
    return json.dumps(_finite(data), allow_nan=False, **dumps_args)


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Atomic JSON write (temp file, fsync, rename)."""
    payload = (json.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8")
    atomic_write(path, lambda f: f.write(payload))


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a UTF-8 JSON file; a missing or malformed file raises ``LaminaError`` naming it."""
    p = Path(path)
    try:
        return loads_json(p.read_text(encoding="utf-8"), str(p))
    except FileNotFoundError as exc:
        raise LaminaError(f"missing file: {p}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LaminaError(f"{p} is not valid JSON: {exc}") from exc


def json_lines(text: str, source: str) -> Iterator[tuple[str, Any]]:
    """The JSON value of each non-blank line of a JSONL text, with where it stands
    ("SOURCE line N"); a line that is not JSON raises ``LaminaError`` naming it."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source} line {n}"
        try:
            yield where, loads_json(line, where)
        except json.JSONDecodeError as exc:
            raise LaminaError(f"{where}: not valid JSON ({exc.msg})") from None


def _too_deep(where: str, limit: int) -> LaminaError:
    return LaminaError(f"{where}: arrays and objects nest deeper than {limit} levels")


def check_depth(value: Any, limit: int, where: str) -> Any:
    """`value` if its lists/dicts nest at most `limit` deep; else LaminaError naming `where`.

    Iterative (no recursion of its own), so any depth is measured without a RecursionError."""
    stack = [(value, 0)] if isinstance(value, (list, tuple, dict)) else []
    while stack:
        item, depth = stack.pop()
        if depth >= limit:
            raise _too_deep(where, limit)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (list, tuple, dict)))
    return value


def loads_json(text: str | bytes, where: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, refusing data nested deeper than `limit` (json's own recursion included);
    a syntax error is left to the caller (json.JSONDecodeError)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(where, limit) from None
    brackets = ("[", "{") if isinstance(text, str) else (b"[", b"{")
    if sum(text.count(b) for b in brackets) > limit:  # type: ignore[arg-type]
        check_depth(value, limit, where)
    return value
