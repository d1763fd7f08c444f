"""`lamina sample MODEL`: stream text from any model lamina opens (`lamina.open`).

    lamina sample RUN --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8 --top-k 50 \
        --top-p 0.95 --seed 1 --num-samples 3 --stop "\n\n"
    lamina sample SmolLM2-135M-Instruct.Q4_1.gguf --chat --prompt "What is a GGUF file?"

MODEL is a lamina run or model folder, a Hugging Face folder or a .gguf file. Each sample prints
the prompt, then the continuation as it is produced (flushed token by token; text is held back
only while a multi-byte character is incomplete: `lamina.generation.TextStream`). A `--stop`
string ends a sample right after the string; a model whose tokenizer names end-of-turn tokens
(<|im_end|>, <|eot_id|>, eos) stops at them too, unless --ignore-eot. The prompt is plain text
by default; --chat wraps it as one user message (after an optional --system message) in the
model's chat template, with the assistant's turn opened, and prints only the reply. Samples are
separated by a line of dashes. An empty prompt is allowed only when the tokenizer defines a
start token (e.g. "<|endoftext|>"); without any prompt option, a tokenizer without one starts
from a newline (as nanoGPT does).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

from lamina.cli import open_for
from lamina.cli.engine import add_engine, open_runtime
from lamina.cli.flags import add_keep_quantized, add_sampling
from lamina.errors import LaminaError
from lamina.generation.prompts import TextStream, encode_prompt, start_id

SEPARATOR = "\n" + "-" * 40 + "\n"
DTYPES = ("float32", "bfloat16")
MAX_PROMPT_BYTES = 2**24  # 16 MiB: far beyond any context window, short of filling memory


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sample",
        help="generate text from a model, streamed as it is produced",
        description="Open a model (a lamina run or model folder, a Hugging Face folder or a "
        ".gguf file), continue the prompt and stream the text to stdout, stopping at the "
        "model's end-of-turn token if its tokenizer names one. Bad input gives one line on "
        "stderr and exit status 2.",
    )
    p.add_argument(
        "run",
        metavar="MODEL",
        help="a lamina run or model folder, a Hugging Face folder, or a .gguf file",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--prompt",
        default=None,
        help="text to continue (default: the tokenizer's start token if it has one, else a "
        "newline); an empty prompt needs a start token",
    )
    src.add_argument(
        "--prompt-file", metavar="PATH", help="read the prompt from a file ('-' for stdin)"
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=200, help="tokens to generate (default: 200)"
    )
    add_sampling(p, 0.8, "random seed (default: random)")
    p.add_argument("--num-samples", type=int, default=1, help="samples to draw (default: 1)")
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="STR",
        help="end a sample right after this string (repeatable; '\\n' escapes understood)",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="wrap the prompt as a user message in the model's chat template and print only "
        "the reply (default: the prompt is plain text, continued as it is)",
    )
    p.add_argument(
        "--system", metavar="TEXT", help="with --chat: a system message before the prompt"
    )
    p.add_argument(
        "--ignore-eot",
        action="store_true",
        help="keep generating past the tokenizer's end-of-turn tokens (default: stop at them)",
    )
    p.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="weights and cache (default: float32)"
    )
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_keep_quantized(p)
    p.add_argument(
        "--quantize",
        choices=["int8", "int4"],
        help="quantize the linear layers on load, for this session (see lamina quantize)",
    )
    p.add_argument(
        "--no-cache", action="store_true", help="recompute every step (slow; for checking)"
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode step: a one-off compile (tens of seconds), then several "
        "times faster per token on small models",
    )
    add_engine(p)
    p.set_defaults(func=run)


def read_prompt(args: argparse.Namespace, tokenizer: Any) -> str:
    """The prompt text; with neither --prompt nor --prompt-file, "" (start token) or a newline."""
    if args.prompt_file is None and args.prompt is None:
        return "" if start_id(tokenizer) is not None else "\n"
    if args.prompt_file is None:
        return args.prompt
    if args.prompt_file == "-":
        if sys.stdin is None or sys.stdin.closed:
            raise LaminaError("--prompt-file -: standard input is closed, nothing to read")
        return _bounded_read(getattr(sys.stdin, "buffer", sys.stdin), "standard input")
    path = Path(args.prompt_file)
    if path.is_dir():
        raise LaminaError(f"--prompt-file {path} is a folder, not a file")
    if not path.exists():
        raise LaminaError(f"prompt file not found: {path}")
    try:
        with path.open("rb") as f:
            return _bounded_read(f, f"prompt file {path}")
    except OSError as exc:
        raise LaminaError(f"--prompt-file {path}: cannot read it ({exc.strerror or exc})") from None


def _bounded_read(stream: Any, what: str) -> str:
    """At most MAX_PROMPT_BYTES of UTF-8 text (a prompt from /dev/zero must not fill memory)."""
    try:
        data = stream.read(MAX_PROMPT_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: a closed file
        raise LaminaError(f"cannot read {what} ({exc})") from None
    if len(data) > MAX_PROMPT_BYTES:
        raise LaminaError(f"{what} is longer than {MAX_PROMPT_BYTES // 2**20} MiB: not a prompt")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LaminaError(f"{what} is not UTF-8 text ({exc.reason})") from None


def prompt_ids(tokenizer: Any, text: str, given: bool = True) -> list[int]:
    """Prompt -> ids (`encode_prompt`). `given` is False for the default prompt (no --prompt or
    --prompt-file): then an error says that no prompt was given, rather than blaming characters
    the user never typed."""
    try:
        return encode_prompt(tokenizer, text)
    except LaminaError:
        if given:
            raise
        raise LaminaError(
            "no --prompt given, and this tokenizer has no start token and no newline to "
            "start from: give --prompt with characters from the training text"
        ) from None


def chat_ids(holder: Any, text: str, system: str | None, path: Any) -> list[int]:
    """The chat template's rendering of [system,] user: text, with the assistant turn opened.
    `holder`: a Bundle or the native runtime (each holds a tokenizer and its chat template)."""
    if holder.chat_template is None or not callable(getattr(holder.tokenizer, "render_chat", None)):
        raise LaminaError(f"--chat: {path} has no chat template")
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": text})
    return list(holder.tokenizer.render_chat(messages, add_generation_prompt=True))


def unescape(s: str) -> str:
    """'\\n' and '\\t' typed on a command line -> newline and tab."""
    return s.replace("\\n", "\n").replace("\\t", "\t")


def check_args(args: argparse.Namespace) -> None:
    from lamina.generation.prompts import MAX_TOKENS

    if args.max_new_tokens <= 0:
        raise LaminaError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if args.max_new_tokens > MAX_TOKENS:
        raise LaminaError(
            f"--max-new-tokens must be at most {MAX_TOKENS:,}, got {args.max_new_tokens:,}"
        )
    if args.num_samples <= 0:
        raise LaminaError(f"--num-samples must be positive, got {args.num_samples}")
    if args.seed is not None and not 0 <= args.seed < 2**64:
        raise LaminaError(f"--seed must be in [0, 2**64), got {args.seed}")
    from lamina.generation.pick import check_sampling

    check_sampling(args.temperature, args.top_k, args.top_p)


def write_stream(out: Any, tokens: Generator[int], text: TextStream) -> None:
    """Write each token's new text as soon as it is complete; stop right after a stop."""
    for token in tokens:
        piece = text.push(token)
        if piece:
            out.write(piece)
            out.flush()
        if text.stopped:
            tokens.close()
            return
    out.write(text.flush())  # the end: show whatever was held back


