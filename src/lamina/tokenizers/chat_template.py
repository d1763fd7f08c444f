"""Chat templates: a list of messages -> the text a chat model was trained on.

    render_chat_template(template, messages, add_generation_prompt=True, **variables) -> str
    assistant_spans(template, messages, **variables) -> (text, [(start, end), ...])
        the whole conversation rendered, and the character span each assistant message adds
        (what completion-only fine-tuning trains on).

Rendering follows Hugging Face transformers' ``apply_chat_template``: jinja2's
``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the loop-control
extension, ``raise_exception(msg)``, ``strftime_now(fmt)``, a ``tojson`` filter that does not
escape HTML, and the variables ``messages``, ``add_generation_prompt``, ``tools`` and
``documents`` (None) plus what the caller passes (``bos_token``, ``eos_token``...). Messages
are dicts with a string ``role``; keys whose value is None are dropped, as transformers does.
A template that fails, or that tries to leave the sandbox, is one LaminaError line.

Every render is bounded (`RenderLimits`; `limits=` overrides them for one call): it is stopped
after ``RENDER_LIMITS.seconds`` (10 s; `lamina.bounds.deadline`) and refused once its text
passes ``RENDER_LIMITS.max_chars`` (4 Mi characters, far above any model's context), checked as
the text is produced, so what reaches a tokenizer is never larger. A template longer than
``MAX_TEMPLATE_CHARS`` (1 Mi) is refused before it is compiled. Inside the template, what could
build a string past the bound in one step is checked before it runs (`template_bounds.guard`:
``*``, ``**``, ``%``, str.format, the center/indent/replace/format filters, ``namespace`` values,
``lipsum``, ``strftime_now``). Any error while compiling (a MemoryError, a RecursionError) is one
line too.

What this module deliberately does not know: tokens. It renders text; the tokenizer
(lamina.tokenizers.pretrained) encodes it and maps spans to tokens.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from lamina.bounds import deadline
from lamina.errors import LaminaError
from lamina.tokenizers.template_bounds import (
    ACTIVE,
    MAX_TEMPLATE_CHARS,
    RENDER_LIMITS,
    RenderLimits,
    guard,
    sized,
)

__all__ = [
    "MAX_TEMPLATE_CHARS",
    "RENDER_LIMITS",
    "RenderLimits",
    "assistant_spans",
    "check_messages",
    "render_chat_template",
]


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys=False
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=1)
def _environment() -> Any:
    """The one sandboxed environment (built, and jinja2 imported, outside any deadline: an
    exception landing inside an import would leave jinja2 half-initialised for the process)."""
    import jinja2
    import jinja2.constants  # noqa: F401 - what jinja2 imports lazily: lipsum's words,
    import jinja2.debug  # noqa: F401 - and the traceback rewriting of a failing render
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers' assistant marker): the body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """jinja2's namespace, refusing underscore names (no reaching into python internals)."""

        def __setitem__(self, name: str, value: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is refused")
            super().__setitem__(name, sized(value, f"namespace value {name!r}"))

    env = guard(ImmutableSandboxedEnvironment)(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["namespace"] = Namespace
    return env


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    try:
        return _environment().from_string(template)
    except Exception as e:  # a syntax error; a MemoryError or RecursionError while compiling
        raise LaminaError(f"chat template does not parse: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _plain(value: Any, where: str) -> Any:
    """A fresh copy of JSON-like data (str/int/float/bool/None, lists, dicts); else refused."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise LaminaError(f"chat {where} is a {type(value).__name__}; messages hold JSON-like data")


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages as plain dicts (None values dropped), each with a string role; else LaminaError."""
    if not isinstance(messages, (list, tuple)):
        raise LaminaError(f"chat messages must be a list of dicts, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise LaminaError(f"chat message {i} must be a dict, got {type(m).__name__}")
        if not isinstance(m.get("role"), str):
            raise LaminaError(f"chat message {i} needs a string 'role', got {m.get('role')!r}")
        out.append(_plain(m, f"message {i}"))
    return out


def render_chat_template(
    template: str | None,
    messages: Any,
    add_generation_prompt: bool = True,
    limits: RenderLimits | None = None,
    **variables: Any,
) -> str:
    """The conversation as the template writes it (nothing tokenized, nothing added), within
    `limits` (RENDER_LIMITS when None)."""
    if not isinstance(template, str) or not template:
        raise LaminaError("this tokenizer has no chat template, so it cannot render a chat")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise LaminaError(
            f"chat template is {len(template):,} characters, over the {MAX_TEMPLATE_CHARS:,} limit"
        )
    lim = limits or RENDER_LIMITS
    msgs = check_messages(messages)
    _environment()  # imports done before the deadline is armed
    token = ACTIVE.set(lim)
    try:
        with deadline(lim.seconds, "rendering the chat template"):
            compiled = _compile(template)
            return _write(
                compiled,
                lim.max_chars,
                dict(
                    {"tools": None, "documents": None, **variables},  # as transformers passes them
                    messages=msgs,
                    add_generation_prompt=bool(add_generation_prompt),
                ),
            )
    finally:
        ACTIVE.reset(token)


def _write(compiled: Any, max_chars: int, context: dict[str, Any]) -> str:
    """The template's text, refused as soon as it passes `max_chars`."""
    parts, size = [], 0
    try:
        for piece in compiled.generate(**context):
            size += len(piece)
            if size > max_chars:
                raise LaminaError(
                    f"chat template writes more than {max_chars:,} characters, the render limit"
                )
            parts.append(piece)
    except LaminaError:
        raise
    except Exception as e:  # TemplateError, SecurityError, and whatever the template trips on
        raise LaminaError(f"chat template failed: {_one_line(e)}") from None
    return "".join(parts)


def assistant_spans(
    template: str | None, messages: Any, **variables: Any
) -> tuple[str, list[tuple[int, int]]]:
    """The conversation (no generation prompt) and the characters each assistant turn adds.

    Turn i's span runs from the end of the conversation before it, rendered with the
    generation prompt, to the end of the conversation through it. The template must render
    conversations incrementally (each shorter conversation a prefix of the longer); one that
    does not (it rewrites earlier turns) is refused, since no span would be exact.
    """
    msgs = check_messages(messages)
    full = render_chat_template(template, msgs, False, **variables)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = render_chat_template(template, msgs[:i], True, **variables)
        through = render_chat_template(template, msgs[: i + 1], False, **variables)
        if not (through.startswith(before) and full.startswith(through)):
            raise LaminaError(
                f"chat template does not render message {i} incrementally (earlier text changes "
                "as the conversation grows), so its assistant tokens cannot be marked"
            )
        spans.append((len(before), len(through)))
    return full, spans
