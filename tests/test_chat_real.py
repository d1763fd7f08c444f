"""Chat on the real SmolLM2-135M-Instruct: answers stop at <|im_end|>, and cached turns equal
fresh renders of the whole conversation (one load of the model for the module)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from lamina.generation import generate
from lamina.generation.conversation import ChatOptions, Conversation
from lamina.interop.bundle import open_model

N = 16


@pytest.fixture(scope="module")
def bundle(smollm2_gguf):
    return open_model(smollm2_gguf)


def fresh(bundle, messages, n=N):
    tok = bundle.tokenizer
    ids = tok.render_chat(messages, add_generation_prompt=True)
    out = generate(bundle.model, torch.tensor([ids]), n, stop=list(tok.eot_ids))[0, len(ids) :]
    out = out.tolist()
    ends = [i for i, t in enumerate(out) if t in tok.eot_ids]
    return tok.decode(out[: ends[0]] if ends else out), bool(ends)


def test_capital_of_france_is_paris_and_the_turn_ends(bundle):
    conv = Conversation(bundle.model, bundle.tokenizer)
    events = list(conv.reply("What is the capital of France?", ChatOptions(max_new_tokens=40)))
    text = "".join(e.text for e in events)
    assert "Paris" in text
    assert events[-1].finish == "stop"  # ended at <|im_end|>, not at the token limit
    assert "<|im_end|>" not in text and "<|im_start|>" not in text


def test_three_turns_equal_fresh_renders(bundle):
    conv = Conversation(bundle.model, bundle.tokenizer, system="You are a helpful assistant.")
    questions = ["Name a color.", "Another one?", "Which is darker?"]
    for i, q in enumerate(questions):
        expected, _ = fresh(bundle, [*conv.messages, {"role": "user", "content": q}])
        events = list(conv.reply(q, ChatOptions(max_new_tokens=N)))
        assert "".join(e.text for e in events) == expected
        if i:
            assert events[-1].cached_tokens > events[-1].prompt_tokens // 2


def test_greedy_reply_equals_transformers_generate(bundle, smollm2_hf):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2_hf, torch_dtype=torch.float32)
    hf_tok = transformers.AutoTokenizer.from_pretrained(smollm2_hf)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert list(ids) == bundle.tokenizer.render_chat(messages)
    out = hf.generate(torch.tensor([ids]), max_new_tokens=N, do_sample=False)[0, len(ids) :]
    theirs = hf_tok.decode(out, skip_special_tokens=True).strip()
    conv = Conversation(bundle.model, bundle.tokenizer)
    ours = "".join(
        e.text for e in conv.reply(messages[0]["content"], ChatOptions(max_new_tokens=N))
    )
    assert ours.strip() == theirs


# `lamina chat` in a process of its own, which says at the end whether torch was imported
CHAT = "import sys\nfrom lamina.cli import main\ncode = main()\nprint('torch' in sys.modules)\n"
CHAT += "sys.exit(code)"


def test_lamina_chat_command_holds_a_piped_conversation(bundle, smollm2_gguf):
    """Each piped line is a turn; /clear forgets them, /exit ends before the rest is read. The
    command runs the file on the native runtime, with no torch in its process, and its greedy
    replies (the second from the cached first turn) are the torch path's."""
    lines = (
        "What is the capital of France?\nAnd of Italy?\n/clear\nName a fruit.\n/exit\nnot read\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", CHAT, "chat", str(smollm2_gguf), "--max-new-tokens", "16"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    *replies, torch_imported = r.stdout.strip().split("\n")
    assert torch_imported == "False" and "note" not in r.stderr
    assert "Paris" in replies[0]
    assert "cleared" in r.stderr
    # the same turns through the torch path; after /clear, what a new conversation answers
    opts, conv = ChatOptions(max_new_tokens=16), Conversation(bundle.model, bundle.tokenizer)
    want = [
        "".join(e.text for e in conv.reply(q, opts))
        for q in ("What is the capital of France?", "And of Italy?")
    ]
    alone = Conversation(bundle.model, bundle.tokenizer).reply("Name a fruit.", opts)
    want.append("".join(e.text for e in alone))
    assert replies == want


def test_keep_quantized_chat_answers_from_the_files_own_blocks(smollm2_gguf):
    """--keep-quantized runs the Q4_1 blocks as the file holds them: still Paris, still a turn
    that ends at <|im_end|>."""
    r = subprocess.run(
        [sys.executable, "-m", "lamina", "chat", str(smollm2_gguf), "--keep-quantized", "--json",
         "--prompt", "What is the capital of France?", "--max-new-tokens", "24"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    line = json.loads(r.stdout)
    assert "Paris" in line["content"] and line["finish_reason"] == "stop"
