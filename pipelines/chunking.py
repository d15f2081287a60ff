"""Splitting a backlog of Delta versions into steps of bounded size.

A job that reads the rows a table's commits appended after the version it last processed
(silver reading bronze, gold reading silver) reads them a few versions at a time, so that
its memory is bounded by its configured step size and not by the length of the backlog:
:func:`version_sizes` tells how many rows (and payload bytes) each version added, and
:func:`plan_chunks` the versions to stop at. Each step is committed with the version it
reached, so a run that dies between steps resumes at the next one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipelines.engines.base import HistoryEntry

__all__ = ["plan_chunks", "rows_between", "version_sizes"]

# How the two Delta implementations name the rows a write added, in DESCRIBE HISTORY.
_ADDED_ROWS_METRICS = ("num_added_rows", "numOutputRows")


def _added_rows(entry: HistoryEntry) -> int:
    for key in _ADDED_ROWS_METRICS:
        value = entry.metrics.get(key)
        if value is not None and str(value).isdigit():
            return int(value)
    return 0


def version_sizes(
    history: Iterable[HistoryEntry], checkpoints: Iterable[Mapping[str, Any]] = ()
) -> dict[int, tuple[int, int]]:
    """``(rows, payload bytes)`` each version of a table added: rows from the table's
    history, bytes from landing's checkpoint rows of a bronze table (``bronze_version``,
    ``event_count``, ``payload_bytes``); a version landing did not record (and every version
    of a table landing does not write) has 0 bytes."""
    sizes = {entry.version: (_added_rows(entry), 0) for entry in history}
    for row in checkpoints:
        version = row.get("bronze_version")
        if version is None:
            continue
        rows, _ = sizes.get(version, (0, 0))
        sizes[version] = (
            max(rows, int(row.get("event_count") or 0)),
            int(row.get("payload_bytes") or 0),
        )
    return sizes


def plan_chunks(
    sizes: Mapping[int, tuple[int, int]],
    after: int | None,
    current: int,
    *,
    max_rows: int,
    max_bytes: int,
) -> list[int]:
    """The versions to stop at, after ``after`` and up to ``current``, so that each step
    reads at most ``max_rows`` rows and ``max_bytes`` payload bytes (one version is never
    split; versions missing from ``sizes`` count as empty)."""
    if after is not None and after >= current:
        return []
    ends: list[int] = []
    rows = size = 0
    for version in range(0 if after is None else after + 1, current + 1):
        n, b = sizes.get(version, (0, 0))
        if (rows or size) and (rows + n > max_rows or size + b > max_bytes):
            ends.append(version - 1)
            rows = size = 0
        rows += n
        size += b
    ends.append(current)
    return ends


def rows_between(sizes: Mapping[int, tuple[int, int]], after: int | None, end: int) -> int:
    """Rows the versions after ``after`` up to ``end`` added."""
    start = 0 if after is None else after + 1
    return sum(sizes.get(v, (0, 0))[0] for v in range(start, end + 1))
