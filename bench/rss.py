"""This process's peak resident memory, its own: `peak_rss_mb()`.

Read from /proc/self/status VmHWM (the high-water mark of this process's own address space).
Not getrusage's ru_maxrss: on Linux a child started by subprocess (vfork/posix_spawn, then exec)
inherits its parent's peak there, so a bench driver holding torch (~250 MB) would lend that to
a llama.cpp worker that never loads it. Elsewhere (no /proc) ru_maxrss is the fallback.
Imported by the scripts beside it, which run as `python bench/NAME.py`.
"""

from __future__ import annotations

import sys


def peak_rss_mb() -> float:
    """Peak RSS of this process in MB (MiB)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
        return kb / 1024
    except (OSError, StopIteration, ValueError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS, KiB on Linux
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024
