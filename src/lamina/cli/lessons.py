"""`lamina lessons`: copy the lesson notebooks into a working folder and say how to open them.

The notebooks live in the source tree, in `lessons/exercises/` (and `lessons/solutions/`) next
to `src/`; lamina is installed from a clone with `pip install -e`, so they are found relative
to the package. LAMINA_LESSONS_DIR overrides where they are looked for. Notebooks already in the
working folder are kept (they hold the learner's work) unless --force. Nothing is started and
nothing touches the network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from lamina.cli import check_writable
from lamina.errors import LaminaError


def lessons_dir() -> Path:
    """The `lessons/` folder of the source tree (or LAMINA_LESSONS_DIR)."""
    override = os.environ.get("LAMINA_LESSONS_DIR")
    if override:
        found = Path(override).expanduser()
    else:
        found = Path(__file__).resolve().parents[3] / "lessons"  # src/lamina/cli -> repo root
    if not (found / "exercises").is_dir():
        raise LaminaError(
            f"no lesson notebooks at {found / 'exercises'}: the lessons ship with the source "
            "tree; install lamina from a clone (pip install -e .) or set LAMINA_LESSONS_DIR"
        )
    return found


def copy_notebooks(source: Path, dest: Path, force: bool) -> tuple[list[Path], list[Path]]:
    """Copy source/*.ipynb into dest: (copied, kept because they already exist)."""
    if dest.exists() and not dest.is_dir():
        raise LaminaError(f"--dest {dest} is a file, not a folder")
    check_writable(dest, "--dest")
    dest.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for nb in sorted(source.glob("*.ipynb")):
        target = dest / nb.name
        if target.exists() and not force:
            kept.append(target)
        else:
            shutil.copyfile(nb, target)
            copied.append(target)
    return copied, kept


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lessons",
        help="copy the lesson notebooks (exercises) into a working folder",
        description="Copy the five lesson notebooks, in their exercise form (TODO cells that "
        "raise NotImplementedError until you write the code), into a working folder, and print "
        "how to open them. Notebooks already there are kept. Starts nothing; needs no network.",
    )
    p.add_argument(
        "--dest",
        default="lessons-work",
        help="working folder to copy into (default: ./lessons-work)",
    )
    p.add_argument(
        "--solutions",
        action="store_true",
        help="also copy the solution notebooks, into DEST/solutions (default: off)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="overwrite notebooks already in the working folder (default: keep them)",
    )
    p.set_defaults(func=run)


def _how_to_open(dest: Path) -> str:
    """A command that opens the folder: this environment's Jupyter if it has one."""
    scripts = Path(sys.executable).parent
    for tool, verb in (("jupyter-lab", "lab"), ("jupyter-notebook", "notebook")):
        if (scripts / tool).exists():
            return f"open them with:  {scripts / 'jupyter'} {verb} {dest}"
        if shutil.which(tool):
            return f"open them with:  jupyter {verb} {dest}"
    return (
        "open them with any notebook tool (VS Code, Jupyter, ...); to add Jupyter here:\n"
        f"  {sys.executable} -m pip install jupyterlab   and then   {scripts / 'jupyter'} lab {dest}"
    )


def run(args: argparse.Namespace) -> int:
    source = lessons_dir()
    dest = Path(args.dest)
    copied, kept = copy_notebooks(source / "exercises", dest, args.force)
    if args.solutions:
        more, also_kept = copy_notebooks(source / "solutions", dest / "solutions", args.force)
        copied, kept = copied + more, kept + also_kept
    for path in copied:
        print(f"copied {path}")
    for path in kept:
        print(f"kept   {path} (already there; --force overwrites)")
    first = sorted(dest.glob("*.ipynb"))
    print(
        f"\n{len(first)} lessons in {dest.resolve()}; start with {first[0].name}" if first else ""
    )
    print(_how_to_open(dest))
    print("Cells tagged 'todo' raise NotImplementedError until you write them; the self-check")
    print("after each prints PASS, or what is wrong and by how much.")
    return 0
