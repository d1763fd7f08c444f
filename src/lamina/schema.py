"""Typed shapes for the JSON files lamina reads: one checker, one kind of error.

Every on-disk JSON format (config.json, index.json, trainer_state.json, metrics.jsonl,
tokenizer.json, labels.json, train_config.json) is read through a shape declared here or beside
its reader, so a missing field, a wrong type, a list of the wrong length or a number out of
range is one `LaminaError` naming the file and the field, never a KeyError or TypeError later.

    Obj(fields, optional={})     a JSON object holding `fields` (name -> shape) and maybe
                                 `optional` ones; other fields are kept as they are
    Arr(item, min_len=0, max_len=None)     a JSON array of one shape
    Map(value, int_keys=False)   an object of any keys (or "0", "1", ...), values of one shape
    Int(lo=None, hi=None)  Num(lo=None, hi=None)  Str(nonempty=False)  Bool()  Any_()
    OneOf(*values)               one of the given constants
    Maybe(shape)                 the shape, or null
    FileName()                   a plain file name: no folder part, not "." or ".."
    check(shape, value, source) -> value      LaminaError("{source}: {field}: expected ...")

Deliberately small and hand-written (no dependency): shapes only, no coercion and no defaults;
what a field means is its reader's business. A leaf: it imports only `lamina.errors`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lamina.errors import LaminaError

__all__ = [
    "Any_",
    "Arr",
    "Bool",
    "FileName",
    "Int",
    "Map",
    "Maybe",
    "Num",
    "Obj",
    "OneOf",
    "Str",
    "check",
]


class _Bad(Exception):
    def __init__(self, where: str, message: str) -> None:
        super().__init__(where, message)
        self.where, self.message = where, message


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _got(value: Any) -> str:
    kind = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )
    return f"{kind} {_show(value)}" if not isinstance(value, (dict, list)) else kind


class Shape:
    what = "a value"

    def __call__(self, value: Any, where: str) -> Any:
        raise NotImplementedError

    def bad(self, value: Any, where: str) -> _Bad:
        return _Bad(where, f"expected {self.what}, got {_got(value)}")


class Any_(Shape):
    def __call__(self, value: Any, where: str) -> Any:
        return value


class Bool(Shape):
    what = "true or false"

    def __call__(self, value: Any, where: str) -> Any:
        if not isinstance(value, bool):
            raise self.bad(value, where)
        return value


class _Ranged(Shape):
    """A number of one kind (`floats` too, and then finite), optionally within [lo, hi]."""

    def __init__(self, lo: float | None, hi: float | None, floats: bool, noun: str) -> None:
        self.lo, self.hi, self.floats = lo, hi, floats
        rng = [f">= {lo}"] * (lo is not None) + [f"<= {hi}"] * (hi is not None)
        self.what = noun + (f" {' and '.join(rng)}" if rng else "")

    def __call__(self, value: Any, where: str) -> Any:
        kinds = (int, float) if self.floats else (int,)
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise self.bad(value, where)
        if self.floats and not math.isfinite(value):
            raise self.bad(value, where)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise self.bad(value, where)
        return value


class Int(_Ranged):
    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        super().__init__(lo, hi, False, "an integer")


class Num(_Ranged):
    def __init__(self, lo: float | None = None, hi: float | None = None) -> None:
        super().__init__(lo, hi, True, "a finite number")


class Str(Shape):
    def __init__(self, nonempty: bool = False) -> None:
        self.nonempty = nonempty
        self.what = "a non-empty string" if nonempty else "a string"

    def __call__(self, value: Any, where: str) -> Any:
        if not isinstance(value, str) or (self.nonempty and not value):
            raise self.bad(value, where)
        return value


class FileName(Shape):
    what = "a plain file name (no folder part)"

    def __call__(self, value: Any, where: str) -> Any:
        if (
            not isinstance(value, str)
            or value in ("", ".", "..")
            or "/" in value
            or "\\" in value
            or "\0" in value
        ):
            raise self.bad(value, where)
        return value


class OneOf(Shape):
    def __init__(self, *values: Any) -> None:
        self.values = values
        self.what = "one of " + ", ".join(map(repr, values))

    def __call__(self, value: Any, where: str) -> Any:
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise self.bad(value, where)
        return value


class Maybe(Shape):
    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.what = f"{shape.what} or null"

    def __call__(self, value: Any, where: str) -> Any:
        return None if value is None else self.shape(value, where)


class Arr(Shape):
    def __init__(self, item: Shape, min_len: int = 0, max_len: int | None = None) -> None:
        self.item, self.min_len, self.max_len = item, min_len, max_len
        self.what = "an array"

    def __call__(self, value: Any, where: str) -> Any:
        if not isinstance(value, list):
            raise self.bad(value, where)
        n = len(value)
        if n < self.min_len or (self.max_len is not None and n > self.max_len):
            hi = "" if self.max_len is None else f" and at most {self.max_len}"
            raise _Bad(where, f"expected at least {self.min_len}{hi} items, got {n}")
        return [self.item(v, f"{where}[{i}]") for i, v in enumerate(value)]


class Map(Shape):
    what = "an object"

    def __init__(self, value: Shape, int_keys: bool = False) -> None:
        self.value, self.int_keys = value, int_keys
        if int_keys:
            self.what = "an object keyed by integers"

    def __call__(self, value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise self.bad(value, where)
        if self.int_keys and not all(k.isascii() and k.isdigit() for k in value):
            raise self.bad(value, where)
        return {k: self.value(v, f"{where}.{k}") for k, v in value.items()}


class Obj(Shape):
    what = "an object"

    def __init__(
        self, fields: Mapping[str, Shape], optional: Mapping[str, Shape] | None = None
    ) -> None:
        self.fields, self.optional = dict(fields), dict(optional or {})

    def __call__(self, value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise self.bad(value, where)
        out = dict(value)
        for name, shape in self.fields.items():
            if name not in value:
                raise _Bad(where, f"has no {name!r} field")
            out[name] = shape(value[name], f"{where}.{name}" if where else name)
        for name, shape in self.optional.items():
            if name in value:
                out[name] = shape(value[name], f"{where}.{name}" if where else name)
        return out


def check(shape: Shape, value: Any, source: str) -> Any:
    """`value` if it has `shape`; else a LaminaError naming `source` and the field at fault."""
    try:
        return shape(value, "")
    except _Bad as bad:
        field = f" {bad.where}:" if bad.where else ""
        raise LaminaError(f"{source}:{field} {bad.message}") from None
