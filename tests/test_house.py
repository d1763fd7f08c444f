"""The house rules that a reading of src/ can check: module size, and no measured figures in code.

Measured figures live in BENCHMARKS.md only (figures in code comments and --help texts drifted
from the tables); code says what was measured and points there.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "lamina"
MAX_LINES = 400

# a speed figure: "95 tok/s", "2x faster", "1.45x the weights" after "measured", "10 us per
# slice", "300 times closer"; a format such as "{rate:,.0f} tok/s" has no digit before the unit
FIGURE = re.compile(
    r"\b\d[\d,.]*\s?(?:tok/s|tokens/s|it/s|GFLOP/s|GB/s)"
    r"|\b\d+(?:\.\d+)?x (?:faster|slower|as fast|the speed)"
    r"|\b\d+(?:\.\d+)?\s?(?:ms|us|µs|s) (?:per|a) (?:step|token|slice|call)"
    r"|\b\d+ times (?:faster|slower|closer)"
    r"|\bmeasured:? \d+(?:\.\d+)?x\b"
)


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*") if p.suffix in (".py", ".c"))


def test_no_python_module_is_over_400_lines():
    long = {
        str(p.relative_to(SRC)): n
        for p in _sources()
        if p.suffix == ".py" and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_measured_speed_figure_stands_in_code():
    found = [
        f"{p.relative_to(SRC)}:{n}: {line.strip()}"
        for p in _sources()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if FIGURE.search(line)
    ]
    assert found == [], "measured figures belong in BENCHMARKS.md:\n" + "\n".join(found)


def test_the_figure_rule_catches_figures_and_spares_formats():
    caught = ["decoded at 95 tok/s here", "measured 2x faster", "(measured: 1.45x the weights)",
              "costs ~10 us per slice", "0.8 s per step", "300 times closer", "12.5 tokens/s"]  # fmt: skip
    spared = ['f"{tok_per_s:,.0f} tok/s"', "within 64x the tensors' bytes", "Llama 3.x",
              "seconds per step", "batch_size x (2 x length + 1)", "0x0101"]  # fmt: skip
    assert all(FIGURE.search(t) for t in caught)
    assert not any(FIGURE.search(t) for t in spared)
