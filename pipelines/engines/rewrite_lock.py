"""One rewrite of a local Delta table at a time, across threads and processes.

delta-rs lets two commits that both remove the same data file with ``dataChange: false``
through its conflict check. So two compactions of one table that overlap in time (the landing
compacting bronze every N commits while a continuous run's scheduled maintenance, or a
``sfcdc maintain`` in another terminal, compacts it too) both commit: each removes the small
files and adds its own copy of their rows, and the table holds them twice. A MERGE or
overwrite racing a compaction of the files it rewrites is open to the same. Delta Spark
detects these conflicts (``ConcurrentDeleteDeleteException``); the local engine instead
serializes every commit that removes files of a table with an exclusive lock on a file of its
own, ``<lake>/_sfcdc_locks/<layer>.<table>.lock``. Appends remove nothing and take no lock.

The lock is an advisory ``flock`` (``msvcrt.locking`` on Windows), so it holds between
processes of one machine, which is where the local engine's lake lives; it is released when
the holder exits, however it ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_DIR", "rewrite_lock"]

_log = logging.getLogger(__name__)
LOCK_DIR = "_sfcdc_locks"
# How often a waiter says it is still waiting.
_REPORT_EVERY = 30.0

try:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

except ImportError:  # pragma: no cover - Windows
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
        except OSError:
            return False
        return True

    def _lock(fd: int) -> None:
        while not _try_lock(fd):
            time.sleep(0.05)

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]


@contextlib.contextmanager
def rewrite_lock(lake: Path, key: str, *, action: str = "rewrite") -> Iterator[None]:
    """Hold the rewrite lock of table ``key`` (``layer.name``) of the lake at ``lake`` for
    the block; waits for another holder to finish."""
    directory = lake / LOCK_DIR
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_lock(fd):
            started = time.monotonic()
            _log.debug("%s: waiting for another rewrite of the table to finish", key)
            _lock(fd)
            waited = time.monotonic() - started
            if waited >= _REPORT_EVERY:
                _log.info("%s: waited %.0f s for another rewrite (%s)", key, waited, action)
        try:
            yield
        finally:
            _unlock(fd)
    finally:
        os.close(fd)
