"""A conversation keeps its KV cache across turns, and every reply equals a fresh render's."""

from __future__ import annotations

import pytest
import torch
from chat_fixtures import ChatMLChars, talkative  # noqa: I001

from lamina.errors import LaminaError
from lamina.generation import generate
from lamina.generation.conversation import ChatOptions, Conversation, common_prefix
from lamina.models import GPT, GPTConfig


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    tok = ChatMLChars()
    config = GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, block_size=512)
    return talkative(GPT(config).eval(), tok)


def fresh_reply(model, tok, messages, n) -> list[int]:
    """The reference: render everything, prefill it at once, decode greedily to the eot."""
    ids = tok.render_chat(messages, add_generation_prompt=True)
    out = generate(model, torch.tensor([ids]), n, stop=list(tok.eot_ids))[0, len(ids) :].tolist()
    return out[: out.index(tok.eot_ids[0])] if tok.eot_ids[0] in out else out


def test_three_turns_equal_fresh_renders_and_reuse_the_cache(model):
    """Turns 2 and 3 prefill only their new tokens, yet each reply equals a fresh render's."""
    tok = ChatMLChars()
    conv = Conversation(model, tok, system="You are terse.")
    opts = ChatOptions(max_new_tokens=12)
    for turn, question in enumerate(["Hello there", "What is 2 and 2?", "Thanks, bye"]):
        expected = tok.decode(
            fresh_reply(model, tok, [*conv.messages, {"role": "user", "content": question}], 12)
        )
        events = list(conv.reply(question, opts))
        assert expected and "".join(e.text for e in events) == expected
        last = events[-1]
        assert last.finish in ("stop", "length")
        assert conv.messages[-1] == {"role": "assistant", "content": expected}
        if turn:
            # everything up to this turn's user message was in the cache already
            assert last.cached_tokens >= last.prompt_tokens - len(question) - 30
            assert last.cached_tokens > 0
        else:
            assert last.cached_tokens == 0
    assert [m["role"] for m in conv.messages] == ["system"] + ["user", "assistant"] * 3


def test_sampled_reply_is_reproducible_with_a_seed(model):
    tok = ChatMLChars()
    opts = ChatOptions(max_new_tokens=10, temperature=1.0, top_k=20, seed=7)
    a = "".join(e.text for e in Conversation(model, tok).reply("hi", opts))
    b = "".join(e.text for e in Conversation(model, tok).reply("hi", opts))
    assert a == b and len(a) > 0


def test_overflow_drops_oldest_turns_and_keeps_the_system_message(model):
    tok = ChatMLChars()
    conv = Conversation(model, tok, system="sys", context=160)
    opts = ChatOptions(max_new_tokens=8)
    dropped = []
    for i in range(8):
        events = list(conv.reply(f"question number {i} is here", opts))
        dropped.append(events[-1].dropped)
        assert events[-1].prompt_tokens + 8 <= 160 or events[-1].finish == "length"
    assert sum(dropped) > 0  # the user was told
    assert conv.messages[0] == {"role": "system", "content": "sys"}
    assert conv.messages[-2] == {"role": "user", "content": "question number 7 is here"}
    assert "question number 0 is here" not in [m["content"] for m in conv.messages]


def test_a_message_too_long_alone_is_refused_not_cut(model):
    tok = ChatMLChars()
    conv = Conversation(model, tok, context=100)
    with pytest.raises(LaminaError, match="too long for the context"):
        conv.reply("x" * 200, ChatOptions(max_new_tokens=8))
    assert conv.messages == []  # nothing half-recorded


def test_closing_the_stream_keeps_what_was_said(model):
    tok = ChatMLChars()
    conv = Conversation(model, tok)
    events = conv.reply("tell me", ChatOptions(max_new_tokens=50))
    first = next(e for e in events if e.text)
    events.close()
    assert conv.messages[-1] == {"role": "assistant", "content": first.text}
    # the next turn still equals a fresh render (the cache was cut back where it diverged)
    question = "again"
    expected = tok.decode(
        fresh_reply(model, tok, [*conv.messages, {"role": "user", "content": question}], 6)
    )
    assert "".join(e.text for e in conv.reply(question, ChatOptions(max_new_tokens=6))) == expected


def test_stop_strings_end_the_reply_before_the_string(model):
    tok = ChatMLChars()
    full = "".join(
        e.text for e in Conversation(model, tok).reply("hi", ChatOptions(max_new_tokens=12))
    )
    stop = full[3:5]
    if not stop or full.find(stop) < 1:
        pytest.skip("this random model's reply has no usable stop string")
    got = list(Conversation(model, tok).reply("hi", ChatOptions(max_new_tokens=12, stop=(stop,))))
    assert "".join(e.text for e in got) == full[: full.find(stop)]
    assert got[-1].finish == "stop"


def test_clear_and_system_change_the_rendered_conversation(model):
    tok = ChatMLChars()
    conv = Conversation(model, tok)
    list(conv.reply("one", ChatOptions(max_new_tokens=4)))
    conv.clear()
    conv.set_system("be kind")
    assert conv.messages == [{"role": "system", "content": "be kind"}]


def test_bad_options_and_models_are_refused(model):
    with pytest.raises(LaminaError, match="max_new_tokens"):
        ChatOptions(max_new_tokens=0)
    with pytest.raises(LaminaError, match="temperature"):
        ChatOptions(temperature=-1)
    with pytest.raises(LaminaError, match="no chat template"):
        Conversation(model, object())
    with pytest.raises(LaminaError, match="context"):
        Conversation(model, ChatMLChars(), context=10_000)


def test_helpers():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
