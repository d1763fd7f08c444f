"""Names of a package that load on first use (PEP 562), so that importing the package imports
none of the modules behind them (torch above all): the torch-free parts (the native runtime,
the tokenizers, sampling's NumPy rule) stay torch-free.

    lazy_names(__name__, {"generate": "lamina.generation.generate", "load": "lamina.checkpoint:load_model"})

A value is the module that holds the name, or "module:name" where the name differs there. A
lazy name is never rebound to a submodule of the same name when that submodule is imported
(`generate` the function, not `lamina.generation.generate` the module), as eager imports kept it
by their order.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping
from typing import Any


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in self.__dict__.get("_lazy_names", {}):
            return
        super().__setattr__(name, value)


def lazy_names(package: str, names: Mapping[str, str]) -> None:
    """Give the module `package` (already in sys.modules: call it from the package's own body)
    `names`, loaded on first use (see the module docstring)."""
    module = sys.modules[package]
    table = dict(names)

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        where, _, attr = table[name].partition(":")
        value = getattr(importlib.import_module(where), attr or name)
        module.__dict__[name] = value  # once: later lookups find it in the module
        return value

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | set(table))

    module.__dict__.update(_lazy_names=table, __getattr__=__getattr__, __dir__=__dir__)
    module.__class__ = _Package
