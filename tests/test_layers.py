"""The layer map is a tested rule: no module imports from its own layer's betters or equals.

Every ``import`` and ``from ... import`` in ``src/lamina`` is read with ``ast`` (imports inside
functions and under ``TYPE_CHECKING`` included) and checked against ``LAYERS``, the code's own
copy of the README's layer map. A module may import a unit of a lower rank, or another module of
its own unit (``lamina.data.corpus`` -> ``lamina.data.sources``) as long as the modules of
one unit form no cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# unit -> rank. A unit is ``lamina`` itself (the public API), a top-level module or a package.
LAYERS: dict[str, int] = {
    # the leaves every layer may import
    "lamina.errors": 0,
    "lamina.version": 0,
    "lamina.bounds": 1,
    "lamina.files": 1,
    "lamina.modes": 1,
    "lamina.schema": 1,
    "lamina.validate": 1,
    "lamina.tensorfile": 1,
    "lamina.libc": 1,
    "lamina.lazy": 1,  # names of a package loaded on first use (PEP 562)
    # leaf modules inside a package (see LEAF_MODULES): the native library's builder, and the
    # kernel policy that asks it
    "lamina.native.build": 1,
    "lamina.generation.pick": 1,  # sampling's rule in NumPy: the torch-free runtime uses it
    "lamina.cpu": 2,
    # layers 0-4 of the README's map
    "lamina.tokenizers": 2,
    "lamina.data": 3,
    "lamina.embedding": 3,
    "lamina.rope": 3,
    "lamina.native.prefill": 3,  # a leaf module: the attention layer calls it
    "lamina.native.train_attention": 3,  # a leaf module too: training's attention
    "lamina.attention": 4,
    "lamina.block": 5,
    "lamina.models": 6,
    # above the models: the native decode step, files of models, then what uses them
    "lamina.native": 7,
    "lamina.frozen_linear": 7,
    "lamina.lora": 8,
    "lamina.lora_size": 9,
    "lamina.quant": 8,
    "lamina.checkpoint": 9,
    "lamina.checks": 10,
    "lamina.generation": 10,
    "lamina.evals": 10,
    "lamina.inspect": 10,
    "lamina.pictures": 10,
    "lamina.interop": 10,
    "lamina.training": 11,
    "lamina.serve": 11,
    # the command line, and the package's public face
    "lamina.cli": 12,
    "lamina": 13,
    "lamina.__main__": 13,
}


# modules ranked on their own, below their package: each imports nothing of it
LEAF_MODULES = (
    "lamina.native.build",
    "lamina.native.prefill",
    "lamina.native.train_attention",
    "lamina.generation.pick",
)


def unit_of(module: str) -> str:
    if module in LEAF_MODULES:
        return module
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str) -> set[str]:
    """Every lamina module that ``path`` imports, wherever the statement stands."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = module.split(".")
                pkg = pkg if is_package else pkg[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            found.add(base)
            # ``from lamina.data import corpus`` imports the submodule lamina.data.corpus
            found.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return {m for m in found if m == "lamina" or m.startswith("lamina.")}


def import_graph(src: Path) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((src / "lamina").rglob("*.py")):
        name = module_name(path, src)
        graph[name] = imports_of(path, name)
    known = set(graph)
    # keep imports of real modules; ``from pkg import name`` adds pkg.name, which may be a function
    return {m: {t for t in targets if t in known and t != m} for m, targets in graph.items()}


def violations(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Upward or sideways imports across units, and modules that the map does not place."""
    out = []
    for module, targets in sorted(graph.items()):
        unit = unit_of(module)
        if unit not in layers:
            out.append(f"{module}: its unit {unit} is not in the layer map")
            continue
        for target in sorted(targets):
            tunit = unit_of(target)
            if tunit == unit:
                continue
            if tunit not in layers:
                out.append(f"{module} imports {target}, whose unit is not in the layer map")
            elif layers[tunit] >= layers[unit]:
                out.append(
                    f"{module} (layer {layers[unit]}) imports {target} (layer {layers[tunit]})"
                )
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles between modules (a package's __init__ re-exporting its modules is fine)."""
    edges = {
        m: {t for t in ts if not m.startswith(t + ".") and not t.startswith(m + ".")}
        for m, ts in graph.items()
    }
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_breaks_the_layer_map():
    problems = violations(import_graph(SRC), LAYERS)
    assert not problems, "layering broken:\n" + "\n".join(problems)


def test_no_import_cycles():
    found = cycles(import_graph(SRC))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_every_unit_in_the_tree_is_mapped():
    units = {unit_of(m) for m in import_graph(SRC)}
    assert units == set(LAYERS), f"unmapped: {units - set(LAYERS)}; stale: {set(LAYERS) - units}"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / "lamina" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_an_upward_import_is_caught_even_inside_a_function(tmp_path):
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "",
            "embedding.py": "from lamina.errors import LaminaError\n",
            "models/__init__.py": "",
            "models/gpt.py": "def f():\n    from lamina.interop.hf import load\n",
            "interop/__init__.py": "",
            "interop/hf.py": "from lamina.models.gpt import GPT\n",
        },
    )
    layers = {"lamina": 11, "lamina.errors": 0, "lamina.embedding": 3}
    layers |= {"lamina.models": 6, "lamina.interop": 8}
    problems = violations(import_graph(src), layers)
    assert problems == ["lamina.models.gpt (layer 6) imports lamina.interop.hf (layer 8)"]
    assert cycles(import_graph(src)) == [
        ["lamina.interop.hf", "lamina.models.gpt", "lamina.interop.hf"]
    ]


