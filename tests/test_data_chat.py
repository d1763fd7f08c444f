"""Chat templates: rendered text equals transformers' renderer (same sandbox, globals and
filters), assistant spans for the SFT mask, and every failure is one LaminaError line."""

from __future__ import annotations

import pytest
from tiny_tokenizers import CHATML

from lamina.errors import LaminaError
from lamina.tokenizers.chat_template import assistant_spans, check_messages, render_chat_template

chat_utils = pytest.importorskip("transformers.utils.chat_template_utils")

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": 'Ünïcode 😀 and <b>html</b> & "quotes"'},
    {"role": "assistant", "content": "Sure."},
    {"role": "user", "content": "again"},
]
# Templates that use what transformers gives a template: namespace, loop controls, tojson,
# raise_exception, bos_token, {% generation %}, trim_blocks and lstrip_blocks.
TEMPLATES = {
    "chatml": CHATML,
    "llama2-like": (
        "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}"
        "{% set messages = messages[1:] %}{% else %}{% set sys = false %}{% endif %}"
        "{% for message in messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}"
        "{% if loop.index0 == 0 and sys %}{% set content = '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n'"
        " + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
        "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
        "{% else %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
    ),
    "json-and-namespace": (
        "{% set ns = namespace(n=0) %}\n"
        "{% for m in messages %}\n"
        "  {% if m.role == 'system' %}{% continue %}{% endif %}\n"
        "  {% set ns.n = ns.n + 1 %}\n"
        "{{ ns.n }}: {{ m | tojson }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}{% generation %}>>{% endgeneration %}{% endif %}"
        "{% if tools is not none %}{{ tools | length }} tools{% endif %}"
        "{{ documents is none }}"
    ),
}
VARIABLES = {"bos_token": "<s>", "eos_token": "</s>"}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("prompt", [True, False])
def test_rendering_equals_transformers(name, prompt):
    template = TEMPLATES[name]
    chat = CHAT if name != "llama2-like" else CHAT[:2]
    ours = render_chat_template(template, chat, prompt, **VARIABLES)
    ref, _ = chat_utils.render_jinja_template(
        conversations=[chat], chat_template=template, add_generation_prompt=prompt, **VARIABLES
    )
    assert ours == ref[0]
    if name == "json-and-namespace":
        assert '"Ünïcode 😀 and <b>html</b> & \\"quotes\\""' in ours  # tojson escapes no HTML


def test_assistant_spans_cover_each_reply_and_its_end_of_turn():
    chat = CHAT[1:] + [{"role": "assistant", "content": "Done!"}]
    text, spans = assistant_spans(CHATML, chat)
    assert text == render_chat_template(CHATML, chat, add_generation_prompt=False)
    assert [text[s:e] for s, e in spans] == ["Sure.<|im_end|>\n", "Done!<|im_end|>\n"]
    assert text[: spans[0][0]].endswith("<|im_start|>assistant\n")


def test_a_template_that_rewrites_earlier_turns_cannot_give_spans():
    rewrites = "{% for m in messages %}{{ m.content if loop.last else '.' }}{% endfor %}"
    chat = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    render_chat_template(rewrites, chat)  # renders fine
    with pytest.raises(LaminaError, match="does not render message 1 incrementally"):
        assistant_spans(rewrites, chat)


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("{{ raise_exception('Conversation roles must alternate\nuser/assistant') }}", "alternate"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
        ("{% set xs = [] %}{{ xs.append(1) }}", "SecurityError"),
        ("{% set ns = namespace() %}{% set ns._x = 1 %}", "SecurityError"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{% for m in messages %}", "does not parse"),
    ],
    ids=["raise_exception", "dunder", "mutation", "namespace", "python-error", "syntax"],
)
def test_template_errors_and_sandbox_violations_are_one_line(template, match):
    with pytest.raises(LaminaError, match=match) as e:
        render_chat_template(template, CHAT)
    _one_line(e)


def test_str_format_cannot_reach_python_internals():
    assert render_chat_template("{{ '{0.__class__}'.format(messages) }}", CHAT) == ""


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ("hello", "must be a list"),
        ([{"content": "x"}], "message 0 needs a string 'role'"),
        (["x"], "message 0 must be a dict"),
        ([{"role": "user", "content": object()}], "message 0.content is a object"),
    ],
)
def test_malformed_messages_are_refused(messages, match):
    with pytest.raises(LaminaError, match=match):
        render_chat_template(CHATML, messages)


def test_none_values_are_dropped_and_the_caller_keeps_its_messages():
    chat = [{"role": "user", "content": "hi", "name": None}]
    assert check_messages(chat) == [{"role": "user", "content": "hi"}]
    assert chat[0] == {"role": "user", "content": "hi", "name": None}
    with pytest.raises(LaminaError, match="no chat template"):
        render_chat_template(None, chat)
