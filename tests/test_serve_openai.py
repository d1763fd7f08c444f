"""lamina serve's OpenAI-compatible API, driven by the real `openai` client on a live server."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("starlette")
openai = pytest.importorskip("openai")

from chat_fixtures import chat_engine, fresh_reply  # noqa: E402
from serving import live_server, request  # noqa: E402

from lamina.generation import generate  # noqa: E402
from lamina.serve import Engine  # noqa: E402


def fresh(engine: Engine, messages: list[dict], n: int) -> str:
    return fresh_reply(engine, messages, n)


@pytest.fixture(scope="module")
def server():
    engine = chat_engine()
    with live_server(engine) as addr:
        client = openai.OpenAI(base_url=f"http://{addr[0]}:{addr[1]}/v1", api_key="none")
        yield engine, addr, client


def test_models_lists_the_one_model(server):
    _, _, client = server
    ids = [m.id for m in client.models.list()]
    assert ids == ["lamina"]


def test_chat_completion_equals_a_fresh_render(server):
    engine, _, client = server
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = client.chat.completions.create(
        model="lamina", messages=messages, max_tokens=10, temperature=0
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content and r.choices[0].message.content == fresh(
        engine, messages, 10
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(engine.tokenizer.render_chat(messages))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_chat_equals_non_streamed_and_reuses_the_cache(server):
    engine, _, client = server
    messages = [{"role": "user", "content": "Tell me more"}]
    whole = (
        client.chat.completions.create(model="x", messages=messages, max_tokens=12, temperature=0)
        .choices[0]
        .message.content
    )
    messages += [{"role": "assistant", "content": whole}, {"role": "user", "content": "And?"}]
    chunks = list(
        client.chat.completions.create(
            model="x",
            messages=messages,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == fresh(engine, messages, 12)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    usage = chunks[-1].usage
    # the second request resent the first turn: its tokens were in the KV cache
    assert usage.prompt_tokens_details.cached_tokens > len(
        engine.tokenizer.render_chat(messages[:1])
    )


def test_completions_plain_prompt(server):
    engine, _, client = server
    r = client.completions.create(model="x", prompt="hello", max_tokens=5, temperature=0)
    ids = engine.tokenizer.encode("hello")
    expected = engine.tokenizer.decode(
        generate(engine.model, torch.tensor([ids]), 5, stop=list(engine.tokenizer.eot_ids))[
            0, len(ids) :
        ].tolist()
    )
    assert expected.startswith(r.choices[0].text)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="x", prompt="hello", max_tokens=5, temperature=0, stream=True
        )
    )
    assert streamed == r.choices[0].text


def test_errors_are_openai_error_objects(server):
    _, addr, client = server
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[], max_tokens=5)
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError, match="n must be an integer in"):
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "a"}], n=99)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "a"}], max_tokens=10_000
        )
    status, _, body = request(addr, "POST", "/v1/chat/completions", {"messages": "hi", "bogus": 1})
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == "bogus"


def test_chat_page_is_served(server):
    _, addr, _ = server
    status, _, text = request(addr, "GET", "/chat")
    assert status == 200 and "/v1/chat/completions" not in text and "chat.js" in text


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("name", ['lamina "q"', "has the \0lamina\0 mark", "\0lamina\0"])
def test_a_text_chunk_from_its_template_equals_the_whole_chunk(kind, name):
    """A streamed token's chunk is its choice's template around the text's JSON: byte for byte
    what encoding the whole chunk gives (texts JSON escapes; a model name holding the
    template's mark as its whole gets no template)."""
    from types import SimpleNamespace

    from lamina.serve.answers import Answer

    req = SimpleNamespace(kind=kind, n=2, tools=None, tool_choice=None)
    ans = Answer(None, SimpleNamespace(request=req), {"id": "c-1", "created": 1, "model": name})
    for text in ["hi", ' "q" \\ \n\t', "café 東京 😀", "\u2028</script>", "\0lamina\0", "\x01"]:
        for i in (0, 1):
            delta = {"content": text} if kind == "chat" else text
            assert ans.text_chunk(i, text) == ans.chunk(i, delta, None, None)
    assert (
        ans.templates[0] is None if name == "\0lamina\0" else ans.templates[0][0][:6] == b"data: "
    )
