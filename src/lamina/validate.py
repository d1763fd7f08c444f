"""Field validators shared by every config: each raises `LaminaError` naming the field and rule.

    positive_int(name, value)           an int > 0 (bool refused)
    non_negative_int(name, value)       an int >= 0
    fraction(name, value)               a number in [0, 1)
    positive_number(name, value)        a finite number > 0
    non_negative_number(name, value)    a finite number >= 0
    choice(name, value, options)        one of `options`
    boolean(name, value)                True or False

A leaf: it imports only `lamina.errors`. Configs call these once, when they are built; code that
receives a built config trusts it and does not check again.
"""

from __future__ import annotations

import math
from typing import Any

from lamina.errors import LaminaError


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_int(name: str, value: Any) -> None:
    if not _is_int(value) or value <= 0:
        raise LaminaError(f"{name} must be a positive integer, got {value!r}")


def non_negative_int(name: str, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise LaminaError(f"{name} must be an integer >= 0, got {value!r}")


def fraction(name: str, value: Any) -> None:
    if not _is_number(value) or not 0.0 <= value < 1.0:
        raise LaminaError(f"{name} must be in [0, 1), got {value!r}")


def positive_number(name: str, value: Any) -> None:
    if not _is_number(value) or not (math.isfinite(value) and value > 0):
        raise LaminaError(f"{name} must be a positive number, got {value!r}")


def non_negative_number(name: str, value: Any) -> None:
    if not _is_number(value) or not (math.isfinite(value) and value >= 0):
        raise LaminaError(f"{name} must be a number >= 0, got {value!r}")


def choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise LaminaError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")


def boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise LaminaError(f"{name} must be true or false, got {value!r}")
