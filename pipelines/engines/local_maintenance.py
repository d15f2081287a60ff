"""Maintenance of the local engine's tables through delta-rs: compaction in two tiers,
VACUUM with sfcdc's retention, how long checkpoints keep the tombstones of removed files, and
the table's log retention.

VACUUM is delta-rs' own, run twice. Its ``lite`` mode deletes the files that commits removed
(compaction, MERGE) once their tombstones are older than the retention, and nothing else, so
a data file a writer has written but not yet committed is safe whatever the retention. Its
``full`` mode also deletes files no version references -- the change data files MERGEs write
for the change data feed, and files crashed writers left -- once written longer ago than the
retention; it runs with a retention of at least an hour, so that an uncommitted file of a
running writer is never taken for one. delta-rs counts retentions in whole hours: a
fractional one is rounded up, as the spark engine's VACUUM does.

:class:`LocalMaintainer` is the maintenance role of
:class:`~pipelines.engines.local.LocalEngine`: compaction, VACUUM, checkpoints and log cleanup
of one table at a time, through :class:`~pipelines.engines.local_tables.LocalTables`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from ingest.errors import LakeError
from pipelines.engines.base import (
    DEFAULT_LOG_HOURS,
    LOG_RETENTION_PROPERTY,
    TOMBSTONE_PROPERTY,
    MaintenanceResult,
    TableRef,
    interval_hours,
)
from pipelines.engines.deltalog import expire_log
from pipelines.engines.local_tables import LocalTables

__all__ = [
    "COMPACT_SMALL_BYTES",
    "COMPACT_TARGET_BYTES",
    "COMPACT_TIER_FILES",
    "LocalMaintainer",
    "compact_in_tiers",
    "keep_tombstones",
    "log_retention_hours",
    "vacuum",
]

_log = logging.getLogger(__name__)
# The engine's log lines (of LocalMaintainer) stay under its module's logger.
_engine_log = logging.getLogger("pipelines.engines.local")

_MIN_SAFE_VACUUM_HOURS = 168.0

# Compaction packs small files into files of about this size and leaves larger ones alone, so
# one compaction rewrites (and holds in memory) at most about this much, however large the
# table grows. delta-rs' default (100 MiB) rewrites a whole table of up to that size each
# time, and a silver table compacted every few hundred commits then costs more memory and
# time every time.
COMPACT_TARGET_BYTES = 16 * 1024**2
# Compaction runs in two tiers. delta-rs rewrites every file smaller than the size it is
# asked for, and its outputs stay smaller than that size (they compress better than their
# inputs), so asked for the target every round, a bronze table compacted every hundred
# commits rewrote its largest unfinished file (up to 16 MiB) every time, which cost more round
# after round over a run's first quarter hour. Every round therefore packs the files under
# COMPACT_SMALL_BYTES into files of about that size, and only once COMPACT_TIER_FILES files
# under the target have gathered does a round pack those into files of the target size.
COMPACT_SMALL_BYTES = 1024**2
COMPACT_TIER_FILES = 16
# Files no version references are another writer's until they are this old (a writer commits
# the files it writes within seconds).
_ORPHAN_HOURS = 1


def compact_in_tiers(dt: DeltaTable) -> tuple[int, int]:
    """Compact ``dt`` in the two tiers of :data:`COMPACT_SMALL_BYTES` and
    :data:`COMPACT_TARGET_BYTES`: (files removed, files added)."""
    removed = added = 0
    small = min(COMPACT_SMALL_BYTES, COMPACT_TARGET_BYTES)
    for target in dict.fromkeys((small, COMPACT_TARGET_BYTES)):
        if target != small:
            sizes = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes")
            unfinished = pc.sum(pc.less(sizes, target)).as_py() or 0
            if unfinished < COMPACT_TIER_FILES:
                break
        report = dt.optimize.compact(target_size=target)
        removed += int(report.get("numFilesRemoved", 0))
        added += int(report.get("numFilesAdded", 0))
    return removed, added


def vacuum(dt: DeltaTable, hours: float) -> int:
    """Delete the files of ``dt`` no version of the last ``hours`` needs (see the module
    notes); how many went."""
    retention = math.ceil(hours)
    deleted = dt.vacuum(retention_hours=retention, dry_run=False, enforce_retention_duration=False)
    dt.update_incremental()
    orphans = dt.vacuum(
        retention_hours=max(retention, _ORPHAN_HOURS),
        dry_run=False,
        enforce_retention_duration=False,
        full=True,
    )
    dt.update_incremental()
    # Either pass may list files deleted before (a tombstone outlives its file), spelt as a
    # relative or an absolute path: the caller counts what it can see go.
    return len({Path(name).name for name in (*deleted, *orphans)})


def log_retention_hours(dt: DeltaTable) -> float:
    """The table's ``delta.logRetentionDuration`` in hours (Delta's 30 days unless set)."""
    return interval_hours(
        dt.metadata().configuration.get(LOG_RETENTION_PROPERTY), DEFAULT_LOG_HOURS
    )


def keep_tombstones(table: TableRef, dt: DeltaTable, hours: float) -> None:
    """Have the checkpoints of ``table`` keep the tombstones of removed files ``hours``
    rather than Delta's default week: a bronze table compacted every few minutes otherwise
    carries tens of thousands of them, which every reader loads. VACUUM here does not need
    them for files whose tombstones are gone (its ``full`` mode finds those), nor do delta-rs'
    reads of older versions. One
    commit when the value changes; when a concurrent writer wins it, the next round sets it."""
    wanted = f"interval {max(1, math.ceil(hours * 3600))} seconds"
    if dt.metadata().configuration.get(TOMBSTONE_PROPERTY) == wanted:
        return
    try:
        dt.update_incremental()
        dt.alter.set_table_properties({TOMBSTONE_PROPERTY: wanted})
    except DeltaError as exc:
        _log.warning("%s: cannot set %s yet: %s", table, TOMBSTONE_PROPERTY, exc)


class LocalMaintainer:
    """Maintenance of the tables of ``lake``: each run opens its table afresh, so it may run
    on a thread beside the engine's writes."""

    def __init__(self, lake: LocalTables) -> None:
        self._lake = lake

    def maintain(
        self,
        table: TableRef,
        *,
        compact: bool = True,
        checkpoint: bool = True,
        vacuum_hours: float | None = None,
        log_hours: float | None = None,
        log_from_version: int | None = None,
        tombstone_hours: float | None = None,
    ) -> MaintenanceResult:
        lake = self._lake
        # A table of its own: maintenance may run on a thread beside this engine's appends.
        uri = lake.uri(table)
        if not DeltaTable.is_deltatable(uri, lake.storage_options):
            raise LakeError(f"table {table} does not exist (no Delta table at {uri})")
        if log_hours is not None and log_hours < 0:
            raise LakeError(f"log_hours must be >= 0 (got {log_hours})")
        if vacuum_hours is not None and vacuum_hours < 0:
            raise LakeError(f"vacuum_hours must be >= 0 (got {vacuum_hours})")
        removed = added = 0
        checkpoint_version = vacuumed = expired = None
        with lake.errors("maintain", table):
            dt = lake.open(table)
            if compact:
                with lake.rewriting(table, "compaction"):
                    dt.update_incremental()
                    removed, added = compact_in_tiers(dt)
            if vacuum_hours is not None:
                if vacuum_hours < _MIN_SAFE_VACUUM_HOURS:
                    _engine_log.warning(
                        "%s: vacuuming files unreferenced for %.1f h (< 7 days): readers of "
                        "older versions, and running jobs, may fail",
                        table,
                        vacuum_hours,
                    )
                dt.update_incremental()
                before = _data_files(lake.path(table)) if lake.where.local else None
                vacuumed = vacuum(dt, vacuum_hours)
                if before is not None:
                    vacuumed = max(0, before - _data_files(lake.path(table)))
            if tombstone_hours is not None:
                keep_tombstones(table, dt, tombstone_hours)
            # The checkpoint last, so it covers vacuum's commits, and the log cleanup after it.
            if checkpoint:
                dt.update_incremental()
                dt.create_checkpoint()
                checkpoint_version = dt.version()
                expired = self._clean_log(table, dt, log_hours, log_from_version)
        _engine_log.info(
            "%s: maintenance compacted %d files into %d, checkpoint %s, vacuumed %s files, "
            "removed %s log entries",
            table,
            removed,
            added,
            checkpoint_version,
            vacuumed,
            expired,
        )
        lake.after_write(table)
        return MaintenanceResult(table, removed, added, checkpoint_version, vacuumed, expired)

    def _clean_log(
        self, table: TableRef, dt: DeltaTable, log_hours: float | None, keep: int | None
    ) -> int | None:
        """Delete the log entries older than ``log_hours`` (None: the table's
        ``delta.logRetentionDuration``, 30 days unless set) that no kept version needs."""
        hours = log_retention_hours(dt) if log_hours is None else log_hours
        if self._lake.where.local is None:
            if log_hours is not None and log_hours < log_retention_hours(dt):
                _engine_log.warning(
                    "%s: on object storage delta-rs cleans the log after the table's "
                    "delta.logRetentionDuration (%g h), not after %g h",
                    table,
                    log_retention_hours(dt),
                    log_hours,
                )
            dt.cleanup_metadata()
            return None
        if math.isinf(hours):
            return 0
        return expire_log(
            self._lake.path(table) / "_delta_log",
            older_than=time.time() - hours * 3600,
            keep_version=keep,
        )


def _data_files(directory: Path) -> int:
    """Data and change data files under a table directory (its log aside)."""
    count = 0
    for _root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        count += sum(1 for f in files if f.endswith(".parquet") and not f.startswith("."))
    return count