def torch_tokens(steps: Any) -> Generator[int]:
    """The tokens of `lamina.generation.stream`'s steps (one row); the stream closed after."""
    try:
        for step in steps:
            yield int(step.tokens[0])
    finally:
        steps.close()


def run(args: argparse.Namespace) -> int:
    check_args(args)
    if args.system is not None and not args.chat:
        raise LaminaError("--system needs --chat")
    stops = [unescape(s) for s in args.stop or []]
    if any(not s for s in stops):
        raise LaminaError("--stop must not be empty")
    needs_torch = {
        "--dtype bfloat16": args.dtype == "bfloat16",
        "--device": args.device != "cpu",
        "--dequantize": args.keep_quantized is False,
        "--quantize": args.quantize is not None,
        "--no-cache": args.no_cache,
        "--compile": args.compile,
    }
    runtime = open_runtime(args, "sample", args.run, needs_torch)
    if runtime is not None and run_native(args, runtime, stops):
        return 0
    del runtime  # (one whose cache the prompt outgrew: its memory goes before torch's model)
    return run_torch(args, stops)


def _prompt(args: argparse.Namespace, holder: Any, tokenizer: Any, path: Any) -> tuple[str, list]:
    """The prompt's text and ids (a chat rendering with --chat)."""
    prompt = read_prompt(args, tokenizer)
    if args.chat:
        return prompt, chat_ids(holder, prompt, args.system, path)
    given = args.prompt is not None or args.prompt_file is not None
    return prompt, prompt_ids(tokenizer, prompt, given)


