"""lamina serve's response_format: json_object and json_schema decoded under a grammar
(llguidance), streamed and not; every reply parses and validates, even from a random model."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from serving import bpe_chat_model, live_server, request  # noqa: E402

from lamina.serve import Engine, Limits  # noqa: E402

NAME = {"type": "string", "maxLength": 10}  # a random model's strings end only when they must
SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "role": {"enum": ["admin", "user", "guest"]},
                    "tags": {"type": "array", "items": NAME, "maxItems": 3},
                },
                "required": ["id", "role", "tags"],
                "additionalProperties": False,
            },
            "ok": {"type": "boolean"},
        },
        "required": ["user", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "x": {"type": "number", "minimum": -5, "maximum": 5},
            "n": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9},
            "points": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
                "minItems": 1,
                "maxItems": 2,
            },
        },
        "required": ["x", "n", "points"],
        "additionalProperties": False,
    },
]


@pytest.fixture(scope="module")
def server():
    model, tok = bpe_chat_model()
    engine = Engine(model, tok, Limits(max_tokens=300, slots=4, context=512))
    with live_server(engine) as addr:
        client = openai.OpenAI(base_url=f"http://{addr[0]}:{addr[1]}/v1", api_key="none")
        yield engine, addr, client


def fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


MESSAGES = [{"role": "user", "content": "Reply in JSON."}]


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_every_reply_parses_and_validates(server, index):
    _, _, client = server
    schema = SCHEMAS[index]
    r = client.chat.completions.create(
        model="x", messages=MESSAGES, response_format=fmt(schema), max_tokens=300, seed=1, n=3
    )
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), schema)
    chunks = client.chat.completions.create(
        model="x",
        messages=MESSAGES,
        response_format=fmt(schema),
        max_tokens=300,
        seed=7,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)


def test_json_object_is_an_object(server):
    _, _, client = server
    finished = 0
    for seed in (0, 1, 4):
        r = client.chat.completions.create(
            model="x",
            messages=MESSAGES,
            response_format={"type": "json_object"},
            max_tokens=300,
            seed=seed,
            temperature=0.7,
        )
        choice = r.choices[0]
        if choice.finish_reason == "stop":  # (one cut by max_tokens is cut, as OpenAI's is)
            finished += 1
            assert isinstance(json.loads(choice.message.content), dict)
    assert finished >= 2


def test_a_schema_that_cannot_compile_is_a_400_at_once(server):
    _, addr, _ = server
    for schema in (
        {"type": "strin"},
        {"$ref": "#/nowhere"},
        {"type": "object", "minProperties": "x"},
    ):
        t0 = time.perf_counter()
        status, _, body = request(
            addr,
            "POST",
            "/v1/chat/completions",
            {"messages": MESSAGES, "response_format": fmt(schema)},
        )
        assert status == 400 and body["error"]["param"] == "response_format", body
        assert time.perf_counter() - t0 < 5
    status, _, body = request(
        addr,
        "POST",
        "/v1/chat/completions",
        {"messages": MESSAGES, "response_format": {"type": "json_schema"}},
    )
    assert status == 400 and "schema" in body["error"]["message"]
