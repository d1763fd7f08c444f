"""`import lamina` loads its public names on first use (PEP 562), so that importing the package,
its tokenizers or lamina.native's torch-free runtime pulls in no torch."""

from __future__ import annotations

import subprocess
import sys

import lamina

CHECK = """
import sys
import lamina
import lamina.native.runtime
import lamina.tokenizers
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
print(lamina.GPT.__name__)
assert "torch" in sys.modules
"""


def test_importing_lamina_imports_no_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "GPT"


def test_every_public_name_resolves() -> None:
    from lamina.interop.bundle import open_model
    from lamina.models import GPT

    assert lamina.GPT is GPT and lamina.open is open_model and lamina.open_model is open_model
    for name in lamina.__all__:
        assert getattr(lamina, name) is not None, name
    assert set(lamina.__all__) <= set(dir(lamina))
    namespace: dict[str, object] = {}
    exec("from lamina import *", namespace)
    assert namespace["GPTConfig"] is lamina.GPTConfig
    assert "open" not in namespace  # a star import must not shadow the built-in


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        lamina.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("lamina.no_such_name resolved")


def test_a_submodule_does_not_shadow_the_function_of_its_name() -> None:
    """lamina.generation and lamina.interop load lazily too; importing the submodule `generate`
    (or `hf_config`) leaves the package's name the function, as the eager imports did."""
    import lamina.generation.generate
    import lamina.interop.hf_config  # noqa: F401
    from lamina.generation import generate
    from lamina.interop import hf_config

    assert callable(generate) and generate.__module__ == "lamina.generation.generate"
    assert callable(hf_config) and hf_config.__module__ == "lamina.interop.hf_family"
