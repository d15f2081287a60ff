"""Handing memory the allocators keep for reuse back to the operating system.

A continuous run reads and writes Arrow data in bursts: each silver/gold pass allocates
hundreds of megabytes, on the main thread and on Arrow's and the lake engine's worker
threads, and frees them when it ends. The allocators behind that memory keep freed pages for
the next burst (Arrow's default pool, mimalloc, keeps them per thread, in arenas reserved a
gigabyte at a time; glibc's malloc keeps them in one arena per thread that used it), so a
long run's resident memory climbs for its first minutes and stays at the highest level any
pass needed. :func:`release_unused_memory`, called between passes, asks both to return what
they do not use. It costs milliseconds, and nothing when there is nothing to return.

Arrow's memory comes from jemalloc here rather than its default, mimalloc. With mimalloc, the
memory a continuous run kept between passes climbed through a soak at 1,000 events/s (its
arena grew by about 40 MB every four minutes) although it was asked to release what it did
not use after every pass; jemalloc's release purges every arena, and the arena stayed flat.
:func:`configure_allocators` makes the switch, unless ``ARROW_DEFAULT_MEMORY_POOL`` already
names a pool.

The local engine's delta-rs has an allocator of its own, jemalloc, which returns freed pages
only while the thread that freed them keeps allocating; delta-rs's worker threads sit idle
between passes holding theirs. :func:`configure_allocators`, called before delta-rs is
loaded, has it purge freed pages after a second from a background thread (unless
``_RJEM_MALLOC_CONF`` already says otherwise: the operator's setting wins).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Callable

import pyarrow as pa

__all__ = ["JEMALLOC_CONF", "configure_allocators", "release_unused_memory"]

_log = logging.getLogger(__name__)
# delta-rs's jemalloc reads its options from this variable (its symbols carry the _rjem_
# prefix) when it starts, the first time delta-rs allocates.
_JEMALLOC_ENV = "_RJEM_MALLOC_CONF"
# Purge freed pages after a second, from a background thread, and skip the "muzzy" stage
# (pages kept mapped but marked reclaimable, which still count as resident until reclaimed).
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"
# Arrow reads its pool's name from this variable the first time it needs one; children of this
# process (the landing) inherit the choice.
_ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def configure_allocators() -> None:
    """Set delta-rs's allocator options, unless the environment sets them; effective only
    before delta-rs is first loaded in this process (its children inherit them too). Have
    Arrow allocate from jemalloc, where this build of Arrow has it."""
    os.environ.setdefault(_JEMALLOC_ENV, JEMALLOC_CONF)
    if _ARROW_POOL_ENV in os.environ:
        return
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # an Arrow built without it keeps its default
        return
    pa.set_memory_pool(pool)
    os.environ[_ARROW_POOL_ENV] = "jemalloc"


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
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    _log.debug("released unused memory to the operating system")
