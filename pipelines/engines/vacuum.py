"""VACUUM on the local engine, to the second and with the change data feed's files.

delta-rs' VACUUM (without ``full``, so that a file an appender is writing and has not committed
yet stays) deletes the data files that versions older than a whole number of hours removed.
It leaves two things undone that a long-running pipeline needs:

- a retention of less than an hour: it takes whole hours, so five minutes would mean one;
- the change data files (``_change_data/``) that MERGE, UPDATE and DELETE commits write for
  the change data feed: no version's state references them, so delta-rs never lists them, and
  a gold table that is merged into every few seconds gathers thousands. Delta Spark's VACUUM
  deletes them once they are older than the retention.

:func:`vacuum` does both, choosing what to delete from the log itself: a file goes only when
no version from the one current at the retention's horizon on needs it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from pipelines.engines.deltalog import commit_times

_log = logging.getLogger(__name__)

CHANGE_DATA_DIR = "_change_data"


def vacuum(dt: DeltaTable, table_dir: Path, hours: float, options: Mapping[str, Any]) -> int:
    """Delete the data and change data files no version of the last ``hours`` needs; how many
    went. delta-rs' VACUUM (with ``options``) is used as is for a whole number of hours;
    otherwise it lists every unreferenced file for :func:`unreferenced_since` to choose from.
    Change data files are chosen by :func:`expired_change_data` either way."""
    older_than = time.time() - hours * 3600
    if hours == int(hours):
        # delta-rs lists tombstones it deleted before too: count what was on disk.
        listed = dt.vacuum(dry_run=True, retention_hours=int(hours), **options)
        present = [f for f in listed if Path(table_dir, f).exists()]
        dt.vacuum(dry_run=False, retention_hours=int(hours), **options)
        deleted = sum(1 for f in present if not Path(table_dir, f).exists())
        doomed: list[str] = []
    else:
        listed = dt.vacuum(dry_run=True, retention_hours=0, **options)
        deleted = 0
        doomed = unreferenced_since(table_dir, listed, older_than=older_than)
    for name in [*doomed, *expired_change_data(table_dir, older_than=older_than)]:
        with contextlib.suppress(FileNotFoundError):
            Path(table_dir, name).unlink()
            deleted += 1
    return deleted


def _anchor(commits: Mapping[int, float], older_than: float) -> int:
    """The version current at ``older_than``: the newest committed before it, or, when the log
    no longer reaches back that far, the oldest it holds (no reader can open an older one)."""
    before = [v for v, mtime in commits.items() if mtime < older_than]
    return max(before) if before else min(commits)


def _named(table_dir: Path, versions: Iterable[int], action: str) -> set[str]:
    """The paths (as on disk, relative to ``table_dir``) that the ``action`` entries (``add``,
    ``cdc``) of the commits ``versions`` name."""
    names: set[str] = set()
    for version in versions:
        with Path(table_dir, "_delta_log", f"{version:020d}.json").open(encoding="utf-8") as f:
            for line in f:
                entry = json.loads(line).get(action) if line.strip() else None
                if entry is not None:
                    # The log holds paths as URIs.
                    names.add(urllib.parse.unquote(entry["path"]))
    return names


def unreferenced_since(
    table_dir: Path, candidates: Iterable[str], *, older_than: float
) -> list[str]:
    """Of ``candidates`` (data files relative to ``table_dir`` that the latest version no
    longer references, as delta-rs' VACUUM lists them), those that neither the version
    current at ``older_than`` (seconds since the epoch; a commit's time is its log file's
    modification time, as in :func:`~pipelines.engines.deltalog.expire_log`) nor any later
    version references: what a VACUUM with that horizon may delete, to the second.

    Nothing is returned when that version cannot be read: a VACUUM that cannot tell keeps
    every file."""
    commits = commit_times(table_dir / "_delta_log")
    if not commits:
        return []
    anchor = _anchor(commits, older_than)
    try:
        adds = pa.table(DeltaTable(str(table_dir), version=anchor).get_add_actions())
        keep = {urllib.parse.unquote(p) for p in adds.column("path").to_pylist()}
        keep |= _named(table_dir, sorted(v for v in commits if v > anchor), "add")
    except (DeltaError, OSError, ValueError) as exc:
        _log.warning(
            "%s: cannot read version %d to tell which files VACUUM may delete; keeping them "
            "all (%s)",
            table_dir,
            anchor,
            exc,
        )
        return []
    return [c for c in candidates if c not in keep]


def expired_change_data(table_dir: Path, *, older_than: float) -> list[str]:
    """The change data files of ``table_dir`` (relative paths under ``_change_data/``) that a
    VACUUM with the horizon ``older_than`` may delete: written before it, and named by no
    commit after the version current at the horizon (whose changes stay readable).

    A file written after the newest commit stays, whatever its age: it may belong to a commit
    that is being made. Nothing is returned when the log cannot be read."""
    root = table_dir / CHANGE_DATA_DIR
    if not root.is_dir():
        return []
    commits = commit_times(table_dir / "_delta_log")
    if not commits:
        return []
    horizon = min(older_than, max(commits.values()))
    old: list[str] = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            with contextlib.suppress(FileNotFoundError):
                if not name.startswith(".") and path.stat().st_mtime < horizon:
                    old.append(path.relative_to(table_dir).as_posix())
    if not old:
        return []
    anchor = _anchor(commits, older_than)
    try:
        keep = _named(table_dir, sorted(v for v in commits if v > anchor), "cdc")
    except (OSError, ValueError) as exc:
        _log.warning(
            "%s: cannot read the log to tell which change data files VACUUM may delete; "
            "keeping them all (%s)",
            table_dir,
            exc,
        )
        return []
    return [name for name in old if name not in keep]
