"""Handing memory the allocators keep for reuse back to the operating system.

A continuous run reads and writes Arrow data in bursts: each silver/gold pass allocates
hundreds of megabytes, on the main thread and on Arrow's and the lake engine's worker
threads, and frees them when it ends. The allocators behind that memory keep freed pages for
the next burst (Arrow's default pool, mimalloc, keeps them per thread, in arenas reserved a
gigabyte at a time; glibc's malloc keeps them in one arena per thread that used it), so a
long run's resident memory climbs for its first minutes and stays at the highest level any
pass needed. :func:`release_unused_memory`, called between passes, asks both to return what
they do not use. It costs milliseconds, and nothing when there is nothing to return.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

__all__ = ["release_unused_memory"]

_log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (``None`` elsewhere: musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_unused_memory() -> None:
    """Return the free memory Arrow's pool and the C heap hold to the operating system."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        pass
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    _log.debug("released unused memory to the operating system")
