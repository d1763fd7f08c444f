"""lamina serve's tool calling through the openai client: tools rendered by a Qwen2.5-style
template, calls decoded under the functions' schemas, results sent back as role "tool"; a
template without tools is a 400 saying so."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from chat_fixtures import chat_engine  # noqa: E402
from serving import bpe_chat_model, live_server  # noqa: E402

from lamina.serve import Engine, Limits  # noqa: E402
from lamina.serve.tools import parse_calls, supports_tools  # noqa: E402

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client():
    model, tok = bpe_chat_model()
    engine = Engine(model, tok, Limits(max_tokens=200, slots=2, context=2048))
    with live_server(engine) as addr:
        yield openai.OpenAI(base_url=f"http://{addr[0]}:{addr[1]}/v1", api_key="none")


def test_a_required_call_round_trips(client):
    r = client.chat.completions.create(
        model="x", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, seed=3
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "add")
    args = json.loads(call.function.arguments)
    schema = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
    jsonschema.validate(args, schema["function"]["parameters"])
    back = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'},
    ]
    after = client.chat.completions.create(
        model="x", messages=back, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    )
    assert after.choices[0].message.content and not after.choices[0].message.tool_calls
    assert after.usage.prompt_tokens > r.usage.prompt_tokens


def test_a_named_function_is_the_one_called_streamed_too(client):
    choice = {"type": "function", "function": {"name": "add"}}
    r = client.chat.completions.create(
        model="x", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=200, seed=1
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add"
    args = json.loads(call.function.arguments)
    assert isinstance(args["a"], int) and isinstance(args["b"], int)
    chunks = list(
        client.chat.completions.create(
            model="x",
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
            max_tokens=200,
            seed=2,
            stream=True,
        )
    )
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert len(calls) == 1 and calls[0].function.name == "add" and calls[0].index == 0
    json.loads(calls[0].function.arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_bad_tools_are_400s(client):
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(
            model="x",
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model="x", messages=ASK, tools=[{"type": "x"}])


def test_a_template_without_tools_says_so():
    engine = chat_engine()  # ChatML without tools, as SmolLM2's template
    with live_server(engine) as addr:
        c = openai.OpenAI(base_url=f"http://{addr[0]}:{addr[1]}/v1", api_key="none")
        with pytest.raises(openai.BadRequestError, match="does not render tools") as e:
            c.chat.completions.create(model="x", messages=ASK, tools=TOOLS)
        assert e.value.body["param"] == "tools"


def test_parse_calls_and_template_detection():
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    content, calls = parse_calls(text)
    assert content == "Sure." and json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert parse_calls("no call <tool_call>{oops</tool_call>") == (
        "no call <tool_call>{oops</tool_call>",
        [],
    )
    assert supports_tools("{% if tools %}x{% endif %}") and not supports_tools("{{ messages }}")
