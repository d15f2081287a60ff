"""How the ``spark`` engine manages its tables: creating them and adding columns and
properties, their history, and their upkeep -- OPTIMIZE, VACUUM and log cleanup, all SQL.

Delta has no SQL statement that writes a log checkpoint: Delta Spark writes one by itself every
``delta.checkpointInterval`` commits (10 by default) and removes log entries older than
``delta.logRetentionDuration`` after it, so :meth:`SparkTablesMixin.maintain` leaves
checkpoints to Delta and reports none.

:class:`SparkTablesMixin` is part of :class:`~pipelines.engines.spark.SparkEngine`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.errors import LakeError
from pipelines.engines.arrow import same_type
from pipelines.engines.base import HistoryEntry, MaintenanceResult, TableRef
from pipelines.engines.spark_sql import (
    DELETION_VECTORS_PROPERTY,
    RETENTION_CHECK_CONF,
    add_columns_sql,
    create_table_sql,
    history_entry,
    metric_int,
    set_properties_sql,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["SparkTablesMixin"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.spark")


class SparkTablesMixin:
    """Table creation, properties, history and maintenance of
    :class:`~pipelines.engines.spark.SparkEngine`."""

    if TYPE_CHECKING:
        # What table management uses of the rest of the engine.
        _spark: SparkSession
        location: str | None
        default_properties: dict[str, str]

        def exists(self, table: TableRef) -> bool: ...
        def schema(self, table: TableRef) -> StructType | None: ...
        def qualified_name(self, table: TableRef) -> str: ...
        def schema_name(self, layer: str) -> str: ...
        def path(self, table: TableRef) -> str: ...
        def _ident(self, table: TableRef) -> str: ...
        def _sql(self, text: str) -> DataFrame: ...
        def _require(self, table: TableRef) -> int: ...
        def _history_rows(self, table: TableRef, limit: int | None) -> list[dict[str, Any]]: ...
        def _errors(self, action: str, table: TableRef) -> AbstractContextManager[None]: ...
        def _session_conf(
            self, values: Mapping[str, str] | None = None
        ) -> AbstractContextManager[None]: ...

    def properties(self, table: TableRef) -> dict[str, str]:
        with self._errors("read the properties of", table):
            rows = self._sql(f"SHOW TBLPROPERTIES {self._ident(table)}").collect()
        return {str(r["key"]): str(r["value"]) for r in rows}

    def ensure_table(
        self,
        table: TableRef,
        schema: StructType,
        *,
        properties: Mapping[str, str] | None = None,
        deletion_vectors: bool = False,
    ) -> None:
        wanted = {**self.default_properties, **(properties or {})}
        if deletion_vectors:
            wanted[DELETION_VECTORS_PROPERTY] = "true"
        ident = self._ident(table)
        if not self.exists(table):
            # Its commit would take a MERGE's settings of another thread: see _session_conf.
            with self._errors("create", table), self._session_conf():
                if self.location is None:
                    self._sql(f"CREATE SCHEMA IF NOT EXISTS {self.schema_name(table.layer)}")
                self._sql(create_table_sql(ident, schema, wanted))
            _log.info("created %s (%s)", table, ident)
            return
        current = self.schema(table)
        assert current is not None
        by_name = {f.name.lower(): f for f in current.fields}
        missing = []
        for f in schema.fields:
            existing = by_name.get(f.name.lower())
            if existing is None:
                missing.append(f)
            elif not same_type(existing.dataType, f.dataType):
                raise LakeError(
                    f"column {f.name!r} of {self.qualified_name(table)} is "
                    f"{existing.dataType.simpleString()}, not {f.dataType.simpleString()}; "
                    "changing a column type needs a rewrite"
                )
        with self._errors("alter", table), self._session_conf():
            if missing:
                self._sql(add_columns_sql(ident, missing))
            have = self.properties(table)
            changed = {k: v for k, v in wanted.items() if have.get(k) != v}
            if changed:
                self._sql(set_properties_sql(ident, changed))

    def history(self, table: TableRef, *, limit: int = 20) -> list[HistoryEntry]:
        self._require(table)
        return [history_entry(row) for row in self._history_rows(table, limit)]

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
        # tombstone_hours is not applied: Delta Spark refuses to read a version (or the change
        # data feed from one) older than delta.deletedFileRetentionDuration, which a consumer
        # that is behind does, so tables keep Delta's default.
        del tombstone_hours
        self._require(table)
        ident = self._ident(table)
        removed = added = 0
        checkpoint_version: int | None = None
        vacuumed = expired = None
        local_dir = self._local_dir(table)
        if log_hours is not None and log_hours < 0:
            raise LakeError(f"log_hours must be >= 0 (got {log_hours})")
        with self._errors("maintain", table), self._session_conf():
            if compact:
                rows = self._sql(f"OPTIMIZE {ident}").collect()
                report = rows[0].asDict(recursive=True).get("metrics") if rows else None
                if isinstance(report, Mapping):
                    removed = metric_int(report, "numFilesRemoved")
                    added = metric_int(report, "numFilesAdded")
            if vacuum_hours is not None:
                if vacuum_hours < 0:
                    raise LakeError(f"vacuum_hours must be >= 0 (got {vacuum_hours})")
                hours = math.ceil(vacuum_hours)
                conf = {RETENTION_CHECK_CONF: "false"} if hours < 168 else {}
                before = _data_files(local_dir) if local_dir is not None else None
                with self._session_conf(conf):
                    # Delta rounds RETAIN's hours to a whole number (0.4 would delete every
                    # unreferenced file): round up instead.
                    self._sql(f"VACUUM {ident} RETAIN {hours} HOURS")
                if before is not None and local_dir is not None:
                    vacuumed = max(0, before - _data_files(local_dir))
            # No SQL writes a log checkpoint: Delta writes them itself (checkpoint_version
            # stays None), and log cleanup only ever goes up to the newest one.
            if checkpoint and log_hours is not None:
                expired = self._expire_log(table, local_dir, log_hours, log_from_version)
        return MaintenanceResult(table, removed, added, checkpoint_version, vacuumed, expired)

    def _local_dir(self, table: TableRef) -> Path | None:
        """The table's directory when it is on this machine's disk (location mode)."""
        if self.location is None:
            return None
        path = self.path(table)
        if path.startswith("file:"):
            path = path.removeprefix("file:")
        return Path(path) if "://" not in path else None

    def _expire_log(
        self,
        table: TableRef,
        local_dir: Path | None,
        log_hours: float,
        keep: int | None,
    ) -> int | None:
        """Log cleanup with a retention of its own, where the log is on this machine's disk;
        elsewhere Delta Spark cleans up after checkpoints per delta.logRetentionDuration."""
        if local_dir is None:
            _log.warning(
                "%s: log cleanup after %.1f h is only done for tables on a local disk; Delta "
                "Spark removes this table's log entries after delta.logRetentionDuration",
                table,
                log_hours,
            )
            return None
        try:
            # delta-rs' package: the spark extra may not have it.
            from pipelines.engines.deltalog import expire_log
        except ImportError as exc:
            _log.warning("%s: no log cleanup (%s)", table, exc)
            return None
        return expire_log(
            local_dir / "_delta_log", older_than=time.time() - log_hours * 3600, keep_version=keep
        )


def _data_files(directory: Path) -> int:
    """Data files (Parquet, change data and deletion vectors too) under a table directory."""
    count = 0
    for _root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        count += sum(1 for f in files if not f.startswith((".", "_")) and f.endswith(".parquet"))
    return count
