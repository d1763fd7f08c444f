"""What machine a benchmark ran on, for the line printed beside every table.

    cpu_flags() -> "avx2 fma f16c"                     the flags that choose lamina's kernels
    cpu_line()  -> "AMD EPYC; 2 cores; flags: avx2 fma f16c"

Read from /proc/cpuinfo (Linux); elsewhere "unknown". Imported by the scripts beside it, which
run as `python bench/NAME.py` (so this folder is on the path).
"""

from __future__ import annotations

import os
from pathlib import Path

FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni")
FLAGS += ("amx_tile", "amx_bf16", "amx_int8")


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


def cpu_flags() -> str:
    """The listed flags this CPU has, space-separated ("unknown" without /proc/cpuinfo)."""
    lines = _cpuinfo()
    have = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
    if not lines:
        return "unknown"
    return " ".join(f for f in FLAGS if f in have) or "none of avx2/avx512/amx"


def cpu_line() -> str:
    """The CPU's model name, the cores visible and its flags, in one line."""
    lines = _cpuinfo()
    name = next((ln.split(":", 1)[1].strip() for ln in lines if "model name" in ln), "unknown CPU")
    return f"{name}; {os.cpu_count()} cores; flags: {cpu_flags()}"
