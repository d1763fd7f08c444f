"""Chat and instruction data for supervised fine-tuning: files in, (tokens, loss mask) out.

    read_examples(path) -> list[Example] | None   None for plain text (an ordinary LM corpus)
    encode_example(tokenizer, example, train_on_prompt=False) -> (ids, mask)
        mask[i] is True where token i is a target the loss covers (assistant / completion
        tokens, and the end-of-turn token that closes them); with train_on_prompt every token
    pad_rows(rows, block_size) -> (inputs (B, T), targets (B, T)) int64, targets -100 where
        the loss ignores them (prompt tokens, padding); one example per row, right-padded

Files (the format is read from the content, not the name):
  * JSONL of {"messages": [{"role", "content"}, ...]} (roles system, user, assistant, tool);
  * JSONL of {"prompt", "completion"} -> a user turn and an assistant turn;
  * Alpaca: a JSON array (or JSONL) of {"instruction", "input" (optional), "output"}
    -> a user turn (instruction, then the input after a blank line) and an assistant turn;
  * anything else that is text: plain text, for next-token training on every token.
A bad record is one LaminaError naming the file, the line (or item) and the field.

Rendering: a tokenizer with a chat template renders every example with it, through its
`chat_with_mask(messages)` (True on assistant content); the token that ends an assistant turn
(one of its `eot_ids`) is added to the mask, so the model learns to stop. A tokenizer without a
template (lamina's char, byte, bpe) gets plain text: prompt + completion as they are, Alpaca's
own "### Instruction / ### Response" layout, and chats as "User: ...\\nAssistant: ...\\n" turns.

One example per row, never packed: with causal attention and padding only on the right, no
token ever attends to another example or to a pad, so no attention mask is needed. Rows longer
than the block are cut at the end (the start of a conversation is kept).

Deliberately unaware of models, losses and training loops (IGNORE is the value they skip).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lamina.errors import LaminaError
from lamina.files import loads_json

IGNORE = -100  # the target value cross_entropy's ignore_index skips
ROLES = ("system", "user", "assistant", "tool")
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"


@dataclass(frozen=True)
class Example:
    """One training conversation, in the form it came in (kind picks the plain-text layout)."""

    kind: str  # "chat", "completion" or "alpaca"
    messages: tuple[dict[str, str], ...]
    where: str  # file and line, for messages about it


def _text(record: dict[str, Any], field: str, where: str, required: bool = True) -> str:
    value = record.get(field, None if required else "")
    if not isinstance(value, str):
        raise LaminaError(f"{where}: field {field!r} must be a string, got {value!r:.60}")
    return value


def _chat(record: dict[str, Any], where: str) -> Example:
    msgs = record["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise LaminaError(f"{where}: 'messages' must be a non-empty list of {{role, content}}")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            got = m.get("role") if isinstance(m, dict) else m
            raise LaminaError(
                f"{where}: messages[{i}] needs a role among {', '.join(ROLES)}, got {got!r:.60}"
            )
        out.append({"role": m["role"], "content": _text(m, "content", f"{where} messages[{i}]")})
    if not any(m["role"] == "assistant" for m in out):
        raise LaminaError(f"{where}: the conversation has no assistant turn to learn from")
    return Example("chat", tuple(out), where)


def _completion(record: dict[str, Any], where: str) -> Example:
    prompt, completion = _text(record, "prompt", where), _text(record, "completion", where)
    msgs = ({"role": "user", "content": prompt}, {"role": "assistant", "content": completion})
    return Example("completion", msgs, where)


def _alpaca(record: dict[str, Any], where: str) -> Example:
    instruction, extra = _text(record, "instruction", where), _text(record, "input", where, False)
    output = _text(record, "output", where)
    user = f"{instruction}\n\n{extra}" if extra else instruction
    msgs = ({"role": "user", "content": user}, {"role": "assistant", "content": output})
    return Example("alpaca", msgs, where)


def parse_record(record: Any, where: str) -> Example:
    """One JSON record in any of the three instruction formats."""
    if not isinstance(record, dict):
        raise LaminaError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        return _chat(record, where)
    if "prompt" in record or "completion" in record:
        return _completion(record, where)
    if "instruction" in record or "output" in record:
        return _alpaca(record, where)
    raise LaminaError(
        f"{where}: a record needs 'messages', 'prompt' and 'completion', or 'instruction' and "
        f"'output'; it has {', '.join(map(repr, list(record)[:5])) or 'no fields'}"
    )


def _jsonl_records(text: str) -> list[tuple[Any, int]] | None:
    """(record, line number) for a JSONL text whose first non-empty line is an object."""
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not lines or not lines[0][1].lstrip().startswith("{"):
        return None
    try:
        loads_json(lines[0][1], f"line {lines[0][0]}")
    except json.JSONDecodeError:
        return None
    out = []
    for n, line in lines:
        try:
            out.append((loads_json(line, f"line {n}"), n))
        except json.JSONDecodeError as e:
            raise LaminaError(f"line {n}: not valid JSON ({e.msg})") from None
    return out


def read_examples(path: str | os.PathLike[str]) -> list[Example] | None:
    """The examples of an instruction file, or None when the file is plain text."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LaminaError(f"--data {p}: cannot read it as UTF-8 text ({e})") from e
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = loads_json(text, str(p))
        except json.JSONDecodeError:
            return None  # text that happens to start with a bracket
        if not isinstance(items, list) or not items:
            raise LaminaError(f"{p}: a JSON file of examples must be a non-empty array")
        return [parse_record(r, f"{p} item {i}") for i, r in enumerate(items)]
    try:
        records = _jsonl_records(text)
    except LaminaError as e:
        raise LaminaError(f"{p} {e}") from None
    if records is None:
        return None
    return [parse_record(r, f"{p} line {n}") for r, n in records]


