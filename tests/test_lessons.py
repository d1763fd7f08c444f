"""The lessons: sources and notebooks in step, solutions run, exercises stop at the first TODO.

Each lesson runs in a fresh local Jupyter kernel (nbclient; the kernel "python3" is pinned to
this interpreter, so a user-level kernelspec of another Python cannot stand in): its exercise up
to the first TODO, then its solution from there (see ``lesson_runs``), with
LAMINA_LESSON_FAST=1 (small sizes), LAMINA_LESSON_STRICT=1 (a failed self-check raises instead
of only printing FAIL) and one torch thread.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from lamina.cli import main as lamina_main

REPO = Path(__file__).resolve().parent.parent
LESSONS = REPO / "lessons"


def _build_module():
    spec = importlib.util.spec_from_file_location("lessons_build", LESSONS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _build_module()
SOURCES = build.sources()
NAMES = [s.stem for s in SOURCES]


@pytest.fixture(scope="module")
def kernel_path(tmp_path_factory):
    """A JUPYTER_PATH whose "python3" kernel is this interpreter, first on the search path."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "Python 3 (lamina tests)", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel), encoding="utf-8")
    return str(root)


def first_todo(nb: nbformat.NotebookNode) -> int:
    return next(i for i, c in enumerate(nb.cells) if "todo" in c.metadata.get("tags", []))


def run_cells(client: NotebookClient, cells: range) -> CellExecutionError | None:
    """Run these cells of the client's notebook in its kernel, stopping at the first error."""
    for index in cells:
        try:
            client.execute_cell(client.nb.cells[index], index)
        except CellExecutionError as exc:
            return exc
    return None


def client_for(nb: nbformat.NotebookNode, tmp_path: Path) -> NotebookClient:
    return NotebookClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    )


