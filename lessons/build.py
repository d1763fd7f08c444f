"""Build the lesson notebooks from their sources: `python lessons/build.py [--check]`.

Each lesson is written once, as a jupytext percent-format script in `lessons/src/` (cells start
with `# %%`; markdown cells with `# %% [markdown]`, every line commented). Inside code cells,
the learner's part sits between two marker lines:

    # BEGIN SOLUTION: LayerNorm.forward
    ...the solution...
    # END SOLUTION

From one source this writes two notebooks, without outputs:
  * `lessons/solutions/NAME.ipynb`: the markers are dropped and the solution kept;
  * `lessons/exercises/NAME.ipynb`: the solution is replaced by
    `raise NotImplementedError("TODO: LayerNorm.forward")` at the same indentation.
Cells that held a solution get the tag "todo" in both forms. Cell ids and metadata are fixed,
so building twice gives the same bytes; `--check` only compares (tests call `render`).

Standard library and nbformat only; no outputs, no kernel.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

LESSONS = Path(__file__).resolve().parent
SOURCES = LESSONS / "src"
VARIANTS = ("solutions", "exercises")
_CELL = re.compile(r"^# %%(?P<rest>.*)$")
_BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION(?::\s*(?P<what>.*?))?\s*$")
_END = re.compile(r"^\s*# END SOLUTION\s*$")
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def sources() -> list[Path]:
    """The lesson sources, in lesson order (their names start with the lesson number)."""
    return sorted(SOURCES.glob("[0-9][0-9]_*.py"))


def split_cells(text: str) -> list[tuple[str, list[str]]]:
    """Percent-format text -> [(cell_type, lines)], blank lines at either end of a cell dropped."""
    cells: list[tuple[str, list[str]]] = []
    kind, lines = None, []
    for line in text.splitlines():
        m = _CELL.match(line)
        if m:
            if kind is not None:
                cells.append((kind, lines))
            kind = "markdown" if "[markdown]" in m.group("rest") else "code"
            lines = []
        elif kind is not None:
            lines.append(line)
    if kind is not None:
        cells.append((kind, lines))
    out = []
    for kind, lines in cells:
        while lines and not lines[0].strip():
            lines = lines[1:]
        while lines and not lines[-1].strip():
            lines = lines[:-1]
        if kind == "markdown":
            lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in lines]
        if lines:
            out.append((kind, lines))
    return out


def strip_solutions(lines: list[str], variant: str, where: str) -> tuple[list[str], bool]:
    """Apply the solution markers for one variant; also say whether the cell had any."""
    out: list[str] = []
    inside, found = False, False
    for n, line in enumerate(lines, 1):
        begin, end = _BEGIN.match(line), _END.match(line)
        if begin:
            if inside:
                raise ValueError(f"{where}, line {n}: BEGIN SOLUTION inside another")
            inside, found = True, True
            if variant == "exercises":
                what = begin.group("what") or "your code here"
                out.append(f'{begin.group("indent")}raise NotImplementedError("TODO: {what}")')
        elif end:
            if not inside:
                raise ValueError(f"{where}, line {n}: END SOLUTION without BEGIN")
            inside = False
        elif not inside or variant == "solutions":
            out.append(line)
    if inside:
        raise ValueError(f"{where}: BEGIN SOLUTION is never closed")
    return out, found


def render(source: Path, variant: str) -> nbformat.NotebookNode:
    """The notebook for one lesson source in one variant ("solutions" or "exercises")."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for i, (kind, lines) in enumerate(split_cells(source.read_text(encoding="utf-8"))):
        cell_id = f"cell-{i:02d}"
        if kind == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell("\n".join(lines), id=cell_id))
            continue
        code, todo = strip_solutions(lines, variant, f"{source.name}, cell {i}")
        cell = nbformat.v4.new_code_cell("\n".join(code), id=cell_id)
        if todo:
            cell.metadata["tags"] = ["todo"]
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def notebook_text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def target(source: Path, variant: str) -> Path:
    return LESSONS / variant / f"{source.stem}.ipynb"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only report notebooks that are out of date"
    )
    args = parser.parse_args(argv)
    stale = []
    for source in sources():
        for variant in VARIANTS:
            path, text = target(source, variant), notebook_text(render(source, variant))
            if path.exists() and path.read_text(encoding="utf-8") == text:
                continue
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    verb = "out of date" if args.check else "written"
    for path in stale:
        print(f"{verb}: {path.relative_to(LESSONS.parent)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
