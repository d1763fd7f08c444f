"""The training package stays readable: no function (or method) in src/lamina/training is longer
than MAX_LINES lines, counted with ast from its `def` line to its last line."""

from __future__ import annotations

import ast
from pathlib import Path

TRAINING = Path(__file__).resolve().parent.parent / "src" / "lamina" / "training"
MAX_LINES = 80


def long_functions(folder: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.name}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_in_training_is_over_80_lines():
    too_long = long_functions(TRAINING, MAX_LINES)
    assert not too_long, "split these:\n" + "\n".join(too_long)


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path, MAX_LINES) == [f"m.py:1 long ({MAX_LINES + 1} lines)"]
