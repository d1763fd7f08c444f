"""The layer numbers that docstrings state are tests/test_layers.py's ranks (issue 34.6).

A module docstring that says "Layer N" (its first words, "Layer N, name: ...") and each line of
lamina/__init__.py's layer list ("    N name   ...   (lamina.unit)") must give its unit the rank
that LAYERS gives it, so the prose, the README's drawing and the tested map agree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_layers import LAYERS, SRC, module_name, unit_of

CLAIM = re.compile(r"\bLayer (\d+)\b")
LISTED = re.compile(r"^\s+(\d+) [a-z]+\s.*\((lamina\.[a-z_]+)\)\s*$", re.MULTILINE)


def docstring_claims(src: Path = SRC) -> list[tuple[str, str, int]]:
    """(module, unit, rank stated) for every "Layer N" in a module docstring, and every line of
    the package docstring's layer list."""
    found = []
    for path in sorted((src / "lamina").rglob("*.py")):
        module = module_name(path, src)
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
        found += [(module, unit_of(module), int(n)) for n in CLAIM.findall(doc)]
        if module == "lamina":
            found += [(module, unit, int(n)) for n, unit in LISTED.findall(doc)]
    return found


def test_docstring_layer_numbers_are_the_map_ranks():
    claims = docstring_claims()
    assert len(claims) >= 15, claims  # the layers' own docstrings and the package's list
    wrong = [
        f"{module}: says layer {n} for {unit}, tests/test_layers.py ranks it {LAYERS.get(unit)}"
        for module, unit, n in claims
        if LAYERS.get(unit) != n
    ]
    assert not wrong, "\n".join(wrong)


def test_the_package_docstring_lists_every_numbered_layer():
    claims = docstring_claims()
    listed = {unit for module, unit, _ in claims if module == "lamina"}
    numbered = {unit for module, unit, _ in claims if module != "lamina"}
    assert listed == numbered, f"missing {numbered - listed}; extra {listed - numbered}"


def test_a_wrong_number_is_caught(tmp_path):
    (tmp_path / "lamina").mkdir()
    (tmp_path / "lamina" / "__init__.py").write_text(
        '"""lamina.\n\n    5 block   blocks   (lamina.block)\n    2 data   corpora   (lamina.data)\n"""\n'
    )
    (tmp_path / "lamina" / "block.py").write_text('"""Layer 9, block: residual blocks."""\n')
    claims = docstring_claims(tmp_path)
    assert sorted(claims) == [
        ("lamina", "lamina.block", 5),
        ("lamina", "lamina.data", 2),
        ("lamina.block", "lamina.block", 9),
    ]
    assert [c for c in claims if LAYERS[c[1]] != c[2]] == [
        ("lamina", "lamina.data", 2),
        ("lamina.block", "lamina.block", 9),
    ]
