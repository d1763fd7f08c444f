"""Issue 35, classes 1 and 2: every chat-template render is bounded in time and size, and every
reader has a depth bound; each case is one LaminaError line, never a hang or a traceback."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import pytest

from lamina.bounds import deadline
from lamina.errors import LaminaError
from lamina.files import json_lines, loads_json, read_json
from lamina.native.gguf_read import read_gguf
from lamina.tokenizers.chat_template import RenderLimits, render_chat_template

CHAT = [{"role": "user", "content": "hi"}]
QUICK = RenderLimits(seconds=0.3)


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% for i in range(100000) %}{% endfor %}{{ f(n) }}{% endmacro %}{{ f(0) }}",
    ],
    ids=["nested-loops", "recursive-macro"],
)
def test_a_render_that_runs_on_is_stopped_at_its_deadline(template):
    t0 = time.perf_counter()
    with pytest.raises(LaminaError, match=r"took longer than 0.3 s|RecursionError"):
        render_chat_template(template, CHAT, limits=QUICK)
    assert time.perf_counter() - t0 < 3.0


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("{{ lipsum(n=10000000) }}", "lipsum"),
        ("{{ 'x' * 50000000 }}", r"'\*' result \(a str\) has 50,000,000 items"),  # was folded
        ("{{ [1] * 50000000 }}", "a list"),
        ("{{ 7 ** 100000000 }}", "bits"),
        ("{{ strftime_now('%Y' * 2000) }}", "strftime_now format is 4000 long"),
        (
            "{% set ns = namespace(x='ab') %}{% for i in range(30) %}"
            "{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}",
            "namespace value 'x'",
        ),
        ("{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}", "more than 4,194,304 char"),
        ("{{ messages[0].content|center(3000000000) }}", "center width"),
        ("{{ '%9999999999s' % 'x' }}", "'%' format width"),
        ("{{ '%*s' % (9999999999, 'x') }}", "'%' format width"),
        ("{{ '{:>9999999999}'.format('x') }}", "str.format width"),
        ("{{ '{0:>{1}}'.format('x', 9999999999) }}", "str.format width"),
        ("{{ '%9999999999s'|format('x') }}", "format filter width"),
        ("{{ ('x' * 1000000)|replace('x', 'xxxxxxxxxx') }}", "replace result"),
        ("{{ 'a\nb'|indent(3000000000) }}", "indent result"),
    ],
)
def test_a_render_that_would_build_too_much_is_refused_before_it_does(template, match):
    with pytest.raises(LaminaError, match=match):
        render_chat_template(template, CHAT)


def test_the_guarded_operations_still_do_what_jinja_does():
    text = (
        "{{ 'hi'|center(6) }}|{{ 'a b'|replace('a', 'c') }}|{{ '%3s' % 'x' }}|"
        "{{ '{:>3}'.format('y') }}|{{ '{0:>{1}}'.format('z', 2) }}|{{ 'a\nb'|indent(1) }}|"
        "{{ '%s-%s'|format(1, 2) }}|{{ 10 % 3 }}|{{ 'id 5551234567 {}'.format(7) }}"
    )
    want = "  hi  |c b|  x|  y| z|a\n b|1-2|1|id 5551234567 7"
    assert render_chat_template(text, CHAT) == want


def test_the_output_cap_is_the_callers_to_set():
    text = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert render_chat_template(text, [{"role": "user", "content": "z" * 900}]) == "z" * 900
    with pytest.raises(LaminaError, match="more than 800 characters"):
        render_chat_template(
            text, [{"role": "user", "content": "z" * 900}], limits=RenderLimits(max_chars=800)
        )


@pytest.mark.parametrize(
    "template",
    [
        "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",  # RecursionError in jinja2's parser
        "{% if %}",  # a plain syntax error
    ],
)
def test_every_compile_error_is_one_line(template):
    with pytest.raises(LaminaError, match="chat template does not parse") as e:
        render_chat_template(template, CHAT)
    assert "\n" not in str(e.value)


def test_a_huge_template_is_refused_before_it_is_compiled():
    with pytest.raises(LaminaError, match="over the 1,048,576 limit"):
        render_chat_template("x" * (2**20 + 1), CHAT)


def test_the_deadline_stops_only_its_own_thread_and_never_fires_late():
    hits = []

    def spin():
        try:
            with deadline(0.1, "spinning"):
                while True:
                    pass
        except LaminaError as e:
            hits.append(str(e))

    other = threading.Thread(target=spin)
    other.start()
    with deadline(0.05, "quick work"):
        total = sum(range(1000))
    time.sleep(0.3)  # past both deadlines: nothing may land here
    other.join()
    assert total == 499500 and hits == ["spinning took longer than 0.1 s, so it was stopped"]


def test_json_nested_past_the_depth_limit_is_one_line(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(LaminaError, match="tasks.jsonl line 2: arrays and objects nest deeper"):
        list(json_lines('{"a": 1}\n' + deep, "tasks.jsonl"))
    with pytest.raises(LaminaError, match="nest deeper than 64"):
        loads_json('{"a":' * 70 + "1" + "}" * 70, "x")
    assert loads_json("[" * 64 + "]" * 64, "x") is not None
    assert loads_json('"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["', "x")
    (tmp_path / "config.json").write_text(deep)
    with pytest.raises(LaminaError, match="config.json: arrays and objects nest deeper"):
        read_json(tmp_path / "config.json")


def _gguf_with_nested_array(depth: int) -> bytes:
    key = b"deep"
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<I", 9)
    for _ in range(depth):
        kv += struct.pack("<IQ", 9, 1)  # an array of one array
    kv += struct.pack("<IQ", 4, 0)  # ... of no uint32
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv


def test_a_gguf_metadata_array_nested_1000_deep_is_one_line(tmp_path):
    p = tmp_path / "deep.gguf"
    p.write_bytes(_gguf_with_nested_array(1000))
    with pytest.raises(LaminaError, match="nests arrays deeper than 8"):
        read_gguf(p)


@pytest.mark.parametrize("reader", ["corpus", "instruct", "tokenizer", "safetensors"])
def test_every_json_reader_refuses_deep_nesting_in_one_line(tmp_path, reader):
    from lamina.data.corpus import load_corpus
    from lamina.data.instruct import read_examples
    from lamina.tensorfile import TensorFile
    from lamina.tokenizers.kinds import load_tokenizer

    deep = "[" * 100_000 + "]" * 100_000
    if reader == "safetensors":
        header = ('{"a": ' + deep + "}").encode()
        p = tmp_path / "x.safetensors"
        p.write_bytes(len(header).to_bytes(8, "little") + header)
        with pytest.raises(LaminaError, match="not a readable safetensors file"):
            TensorFile(p)
        return
    p = tmp_path / ("x.json" if reader == "tokenizer" else "x.jsonl")
    p.write_text({"corpus": '{"text": "a"}\n', "instruct": '{"prompt": "a", "completion": "b"}\n'}
                 .get(reader, "") + '{"a": ' + deep + "}\n")  # fmt: skip
    read = {"corpus": load_corpus, "instruct": read_examples, "tokenizer": load_tokenizer}[reader]
    with pytest.raises(LaminaError, match="nest deeper than 64|not valid JSON|line 2") as e:
        read(p)
    assert "\n" not in str(e.value)


def test_nothing_is_imported_for_the_first_time_under_a_deadline():
    """jinja2 (and what it imports lazily) is imported before the deadline is armed: an
    exception landing inside an import leaves a package half-initialised for the process."""
    import subprocess
    import sys

    src = Path(__file__).resolve().parent.parent / "src" / "lamina"
    code = (
        "import contextlib, sys, types\n"  # lamina's packages as bare namespaces: no torch
        f"for name, path in (('lamina', {str(src)!r}), ('lamina.tokenizers', {str(src / 'tokenizers')!r})):\n"
        "    sys.modules[name] = types.ModuleType(name)\n"
        "    sys.modules[name].__path__ = [path]\n"
        "import lamina.tokenizers.chat_template as ct\n"
        "new = []\n"
        "@contextlib.contextmanager\n"
        "def watched(seconds, what):\n"
        "    before = set(sys.modules)\n"
        "    try:\n"
        "        yield\n"
        "    finally:\n"
        "        new.extend(sorted(set(sys.modules) - before))\n"
        "ct.deadline = watched\n"
        "chat = [{'role': 'user', 'content': 'hi'}]\n"
        "print(ct.render_chat_template('{{ lipsum(1)[:0] }}{{ messages[0].content }}', chat))\n"
        "try:\n"
        "    ct.render_chat_template('{{ raise_exception(1) }}', chat)\n"
        "except ct.LaminaError:\n"
        "    pass\n"
        "print(new)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "hi\n[]\n", out.stdout + out.stderr[-500:]
