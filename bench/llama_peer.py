"""llama.cpp as every bench's peer: its build described, and opened under its own defaults.

    llama_cpp_line() -> "llama-cpp-python 0.3.36; system info: AVX2 = 1 | ... | REPACK = 1"
    llama(path, **kw) -> llama_cpp.Llama            verbose off, llama.cpp's defaults otherwise

llama.cpp runs with its repacked weight layouts (extra buffer types) on, as it does by default.
A build with its AMX backend (system info AMX_INT8 = 1) is refused: its AMX matmul segfaults on
the first evaluation on this kind of machine (ggml-org/llama.cpp#20824, open); `make bench-deps`
builds llama-cpp-python without AMX (-mno-amx-*) on an AMX CPU. Imports neither torch nor lamina,
so a llama.cpp worker's RSS and threads are llama.cpp's own. Imported by the scripts beside it,
which run as `python bench/NAME.py` (so this folder is on the path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def amx_build() -> bool:
    """Whether this llama.cpp build runs its AMX backend here (see the module docstring)."""
    import llama_cpp

    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def llama_cpp_line() -> str:
    """llama-cpp-python's version and its build's system info (the instruction sets and
    backends it was built with), or why there is none."""
    try:
        import llama_cpp
    except ImportError:
        return "llama-cpp-python not installed (make bench-deps)"
    info = llama_cpp.llama_print_system_info().decode().strip().rstrip("|").strip()
    return f"llama-cpp-python {llama_cpp.__version__}; system info: {info}"


def llama(path: Path, **kw: Any) -> Any:
    """llama_cpp.Llama on `path`, llama.cpp's defaults otherwise; an AMX build is refused."""
    from llama_cpp import Llama

    if amx_build():
        raise SystemExit(
            "this llama-cpp-python has its AMX backend, whose matmul segfaults here "
            "(ggml-org/llama.cpp#20824): rebuild it without AMX with `make bench-deps`"
        )
    return Llama(model_path=str(path), verbose=False, **kw)
