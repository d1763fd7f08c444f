"""lamina serve's stream interval: a streamed choice's tokens go out every N, merged into one
chunk, the first at once and the rest before the end; the text, the logprobs and the usage are
what the reply gives whole."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("starlette")
openai = pytest.importorskip("openai")

import torch  # noqa: E402
from chat_fixtures import ChatMLChars, talkative  # noqa: E402
from serving import live_server  # noqa: E402

from lamina.errors import LaminaError  # noqa: E402
from lamina.models import GPT, GPTConfig  # noqa: E402
from lamina.serve import Engine, Limits  # noqa: E402
from lamina.serve.pacing import SHARED, Pace, every_for  # noqa: E402
from lamina.serve.sequence import Done, Token  # noqa: E402

ASK = [{"role": "user", "content": "Tell me about the sea"}]


def test_pace_sends_the_first_token_at_once_then_every_n_and_flushes_before_the_end():
    posted: list = []
    pace = Pace(posted.append, 2, lambda: 3)
    t = [Token(i, c) for i, c in enumerate("abcdefg")]
    pace.sink(0, "token", t[0])
    assert posted == [(0, "tokens", [t[0]])]  # the first token at once
    for tok in t[1:6]:
        pace.sink(0, "token", tok)
    assert posted[1:] == [(0, "tokens", t[1:4])]  # then three at a time; t[4:6] held
    pace.sink(1, "token", Token(9, ""))  # choice 1: no text yet, nothing to show
    pace.sink(1, "error", "boom")  # held tokens go before the error
    assert posted[2:] == [(1, "tokens", [Token(9, "")]), (1, "error", "boom")]
    done = Done("length", 3, 0, 7, "abcdefg")
    pace.sink(0, "token", t[6])
    pace.sink(0, "done", done)
    assert posted[4:] == [(0, "tokens", t[4:7]), (0, "done", done)]


def test_a_token_without_text_waits_for_the_next_and_none_holds_all_after_the_first():
    posted: list = []
    pace = Pace(posted.append, 1, lambda: 1)
    empty, x = Token(1, "", -0.5), Token(2, "é", -0.25)
    pace.sink(0, "token", empty)  # half a character: held
    assert posted == []
    pace.sink(0, "token", x)
    assert posted == [(0, "tokens", [empty, x])]
    held: list = []
    whole = Pace(held.append, 1, None)
    for i, c in enumerate("abc"):
        whole.sink(0, "token", Token(i, c))
    assert [len(item[2]) for item in held] == [1]
    whole.sink(0, "busy", "no slot")
    assert [item[1] for item in held] == ["tokens", "tokens", "busy"] and len(held[1][2]) == 2


def test_the_default_is_one_alone_and_shared_while_several_decode():
    class Rows:
        decoding = 1

    rows = Rows()
    every = every_for(None, rows)
    assert every() == 1
    rows.decoding = 3
    assert every() == SHARED > 1
    assert every_for(5, rows)() == 5
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(LaminaError, match="stream_interval must be an integer >= 1"):
            Limits(stream_interval=bad)


def test_the_command_line_checks_the_interval(tmp_path):
    import argparse

    from lamina.cli.serve import check_args, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["serve", "m", "--stream-interval", "0"])
    with pytest.raises(LaminaError, match="--stream-interval must be an integer >= 1"):
        check_args(args)
    assert parser.parse_args(["serve", "m", "--stream-interval", "3"]).stream_interval == 3
    assert parser.parse_args(["serve", "m"]).stream_interval is None
    sub = parser._subparsers._group_actions[0].choices["serve"]
    assert f"{SHARED} while several" in " ".join(sub.format_help().split())  # the help's default
    with pytest.raises(SystemExit):  # argparse: not an integer
        parser.parse_args(["serve", "m", "--stream-interval", "two"])


@pytest.fixture(scope="module", params=[1, 2, 3])
def server(request):
    tok = ChatMLChars()
    torch.manual_seed(0)
    config = GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, block_size=256)
    model = talkative(GPT(config).eval(), tok)
    engine = Engine(
        model, tok, Limits(max_tokens=64, slots=4, context=256, stream_interval=request.param)
    )
    with live_server(engine) as addr:
        client = openai.OpenAI(base_url=f"http://{addr[0]}:{addr[1]}/v1", api_key="none")
        yield request.param, client


def stream(client, **kw) -> list:
    return list(
        client.chat.completions.create(
            model="x", stream=True, stream_options={"include_usage": True}, **kw
        )
    )


def test_streamed_text_is_the_whole_reply_in_first_then_every_n_chunks(server):
    n, client = server
    whole = client.chat.completions.create(model="x", messages=ASK, max_tokens=20, temperature=0)
    chunks = stream(client, messages=ASK, max_tokens=20, temperature=0)
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [
        c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content
    ]
    assert "".join(texts) == whole.choices[0].message.content
    tokens = chunks[-1].usage.completion_tokens
    assert tokens == whole.usage.completion_tokens and tokens > 3
    # every token has text here: the first alone, then n at a time, the rest at the end
    assert len(texts) == 1 + math.ceil((tokens - 1) / n)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])


def test_streamed_logprobs_have_one_entry_a_token(server):
    n, client = server
    kw = {"messages": ASK, "max_tokens": 9, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = client.chat.completions.create(model="x", **kw)
    chunks = stream(client, **kw)
    entries = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in entries] == [
        (e.token, e.logprob) for e in whole.choices[0].logprobs.content
    ]
    assert len(entries) == chunks[-1].usage.completion_tokens
    sizes = []
    for c in chunks:  # each chunk's entries are its own text's tokens: 1, then n at a time
        if c.choices and c.choices[0].delta.content:
            got = "".join(e.token for e in c.choices[0].logprobs.content)
            assert got == c.choices[0].delta.content
            sizes.append(len(c.choices[0].logprobs.content))
    assert sizes[0] == 1 and all(k == n for k in sizes[1:-1]) and 1 <= sizes[-1] <= n
    done = client.completions.create(
        model="x", prompt="Hi", max_tokens=7, temperature=0, logprobs=1
    )
    parts = list(
        client.completions.create(
            model="x", prompt="Hi", max_tokens=7, temperature=0, logprobs=1, stream=True
        )
    )
    offsets = [o for p in parts if p.choices[0].logprobs for o in p.choices[0].logprobs.text_offset]
    assert offsets == done.choices[0].logprobs.text_offset
    assert "".join(p.choices[0].text for p in parts) == done.choices[0].text


def test_n_streamed_choices_each_give_their_whole_text(server):
    _, client = server
    kw = {"messages": ASK, "max_tokens": 12, "temperature": 1.0, "seed": 3, "n": 2}
    whole = client.chat.completions.create(model="x", **kw)
    chunks = stream(client, **kw)
    for i in range(2):
        text = "".join(
            c.choices[0].delta.content or ""
            for c in chunks
            if c.choices and c.choices[0].index == i
        )
        assert text == whole.choices[i].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
