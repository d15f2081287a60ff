"""How the ``spark`` engine manages its tables: creating them and adding columns and
properties, their history, and their upkeep -- OPTIMIZE, VACUUM, log checkpoints and log
cleanup, in SQL. Log cleanup is Delta's own: sfcdc sets the table's ``delta.logRetentionDuration``
to its retention, and Delta deletes the expired entries after each checkpoint (whole days: Delta
keeps every entry of the day the retention ends in). Delta writes a checkpoint by itself every
``delta.checkpointInterval`` commits; no SQL statement writes one, so where the session reaches
Delta's log classes on the JVM (a classic session) maintenance writes one there and then, and
elsewhere (Spark Connect) reports the newest one Delta wrote.

:class:`SparkTables` is the part of :class:`~pipelines.engines.spark.SparkEngine` that does this.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.errors import LakeError
from pipelines.engines.arrow import same_type
from pipelines.engines.base import (
    DEFAULT_TOMBSTONE_HOURS,
    LOG_RETENTION_PROPERTY,
    TOMBSTONE_PROPERTY,
    HistoryEntry,
    MaintenanceResult,
    TableRef,
    interval_hours,
)
from pipelines.engines.spark_access import SparkTableAccess
from pipelines.engines.spark_sql import (
    DELETION_VECTORS_PROPERTY,
    RETENTION_CHECK_CONF,
    add_columns_sql,
    create_table_sql,
    history_entry,
    metric_int,
    set_properties_sql,
)
from pipelines.engines.spark_txns import SparkTransactions

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["SparkTables"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.spark")


class SparkTables:
    """Creation, properties, history and upkeep of the tables of one engine (``access``);
    ``transactions`` tell maintenance where the newest log checkpoint is."""

    def __init__(self, access: SparkTableAccess, transactions: SparkTransactions) -> None:
        self._access = access
        self._transactions = transactions
        # Per table: the version at which ensure_table last found it as asked, and what.
        self._ensured: dict[TableRef, tuple[int, tuple[str, tuple[tuple[str, str], ...]]]] = {}

    def properties(self, table: TableRef) -> dict[str, str]:
        with self._access.errors("read the properties of", table):
            rows = self._access.sql(f"SHOW TBLPROPERTIES {self._access.ident(table)}").collect()
        return {str(r["key"]): str(r["value"]) for r in rows}

    def ensure_table(
        self,
        table: TableRef,
        schema: StructType,
        *,
        properties: Mapping[str, str] | None = None,
        deletion_vectors: bool = False,
    ) -> None:
        wanted = {**self._access.default_properties, **(properties or {})}
        if deletion_vectors:
            wanted[DELETION_VECTORS_PROPERTY] = "true"
        ident = self._access.ident(table)
        # A table found as asked at some version is as asked while that is its version: the
        # check (its schema and properties, a Spark job each) is not made again until a commit.
        asked = (schema.json(), tuple(sorted(wanted.items())))
        version = self._access.version(table)
        if version is not None and self._ensured.get(table) == (version, asked):
            return
        if version is None:
            # Its commit would take the settings of a MERGE of another thread, or any left in
            # the session: see SparkTableAccess.session_conf.
            with self._access.errors("create", table), self._access.session_conf():
                if self._access.location is None:
                    self._access.sql(
                        f"CREATE SCHEMA IF NOT EXISTS {self._access.schema_name(table.layer)}"
                    )
                self._access.sql(create_table_sql(ident, schema, wanted))
            _log.info("created %s (%s)", table, ident)
            return
        current = self._access.schema(table)
        assert current is not None
        by_name = {f.name.lower(): f for f in current.fields}
        missing = []
        for f in schema.fields:
            existing = by_name.get(f.name.lower())
            if existing is None:
                missing.append(f)
            elif not same_type(existing.dataType, f.dataType):
                raise LakeError(
                    f"column {f.name!r} of {self._access.qualified_name(table)} is "
                    f"{existing.dataType.simpleString()}, not {f.dataType.simpleString()}; "
                    "changing a column type needs a rewrite"
                )
        with self._access.errors("alter", table), self._access.session_conf():
            if missing:
                self._access.sql(add_columns_sql(ident, missing))
            have = self.properties(table)
            changed = {k: v for k, v in wanted.items() if have.get(k) != v}
            if changed:
                self._access.sql(set_properties_sql(ident, changed))
        if not missing and not changed:
            self._ensured[table] = (version, asked)

    def history(self, table: TableRef, *, limit: int = 20) -> list[HistoryEntry]:
        self._access.require_exists(table)
        return [history_entry(row) for row in self._access.history_rows(table, limit)]

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
        self._access.require_exists(table)
        ident = self._access.ident(table)
        removed = added = 0
        checkpoint_version: int | None = None
        vacuumed = expired = None
        local_dir = self._access.local_dir(table)
        if log_hours is not None and log_hours < 0:
            raise LakeError(f"log_hours must be >= 0 (got {log_hours})")
        with self._access.errors("maintain", table), self._access.session_conf():
            if compact:
                rows = self._access.sql(f"OPTIMIZE {ident}").collect()
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
                with self._access.session_conf(conf):
                    # Delta rounds RETAIN's hours to a whole number (0.4 would delete every
                    # unreferenced file): round up instead.
                    self._access.sql(f"VACUUM {ident} RETAIN {hours} HOURS")
                if before is not None and local_dir is not None:
                    vacuumed = max(0, before - _data_files(local_dir))
            if checkpoint:
                if log_hours is not None:
                    self._keep_log(table, log_hours)
                before_log = _log_files(local_dir) if local_dir is not None else None
                checkpoint_version = self._checkpoint(table)
                if before_log is not None and local_dir is not None:
                    expired = max(0, before_log - _log_files(local_dir))
        del log_from_version  # Delta keeps every entry of the last day (module notes)
        return MaintenanceResult(table, removed, added, checkpoint_version, vacuumed, expired)

    def _keep_log(self, table: TableRef, hours: float) -> None:
        """Have Delta keep the table's log entries ``hours`` (whole seconds, at least one),
        and never less than its tombstones (Delta refuses that): a commit when the value
        changes."""
        have = self.properties(table)
        tombstones = interval_hours(have.get(TOMBSTONE_PROPERTY), DEFAULT_TOMBSTONE_HOURS)
        wanted = f"interval {max(1, math.ceil(max(hours, tombstones) * 3600))} seconds"
        if have.get(LOG_RETENTION_PROPERTY) != wanted:
            self._access.sql(
                set_properties_sql(self._access.ident(table), {LOG_RETENTION_PROPERTY: wanted})
            )

    def _checkpoint(self, table: TableRef) -> int | None:
        """Write a log checkpoint of the latest version now where Delta's log classes are in
        reach, and return its version; elsewhere the version of the newest checkpoint Delta
        wrote by itself (``None``: none yet, or the log is out of reach)."""
        opened = self._access.delta_log(table)
        if opened is None:
            _log.debug("%s: Delta Spark writes log checkpoints itself", table)
            return self._newest_checkpoint(table)
        delta_log, snapshot = opened
        try:
            jvm: Any = self._access.spark._jvm
            delta_log.checkpoint(snapshot, jvm.scala.Option.empty())
        except Exception as exc:
            _log.warning("%s: writing a log checkpoint failed: %s", table, exc)
            return None
        return int(snapshot.version())

    def _newest_checkpoint(self, table: TableRef) -> int | None:
        if self._access.location is None:
            return None  # a catalog table's log is not read with SQL
        version, _txns = self._transactions.checkpoint_txns(table)
        return None if version < 0 else version


def _data_files(directory: Path) -> int:
    """Data files (Parquet, change data and deletion vectors too) under a table directory."""
    count = 0
    for _root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        count += sum(1 for f in files if not f.startswith((".", "_")) and f.endswith(".parquet"))
    return count


def _log_files(directory: Path) -> int:
    """Commit and checkpoint files in a table directory's ``_delta_log``."""
    log = directory / "_delta_log"
    if not log.is_dir():
        return 0
    return sum(
        1
        for entry in log.iterdir()
        if not entry.name.startswith(".")
        and (entry.name.endswith(".json") or ".checkpoint." in entry.name)
    )