@pytest.fixture(scope="module")
def lesson_runs(kernel_path, tmp_path_factory):
    """Each lesson run once, by name: (exercise, its error, solution, its error), notebooks with
    their outputs.

    One kernel per lesson: the exercise runs up to its first TODO, then the solution goes on in
    the same kernel from that cell (the cells before it are the same in both, which is checked),
    so the cells they share run once. Fresh kernels for both would double the kernel starts and
    the shared cells: a quarter of this module's time."""
    runs: dict[str, tuple] = {}

    def run(name: str) -> tuple:
        if name in runs:
            return runs[name]
        ex = nbformat.read(LESSONS / "exercises" / f"{name}.ipynb", as_version=4)
        sol = nbformat.read(LESSONS / "solutions" / f"{name}.ipynb", as_version=4)
        todo = first_todo(ex)
        shared = [(c.cell_type, c.source) for c in ex.cells[:todo]]
        if shared != [(c.cell_type, c.source) for c in sol.cells[:todo]]:
            raise AssertionError(f"{name}: the cells before the first TODO differ")
        tmp_path = tmp_path_factory.mktemp(name)
        start = time.perf_counter()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("JUPYTER_PATH", kernel_path)
            mp.setenv("LAMINA_LESSON_FAST", "1")
            mp.setenv("LAMINA_LESSON_STRICT", "1")
            mp.setenv("OMP_NUM_THREADS", "1")  # tiny models: threads only cost on shared cores
            client = client_for(ex, tmp_path)
            with client.setup_kernel():
                ex_error = run_cells(client, range(len(ex.cells)))
                for mine, theirs in zip(sol.cells[:todo], ex.cells[:todo], strict=True):
                    mine.outputs = theirs.get("outputs", [])
                client.nb = sol
                sol_error = run_cells(client, range(todo, len(sol.cells)))
        print(f"lessons/{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
        runs[name] = (ex, ex_error, sol, sol_error)
        return runs[name]

    return run


def test_there_are_eight_lessons():
    """Eight lesson sources, each with a solution and an exercise notebook."""
    assert len(SOURCES) == 8, NAMES
    for variant in build.VARIANTS:
        assert sorted(p.stem for p in (LESSONS / variant).glob("*.ipynb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_notebooks_match_sources(name):
    """The committed notebooks are what lessons/build.py makes from the sources."""
    source = LESSONS / "src" / f"{name}.py"
    for variant in build.VARIANTS:
        expected = build.notebook_text(build.render(source, variant))
        committed = build.target(source, variant).read_text(encoding="utf-8")
        assert committed == expected, f"run: python lessons/build.py ({variant}/{name} is stale)"


@pytest.mark.parametrize("name", NAMES)
def test_every_exercise_has_todos_and_no_solution(name):
    """Exercises raise NotImplementedError where solutions have code; markers never leak."""
    source = LESSONS / "src" / f"{name}.py"
    ex, sol = build.render(source, "exercises"), build.render(source, "solutions")
    todo_cells = [c for c in ex.cells if "todo" in c.metadata.get("tags", [])]
    assert todo_cells, "a lesson needs at least one TODO"
    for cell in todo_cells:
        assert "raise NotImplementedError" in cell.source
    for cell in sol.cells + ex.cells:
        assert "BEGIN SOLUTION" not in cell.source and "END SOLUTION" not in cell.source
    assert all("NotImplementedError" not in c.source for c in sol.cells if c.cell_type == "code")


def test_markers_must_balance():
    """An unclosed solution marker is an error, not a silently broken exercise."""
    with pytest.raises(ValueError, match="never closed"):
        build.strip_solutions(["# BEGIN SOLUTION", "x = 1"], "exercises", "here")
    with pytest.raises(ValueError, match="without BEGIN"):
        build.strip_solutions(["# END SOLUTION"], "solutions", "here")


@pytest.mark.parametrize("name", NAMES)
def test_solution_runs_top_to_bottom(name, lesson_runs):
    """Every solution notebook executes without an error and every self-check passes."""
    _, _, nb, error = lesson_runs(name)
    assert error is None, str(error)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "FAIL" not in text
    assert "PASS" in text


@pytest.mark.parametrize("name", NAMES)
def test_exercise_stops_at_first_todo(name, lesson_runs):
    """Every exercise notebook fails exactly at its first TODO cell, with NotImplementedError."""
    nb, error, _, _ = lesson_runs(name)
    assert error is not None and error.ename == "NotImplementedError", str(error)
    failed = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and any(o.output_type == "error" for o in c.outputs)
    ]
    assert failed == [first_todo(nb)]


def test_lessons_command_copies_exercises(tmp_path, capsys):
    """`lamina lessons --dest DIR` copies every exercise notebook and says how to open them."""
    dest = tmp_path / "work"
    assert lamina_main(["lessons", "--dest", str(dest)]) == 0
    assert sorted(p.name for p in dest.glob("*.ipynb")) == [f"{n}.ipynb" for n in NAMES]
    out = capsys.readouterr().out
    assert str(dest) in out and "01_" in out


def test_lessons_command_keeps_a_learners_work(tmp_path, capsys):
    """A second `lamina lessons` does not overwrite a notebook the learner has edited."""
    dest = tmp_path / "work"
    lamina_main(["lessons", "--dest", str(dest)])
    mine = dest / f"{NAMES[0]}.ipynb"
    mine.write_text("my work", encoding="utf-8")
    assert lamina_main(["lessons", "--dest", str(dest)]) == 0
    assert mine.read_text(encoding="utf-8") == "my work"
    assert "kept" in capsys.readouterr().out
    assert lamina_main(["lessons", "--dest", str(dest), "--solutions"]) == 0
    assert (dest / "solutions" / f"{NAMES[0]}.ipynb").is_file()


def test_lessons_command_refuses_a_file_as_dest(tmp_path, capsys):
    """A destination that is a file is bad input: one line on stderr, exit status 2."""
    f = tmp_path / "file"
    f.write_text("x")
    assert lamina_main(["lessons", "--dest", str(f)]) == 2
    assert "error" in capsys.readouterr().err
