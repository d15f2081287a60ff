"""Reads of the local engine: table snapshots, filtered and keyed reads, the rows appended
after a version (from the change data feed), and a table's history.

:class:`LocalReader` is the reading role of :class:`~pipelines.engines.local.LocalEngine`; it
reaches the tables through :class:`~pipelines.engines.local_tables.LocalTables`. A snapshot of
a table whose Delta features do not change how its Parquet files are read is read with pyarrow
(:mod:`pipelines.engines.parquet_read`); any other table through delta-rs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from ingest.errors import LakeError
from pipelines.engines.arrow import fit_to_schema
from pipelines.engines.base import (
    CDF_PROPERTY,
    Condition,
    HistoryEntry,
    TableChanges,
    TableRef,
    check_conditions,
    check_until,
    decode_user_metadata,
)
from pipelines.engines.local_tables import LocalTables, as_arrow, schema_of
from pipelines.engines.parquet_read import read_parquet

__all__ = ["NATIVE_READER_FEATURES", "LocalReader", "reads_natively"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.local")

# Reader features that do not change how a snapshot's Parquet files are read. Anything else
# (deletion vectors, column mapping, ...) makes the engine read through delta-rs instead.
NATIVE_READER_FEATURES = frozenset(
    {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "checkpointProtection"}
)
_CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def reads_natively(dt: DeltaTable) -> bool:
    """Whether the snapshot of ``dt`` is its Parquet files read as they are (no partitions,
    no reader feature beyond :data:`NATIVE_READER_FEATURES`, no column mapping)."""
    protocol = dt.protocol()
    features = set(protocol.reader_features or ())
    mapping = dt.metadata().configuration.get("delta.columnMapping.mode", "none")
    return (
        not dt.metadata().partition_columns
        and features <= NATIVE_READER_FEATURES
        and mapping in (None, "none")
    )


class LocalReader:
    """Snapshots, filtered and keyed reads, appended rows and history of the tables of
    ``lake``."""

    def __init__(self, lake: LocalTables) -> None:
        self._lake = lake

    def _snapshot(
        self,
        table: TableRef,
        dt: DeltaTable,
        columns: Sequence[str] | None,
        conditions: Sequence[Condition] = (),
    ) -> pa.Table:
        schema = schema_of(dt)
        names = list(schema.names if columns is None else columns)
        unknown = sorted({*names, *(c for c, _op, _v in conditions)} - set(schema.names))
        if unknown:
            raise LakeError(
                f"{table} has no column {', '.join(map(repr, unknown))} (columns: "
                f"{', '.join(schema.names)})"
            )
        mapping = dt.metadata().configuration.get("delta.columnMapping.mode", "none")
        if mapping not in (None, "none"):
            # delta-rs 1.6 reads such a table's columns as nulls, without an error.
            raise LakeError(
                f"{table} uses column mapping (delta.columnMapping.mode = {mapping}), which the "
                "local engine cannot read correctly; read it with the spark engine"
            )
        with self._lake.errors("read", table):
            if not reads_natively(dt):
                rows = dt.to_pyarrow_table(columns=names, filters=list(conditions) or None)
                return fit_to_schema(rows, pa.schema([schema.field(n) for n in names]))
            # The snapshot's files are read with pyarrow's Parquet reader itself: delta-rs'
            # dataset wrapper leaves threads behind that abort the interpreter at exit
            # ("terminate called without an active exception"), and pyarrow.dataset imports
            # pandas, half a second of start-up for a landing process that never uses it.
            files = dt.file_uris()
            filesystem = self._lake.object_files()
            if filesystem is not None:
                # Paths in the store, under the lake's root (delta-rs reads any it spells
                # otherwise).
                root, fs = filesystem
                if all(f.startswith(root) for f in files):
                    files = [f.removeprefix(root) for f in files]
                    return read_parquet(files, schema, names, conditions, fs)
                rows = dt.to_pyarrow_table(columns=names, filters=list(conditions) or None)
                return fit_to_schema(rows, pa.schema([schema.field(n) for n in names]))
            return read_parquet(files, schema, names, conditions)

    def read(
        self, table: TableRef, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> pa.Table:
        return self._snapshot(table, self._lake.require(table, version), columns)

    def read_arrow(
        self,
        table: TableRef,
        *,
        columns: Sequence[str] | None = None,
        where: Sequence[Condition] = (),
    ) -> pa.Table:
        return self._snapshot(table, self._lake.require(table), columns, check_conditions(where))

    def read_keyed(
        self, table: TableRef, *, key: str, keys: Any, columns: Sequence[str] | None = None
    ) -> pa.Table:
        values = pc.unique(pc.drop_null(as_arrow(keys).column(key))).to_pylist()
        if not values:
            schema = schema_of(self._lake.require(table))
            names = list(schema.names if columns is None else columns)
            return pa.schema([schema.field(n) for n in names]).empty_table()
        return self.read_arrow(table, columns=columns, where=[(key, "in", values)])

    def read_appends(
        self,
        table: TableRef,
        *,
        after_version: int | None,
        until_version: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> TableChanges:
        dt = self._lake.require(table)
        current = check_until(table, dt.version(), after_version, until_version)
        if current != dt.version():
            dt = self._lake.require(table, current)
        if after_version is None:
            return TableChanges(table, self._snapshot(table, dt, columns), 0, current)
        schema = schema_of(dt)
        names = list(schema.names if columns is None else columns)
        if after_version == current:
            empty = pa.schema([schema.field(n) for n in names]).empty_table()
            return TableChanges(table, empty, None, current)
        if dt.metadata().configuration.get(CDF_PROPERTY, "false").lower() != "true":
            _log.warning(
                "%s: its change data feed is off (%s); reading the whole table at version %d "
                "instead of the rows added after version %d",
                table,
                CDF_PROPERTY,
                current,
                after_version,
            )
            return TableChanges(
                table, self._snapshot(table, dt, columns), after_version + 1, current, True
            )
        try:
            with self._lake.errors("read the change data feed of", table):
                # Every column: delta-rs' column list is parsed as SQL, which folds the case of
                # names such as "Id".
                reader = dt.load_cdf(starting_version=after_version + 1, ending_version=current)
                changes = pa.table(reader)
        except LakeError as exc:
            _log.warning(
                "%s: cannot read the rows added after version %d from the change data feed "
                "(%s); reading the whole table at version %d instead",
                table,
                after_version,
                exc,
                current,
            )
            return TableChanges(
                table, self._snapshot(table, dt, columns), after_version + 1, current, True
            )
        wanted = pa.schema(
            [*(schema.field(n) for n in names), pa.field("_change_type", pa.string())]
        )
        # Cast first: delta-rs answers with view types, which Arrow's filter does not take.
        changes = fit_to_schema(changes, wanted)
        inserted = changes.filter(pc.equal(changes.column("_change_type"), "insert"))
        rows = inserted.drop_columns(["_change_type"])
        return TableChanges(table, rows, after_version + 1, current)

    def history(self, table: TableRef, *, limit: int = 20) -> list[HistoryEntry]:
        dt = self._lake.require(table)
        with self._lake.errors("read the history of", table):
            commits = dt.history(limit)
        return [_history_entry(c) for c in commits]


def _history_entry(commit: Mapping[str, Any]) -> HistoryEntry:
    metadata, txn = decode_user_metadata(commit.get("userMetadata"))
    parameters = {
        str(k): v if isinstance(v, str) else json.dumps(v)
        for k, v in (commit.get("operationParameters") or {}).items()
    }
    timestamp = datetime.fromtimestamp(int(commit.get("timestamp", 0)) / 1000, tz=timezone.utc)
    return HistoryEntry(
        version=int(commit["version"]),
        timestamp=timestamp,
        operation=str(commit.get("operation", "")),
        parameters=parameters,
        metrics=dict(commit.get("operationMetrics") or {}),
        metadata=metadata,
        txn=txn,
    )
