"""The process's C library: glibc's malloc_trim, called from this one place.

    glibc() -> the C library (ctypes) when it is glibc with malloc_trim, else None
    trim_freed_memory() -> bool   malloc_trim(0): the pages the allocator holds free handed
        back to the system; False (nothing done) where the C library is not glibc

Its callers: lamina.open after a load (a load's transients not kept beside the model), the
native step after pack_lanes frees the rows' layouts (many small chunks amid the heap), and
`lamina train`'s lean_heap during a step (lamina.training.heap). Nothing runs at import and no
malloc option is set.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from typing import Any


def glibc() -> Any | None:
    """The process's C library through ctypes when it is glibc (with malloc_trim), else None."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: the libc it runs on
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def trim_freed_memory() -> bool:
    """malloc_trim(0) where the C library is glibc; whether it ran."""
    libc = glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
