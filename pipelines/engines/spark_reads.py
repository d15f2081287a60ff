"""How the ``spark`` engine reads its tables: whole or at a version, the rows of some keys, into
Arrow with a filter, and the rows appended over a range of versions (the change data feed's
inserts, or the whole table where the feed cannot answer).

:class:`SparkReads` is the part of :class:`~pipelines.engines.spark.SparkEngine` that reads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipelines.engines.arrow import dataframe_to_arrow
from pipelines.engines.base import CDF_PROPERTY, Condition, TableChanges, TableRef, check_until
from pipelines.engines.spark_access import SparkTableAccess
from pipelines.engines.spark_sql import history_entry, select_sql
from pipelines.engines.spark_tables import SparkTables
from pipelines.engines.sql import quote_identifier

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SparkReads"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.spark")


class SparkReads:
    """Reads of the tables of one engine (``access``); ``tables`` answer whether a table's
    change data feed is on."""

    def __init__(self, access: SparkTableAccess, tables: SparkTables) -> None:
        self._access = access
        self._tables = tables

    def read(
        self, table: TableRef, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> DataFrame:
        self._access.require_exists(table)
        reader = self._access.reader(table)
        if version is not None:
            reader = reader.option("versionAsOf", str(int(version)))
        with self._access.errors("read", table):
            df = self._access.load(reader, table)
            if version is not None:
                # Spark Connect analyses a plan when it is first used: a version the table
                # does not have fails here, as on a classic session.
                df.schema  # noqa: B018
        return df if columns is None else df.select(*[quote_identifier(c) for c in columns])

    def read_keyed(
        self, table: TableRef, *, key: str, keys: Any, columns: Sequence[str] | None = None
    ) -> DataFrame:
        # Columns come from their DataFrames, never from pyspark.sql.functions: those build
        # classic or Spark Connect columns by the process's mode, not by this session's.
        frame = self._access.dataframe(keys)
        wanted = frame.select(frame[quote_identifier(key)].alias(key))
        # The batch's keys are few next to the table's rows: broadcast them, so the table's
        # rows are filtered where they are read instead of being shuffled for the join.
        ids = wanted.where(wanted[quote_identifier(key)].isNotNull()).distinct().hint("broadcast")
        return self.read(table, columns=columns).join(ids, on=key, how="left_semi")

    def read_arrow(
        self,
        table: TableRef,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Condition] = (),
    ) -> pa.Table:
        self._access.require_exists(table)
        text = select_sql(self._access.ident(table), columns, where)
        with self._access.errors("read", table):
            return dataframe_to_arrow(self._access.sql(text))

    def read_appends(
        self,
        table: TableRef,
        *,
        after_version: int | None,
        until_version: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> TableChanges:
        latest = self._access.require(table)
        current = check_until(table, latest, after_version, until_version)
        if after_version is None:
            return TableChanges(
                table, self.read(table, version=current, columns=columns), 0, current
            )
        if after_version == current:
            empty = self.read(table, version=current, columns=columns).limit(0)
            return TableChanges(table, empty, None, current)
        reason = self._incremental_obstacle(table, after_version + 1, current, latest)
        if reason is not None:
            _log.warning(
                "%s: cannot read the rows added after version %d from the change data feed "
                "(%s); reading the whole table at version %d instead",
                table,
                after_version,
                reason,
                current,
            )
            rows = self.read(table, version=current, columns=columns)
            return TableChanges(table, rows, after_version + 1, current, True)
        reader = (
            self._access.reader(table)
            .option("readChangeFeed", "true")
            .option("startingVersion", str(after_version + 1))
            .option("endingVersion", str(current))
        )
        with self._access.errors("read the change data feed of", table):
            df = self._access.load(reader, table).where("_change_type = 'insert'")
        df = df.drop("_change_type", "_commit_version", "_commit_timestamp")
        if columns is not None:
            df = df.select(*[quote_identifier(c) for c in columns])
        return TableChanges(table, df, after_version + 1, current)

    def _incremental_obstacle(
        self, table: TableRef, first: int, last: int, latest: int
    ) -> str | None:
        if self._tables.properties(table).get(CDF_PROPERTY, "false").lower() != "true":
            return f"{CDF_PROPERTY} is off; ensure_table turns it on"
        since = [history_entry(r) for r in self._access.history_rows(table, latest - first + 1)]
        since = [e for e in since if e.version >= first]
        if not set(range(first, last + 1)) <= {e.version for e in since}:
            return "part of the range is no longer in the table history"
        for entry in since:
            if (
                entry.version <= last
                and entry.operation in ("SET TBLPROPERTIES", "UNSET TBLPROPERTIES")
                and CDF_PROPERTY in str(entry.parameters)
            ):
                return f"{CDF_PROPERTY} changed in version {entry.version}"
            # The feed of a version reads the files it added; a vacuum since may have deleted
            # them (compacted away, then unreferenced long enough): those of the versions
            # committed before its horizon (its time minus its retention), which
            # pipelines.maintenance keeps before the oldest version a consumer needs.
            if entry.operation.startswith("VACUUM") and entry.operation != "VACUUM END":
                retention = _vacuum_retention_ms(entry.parameters)
                for read in since:
                    if not first <= read.version < entry.version or read.operation in _NO_DATA:
                        continue
                    if retention is None or read.timestamp < entry.timestamp - timedelta(
                        milliseconds=retention
                    ):
                        return (
                            f"version {entry.version} ({entry.operation}) may have deleted the "
                            f"files of version {read.version}"
                        )
        return None


# Operations whose commits add no rows to a change data feed.
_NO_DATA = frozenset(
    {"OPTIMIZE", "VACUUM START", "VACUUM END", "CREATE TABLE", "SET TBLPROPERTIES"}
)


def _vacuum_retention_ms(parameters: Mapping[str, str]) -> float | None:
    """The retention a VACUUM's history entry ran with (``None``: not recorded)."""
    for key in ("specifiedRetentionMillis", "defaultRetentionMillis"):
        value = parameters.get(key)
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return None