def _plain_text(example: Example) -> list[tuple[str, bool]]:
    """(text, is target) pieces for a tokenizer without a chat template."""
    msgs = example.messages
    if example.kind == "completion":
        return [(msgs[0]["content"], False), (msgs[1]["content"], True)]
    if example.kind == "alpaca":
        instruction, _, extra = msgs[0]["content"].partition("\n\n")
        template = ALPACA_PROMPT_INPUT if extra else ALPACA_PROMPT
        return [(template.format(instruction=instruction, input=extra), False),
                (msgs[1]["content"], True)]  # fmt: skip
    pieces = []
    for m in msgs:
        label = m["role"].capitalize() + ": "
        if m["role"] == "assistant":
            pieces += [(label, False), (m["content"] + "\n", True)]
        else:
            pieces.append((label + m["content"] + "\n", False))
    return pieces


def _close_turns(ids: list[int], mask: list[bool], eot: set[int]) -> list[bool]:
    """Also train on the end-of-turn token right after each assistant span."""
    out = list(mask)
    for i in range(1, len(ids)):
        if mask[i - 1] and not mask[i] and ids[i] in eot:
            out[i] = True
    return out


def encode_example(
    tokenizer: Any, example: Example, train_on_prompt: bool = False
) -> tuple[list[int], list[bool]]:
    """Token ids of one example and the mask of tokens the loss covers."""
    if getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "chat_with_mask"):
        ids, mask = tokenizer.chat_with_mask(list(example.messages))
        ids, mask = list(ids), [bool(m) for m in mask]
        mask = _close_turns(ids, mask, set(getattr(tokenizer, "eot_ids", ()) or ()))
    else:
        ids, mask = [], []
        bos = getattr(tokenizer, "bos_id", None)
        if bos is not None and getattr(tokenizer, "add_bos", False):
            ids, mask = [bos], [False]
        for text, target in _plain_text(example):
            piece = tokenizer.encode(text)
            ids += piece
            mask += [target] * len(piece)
        eos = getattr(tokenizer, "eos_id", None)
        if eos is not None:
            ids.append(eos)
            mask.append(True)
    if not any(mask):
        raise LaminaError(f"{example.where}: the example has no tokens to learn from")
    return ids, [True] * len(ids) if train_on_prompt else mask


def pad_rows(
    rows: list[tuple[list[int], list[bool]]], block_size: int, pad_id: int = 0
) -> tuple[Tensor, Tensor]:
    """Inputs and next-token targets, (B, T) each with T <= block_size, right-padded.

    targets[b, t] = ids[t + 1] where mask[t + 1], else IGNORE; pads are IGNORE and inputs
    `pad_id` (which no real token attends to: they come after it, under a causal mask).
    """
    if not rows:
        raise LaminaError("pad_rows needs at least one example")
    length = min(block_size, max(len(ids) for ids, _ in rows) - 1)
    inputs = torch.full((len(rows), length), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    for b, (ids, mask) in enumerate(rows):
        ids, mask = ids[: length + 1], mask[: length + 1]
        n = len(ids) - 1
        inputs[b, :n] = torch.tensor(ids[:-1])
        keep = torch.tensor(mask[1:])
        targets[b, :n] = torch.where(keep, torch.tensor(ids[1:]), IGNORE)
    return inputs, targets
