"""Task files (lamina.evals.tasks) and the built-in Shakespeare tasks (lamina.evals.builtin_tasks)."""

from __future__ import annotations

import json

import pytest

from lamina.errors import LaminaError
from lamina.evals.builtin_tasks import BUILTIN_TASKS, TITLES, builtin_task
from lamina.evals.choice import ChoiceItem
from lamina.evals.tasks import read_task, write_task


def write(tmp_path, *lines) -> str:
    p = tmp_path / "t.jsonl"
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(p)


def test_context_and_query_shapes_read_alike(tmp_path):
    task = read_task(write(tmp_path,
        {"context": "A", "choices": ["b", "c"], "gold": 1, "id": 7}, "",
        {"query": "Q", "choices": ["x", "y", "z"], "gold": 0}))  # fmt: skip
    assert task.kind == "choice" and len(task) == 2 and task.delimiter == " "
    assert task.items == (ChoiceItem("A", ("b", "c"), 1), ChoiceItem("Q", ("x", "y", "z"), 0))
    assert task.meta[0] == {"id": 7} and task.chance == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert task.limited(1).items == task.items[:1]


def test_text_lines_are_a_perplexity_task(tmp_path):
    task = read_task(write(tmp_path, {"text": "one"}, {"text": "two"}))
    assert task.kind == "perplexity" and task.texts == ("one", "two")


def test_write_task_round_trips(tmp_path):
    task = builtin_task("which-play", 5)
    write_task(task, tmp_path / "w.jsonl")
    assert read_task(tmp_path / "w.jsonl").items == task.items


@pytest.mark.parametrize(
    "line, needle",
    [
        ("not json", "line 2: not valid JSON"),
        ('["a"]', "line 2: expected a JSON object"),
        ('{"choices": ["a", "b"], "gold": 0}', 'line 2: no "context" (or "query") field'),
        ('{"context": 3, "choices": ["a", "b"], "gold": 0}', '"context" must be a string'),
        ('{"context": "c", "choices": ["a"], "gold": 0}', "at least 2 strings"),
        ('{"context": "c", "choices": ["a", ""], "gold": 0}', '"choices"[1] must be a non-empty'),
        ('{"context": "c", "choices": ["a", "b"], "gold": "a"}', '"gold" must be an integer'),
        ('{"context": "c", "choices": ["a", "b"], "gold": 2}', '"gold" 2 is not an index'),
        ('{"text": "t"}', "line 2: a perplexity item in a file of choice items"),
    ],
)
def test_bad_lines_name_the_line(tmp_path, line, needle):
    path = write(tmp_path, {"context": "ok", "choices": ["a", "b"], "gold": 0}, line)
    with pytest.raises(LaminaError, match=None) as e:
        read_task(path)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_empty_and_binary_files(tmp_path):
    with pytest.raises(LaminaError, match="no such file"):
        read_task(tmp_path / "nope.jsonl")
    with pytest.raises(LaminaError, match="holds no items"):
        read_task(write(tmp_path, ""))
    (tmp_path / "b.jsonl").write_bytes(b"\xff\xfe")
    with pytest.raises(LaminaError, match="not UTF-8"):
        read_task(tmp_path / "b.jsonl")


@pytest.mark.parametrize("name", sorted(BUILTIN_TASKS))
def test_builtin_tasks_are_deterministic_with_a_chance_of_one_in_four(name):
    a, b = builtin_task(name, 60, seed=1), builtin_task(name, 60, seed=1)
    assert a.items == b.items and len(a) == 60 and a.chance == 0.25
    assert builtin_task(name, 60, seed=2).items != a.items
    assert builtin_task(name, 20, seed=1).items == a.items[:20]  # a prefix of the same draw
    golds = [it.gold for it in a.items]
    assert set(golds) == {0, 1, 2, 3}  # the right answer is not always in one place
    for it in a.items:
        assert len(set(it.choices)) == 4 and it.context and not it.context.endswith(" ")


def test_which_play_names_the_speech_play_and_next_line_is_a_line():
    for it in builtin_task("which-play", 30).items:
        assert all(c in TITLES.values() for c in it.choices)
        assert it.context.endswith("\nAnswer:")
    task = builtin_task("next-line", 30)
    assert task.delimiter == "\n"
    assert all("\n" not in c for it in task.items for c in it.choices)
    two = builtin_task("next-line-2", 30)  # lm-eval's shape: the newline is the choice's own
    assert two.delimiter == "" and all(it.context.count("\n") == 1 for it in two.items)
    assert all(c.startswith("\n") and "\n" not in c[1:] for it in two.items for c in it.choices)


def test_unknown_builtin_is_refused():
    with pytest.raises(LaminaError, match="the built-in tasks: next-line, next-line-2, which-play"):
        builtin_task("hellaswag")