def _seed(args: argparse.Namespace) -> int:
    return args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")


def run_native(args: argparse.Namespace, runtime: Any, stops: list[str]) -> bool:
    """The samples on the native runtime; False (nothing written) where the prompt and
    --max-new-tokens outgrow its cache, which the torch path's sliding window serves."""
    import numpy as np

    if runtime.tokenizer is None:
        raise LaminaError(f"{args.run} has no tokenizer: cannot turn text into ids")
    prompt, ids = _prompt(args, runtime, runtime.tokenizer, args.run)
    if len(ids) + args.max_new_tokens > runtime.cache_len:
        print(
            f"lamina sample: note: the torch path runs the model: {len(ids)} prompt tokens and "
            f"--max-new-tokens {args.max_new_tokens} outgrow the native runtime's cache "
            f"({runtime.cache_len} tokens)",
            file=sys.stderr,
        )
        return False
    eot = [] if args.ignore_eot else list(runtime.eot_ids)
    rng = np.random.default_rng(_seed(args))
    o = args
    for n in range(args.num_samples):
        _start(n, args, prompt)
        tokens = runtime.generate(
            ids, o.max_new_tokens, o.temperature, o.top_k, o.top_p, rng, stop=set(eot)
        )
        write_stream(sys.stdout, tokens, TextStream(runtime.tokenizer, stops, eot))
        _end()
    return True


def _start(n: int, args: argparse.Namespace, prompt: str) -> None:
    if n:
        sys.stdout.write(SEPARATOR)
    if not args.chat:
        sys.stdout.write(prompt)
    sys.stdout.flush()


def _end() -> None:
    sys.stdout.write("\n")
    sys.stdout.flush()


def run_torch(args: argparse.Namespace, stops: list[str]) -> int:
    import torch

    from lamina.generation import stream

    # --quantize: lamina.open quantizes (a Hugging Face folder as it reads it, no fp32 copy);
    # --dtype bfloat16 starts from the float weights
    keep = args.quantize or args.keep_quantized
    if keep is None and args.dtype == "bfloat16":
        keep = False
    bundle = open_for(args.run, "sample", device=args.device, quantized=keep)
    model, tokenizer = bundle.model, bundle.tokenizer
    if args.dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    prompt, ids = _prompt(args, bundle, tokenizer, bundle.origin.path)
    eot = [] if args.ignore_eot else list(bundle.eot_ids)
    generator = torch.Generator(device=args.device).manual_seed(_seed(args))
    for n in range(args.num_samples):
        _start(n, args, prompt)
        steps = stream(
            model,
            torch.tensor([ids]),
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=generator,
            stop=[*eot, *stops] or None,
            tokenizer=tokenizer,
            use_cache=not args.no_cache,
            compile=args.compile and not args.no_cache,
        )
        write_stream(sys.stdout, torch_tokens(steps), TextStream(tokenizer, stops, eot))
        _end()
    return 0
