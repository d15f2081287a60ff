"""VACUUM on the local engine: to the second, with the change data feed's files, and without
depending on the tombstones a checkpoint keeps.

delta-rs' VACUUM falls short of what a long-running pipeline needs in three ways:

- it takes whole hours, so a retention of five minutes would mean one;
- it never lists the change data files (``_change_data/``) that MERGE, UPDATE and DELETE
  commits write for the change data feed (no version's state references them), so a gold
  table merged into every few seconds gathers thousands; Delta Spark's VACUUM deletes them
  once they are older than the retention;
- without ``full`` it deletes only files whose ``remove`` tombstone the snapshot still holds,
  and tombstones stay in every checkpoint for ``delta.deletedFileRetentionDuration`` (a week
  unless set): a bronze table compacted every few minutes then carries tens of thousands of
  them, which every reader of the table loads. sfcdc keeps them only as long as its own
  retention (:mod:`pipelines.maintenance`), so VACUUM must not rely on them.

:func:`vacuum` chooses what to delete from the log itself, as Delta Spark does: any file of
the table that no version from the one current at the retention's horizon on references and
that was written before the horizon. A file written after the table's newest commit stays
whatever the retention: a writer may be about to commit it.
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

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from pipelines.engines.deltalog import commit_times

_log = logging.getLogger(__name__)

CHANGE_DATA_DIR = "_change_data"


def vacuum(dt: DeltaTable, table_dir: Path, hours: float) -> int:
    """Delete the data and change data files no version of the last ``hours`` needs; how many
    went. delta-rs lists the files the latest version does not reference,
    :func:`unreferenced_since` and the files' ages choose among them, and
    :func:`expired_change_data` chooses the change data files."""
    older_than = time.time() - hours * 3600
    listed = dt.vacuum(dry_run=True, retention_hours=0, enforce_retention_duration=False, full=True)
    doomed = _written_before(
        table_dir, unreferenced_since(table_dir, listed, older_than=older_than), older_than
    )
    deleted = 0
    for name in [*doomed, *expired_change_data(table_dir, older_than=older_than)]:
        with contextlib.suppress(FileNotFoundError):
            Path(table_dir, name).unlink()
            deleted += 1
    return deleted


def _written_before(table_dir: Path, names: Iterable[str], older_than: float) -> list[str]:
    """Of ``names`` (relative to ``table_dir``), those written before ``older_than`` and before
    the table's newest commit (a later file may be one a writer is about to commit)."""
    commits = commit_times(table_dir / "_delta_log")
    if not commits:
        return []
    horizon = min(older_than, max(commits.values()))
    out = []
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            if Path(table_dir, name).stat().st_mtime < horizon:
                out.append(name)
    return out


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
    written = [
        Path(folder, name).relative_to(table_dir).as_posix()
        for folder, _, files in os.walk(root)
        for name in files
        if not name.startswith(".")
    ]
    old = _written_before(table_dir, written, older_than)
    if not old:
        return []
    commits = commit_times(table_dir / "_delta_log")
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
