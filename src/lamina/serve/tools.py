"""Tool calling in OpenAI's shape, through the model's own chat template.

    supports_tools(template) -> bool         the template renders a `tools` variable
    check_tools(tools) -> list               OpenAI's function list, checked (RequestError)
    check_choice(choice, tools) -> "none" | "auto" | "required" | a function name
    template_message(message) -> dict        an assistant message's tool_calls as templates
                                             read them (arguments a dict, not a JSON string)
    call_schema(tools, name=None) -> dict     JSON schema of one call {"name", "arguments"}
    parse_calls(text) -> (content | None, [tool_call])   <tool_call>{...}</tool_call> blocks

Tool calls are written the way Qwen2.5/Qwen3 and Hermes templates ask a model to write them:
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. With `tool_choice` "required"
or a named function, the reply is opened with `<tool_call>\\n` (appended to the prompt) and the
JSON after it is decoded under `call_schema` (the declared functions' parameter schemas), so it
always parses into a call. With "auto" the model writes freely and any blocks it writes are
parsed; text around them stays the content. "none" renders the tools but parses nothing.

Deliberately unaware of HTTP and of the batch.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from lamina.errors import LaminaError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolError(LaminaError):
    """A tools or tool_choice field OpenAI's API would refuse (HTTP 400)."""


def supports_tools(template: str | None) -> bool:
    """Whether the chat template renders tools (it names the `tools` variable), as
    llama.cpp decides it."""
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


def check_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list) or not tools:
        raise ToolError("tools must be a non-empty list of functions")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise ToolError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}')
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    if len({t["function"]["name"] for t in out}) != len(out):
        raise ToolError("tools: two functions have the same name")
    return out


def check_choice(choice: Any, tools: list[dict[str, Any]] | None) -> str:
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise ToolError(f"tool_choice {choice!r} needs tools")
        return choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not name:
        raise ToolError(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}'
        )
    if name not in {t["function"]["name"] for t in tools or []}:
        raise ToolError(f"tool_choice names {name!r}, which is not in tools")
    return name


def template_message(m: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with tool_calls as chat templates read them: each call's
    `arguments` a dict (OpenAI sends a JSON string); other messages unchanged."""
    calls = m.get("tool_calls")
    if not calls:
        return m
    if not isinstance(calls, list):
        raise ToolError("tool_calls must be a list")
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ToolError("each tool_calls entry needs function.name and function.arguments")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as exc:
                raise ToolError(f"tool_calls arguments are not JSON: {exc}") from None
        out.append({**c, "function": {"name": fn["name"], "arguments": args}})
    return {**m, "tool_calls": out}


def call_schema(tools: list[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    """The JSON schema of one call: {"name": a declared function, "arguments": its parameters}."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"]["parameters"],
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
        if name is None or t["function"]["name"] == name
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def parse_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The content outside <tool_call> blocks (None if blank) and the calls in them (a block
    whose JSON has no name is left in the content)."""
    calls, kept, last = [], [], 0
    for m in _BLOCK.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        kept.append(text[last : m.start()])
        last = m.end()
        calls.append(
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": obj["name"], "arguments": json.dumps(args)},
            }
        )
    content = "".join(kept) + text[last:]
    return (content.strip() or None) if calls else (content or None), calls
