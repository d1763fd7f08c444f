"""What a chat template may build: the render limits and the checks that hold a template to them.

    RenderLimits(seconds=10.0, max_chars=4 Mi)   RENDER_LIMITS, the defaults of every render
    MAX_TEMPLATE_CHARS                 a template longer than this (1 Mi) is refused unread
    ACTIVE                             the limits of the render running now (a ContextVar)
    guard(SandboxedEnvironmentClass) -> the class, with every operation that could build a
        string, list or number past the limits in one C call checked before it runs
    sized(value, what)                 `value`, or a LaminaError when it is longer than allowed

The output cap (checked as the text is written) and the deadline (`lamina.bounds.deadline`) stop
most runaway templates; what they cannot stop is one call into C that allocates gigabytes before
it returns (``'x' * 3000000000``, ``'%9999999999s' % x``, ``s|center(10**9)``). Those are
checked here: ``*`` and ``**`` (no longer folded at compile time, where the MemoryError used to
happen), ``%`` and str.format with their widths, the center / indent / replace / format
filters, ``lipsum`` and ``strftime_now`` (its format at most 1,000 characters).

What this module deliberately does not know: messages and tokens.
"""

from __future__ import annotations

import contextvars
import re
import string
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lamina.errors import LaminaError

__all__ = ["ACTIVE", "MAX_TEMPLATE_CHARS", "RENDER_LIMITS", "RenderLimits", "guard", "sized"]


@dataclass(frozen=True)
class RenderLimits:
    """How long one render may run, and how many characters it may write."""

    seconds: float = 10.0
    max_chars: int = 4 * 2**20


RENDER_LIMITS = RenderLimits()
MAX_TEMPLATE_CHARS = 2**20  # real templates are under 50 KB
ACTIVE: contextvars.ContextVar[RenderLimits] = contextvars.ContextVar("limits")
_MAX_INT_BITS = 2**16  # ``**`` may build integers up to this many bits
_MAX_FORMAT = 1000  # characters in a strftime_now format
_NUMBER = re.compile(r"\d+")
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d*|\*)(?:\.(\d*|\*))?[hlL]?[a-zA-Z%]")


def _cap() -> int:
    return ACTIVE.get(RENDER_LIMITS).max_chars


def _too_big(what: str, size: int) -> LaminaError:
    return LaminaError(f"chat template's {what} has {size:,} items, over the {_cap():,} limit")


def sized(value: Any, what: str) -> Any:
    """`value` if it is no longer than the active limit allows."""
    if isinstance(value, (str, list, tuple)) and len(value) > _cap():
        raise _too_big(what, len(value))
    return value


def _widths(fmt: Any, what: str, args: Any = (), braces: bool = False) -> None:
    """Refuse a format string whose widths or precisions pass the limit: '%9999999999s' (printf
    style), or with `braces` '{:>9999999999}' (str.format); other numbers in it are text. A
    width taken from the arguments ('%*s', '{:{}}') is checked among `args`."""
    if not isinstance(fmt, str):
        return
    if braces:
        try:
            specs = [spec or "" for _, _, spec, _ in string.Formatter().parse(fmt)]
        except ValueError:
            return  # malformed: str.format says so itself
        numbers = [n for spec in specs for n in _NUMBER.findall(spec)]
        from_args = any("{" in spec for spec in specs)
    else:
        numbers = [n for m in _PERCENT.finditer(fmt) for n in m.groups() if n and n != "*"]
        from_args = any("*" in m.group(0) for m in _PERCENT.finditer(fmt))
    values = [v for v in (args if isinstance(args, (tuple, list)) else [args])]
    if isinstance(args, dict):
        values = list(args.values())
    widest = max(
        [*map(int, numbers), *(v for v in values if from_args and type(v) is int)], default=0
    )
    if widest > _cap():
        raise _too_big(f"{what} width", widest)


def _binop(op: str, left: Any, right: Any) -> Any:
    """``*``, ``**`` and ``%`` with their result's size checked before it is built."""
    if op == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
            if len(seq) * max(n, 0) > _cap():
                raise _too_big(f"'*' result (a {type(seq).__name__})", len(seq) * n)
        return left * right
    if op == "%":
        _widths(left, "'%' format", right)
        return left % right
    if isinstance(left, int) and isinstance(right, int) and right > 0:
        if abs(left).bit_length() * right > _MAX_INT_BITS:
            raise LaminaError(
                f"chat template computes {left} ** {right}, over {_MAX_INT_BITS:,} bits"
            )
    return left**right


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str) or len(fmt) > _MAX_FORMAT:
        size = len(fmt) if isinstance(fmt, str) else type(fmt).__name__
        raise LaminaError(f"chat template's strftime_now format is {size} long, over {_MAX_FORMAT}")
    return datetime.now().strftime(fmt)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    from jinja2.utils import generate_lorem_ipsum

    if not all(isinstance(v, int) for v in (n, min, max)) or n > 100 or max > 1000:
        raise LaminaError(f"chat template asks lipsum for {n} paragraphs of up to {max} words")
    return str(generate_lorem_ipsum(n=n, html=html, min=min, max=max))


def _guarded_filters(filters: dict[str, Any]) -> dict[str, Any]:
    center, indent, replace, fmt = (filters[n] for n in ("center", "indent", "replace", "format"))

    def center_(value: Any, width: int = 80) -> Any:
        if isinstance(width, int) and width > _cap():
            raise _too_big("center width", width)
        return center(value, width)

    def indent_(s: Any, width: Any = 4, *args: Any, **kwargs: Any) -> Any:
        lines = str(s).count("\n") + 1
        each = width if isinstance(width, int) else len(str(width))
        if each * lines > _cap():
            raise _too_big("indent result", each * lines)
        return indent(s, width, *args, **kwargs)

    def replace_(eval_ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> Any:
        if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
            n = s.count(old) if old else len(s) + 1
            n = min(n, count) if isinstance(count, int) and count >= 0 else n
            if len(s) + n * (len(new) - len(old)) > _cap():
                raise _too_big("replace result", len(s) + n * (len(new) - len(old)))
        return replace(eval_ctx, s, old, new, count)

    def format_(value: Any, *args: Any, **kwargs: Any) -> Any:
        _widths(value, "format filter", kwargs or args)
        return fmt(value, *args, **kwargs)

    replace_.jinja_pass_arg = getattr(replace, "jinja_pass_arg", None)  # type: ignore[attr-defined]
    return {"center": center_, "indent": indent_, "replace": replace_, "format": format_}


def guard(base: type) -> type:
    """A subclass of the sandboxed environment class `base` with every check above installed."""

    class Guarded(base):  # type: ignore[misc, valid-type]
        intercepted_binops = frozenset({"*", "**", "%"})  # checked at run time, never folded

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.filters.update(_guarded_filters(self.filters))
            self.globals["strftime_now"] = _strftime_now
            self.globals["lipsum"] = _lipsum

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator in self.intercepted_binops:
                return _binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt = value.__self__
            _widths(fmt, "str.format", braces=True)  # checked as the method is looked up

            def checked(*args: Any, **kwargs: Any) -> Any:
                _widths(fmt, "str.format", [*args, *kwargs.values()], braces=True)
                return wrapped(*args, **kwargs)

            return checked

    return Guarded