def test_relative_and_sideways_imports_are_resolved(tmp_path):
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "generation/__init__.py": "",
            "generation/a.py": "from ..interop import b\nfrom . import c\n",
            "generation/c.py": "",
            "interop/__init__.py": "",
            "interop/b.py": "",
        },
    )
    layers = {"lamina": 11, "lamina.generation": 8, "lamina.interop": 8}
    assert violations(import_graph(src), layers) == [
        "lamina.generation.a (layer 8) imports lamina.interop (layer 8)",
        "lamina.generation.a (layer 8) imports lamina.interop.b (layer 8)",
    ]


def test_the_readme_map_names_every_unit():
    readme = (SRC.parent / "README.md").read_text(encoding="utf-8")
    start = readme.index("## The layers")
    section = readme[start : readme.index("\n## ", start + 1)]
    for unit in LAYERS:
        if unit in ("lamina", "lamina.__main__"):
            continue
        short = unit.removeprefix("lamina.")
        mentioned = short in section or short.replace(".", "/") in section
        assert mentioned, f"the README's layer map does not mention {short}"


def drawing_ranks(readme: str) -> dict[str, int]:
    """unit -> the rank the README's layer drawing gives it: each row group ends in "(N)", and
    names its units as `name/` (a package), `name.py` (a module), `package/name.py` (a leaf
    module ranked on its own) or `lamina` (the API)."""
    start = readme.index("## The layers")
    first = readme.index("```\n", start) + 4
    block = readme[first : readme.index("\n```", first)]
    units = {u.removeprefix("lamina."): u for u in LAYERS}
    found: dict[str, int] = {}
    group: list[str] = []
    for line in block.splitlines():
        group.append(line)
        end = re.search(r"\((\d+)\)\s*$", line)
        if not end:
            continue
        text = "\n".join(group)
        names = set()
        for found_name in re.findall(r"(?<![\w./])([a-z_]+(?:/[a-z_]+)?)(?:/|\.py)(?![\w.])", text):
            dotted = found_name.replace("/", ".")  # native/build.py: a leaf module's own rank
            names.add(dotted if dotted in units else found_name.split("/")[0])
        if text.split()[0] == "lamina":
            names.add("lamina")
        for name in names & set(units):
            assert units[name] not in found, f"the drawing ranks {name} twice"
            found[units[name]] = int(end.group(1))
        group = []
    return found


def test_the_readme_drawing_ranks_units_as_the_map_does():
    readme = (SRC.parent / "README.md").read_text(encoding="utf-8")
    drawn = drawing_ranks(readme)
    wanted = {u: r for u, r in LAYERS.items() if u != "lamina.__main__"}
    assert drawn == wanted
